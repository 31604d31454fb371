//! A deterministic two-node simulator: two [`Device`]s with their own memory, joined by a link
//! that can lose, duplicate, reorder, delay and corrupt packets, driven by a fake clock.
//!
//! A corrupted packet is caught the way the daemon's UDP transport catches it: the sending side
//! fills the ICRC as the transport does ([`frame::icrc_for_udp_socket`]), and the receiving side
//! checks it before the packet reaches the device, dropping it on a mismatch.
//!
//! Tests say "drop every third packet, then expect exactly-once delivery" instead of sleeping;
//! the benchmarks and the pcap oracle drive the same thing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use std::net::SocketAddr;

use crate::device::*;
use crate::mem::{Backing, VecMemory};
use crate::types::{Gid, Instant, Qpn};
use crate::verbs::*;
use crate::wire::frame;

/// Faults and timing of one direction of the link. Probabilities are in parts per million.
#[derive(Clone, Debug, Default)]
pub struct LinkConfig {
    pub loss_ppm: u32,
    pub dup_ppm: u32,
    /// Probability that a packet is held back by `reorder_delay_ns` (so later ones overtake it).
    pub reorder_ppm: u32,
    pub reorder_delay_ns: u64,
    pub delay_ns: u64,
    /// Drop every n-th packet (deterministic loss; 0 = off).
    pub drop_every: u32,
    /// Largest RoCE packet (BTH..ICRC) the link carries; bigger ones are dropped. 0 = no limit.
    pub mtu: usize,
    /// Probability that one bit of a packet is flipped on the way. The ICRC catches it at the
    /// receiver (see the module documentation); the flip never lands in the BTH byte the ICRC
    /// masks (FECN, BECN, resv6a), so every corrupted packet must be dropped.
    pub corrupt_ppm: u32,
}

/// The RoCEv2 UDP destination port.
const ROCE_PORT: u16 = 4791;
/// BTH byte 4 (FECN, BECN, resv6a) is replaced by ones in the ICRC computation.
const ICRC_MASKED_BYTE: usize = 4;

pub use crate::types::Rng;

/// One simulated host: a device and the memory its MRs point into.
pub struct Node {
    pub dev: Device,
    pub mem: VecMemory,
    pub gid: Gid,
    /// Next free byte of `mem` for [`Sim::alloc`].
    brk: u64,
}

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    meta: RecvMeta,
    /// The link may corrupt: the ICRC was filled at the sender and is checked on delivery.
    check_icrc: bool,
    bytes: Vec<u8>,
}

/// The UDP endpoints a transport would use for a packet: the GIDs' addresses, the engine's
/// source port, the RoCEv2 port.
fn udp_ends(meta: &RecvMeta) -> (SocketAddr, SocketAddr) {
    (
        SocketAddr::new(meta.src.to_ip(), meta.sport),
        SocketAddr::new(meta.dst.to_ip(), ROCE_PORT),
    )
}

fn fill_icrc(meta: &RecvMeta, roce: &mut [u8]) -> Result<(), crate::wire::WireError> {
    let (s, d) = udp_ends(meta);
    frame::icrc_for_udp_socket(s, d, roce)
}

/// Whether the ICRC of `roce` is the one its sender would have filled.
fn icrc_ok(meta: &RecvMeta, roce: &[u8]) -> bool {
    let mut want = roce.to_vec();
    fill_icrc(meta, &mut want).is_ok() && want == roce
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<core::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> core::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Link statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkStats {
    pub sent: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Packets with a bit flipped on the link (a corrupted packet that is also duplicated
    /// counts twice).
    pub corrupted: u64,
    /// Packets the receiving side dropped because their ICRC did not match.
    pub icrc_dropped: u64,
    /// Packets handed to the receiving device (duplicates count twice; ICRC drops not at all).
    pub delivered: u64,
}

/// A packet handed to a device's `handle_packet`, for tests that need to know what arrived.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub at: Instant,
    /// The receiving node.
    pub to: usize,
    /// BTH..ICRC, as the device got it.
    pub bytes: Vec<u8>,
}

/// A packet as it crossed the link, for traces and pcap.
#[derive(Clone, Debug)]
pub struct Traced {
    pub at: Instant,
    pub from: usize,
    pub tx: Transmit,
    pub bytes: Vec<u8>,
}

pub struct Sim {
    pub now: Instant,
    pub nodes: [Node; 2],
    pub link: [LinkConfig; 2],
    pub stats: [LinkStats; 2],
    pub rng: Rng,
    /// When set, every packet sent is recorded here.
    pub trace: Option<Vec<Traced>>,
    /// When set, every packet handed to a device is recorded here, in the order of delivery:
    /// what survived loss and the ICRC check, with duplicates.
    pub arrivals: Option<Vec<Arrival>>,
    /// 0: a wire. Otherwise the two devices reach each other in memory, as two devices of
    /// one process do: RC packets leave in segments built into a buffer of this many bytes
    /// ([`Device::poll_transmit_segments`]) and arrive through
    /// [`Device::handle_packet_in_memory`].
    pub segment_buf: usize,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    counts: [u32; 2],
    buf: Vec<u8>,
}

/// Memory each node gets, and where it starts (a non-zero base catches address mix-ups).
pub const MEM_SIZE: usize = 64 << 20;
pub const MEM_BASE: u64 = 0x1_0000_0000;

impl Sim {
    pub fn new(seed: u64) -> Self {
        Self::with_config(seed, DeviceConfig::default())
    }

    pub fn with_config(seed: u64, cfg: DeviceConfig) -> Self {
        let mk = |i: u8| {
            let mut dev = Device::new(DeviceConfig {
                mac: [2, 0, 0, 0, 0, i + 1],
                seed: cfg.seed.map(|s| s ^ i as u64),
                ..cfg.clone()
            });
            let gid = Gid::from_ipv4([10, 0, 0, i + 1]);
            dev.add_gid(0, gid).expect("gid slot 0");
            Node {
                dev,
                mem: VecMemory::new(MEM_BASE, MEM_SIZE),
                gid,
                brk: MEM_BASE,
            }
        };
        Sim {
            now: Instant(1_000_000),
            nodes: [mk(0), mk(1)],
            link: [LinkConfig::default(), LinkConfig::default()],
            stats: [LinkStats::default(); 2],
            rng: Rng::new(seed),
            trace: None,
            arrivals: None,
            segment_buf: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            counts: [0; 2],
            buf: vec![0; 8192],
        }
    }

    /// Allocates `len` bytes of node memory (8-byte aligned); returns the address.
    pub fn alloc(&mut self, node: usize, len: usize) -> u64 {
        let n = &mut self.nodes[node];
        let a = n.brk;
        n.brk = (n.brk + len as u64 + 7) & !7;
        assert!(
            n.brk <= MEM_BASE + MEM_SIZE as u64,
            "simulated memory exhausted"
        );
        a
    }

    /// Allocates and registers a buffer; returns (address, key).
    pub fn reg(&mut self, node: usize, pd: u32, len: usize, access: Access) -> (u64, u32) {
        let addr = self.alloc(node, len);
        let key = self.nodes[node]
            .dev
            .reg_mr(
                pd,
                addr,
                len as u64,
                access,
                Backing::Contiguous { base: addr },
            )
            .expect("reg_mr");
        (addr, key)
    }

    /// Sends everything both devices have ready, then delivers what is due; advances the clock
    /// to the next event when nothing is due now. Returns false when the system is idle.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        let seg = self.segment_buf;
        if self.buf.len() < seg {
            self.buf.resize(seg, 0);
        }
        for from in 0..2 {
            loop {
                let n = &mut self.nodes[from];
                let tx = if seg > 0 {
                    let buf = &mut self.buf[..seg];
                    n.dev
                        .poll_transmit_segments(self.now, &mut n.mem, buf, &|_| true)
                } else {
                    n.dev.poll_transmit(self.now, &mut n.mem, &mut self.buf)
                };
                let Some(tx) = tx else {
                    break;
                };
                moved = true;
                let bytes = self.buf[..tx.len].to_vec();
                self.send(from, tx, bytes);
            }
        }
        while let Some(Reverse(p)) = self.queue.peek() {
            if p.at > self.now {
                break;
            }
            let Reverse(p) = self.queue.pop().expect("peeked");
            moved = true;
            if p.check_icrc && !icrc_ok(&p.meta, &p.bytes) {
                self.stats[1 - p.to].icrc_dropped += 1;
                continue;
            }
            if let Some(a) = self.arrivals.as_mut() {
                a.push(Arrival {
                    at: self.now,
                    to: p.to,
                    bytes: p.bytes.clone(),
                });
            }
            let n = &mut self.nodes[p.to];
            let _ = if seg > 0 {
                n.dev
                    .handle_packet_in_memory(self.now, &p.meta, &p.bytes, &mut n.mem)
            } else {
                n.dev.handle_packet(self.now, &p.meta, &p.bytes, &mut n.mem)
            };
            self.stats[1 - p.to].delivered += 1;
        }
        if moved {
            return true;
        }
        // A page fault is answered (by the test's pager) before time moves on, as a driver
        // answers one long before any RoCE timer fires.
        if self.nodes.iter().any(|n| n.dev.page_faults_pending()) {
            return false;
        }
        // Idle now: jump to the next delivery or timer.
        let next_pkt = self.queue.peek().map(|Reverse(p)| p.at);
        let next_timer = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.dev.poll_timeout())
            .min();
        match (next_pkt, next_timer) {
            (None, None) => false,
            (a, b) => {
                let t = a.into_iter().chain(b).min().expect("one is some");
                if t > self.now {
                    self.now = t;
                }
                for n in &mut self.nodes {
                    n.dev.handle_timeout(self.now);
                }
                true
            }
        }
    }

    fn send(&mut self, from: usize, tx: Transmit, mut bytes: Vec<u8>) {
        let to = 1 - from;
        let cfg = &self.link[from];
        self.stats[from].sent += 1;
        self.counts[from] += 1;
        if let Some(t) = self.trace.as_mut() {
            t.push(Traced {
                at: self.now,
                from,
                tx,
                bytes: bytes.clone(),
            });
        }
        let lost = (cfg.drop_every > 0 && self.counts[from].is_multiple_of(cfg.drop_every))
            || self.rng.ppm(cfg.loss_ppm)
            || (cfg.mtu > 0 && bytes.len() > cfg.mtu);
        if lost {
            self.stats[from].lost += 1;
            return;
        }
        let meta = RecvMeta::from(&tx);
        let mut at = self.now.plus_ns(cfg.delay_ns);
        if self.rng.ppm(cfg.reorder_ppm) {
            at = at.plus_ns(cfg.reorder_delay_ns.max(1));
            self.stats[from].reordered += 1;
        }
        // Only a link that corrupts pays for the ICRC: fill it as the transport would, flip a
        // bit, and have the receiving side check it.
        let check_icrc = cfg.corrupt_ppm > 0;
        let mut flipped = false;
        if check_icrc {
            let _ = fill_icrc(&meta, &mut bytes);
            if self.rng.ppm(cfg.corrupt_ppm) && bytes.len() > ICRC_MASKED_BYTE + 1 {
                let mut i = self.rng.below(bytes.len() as u64 - 1) as usize;
                if i >= ICRC_MASKED_BYTE {
                    i += 1;
                }
                bytes[i] ^= 1 << self.rng.below(8);
                flipped = true;
            }
        }
        let copies = if self.rng.ppm(cfg.dup_ppm) {
            self.stats[from].duplicated += 1;
            2
        } else {
            1
        };
        if flipped {
            self.stats[from].corrupted += copies;
        }
        for i in 0..copies {
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at: at.plus_ns(i),
                seq: self.seq,
                to,
                meta,
                check_icrc,
                bytes: bytes.clone(),
            }));
        }
    }

    /// Steps until `done` holds or the system is idle; panics after `max_steps` (a livelock).
    pub fn run_until(&mut self, max_steps: usize, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        panic!("simulation did not settle in {max_steps} steps");
    }

    /// Runs until nothing is in flight and no timer is armed.
    pub fn settle(&mut self, max_steps: usize) {
        self.run_until(max_steps, |_| false);
    }

    pub fn dev(&mut self, node: usize) -> &mut Device {
        &mut self.nodes[node].dev
    }

    /// Drains a CQ.
    pub fn poll_all(&mut self, node: usize, cqn: u32) -> Vec<Cqe> {
        std::iter::from_fn(|| self.nodes[node].dev.poll_cq(cqn)).collect()
    }

    /// Takes up to `max` packets node `from` has ready, past the link: for tests that move,
    /// hold back or lose packets one by one. Each comes with what its transport would see.
    pub fn take(&mut self, from: usize, max: usize) -> Vec<(Transmit, Vec<u8>)> {
        let mut out = Vec::new();
        while out.len() < max {
            let n = &mut self.nodes[from];
            let Some(tx) = n.dev.poll_transmit(self.now, &mut n.mem, &mut self.buf) else {
                break;
            };
            out.push((tx, self.buf[..tx.len].to_vec()));
        }
        out
    }

    /// Hands `bytes` (BTH through ICRC slot) to node `to` as if the other node had sent them
    /// now; the engine's verdict comes back.
    pub fn inject(&mut self, to: usize, bytes: &[u8]) -> Result<(), Drop> {
        let meta = RecvMeta {
            src: self.nodes[1 - to].gid,
            dst: self.nodes[to].gid,
            sport: 0xc000,
            hop_limit: 64,
            ..Default::default()
        };
        let n = &mut self.nodes[to];
        n.dev.handle_packet(self.now, &meta, bytes, &mut n.mem)
    }
}

/// What [`Sim::connect`] sets up on each side.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint {
    pub pd: u32,
    pub cq: u32,
    pub qpn: Qpn,
}

/// Options for a connected pair.
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub sq_psn: [u32; 2],
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub cap: QpCap,
    pub cqe: u32,
    pub access: Access,
    pub srq: bool,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            qp_type: QpType::Rc,
            mtu: Mtu::M1024,
            sq_psn: [0x100, 0x200],
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            cap: QpCap {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
            cqe: 4096,
            access: Access::LOCAL_WRITE.union(Access::REMOTE),
            srq: false,
        }
    }
}

impl Sim {
    /// Creates a PD, a CQ and a QP on each node and connects the QPs (RC or UC) through
    /// INIT → RTR → RTS, the way `ibv_rc_pingpong` does.
    pub fn connect(&mut self, o: ConnOpts) -> [Endpoint; 2] {
        let mut ep = [Endpoint {
            pd: 0,
            cq: 0,
            qpn: Qpn(0),
        }; 2];
        for (i, e) in ep.iter_mut().enumerate() {
            let d = self.dev(i);
            let pd = d.alloc_pd().expect("pd");
            let cq = d.create_cq(o.cqe).expect("cq");
            let srq = o.srq.then(|| d.create_srq(pd, 1024, 4, 0).expect("srq"));
            let qpn = d
                .create_qp(QpInit {
                    qp_type: o.qp_type,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    srq,
                    xrcd: None,
                    cap: o.cap,
                    sq_sig_all: false,
                })
                .expect("qp");
            *e = Endpoint { pd, cq, qpn };
        }
        self.bring_up(&ep, &o);
        ep
    }

    /// INIT → RTR → RTS for both QPs of a pair (in RESET), each aimed at the other: what
    /// [`Sim::connect`] does after creating them, and what a test that reset a pair repeats.
    pub fn bring_up(&mut self, ep: &[Endpoint; 2], o: &ConnOpts) {
        let gids = [self.nodes[0].gid, self.nodes[1].gid];
        let (a, b) = self.nodes.split_at_mut(1);
        bring_up_pair(
            [&mut a[0].dev, &mut b[0].dev],
            [ep[0].qpn, ep[1].qpn],
            gids,
            o,
        );
    }
}

/// INIT → RTR → RTS for QP `qpns[i]` of device `devs[i]` (its shard), each aimed at the
/// other QP at the other device's GID `gids[1 - i]` (GID index 0 on both sides).
pub fn bring_up_pair(devs: [&mut Device; 2], qpns: [Qpn; 2], gids: [Gid; 2], o: &ConnOpts) {
    for (i, d) in devs.into_iter().enumerate() {
        let peer = qpns[1 - i];
        let dgid = gids[1 - i];
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: o.access,
            ..Default::default()
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        d.modify_qp(qpns[i], &a, AttrMask(m)).expect("init");
        a.qp_state = QpState::Rtr;
        a.path_mtu = o.mtu;
        a.dest_qp_num = peer.0;
        a.rq_psn = o.sq_psn[1 - i];
        a.max_dest_rd_atomic = o.max_rd_atomic;
        a.min_rnr_timer = o.min_rnr_timer;
        a.av = Av {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            ..Default::default()
        };
        let mut m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        if o.qp_type == QpType::Rc {
            m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        d.modify_qp(qpns[i], &a, AttrMask(m)).expect("rtr");
        a.qp_state = QpState::Rts;
        a.sq_psn = o.sq_psn[i];
        a.timeout = o.timeout;
        a.retry_cnt = o.retry_cnt;
        a.rnr_retry = o.rnr_retry;
        a.max_rd_atomic = o.max_rd_atomic;
        let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
        if o.qp_type == QpType::Rc {
            m |= AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        d.modify_qp(qpns[i], &a, AttrMask(m)).expect("rts");
    }
}

/// The byte at `offset` of [`prng_pattern`]`(seed, ..)`.
pub fn prng_byte(seed: u64, offset: u64) -> u8 {
    (splitmix64(seed ^ (offset >> 3)) >> (8 * (offset & 7))) as u8
}

/// `len` bytes of a position-keyed PRNG (splitmix64 of `seed` and the 8-byte block index), the
/// payload every data check of the tests uses: no two segments of a buffer are alike and no
/// two seeds give the same bytes, so a segment placed at the wrong offset, duplicated, swapped
/// or left over from another message shows in a byte check whatever the path MTU.
pub fn prng_pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    prng_fill(seed, &mut v);
    v
}

/// Fills `buf` with [`prng_pattern`]`(seed, buf.len())`.
pub fn prng_fill(seed: u64, buf: &mut [u8]) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = splitmix64(seed ^ i as u64).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod fill_tests {
    use super::*;

    /// The fill is the one vur_interop's perftest payload file was built from (the same bytes
    /// for the same seed), and has no period a segment could hide in.
    #[test]
    fn prng_fill_is_position_keyed_and_aperiodic() {
        let p = prng_pattern(0x5eed_0002, 70000);
        assert!(p
            .iter()
            .enumerate()
            .all(|(i, &b)| b == prng_byte(0x5eed_0002, i as u64)));
        assert_eq!(prng_pattern(7, 13), prng_pattern(7, 20)[..13]);
        for shift in 1..=8192 {
            assert_ne!(p[..4096], p[shift..shift + 4096], "shift {shift}");
        }
        assert_ne!(prng_pattern(1, 64), prng_pattern(2, 64));
    }
}
