//! Soak: two daemons with a test guest each, connected through a lossy UDP relay on loopback,
//! carry mixed RC, UC and UD traffic in both directions while their QPs are destroyed and
//! re-created, one connection after another, for `VUR_SOAK_SECS` seconds (default 120).
//!
//! What must hold over the whole run:
//! - every posted work request completes exactly once (success, or a flush when its QP is
//!   moved to the error state); a connection that makes no progress for [`STUCK`] fails;
//! - every byte arrives: each work request carries the shared PRNG fill keyed by its wr_id
//!   ([`payload`]), and every place that must receive bytes is poisoned first. A receive must
//!   hold exactly a message its peer sent (RC: the next one in order; UC and UD: one of the
//!   recent ones, as loss, duplication and reordering reach their receivers), with its length;
//!   an RC WRITE's target and an RC READ's sink are checked at the completion, a
//!   WRITE-with-immediate's target at the receive it completes (RC and UC). Each outstanding
//!   operation and receive has buffers of its own ([`Layout`]);
//! - an RC send ends with RETRY_EXC_ERR only where the path was really cut (see [`Cuts`]):
//!   random loss never exhausts `retry_cnt`, so without a cut none is allowed;
//! - the daemons' live heap (their counting allocator's bytes), own memory (RssAnon) and fd
//!   count stay flat: a least-squares slope over the samples after the warm-up, within
//!   [`HEAP_SLOPE_BYTES_PER_MIN`], [`RSS_SLOPE_KIB_PER_MIN`] and [`FD_SLOPE_PER_MIN`];
//! - the counters agree with what the guests saw: CQEs written = completions polled, no ring
//!   fault, overflow, bad WQE or failed command, no ICRC failure (the relay re-seals every
//!   datagram), the live objects and page-list bytes back at their values after setup.
//!
//! It is `#[ignore]`d so that `cargo test` stays fast; tests/run.sh runs it on its own:
//!
//! ```text
//! VUR_SOAK_SECS=1200 cargo test -p vur-testguest --test soak -- --ignored --nocapture
//! ```

mod common;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::bin;
use rxe_core::sim::prng_pattern;
use rxe_core::verbs::*;
use rxe_core::Gid;
use vur_testguest::*;

/// A connection that completes nothing for this long, with work outstanding, is stuck.
const STUCK: Duration = Duration::from_secs(15);
/// Largest slope of the daemon's own memory (RssAnon, see [`anon_kib`]) after the warm-up. A
/// leak of 16 bytes per work request at this soak's rate (thousands a second) is several MiB
/// a minute, one of 100 bytes per QP churn about 8 KiB a minute; allocator noise over a
/// least-squares fit of one-second samples is below 1 KiB a minute.
const RSS_SLOPE_KIB_PER_MIN: f64 = 4.0;
/// RssAnon counts pages, and in the first minutes it creeps as the allocator reuses pages of
/// freed WQE queues and objects for others (up to 28 KiB in a two-minute run, while the live
/// heap stayed flat; docs/daemon.md, "Memory"): a fitted growth of sixteen pages is allowed
/// whatever the window. A leak per work request (MiB a minute) is far above it even in the
/// two-minute CI run, and the live heap check ([`HEAP_SLOPE_BYTES_PER_MIN`]) sees leaks of
/// bytes; the long run's slope bounds the creep.
const RSS_PAGES_KIB: f64 = 64.0;
/// Largest fd-count slope: nothing the guest does opens fds in the daemon (but the sockets
/// of its QPs' source ports, which close when unused and are taken off the count).
const FD_SLOPE_PER_MIN: f64 = 0.5;
/// Largest slope of the daemon's live heap (its counting allocator's live bytes, `"heap"` in
/// the counters): exact where RssAnon moves in pages and with the allocator's caching. The
/// samples catch work in flight (WQEs, packets), so they scatter by a few KiB; a leak of one
/// byte per work request is tens of KiB a minute, of 100 bytes per churn about 8 KiB a minute.
const HEAP_SLOPE_BYTES_PER_MIN: f64 = 1024.0;
/// Fitted live-heap growth allowed whatever the window: over a short run the scatter of the
/// samples (work in flight, ± 1 KiB) makes a steep slope of a flat line.
const HEAP_BYTES: f64 = 4096.0;
/// Send work requests outstanding per QP, receives kept posted per QP.
const SENDS: usize = 8;
/// Send work requests each end posts per second at most. UC and UD senders complete at once
/// and would post as fast as the loop runs; beyond what the debug-built relay and the shared
/// test machine carry, the kernel's socket buffers drop bursts of datagrams, and a burst
/// longer than `retry_cnt` retransmissions ends an RC QP with RETRY_EXC_ERR, as it should.
const RATE: f64 = 400.0;
const RECVS: usize = 48;
/// UC and UD: how many of the messages a peer sent a receive may be matched against.
const UNORDERED_WINDOW: usize = 1 << 14;
/// Largest RC/UC message: several packets at MTU 1024, so loss hits first, middle and last.
/// With IBTA's retry semantics (`retry_cnt` 7 is seven retries, and only an ACK that makes
/// progress restores them), an RC WQE fails with RETRY_EXC_ERR when eight retransmissions in a
/// row each lose a packet before the next ACK: at 1 in 200 and 8 packets a message, about
/// 0.04^8 per loss, never in an hour of soak.
const MAX_MSG: u32 = 8 << 10;
const QKEY: u32 = 0x1111_1111;
/// Operation slots per end: each holds the source (or READ sink) of one operation on its own
/// node and the target of its WRITE or READ on the peer. More than [`SENDS`]: an RC
/// WRITE-with-immediate keeps its slot until the peer has checked its receive, and freed
/// slots are taken last. (A UC sender completes at once and its messages may be lost, so its
/// slots are free at the completion; a UC WRITE-with-immediate's target is checked if the
/// slot has not been taken again by the time its receive comes, see [`QpEnd::owner`].)
const SLOTS: usize = 4 * SENDS;
/// Receive slots per end (more than [`RECVS`], each of [`MAX_MSG`] bytes).
const RECV_SLOTS: usize = 64;
/// Seed of the payloads: work request `id` carries `prng_pattern(SEED ^ id << 32, len)`.
const SEED: u64 = 0x50a4_0001;
/// Seed of what receive buffers are poisoned with.
const POISON: u64 = 0x50a4_0002;

/// Where things lie in each node's MR: per transport (RC, UC, UD) a region with the
/// operation slots of that transport's end on this node, the targets of its peer's
/// operations and its receive slots.
struct Layout;

impl Layout {
    const SLOT: usize = MAX_MSG as usize;
    const REGION: usize = (2 * SLOTS + RECV_SLOTS) * Self::SLOT;
    const MR_LEN: usize = 3 * Self::REGION;
    fn region(t: QpType) -> usize {
        Self::REGION
            * match t {
                QpType::Rc => 0,
                QpType::Uc => 1,
                _ => 2,
            }
    }
    /// Source (or READ sink) of operation slot `s`, on the node that posts it.
    fn src(t: QpType, s: usize) -> usize {
        Self::region(t) + s * Self::SLOT
    }
    /// Target of operation slot `s`, on the peer.
    fn tgt(t: QpType, s: usize) -> usize {
        Self::region(t) + (SLOTS + s) * Self::SLOT
    }
    fn recv(t: QpType, s: usize) -> usize {
        Self::region(t) + (2 * SLOTS + s) * Self::SLOT
    }
}

/// What work request `id` carries (and a READ must bring back).
fn payload(id: u64, len: u32) -> Vec<u8> {
    prng_pattern(SEED ^ (id << 32), len as usize)
}

/// Index and values of the first byte where `got` differs from `want`.
fn first_diff(got: &[u8], want: &[u8]) -> Option<(usize, u8, u8)> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .map(|i| (i, got[i], want[i]))
}

// ------------------------------------------------------------------------------ the relay

/// Counters of one direction of the relay.
#[derive(Default)]
struct Dir {
    received: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
}

/// Where the path between the daemons was really cut: the relay's thread did not run, no
/// datagram came from one side while traffic flowed, or a socket on the path (the relay's or
/// a daemon's) dropped datagrams because it overflowed. The relay's own random loss (1 in 200,
/// independent) is no cut: eight retransmissions in a row each losing a packet never happen,
/// so an RC send may end with RETRY_EXC_ERR only within [`CUT_WINDOW`] after a cut.
#[derive(Default)]
struct Cuts(Mutex<Vec<(Instant, String)>>);

impl Cuts {
    fn add(&self, at: Instant, what: String) {
        self.0.lock().unwrap().push((at, what));
    }
    /// The cuts in the `CUT_WINDOW` before `t`.
    fn before(&self, t: Instant) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at <= t && t.duration_since(*at) <= CUT_WINDOW)
            .map(|(_, w)| w.clone())
            .collect()
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The relay thread not running, or one side silent, for this long is a cut.
const CUT_GAP: Duration = Duration::from_millis(500);
/// How long before a RETRY_EXC_ERR is polled its cut may lie: `retry_cnt` 7 at a 268 ms
/// timeout is about 2 s without progress, and the loop may poll late (a retire waits up to
/// [`STUCK`]).
const CUT_WINDOW: Duration = Duration::from_secs(30);

/// Datagrams dropped so far by the UDP sockets bound to `addrs` (`/proc/net/udp`, the
/// `drops` column: receive-buffer overflows), and how many such sockets there are.
fn socket_drops(addrs: &[SocketAddr]) -> (u64, usize) {
    let t = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
    let want: Vec<String> = addrs
        .iter()
        .filter_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(format!(
                "{:08X}:{:04X}",
                u32::from_le_bytes(ip.octets()),
                a.port()
            )),
            IpAddr::V6(_) => None,
        })
        .collect();
    let mut n = (0, 0);
    for l in t.lines().skip(1) {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 12 && want.iter().any(|w| w == f[1]) {
            n.0 += f[12].parse::<u64>().unwrap_or(0);
            n.1 += 1;
        }
    }
    n
}

/// A lossy UDP relay between two daemons: `a` talks to `face_b` as if it were `b`, `b` to
/// `face_a` as if it were `a`. Each datagram is dropped (1 in 200), duplicated (3 in 1000) or
/// held back behind the next one (1 in 200, for at most 2 ms), and re-sealed: the ICRC covers
/// the addresses and ports, which the relay changes.
struct Relay {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    dirs: [Arc<Dir>; 2],
    cuts: Arc<Cuts>,
}

impl Relay {
    fn start(a: SocketAddr, b: SocketAddr, face_a: SocketAddr, face_b: SocketAddr) -> Relay {
        let sa = UdpSocket::bind(face_a).expect("bind the relay's face for a");
        let sb = UdpSocket::bind(face_b).expect("bind the relay's face for b");
        for s in [&sa, &sb] {
            set_rcvbuf(s, 4 << 20);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let dirs = [Arc::new(Dir::default()), Arc::new(Dir::default())];
        let cuts = Arc::new(Cuts::default());
        let threads = vec![
            // a → face_b ... face_a → b
            spawn_dir(
                sb.try_clone().unwrap(),
                sa.try_clone().unwrap(),
                b,
                stop.clone(),
                dirs[0].clone(),
                (cuts.clone(), "a → b"),
                1,
            ),
            spawn_dir(
                sa,
                sb,
                a,
                stop.clone(),
                dirs[1].clone(),
                (cuts.clone(), "b → a"),
                2,
            ),
        ];
        Relay {
            stop,
            threads,
            dirs,
            cuts,
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().expect("relay thread");
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Asks for a receive buffer of `bytes` (the kernel caps it at net.core.rmem_max): a relay
/// that falls behind for a moment should delay datagrams, not drop them.
fn set_rcvbuf(s: &UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: setsockopt on a socket we own, with a pointer to an int of the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
    }
}

/// Re-seals a RoCE datagram (BTH … ICRC) for the UDP/IPv4 path `src → dst`, the way the
/// receiving daemon checks it (IP ID 0, DF, TTL 64).
fn reseal(src: SocketAddr, dst: SocketAddr, roce: &mut [u8]) -> bool {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        return false;
    };
    let udp_len = (8 + roce.len()) as u16;
    let mut h = [0u8; 28];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
    h[6] = 0x40;
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&s.octets());
    h[16..20].copy_from_slice(&d.octets());
    h[20..22].copy_from_slice(&src.port().to_be_bytes());
    h[22..24].copy_from_slice(&dst.port().to_be_bytes());
    h[24..26].copy_from_slice(&udp_len.to_be_bytes());
    rxe_core::icrc::fill(&h, roce).is_ok()
}

fn spawn_dir(
    rx: UdpSocket,
    tx: UdpSocket,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    dir: Arc<Dir>,
    (cuts, name): (Arc<Cuts>, &'static str),
    seed: u64,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let from = tx.local_addr().unwrap();
        rx.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
        // The last time this thread ran, and the last datagram it got (none before the first).
        let (mut ran, mut got) = (Instant::now(), None::<Instant>);
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut held: Option<Vec<u8>> = None;
        let mut buf = vec![0u8; 9000];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now - ran > CUT_GAP {
                cuts.add(
                    now,
                    format!("{name}: the relay did not run for {:?}", now - ran),
                );
            }
            ran = now;
            let n = match rx.recv_from(&mut buf) {
                Ok((n, _)) => {
                    let now = Instant::now();
                    if let Some(g) = got.filter(|&g| now - g > CUT_GAP) {
                        cuts.add(now, format!("{name}: no datagram for {:?}", now - g));
                    }
                    got = Some(now);
                    n
                }
                Err(_) => {
                    // Nothing for 2 ms: what was held back goes now.
                    if let Some(p) = held.take() {
                        let _ = tx.send_to(&p, to);
                        dir.forwarded.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
            };
            dir.received.fetch_add(1, Ordering::Relaxed);
            let mut p = buf[..n].to_vec();
            if !reseal(from, to, &mut p) {
                dir.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let r = rand() % 1000;
            if r < 5 {
                dir.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let copies = if r < 8 {
                dir.duplicated.fetch_add(1, Ordering::Relaxed);
                2
            } else {
                1
            };
            if (8..13).contains(&r) && held.is_none() {
                dir.reordered.fetch_add(1, Ordering::Relaxed);
                held = Some(p);
                continue;
            }
            for _ in 0..copies {
                let _ = tx.send_to(&p, to);
                dir.forwarded.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(h) = held.take() {
                let _ = tx.send_to(&h, to);
                dir.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

// ------------------------------------------------------------------------------ the traffic

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Send,
    Write,
    WriteImm,
    Read,
}

/// A send work request: what it does, its length and its slot ([`Layout::src`],
/// [`Layout::tgt`]).
#[derive(Clone, Copy, Debug)]
struct Op {
    kind: OpKind,
    len: u32,
    slot: usize,
}

#[derive(Clone, Copy, Debug)]
enum Side {
    Send(Op),
    /// A receive and its slot ([`Layout::recv`]).
    Recv(usize),
}

/// A message the peer posted that takes a receive of this end (a SEND or a
/// WRITE-with-immediate), in posting order.
#[derive(Clone, Copy, Debug)]
struct Incoming {
    id: u64,
    op: Op,
}

/// One end of a connection: its QP, CQ and the work requests it has outstanding.
struct QpEnd {
    cq: Cq,
    qp: Qp,
    outstanding: HashMap<u64, Side>,
    sends: usize,
    recvs: usize,
    /// Free operation slots (taken in the order they were freed) and receive slots.
    free: VecDeque<usize>,
    free_recv: Vec<usize>,
    /// What the peer sent to this end and this end has not received yet (UC and UD: the
    /// recent ones, received or not: messages may come twice).
    incoming: VecDeque<Incoming>,
    /// The wr_id that last took each operation slot.
    owner: Vec<u64>,
}

/// A connection of one transport between the two nodes.
struct Conn {
    qp_type: QpType,
    ends: [QpEnd; 2],
    last_progress: Instant,
    born: Instant,
    /// An RC send ended with RETRY_EXC_ERR: its QP is in ERR and the connection is retired
    /// at once. IBTA's `retry_cnt` (7 is seven) spends a retry on every timeout and every NAK
    /// until an ACK makes progress; a relay starved of CPU for seconds on a shared machine
    /// can exhaust it. That is the transport working, not a leak or a lost completion, so it
    /// is allowed where the path was really cut ([`Cuts`]), and fails the run elsewhere.
    broken: bool,
    /// Sends posted per end.
    posted: [u64; 2],
    /// Bytes and messages checked.
    checked: [u64; 2],
}

/// Each node's PD and MR.
struct NodeRes {
    pd: u32,
    mr: Mr,
}

/// Totals the run checks against the daemons' counters.
#[derive(Default)]
struct Tally {
    /// Completions polled per node.
    cqes: [u64; 2],
    posted: u64,
    flushed: u64,
    churns: u64,
    /// RC sends that ended with RETRY_EXC_ERR (see [`Conn::broken`]), when they were polled.
    retry_exc: Vec<Instant>,
    /// Messages and bytes whose data was checked: receives, WRITE targets, READ sinks.
    checked: u64,
    checked_bytes: u64,
}

struct Soak {
    nodes: [Node; 2],
    res: [NodeRes; 2],
    /// The GID each node's QPs send to: the relay's face for the other node.
    peer_gid: [Gid; 2],
    next_wr: u64,
    tally: Tally,
}

const CAP: QpCap = QpCap {
    max_send_wr: SENDS as u32 * 2,
    max_recv_wr: RECVS as u32 * 2,
    max_send_sge: 2,
    max_recv_sge: 1,
    max_inline_data: 64,
};

impl Soak {
    fn node(&mut self, i: usize) -> &mut Guest {
        &mut self.nodes[i].guest
    }

    fn new_end(&mut self, i: usize, t: QpType) -> QpEnd {
        let cap = CAP;
        let pd = self.res[i].pd;
        let g = self.node(i);
        let cq = g
            .create_cq(cap.max_send_wr + cap.max_recv_wr)
            .expect("create_cq");
        let qp = g.create_qp(t, pd, &cq, &cq, None, cap).expect("create_qp");
        QpEnd {
            cq,
            qp,
            outstanding: HashMap::new(),
            sends: 0,
            recvs: 0,
            free: (0..SLOTS).collect(),
            free_recv: (0..RECV_SLOTS).rev().collect(),
            incoming: VecDeque::new(),
            owner: vec![0; SLOTS],
        }
    }

    fn connect(&mut self, t: QpType) -> Conn {
        let ends = [self.new_end(0, t), self.new_end(1, t)];
        let o = ConnOpts {
            qp_type: t,
            // 268 ms: eight retransmissions outlast two seconds of a starved relay on a busy
            // machine.
            timeout: 16,
            ..Default::default()
        };
        for i in 0..2 {
            let (dgid, dqpn) = (self.peer_gid[i], ends[1 - i].qp.qpn);
            bring_up(self.node(i), &ends[i].qp, dgid, dqpn, &o).expect("bring_up");
        }
        Conn {
            qp_type: t,
            ends,
            last_progress: Instant::now(),
            born: Instant::now(),
            broken: false,
            posted: [0; 2],
            checked: [0; 2],
        }
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr += 1;
        self.tally.posted += 1;
        self.next_wr
    }

    /// Posts receives up to [`RECVS`] and sends up to [`SENDS`] on both ends. Every source
    /// holds [`payload`] of its wr_id; every place that must receive bytes is poisoned first.
    fn top_up(&mut self, c: &mut Conn) {
        let t = c.qp_type;
        for i in 0..2 {
            while c.ends[i].recvs < RECVS {
                let Some(slot) = c.ends[i].free_recv.pop() else {
                    break;
                };
                let id = self.wr_id();
                let len = if t == QpType::Ud { 1024 + 40 } else { MAX_MSG };
                let mr = &self.res[i].mr;
                mr.write(
                    Layout::recv(t, slot),
                    &prng_pattern(POISON ^ (id << 32), len as usize),
                );
                let sge = mr.sge(Layout::recv(t, slot), len);
                let e = &mut c.ends[i];
                self.nodes[i]
                    .guest
                    .post_recv(
                        &e.qp,
                        &RecvWr {
                            wr_id: id,
                            sg_list: vec![sge].into(),
                        },
                    )
                    .expect("post_recv");
                e.outstanding.insert(id, Side::Recv(slot));
                e.recvs += 1;
            }
            let allowed = (c.born.elapsed().as_secs_f64() * RATE) as u64 + SENDS as u64;
            while c.ends[i].sends < SENDS && c.posted[i] < allowed {
                let Some(slot) = c.ends[i].free.pop_front() else {
                    break;
                };
                c.posted[i] += 1;
                let id = self.wr_id();
                let len = 1 + (id.wrapping_mul(2654435761) % MAX_MSG as u64) as u32;
                let len = if t == QpType::Ud { len % 1024 + 1 } else { len };
                let peer = &self.res[1 - i].mr;
                let (raddr, rkey) = (peer.addr(Layout::tgt(t, slot)), peer.rkey);
                let (kind, op) = match (t, id % 4) {
                    (QpType::Rc, 0) | (QpType::Uc, 0) => (
                        OpKind::Write,
                        SendOp::Write {
                            remote_addr: raddr,
                            rkey,
                        },
                    ),
                    (QpType::Rc, 1) => (
                        OpKind::Read,
                        SendOp::Read {
                            remote_addr: raddr,
                            rkey,
                        },
                    ),
                    (QpType::Rc | QpType::Uc, 2) => (
                        OpKind::WriteImm,
                        SendOp::WriteWithImm {
                            remote_addr: raddr,
                            rkey,
                            imm: id as u32,
                        },
                    ),
                    _ => (OpKind::Send, SendOp::Send),
                };
                let data = payload(id, len);
                let src = &self.res[i].mr;
                if kind == OpKind::Read {
                    // The peer's memory holds what the READ must bring back, the sink its
                    // complement.
                    peer.write(Layout::tgt(t, slot), &data);
                    let poison: Vec<u8> = data.iter().map(|b| !b).collect();
                    src.write(Layout::src(t, slot), &poison);
                } else {
                    src.write(Layout::src(t, slot), &data);
                    if kind != OpKind::Send {
                        let poison: Vec<u8> = data.iter().map(|b| !b).collect();
                        peer.write(Layout::tgt(t, slot), &poison);
                    }
                }
                let mut wr = SendWr::new(id, op, vec![src.sge(Layout::src(t, slot), len)]);
                if t == QpType::Ud {
                    wr.ud = Some(UdDest {
                        av: Av {
                            dgid: self.peer_gid[i],
                            hop_limit: 64,
                            ..Default::default()
                        },
                        remote_qpn: rxe_core::Qpn(c.ends[1 - i].qp.qpn),
                        remote_qkey: QKEY,
                    });
                }
                let o = Op { kind, len, slot };
                let e = &mut c.ends[i];
                self.nodes[i]
                    .guest
                    .post_send(&e.qp, &wr)
                    .expect("post_send");
                e.outstanding.insert(id, Side::Send(o));
                e.owner[slot] = id;
                e.sends += 1;
                if matches!(kind, OpKind::Send | OpKind::WriteImm) {
                    let inc = &mut c.ends[1 - i].incoming;
                    inc.push_back(Incoming { id, op: o });
                    // UC and UD: a window of recent messages. Wide: a receiver kept off the CPU
                    // finds the datagrams of seconds ago in its socket buffer (and the relay's),
                    // far more than its RECVS receives; a window of 4 x RECVS failed so under
                    // a loaded machine. (Lengths are compared first: the scan is cheap.)
                    if t != QpType::Rc && inc.len() > UNORDERED_WINDOW {
                        inc.pop_front();
                    }
                }
            }
        }
    }

    /// Checks a successful completion's data; an error says what differs.
    fn check(
        &mut self,
        c: &mut Conn,
        i: usize,
        w: &Wc,
        side: Side,
    ) -> std::result::Result<(), String> {
        let t = c.qp_type;
        let res = &self.res;
        let tally = &mut self.tally;
        // Slots of the sending end (1 - i) a receive frees: UC WRITE-with-immediate.
        let mut peer_free = Vec::new();
        let bytes = match side {
            Side::Send(o) => {
                // An RC completion means the responder has placed everything. A
                // WRITE-with-immediate's target is checked at its receive, which frees its slot.
                let (node, at, what) = match (t, o.kind) {
                    (QpType::Rc, OpKind::Write) => (1 - i, Layout::tgt(t, o.slot), "WRITE target"),
                    (QpType::Rc, OpKind::Read) => (i, Layout::src(t, o.slot), "READ sink"),
                    _ => {
                        if !(t == QpType::Rc && o.kind == OpKind::WriteImm) {
                            c.ends[i].free.push_back(o.slot);
                        }
                        return Ok(());
                    }
                };
                let got = res[node].mr.to_vec(at, o.len as usize);
                if let Some((k, g, x)) = first_diff(&got, &payload(w.wr_id, o.len)) {
                    return Err(format!(
                        "{what} of wr_id {} ({} bytes): byte {k} is {g:#04x}, expected \
                         {x:#04x}{}",
                        w.wr_id,
                        o.len,
                        if g == !x { " (never placed)" } else { "" }
                    ));
                }
                c.ends[i].free.push_back(o.slot);
                o.len
            }
            Side::Recv(slot) => {
                let imm = w.opcode == WcOpcode::RecvRdmaWithImm as u32;
                let grh = if t == QpType::Ud { 40 } else { 0 };
                let got_len = w.byte_len.wrapping_sub(grh);
                let at = Layout::recv(t, slot) + grh as usize;
                let imm_val = u32::from_be_bytes(w.ex.to_le_bytes());
                let peer_owner = c.ends[1 - i].owner.clone();
                // Is it message `m` of the peer?
                let matches = |m: &Incoming| -> std::result::Result<(), String> {
                    let want_imm = m.op.kind == OpKind::WriteImm;
                    if want_imm != imm {
                        return Err(format!("that was a {:?}", m.op.kind));
                    }
                    if imm && imm_val != m.id as u32 {
                        return Err(format!("immediate {imm_val:#x}, not {:#x}", m.id as u32));
                    }
                    if got_len != m.op.len {
                        return Err(format!("{got_len} bytes, not {}", m.op.len));
                    }
                    if imm && peer_owner[m.op.slot] != m.id {
                        // UC: the slot was taken again before this receive came.
                        return Ok(());
                    }
                    let from = if imm { Layout::tgt(t, m.op.slot) } else { at };
                    let got = res[i].mr.to_vec(from, m.op.len as usize);
                    match first_diff(&got, &payload(m.id, m.op.len)) {
                        Some((k, g, x)) => Err(format!(
                            "byte {k} of {} is {g:#04x}, not {x:#04x}{}",
                            if imm {
                                "the WRITE target"
                            } else {
                                "the receive buffer"
                            },
                            if g == !x { " (never placed)" } else { "" }
                        )),
                        None => Ok(()),
                    }
                };
                let e = &mut c.ends[i];
                e.free_recv.push(slot);
                let found = match t {
                    // In order: the next message the peer sent.
                    QpType::Rc => match e.incoming.pop_front() {
                        Some(m) => matches(&m).map(|_| m).map_err(|why| {
                            format!("the next message the peer sent, wr_id {}: {why}", m.id)
                        }),
                        None => Err("the peer sent nothing more".into()),
                    },
                    // UC and UD: any recent one. Loss, duplication and reordering reach the
                    // application: a UC responder starts a message at any FIRST or ONLY
                    // packet, whatever its PSN.
                    _ => e
                        .incoming
                        .iter()
                        .rev()
                        .find(|m| matches(m).is_ok())
                        .copied()
                        .ok_or_else(|| "no recent message the peer sent matches".to_string()),
                };
                let m = found.map_err(|why| {
                    format!(
                        "receive wr_id {} ({} bytes{}): {why}",
                        w.wr_id,
                        w.byte_len,
                        if imm { ", with immediate" } else { "" }
                    )
                })?;
                if t == QpType::Rc && m.op.kind == OpKind::WriteImm {
                    peer_free.push(m.op.slot);
                }
                m.op.len
            }
        };
        c.ends[1 - i].free.extend(peer_free);
        tally.checked += 1;
        tally.checked_bytes += bytes as u64;
        c.checked[i] += 1;
        Ok(())
    }

    /// Polls both CQs of `c`; `flushing`: a flush completion is expected, not a failure.
    fn poll(&mut self, c: &mut Conn, flushing: bool) -> usize {
        let mut n = 0;
        let mut bad = Vec::new();
        for i in 0..2 {
            let wcs = self.nodes[i].guest.poll_cq(&c.ends[i].cq, 256);
            self.tally.cqes[i] += wcs.len() as u64;
            for w in wcs {
                let e = &mut c.ends[i];
                let Some(side) = e.outstanding.remove(&w.wr_id) else {
                    panic!(
                        "{:?} qp {}: completion of wr_id {} that is not outstanding (twice, \
                         or never posted): {w:?}",
                        c.qp_type, e.qp.qpn, w.wr_id
                    );
                };
                let is_send = matches!(side, Side::Send(_));
                if is_send {
                    e.sends -= 1;
                } else {
                    e.recvs -= 1;
                }
                let qpn = e.qp.qpn;
                let flushed = w.status == WcStatus::WrFlushErr as u32;
                if c.qp_type == QpType::Rc && is_send && w.status == WcStatus::RetryExcErr as u32 {
                    self.tally.retry_exc.push(Instant::now());
                    c.broken = true;
                    n += 1;
                    continue;
                }
                if w.status == WcStatus::Success as u32 {
                    if let Err(why) = self.check(c, i, &w, side) {
                        bad.push(format!("node {i} qp {qpn}: {why}"));
                    }
                } else if !((flushing || c.broken) && flushed) {
                    bad.push(format!(
                        "node {i} qp {qpn} {side:?} wr_id {}: status {} opcode {} len {}",
                        w.wr_id, w.status, w.opcode, w.byte_len
                    ));
                }
                self.tally.flushed += flushed as u64;
                n += 1;
            }
        }
        if !bad.is_empty() {
            let counters: Vec<String> = (0..2)
                .map(|i| self.nodes[i].daemon.counters().unwrap_or_default())
                .collect();
            panic!(
                "{:?} connection: unexpected completions:\n{}\ncounters: {counters:#?}",
                c.qp_type,
                bad.join("\n")
            );
        }
        if n > 0 {
            c.last_progress = Instant::now();
        }
        n
    }

    /// Fails if `c` has work outstanding and completed nothing for [`STUCK`].
    fn check_stuck(&self, c: &Conn, what: &str) {
        let sends: usize = c.ends.iter().map(|e| e.sends).sum();
        assert!(
            sends == 0 || c.last_progress.elapsed() < STUCK,
            "{:?} connection (qps {} and {}) stuck {what}: {} sends outstanding on a, {} on b, \
             no completion for {:?}",
            c.qp_type,
            c.ends[0].qp.qpn,
            c.ends[1].qp.qpn,
            c.ends[0].sends,
            c.ends[1].sends,
            STUCK
        );
    }

    /// Drains `c`: its sends complete, both QPs go to ERR, every receive is flushed; then
    /// both QPs and CQs are destroyed. Every work request posted on it has completed once.
    fn retire(&mut self, mut c: Conn) {
        c.last_progress = Instant::now();
        while !c.broken && c.ends.iter().any(|e| e.sends > 0) {
            if self.poll(&mut c, false) == 0 {
                self.check_stuck(&c, "draining its sends");
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for i in 0..2 {
            let a = QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            };
            let qp = &c.ends[i].qp;
            self.nodes[i]
                .guest
                .modify_qp(qp, &a, AttrMask::STATE)
                .expect("modify_qp to ERR");
        }
        let end = Instant::now() + STUCK;
        while c.ends.iter().any(|e| !e.outstanding.is_empty()) {
            if self.poll(&mut c, true) == 0 {
                assert!(
                    Instant::now() < end,
                    "{:?}: {} and {} work requests never completed after ERR: {:?} {:?}",
                    c.qp_type,
                    c.ends[0].outstanding.len(),
                    c.ends[1].outstanding.len(),
                    c.ends[0].outstanding,
                    c.ends[1].outstanding
                );
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for (i, e) in c.ends.into_iter().enumerate() {
            let g = &mut self.nodes[i].guest;
            g.destroy_qp(e.qp).expect("destroy_qp");
            g.destroy_cq(e.cq).expect("destroy_cq");
        }
        self.tally.churns += 1;
    }
}

// ------------------------------------------------------------------------------ measuring

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// The daemon's own memory: RssAnon. VmRSS also counts the guest RAM the daemon has touched
/// through its shared mapping, which grows (up to the guest's RAM) as the guest hands it
/// page lists and rings in pages it has not touched before: the test guest's allocator never
/// reuses the memory of page lists.
fn anon_kib(pid: u32) -> u64 {
    status_kib(pid, "RssAnon")
}

/// QP and CQ churn alone, fast: the daemon's live heap (its counting allocator's bytes) stays
/// flat. Every create reads a page list the daemon has not read before, so VmRSS grows (that
/// is guest RAM); RssAnon moves as the allocator reuses freed pages, and is reported.
#[test]
fn qp_and_cq_churn_keeps_the_daemons_heap_flat() {
    let (a, _) = loopback_pair(4791);
    let mut n = Node::start(bin(), a, &[]).expect("node");
    let pd = n.guest.alloc_pd().expect("alloc_pd");
    let pid = n.daemon.pid();
    let heap = |n: &Node| {
        let j = n.daemon.counters().expect("counters");
        json_u64(&j, "heap", "live_bytes").unwrap_or_else(|| panic!("heap: {j}"))
    };
    let mut at = Vec::new();
    for i in 0..=3000 {
        let cq = n.guest.create_cq(127).expect("create_cq");
        let qp = n
            .guest
            .create_qp(QpType::Rc, pd, &cq, &cq, None, CAP)
            .expect("create_qp");
        n.guest.destroy_qp(qp).expect("destroy_qp");
        n.guest.destroy_cq(cq).expect("destroy_cq");
        if i % 500 == 0 {
            at.push((heap(&n), anon_kib(pid), status_kib(pid, "VmRSS")));
        }
    }
    // From the 500th cycle to the 3000th: 2500 cycles, between which nothing is left that
    // the guest holds; one byte kept per cycle would be 2 500. The counters' own numbers
    // grow a digit now and then.
    let grew = at[at.len() - 1].0 as i64 - at[1].0 as i64;
    assert!(
        grew <= 64,
        "the live heap grew {grew} bytes over 2500 QP+CQ create/destroy cycles: {at:?} (live \
         heap bytes, RssAnon KiB, VmRSS KiB)"
    );
    eprintln!("churn: live heap, RssAnon KiB, VmRSS KiB every 500 cycles: {at:?}");
}

/// The data path allocates nothing per packet and less than once per work request (a scatter
/// list of one or two SGEs is kept in place): RC SENDs of 16 packets each, in steady state
/// (queues grown by a first round), cost each daemon fewer than one allocation per two WRs.
/// A ring visit that copied the ring's page list cost one per packet received, a WQE's SGEs
/// on the heap one per WR on each side.
#[test]
fn the_data_path_allocates_per_work_request_not_per_packet() {
    const LEN: usize = 16 * 1024;
    const DEPTH: usize = 16;
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).expect("node a");
    let mut b = Node::start(bin(), ba, &[]).expect("node b");
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).expect("connect");
    let sbuf = a.guest.reg_mr(ea.pd, LEN, Access::LOCAL_WRITE).unwrap();
    let rbuf = b
        .guest
        .reg_mr(eb.pd, LEN * DEPTH, Access::LOCAL_WRITE)
        .unwrap();
    let round = |a: &mut Node, b: &mut Node| {
        for i in 0..DEPTH {
            let wr = RecvWr {
                wr_id: i as u64,
                sg_list: vec![rbuf.sge(i * LEN, LEN as u32)].into(),
            };
            b.guest.post_recv(&eb.qp, &wr).unwrap();
        }
        for i in 0..DEPTH {
            let wr = SendWr::new(i as u64, SendOp::Send, vec![sbuf.sge(0, LEN as u32)]);
            a.guest.post_send(&ea.qp, &wr).unwrap();
        }
        let wa = a.guest.wait_cq(&ea.cq, DEPTH, Duration::from_secs(10));
        let wb = b.guest.wait_cq(&eb.cq, DEPTH, Duration::from_secs(10));
        assert_eq!(
            (wa.len(), wb.len()),
            (DEPTH, DEPTH),
            "completions of one round"
        );
        assert!(wa.iter().chain(&wb).all(|w| w.status == 0), "{wa:?} {wb:?}");
    };
    let count = |n: &Node| {
        let j = n.daemon.counters().expect("counters");
        let get = |s: &str, k: &str| json_u64(&j, s, k).unwrap_or_else(|| panic!("{s}.{k}: {j}"));
        (
            get("heap", "allocations"),
            get("transport", "tx_packets") + get("transport", "rx_packets"),
        )
    };
    round(&mut a, &mut b);
    let (a0, b0) = (count(&a), count(&b));
    let rounds = 20;
    for _ in 0..rounds {
        round(&mut a, &mut b);
    }
    let (a1, b1) = (count(&a), count(&b));
    let wrs = (rounds * DEPTH) as u64;
    for (name, (al0, p0), (al1, p1)) in [("a", a0, a1), ("b", b0, b1)] {
        let (allocs, packets) = (al1 - al0, p1 - p0);
        eprintln!("daemon {name}: {allocs} allocations for {wrs} WRs and {packets} packets");
        assert!(
            packets >= wrs * 16,
            "daemon {name}: only {packets} packets for {wrs} WRs"
        );
        assert!(
            allocs * 2 < wrs,
            "daemon {name}: {allocs} allocations for {wrs} WRs ({packets} packets): the data \
             path allocates per work request or per packet"
        );
    }
}

/// Least-squares slope of `(t, y)` in y per unit of t.
fn slope(pts: &[(f64, f64)]) -> f64 {
    let n = pts.len() as f64;
    let (mt, my) = pts
        .iter()
        .fold((0.0, 0.0), |(a, b), (t, y)| (a + t / n, b + y / n));
    let (sxy, sxx) = pts.iter().fold((0.0, 0.0), |(a, b), (t, y)| {
        (a + (t - mt) * (y - my), b + (t - mt) * (t - mt))
    });
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

#[test]
fn slope_fits_a_line() {
    let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 7.0)).collect();
    assert!((slope(&pts) - 3.0).abs() < 1e-9);
    assert_eq!(slope(&[(1.0, 5.0), (1.0, 9.0)]), 0.0);
}

#[test]
fn the_relay_reseals_what_the_daemon_checks() {
    use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};
    let mut buf = vec![0u8; 64];
    let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, 7, true);
    let (n, pr) = emit(&mut buf, &bth, &ExtRepr::default(), 4).unwrap();
    buf[pr].copy_from_slice(b"ping");
    let src: SocketAddr = "127.0.0.3:4791".parse().unwrap();
    let dst: SocketAddr = "127.0.0.2:4791".parse().unwrap();
    assert!(reseal(src, dst, &mut buf[..n]));
    let sealed = buf[..n].to_vec();
    // Sealed for one path, not for another.
    assert!(reseal(src, dst, &mut buf[..n]));
    assert_eq!(buf[..n], sealed[..], "deterministic");
    let other: SocketAddr = "127.0.0.4:4791".parse().unwrap();
    assert!(reseal(other, dst, &mut buf[..n]));
    assert_ne!(buf[..n], sealed[..], "the ICRC covers the source address");
}

#[derive(Clone, Copy)]
struct Sample {
    t: f64,
    /// RssAnon, the daemon's own memory (see [`anon_kib`]).
    rss: [u64; 2],
    vm_rss: [u64; 2],
    fds: [usize; 2],
    /// Live heap bytes (the daemon's counting allocator).
    heap: [u64; 2],
}

#[test]
#[ignore = "minutes long: tests/run.sh runs it; VUR_SOAK_SECS sets the duration (default 120)"]
fn mixed_traffic_with_loss_and_qp_churn_stays_flat() {
    let secs: u64 = std::env::var("VUR_SOAK_SECS")
        .ok()
        .map(|s| s.parse().expect("VUR_SOAK_SECS: seconds"))
        .unwrap_or(120);
    let duration = Duration::from_secs(secs);
    let warmup = Duration::from_secs((secs / 4).clamp(5, 60));
    let churn_every = Duration::from_millis(700);
    let sample_every = Duration::from_secs(1);

    // a at .1, b at .2; the relay's faces: .3 stands for a (towards b), .4 for b (towards a).
    let (aa, ba) = loopback_pair(4791);
    let IpAddr::V4(ip) = aa.ip() else {
        unreachable!()
    };
    let o = ip.octets();
    let face = |last| SocketAddr::new(Ipv4Addr::new(o[0], o[1], o[2], last).into(), aa.port());
    let (face_a, face_b) = (face(3), face(4));
    let mut relay = Relay::start(aa, ba, face_a, face_b);
    let mut nodes = [
        Node::start(bin(), aa, &[]).expect("node a"),
        Node::start(bin(), ba, &[]).expect("node b"),
    ];
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let res = [0, 1].map(|i| {
        let g = &mut nodes[i].guest;
        let pd = g.alloc_pd().expect("alloc_pd");
        let mr = g.reg_mr(pd, Layout::MR_LEN, all).expect("reg_mr");
        NodeRes { pd, mr }
    });
    let mut s = Soak {
        nodes,
        res,
        peer_gid: [Gid::from_ip(face_b.ip()), Gid::from_ip(face_a.ip())],
        next_wr: 0,
        tally: Tally::default(),
    };
    // The page lists the device keeps with no connection: what it must come back to.
    let counters = |s: &Soak, i: usize| s.nodes[i].daemon.counters().expect("counters");
    let base_lists: Vec<u64> = (0..2)
        .map(|i| json_u64(&counters(&s, i), "device", "page_list_bytes").expect("page_list_bytes"))
        .collect();
    let kinds = [QpType::Rc, QpType::Uc, QpType::Ud];
    let mut conns: Vec<Conn> = kinds.iter().map(|&t| s.connect(t)).collect();
    let pids = [s.nodes[0].daemon.pid(), s.nodes[1].daemon.pid()];
    // The UDP sockets on the path (the daemons' and the relay's): their overflow drops are cuts.
    let path = [aa, ba, face_a, face_b];
    let (mut path_drops, path_sockets) = socket_drops(&path);
    eprintln!(
        "soak: {secs} s (warm-up {} s), daemons {pids:?}, relay {face_a} / {face_b}, {path_sockets} \
         sockets on the path in /proc/net/udp",
        warmup.as_secs()
    );

    let t0 = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = t0;
    let mut next_churn = t0 + churn_every;
    let mut next_report = t0 + Duration::from_secs(30);
    let mut churn = 0usize;
    while t0.elapsed() < duration {
        let mut moved = 0;
        for c in conns.iter_mut() {
            s.top_up(c);
            moved += s.poll(c, false);
            s.check_stuck(c, "under traffic");
        }
        if moved == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        let now = Instant::now();
        if let Some(k) = conns.iter().position(|c| c.broken) {
            let t = conns[k].qp_type;
            let old = std::mem::replace(&mut conns[k], s.connect(t));
            s.retire(old);
        }
        if now >= next_churn {
            // The next connection in turn is drained, destroyed and made anew.
            let k = churn % conns.len();
            let t = conns[k].qp_type;
            let old = std::mem::replace(&mut conns[k], s.connect(t));
            s.retire(old);
            churn += 1;
            next_churn = Instant::now() + churn_every;
        }
        if now >= next_sample {
            let (drops, _) = socket_drops(&path);
            if drops > path_drops {
                relay.cuts.add(
                    now,
                    format!(
                        "the sockets on the path dropped {} datagrams (overflow)",
                        drops - path_drops
                    ),
                );
                path_drops = drops;
            }
            samples.push(Sample {
                t: t0.elapsed().as_secs_f64(),
                rss: pids.map(anon_kib),
                vm_rss: pids.map(|p| status_kib(p, "VmRSS")),
                // Less the sockets for the QPs' source ports: they come and go with the QPs.
                fds: [0, 1].map(|i| {
                    let n = s.nodes[i].daemon.fd_count().expect("fd count");
                    let j = counters(&s, i);
                    n - json_u64(&j, "transport", "tx_sport_open").unwrap_or(0) as usize
                }),
                heap: [0, 1].map(|i| {
                    let j = counters(&s, i);
                    json_u64(&j, "heap", "live_bytes").unwrap_or_else(|| panic!("heap: {j}"))
                }),
            });
            next_sample += sample_every;
        }
        if now >= next_report {
            let l = samples.last().expect("sampled");
            eprintln!(
                "soak: {:>5.0} s, {} WRs posted, {} churns, RssAnon {:?} KiB, VmRSS {:?} KiB, \
                 fds {:?}",
                l.t, s.tally.posted, s.tally.churns, l.rss, l.vm_rss, l.fds
            );
            next_report += Duration::from_secs(30);
        }
    }
    // Every connection drained and retired once more: nothing may be left outstanding.
    for c in conns.drain(..) {
        s.retire(c);
    }
    let elapsed = t0.elapsed();
    relay.stop();

    let report = flat_after_warmup(&samples, warmup);
    let (ab, ba) = counters_agree(&s, &relay, &base_lists);
    recovered(&s, &relay, (ab, ba), t0, kinds.len());
    eprintln!(
        "soak: {:.0} s, {} work requests ({} flushed at churn), {} with their data checked \
         ({} bytes), {} QP pairs re-created, {} RC retry exhaustions, {} \
         cuts of the path; relay a→b [received, forwarded, dropped, duplicated, reordered] \
         {ab:?}, b→a {ba:?}",
        elapsed.as_secs_f64(),
        s.tally.posted,
        s.tally.flushed,
        s.tally.checked,
        s.tally.checked_bytes,
        s.tally.churns,
        s.tally.retry_exc.len(),
        relay.cuts.len(),
    );
    for r in report {
        eprintln!("soak: {r}");
    }
}

/// Flat RSS, live heap and fds after the warm-up; returns a line per daemon for the report.
fn flat_after_warmup(samples: &[Sample], warmup: Duration) -> Vec<String> {
    let after: Vec<&Sample> = samples
        .iter()
        .filter(|x| x.t >= warmup.as_secs_f64())
        .collect();
    assert!(
        after.len() >= 5,
        "{} samples after the warm-up: too short a run",
        after.len()
    );
    let mut report = Vec::new();
    for i in 0..2 {
        let rss: Vec<(f64, f64)> = after
            .iter()
            .map(|x| (x.t / 60.0, x.rss[i] as f64))
            .collect();
        let fds: Vec<(f64, f64)> = after
            .iter()
            .map(|x| (x.t / 60.0, x.fds[i] as f64))
            .collect();
        let (rs, fs) = (slope(&rss), slope(&fds));
        let (r0, r1) = (after[0].rss[i], after[after.len() - 1].rss[i]);
        let (f0, f1) = (after[0].fds[i], after[after.len() - 1].fds[i]);
        let vm: Vec<(f64, f64)> = after
            .iter()
            .map(|x| (x.t / 60.0, x.vm_rss[i] as f64))
            .collect();
        let (v0, v1) = (after[0].vm_rss[i], after[after.len() - 1].vm_rss[i]);
        let heap: Vec<(f64, f64)> = after
            .iter()
            .map(|x| (x.t / 60.0, x.heap[i] as f64))
            .collect();
        let hs = slope(&heap);
        let (h0, h1) = (after[0].heap[i], after[after.len() - 1].heap[i]);
        report.push(format!(
            "daemon {}: live heap {h0} → {h1} bytes, slope {hs:+.0} bytes/min; RssAnon {r0} → \
             {r1} KiB, slope {rs:+.1} KiB/min; VmRSS {v0} → {v1} KiB, slope {:+.1} KiB/min \
             (guest RAM touched included); fds {f0} → {f1}, slope {fs:+.2}/min",
            ["a", "b"][i],
            slope(&vm)
        ));
        // RssAnon moves in pages: over a short window one page more is a steep slope.
        let window = (after[after.len() - 1].t - after[0].t) / 60.0;
        let allowed = (RSS_SLOPE_KIB_PER_MIN * window).max(RSS_PAGES_KIB);
        assert!(
            rs * window <= allowed,
            "daemon {i} RssAnon grows {rs:.1} KiB/min over {window:.1} min: {:.0} KiB, more than \
             {allowed:.0} KiB ({RSS_SLOPE_KIB_PER_MIN} KiB/min, at least {RSS_PAGES_KIB} KiB): \
             {rss:?}",
            rs * window
        );
        let allowed = (HEAP_SLOPE_BYTES_PER_MIN * window).max(HEAP_BYTES);
        assert!(
            hs * window <= allowed,
            "daemon {i} live heap grows {hs:.0} bytes/min over {window:.1} min: {:.0} bytes, \
             more than {allowed:.0} ({HEAP_SLOPE_BYTES_PER_MIN} bytes/min, at least \
             {HEAP_BYTES}): {heap:?}",
            hs * window
        );
        assert!(
            fs <= FD_SLOPE_PER_MIN,
            "daemon {i} fd count grows {fs:.2}/min (bound {FD_SLOPE_PER_MIN}): {fds:?}"
        );
    }
    report
}

/// Counters agree with what the guests saw; returns the relay's counts a→b and b→a
/// ([received, forwarded, dropped, duplicated, reordered]).
fn counters_agree(s: &Soak, relay: &Relay, base_lists: &[u64]) -> ([u64; 5], [u64; 5]) {
    let counters = |s: &Soak, i: usize| s.nodes[i].daemon.counters().expect("counters");
    let dirs = &relay.dirs;
    let get = |d: &Dir| {
        [
            d.received.load(Ordering::Relaxed),
            d.forwarded.load(Ordering::Relaxed),
            d.dropped.load(Ordering::Relaxed),
            d.duplicated.load(Ordering::Relaxed),
            d.reordered.load(Ordering::Relaxed),
        ]
    };
    let (ab, ba) = (get(&dirs[0]), get(&dirs[1]));
    for (i, &base) in base_lists.iter().enumerate() {
        let j = counters(s, i);
        let d = |k: &str| json_u64(&j, "device", k).unwrap_or_else(|| panic!("device.{k}: {j}"));
        let t =
            |k: &str| json_u64(&j, "transport", k).unwrap_or_else(|| panic!("transport.{k}: {j}"));
        assert_eq!(
            d("cqes"),
            s.tally.cqes[i],
            "node {i}: CQEs written = completions polled ({j})"
        );
        for k in ["ring_faults", "cq_overflows", "bad_wqes", "ctrl_errors"] {
            assert_eq!(d(k), 0, "node {i}: {k} ({j})");
        }
        assert_eq!(t("rx_icrc_bad"), 0, "node {i}: the relay re-seals ({j})");
        let (sent_to_relay, from_relay) = if i == 0 { (ab, ba) } else { (ba, ab) };
        assert!(
            sent_to_relay[0] <= t("tx_packets"),
            "node {i}: the relay got {} of {} sent ({j})",
            sent_to_relay[0],
            t("tx_packets")
        );
        assert!(
            t("rx_packets") <= from_relay[1],
            "node {i}: received {} of {} forwarded ({j})",
            t("rx_packets"),
            from_relay[1]
        );
        assert_eq!(
            (
                json_u64(&j, "objects", "qps"),
                json_u64(&j, "objects", "cqs")
            ),
            (Some(0), Some(0)),
            "node {i}: every QP and CQ destroyed ({j})"
        );
        assert_eq!(
            d("page_list_bytes"),
            base,
            "node {i}: page lists back at their value before the first connection ({j})"
        );
    }
    (ab, ba)
}

/// The loss was real (`ab`, `ba`: the relay's counts), and the transports recovered from it:
/// connections churned, data checked, a retry exhaustion only where the path was cut.
fn recovered(s: &Soak, relay: &Relay, (ab, ba): ([u64; 5], [u64; 5]), t0: Instant, kinds: usize) {
    assert!(
        ab[2] > 0 && ba[2] > 0,
        "the relay dropped nothing: {ab:?} {ba:?}"
    );
    assert!(s.tally.churns as usize >= kinds, "no churn");
    // Every byte was checked: receives, WRITE targets and READ sinks of every transport.
    assert!(
        s.tally.checked * 4 >= s.tally.posted,
        "only {} of {} work requests had their data checked",
        s.tally.checked,
        s.tally.posted
    );
    // A retry exhaustion only where the path was really cut.
    let unexplained: Vec<f64> = s
        .tally
        .retry_exc
        .iter()
        .filter(|&&t| relay.cuts.before(t).is_empty())
        .map(|t| t.duration_since(t0).as_secs_f64())
        .collect();
    assert!(
        unexplained.is_empty(),
        "{} RC connections ended with RETRY_EXC_ERR (at {unexplained:.1?} s) with no cut of \
         the path in the {CUT_WINDOW:?} before: the relay's random loss never exhausts \
         retry_cnt; cuts in the run: {:?}",
        unexplained.len(),
        relay
            .cuts
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(at, w)| format!("{:.1} s: {w}", at.duration_since(t0).as_secs_f64()))
            .collect::<Vec<_>>()
    );
}
