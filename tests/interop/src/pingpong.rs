//! Our side of `ibv_rc_pingpong`, `ibv_uc_pingpong` and `ibv_ud_pingpong`: the same QP setup,
//! the same exchange and the same ping-pong loop, so the unmodified tool is the other end —
//! plus a byte check the tools do not make: every buffer that comes back is compared with
//! what must be in it.
//!
//! Every message carries a payload of its own ([`payload`]), and after each check the receive
//! buffer is scrubbed with the complement of the next expectation ([`scrub_of`]): a segment that
//! is dropped, or left over from an earlier message, while the completion still reports success
//! shows in any iteration, not only the first (the retransmissions of the loss cases come later).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant as Wall};

use rxe_core::mem::Backing;
use rxe_core::verbs::*;
use rxe_core::{Gid, QpInit, Qpn};

use crate::oob::{self, Dest};
use crate::peer::{Peer, MEM_BASE};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The Q_Key `ibv_ud_pingpong` uses.
pub const UD_QKEY: u32 = 0x1111_1111;
/// The fill byte the tools put in their buffer before the first exchange.
pub const TOOL_FILL: u8 = 0x7b;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rc,
    Uc,
    Ud,
}

#[derive(Clone, Debug)]
pub struct Opts {
    pub kind: Kind,
    /// `Some(addr)`: we are the client and the tool listens at `addr`; `None`: we listen.
    pub server: Option<SocketAddr>,
    /// Where we listen when we are the server.
    pub listen: SocketAddr,
    pub size: usize,
    pub iters: u32,
    pub mtu: Mtu,
    pub rx_depth: u32,
    pub timeout: Duration,
    /// The other end is the stock tool (its first buffer is all [`TOOL_FILL`], then it echoes
    /// our [`payload`]s); false when it is another `rxe-peer`, which sends the same
    /// [`payload`]s (see [`expected`]).
    pub peer_is_tool: bool,
    /// A file the harness creates, holding the tool's exit code, once the tool has exited.
    /// With it we stay on the wire (re-ACKing retransmissions) until the tool has left, and a
    /// last SEND that fails with RetryExcErr after the tool exited 0 is the defined end of a run
    /// whose final ACK was lost (see docs/interop.md). Without it we linger 300 ms.
    pub tool_done: Option<PathBuf>,
    /// Fail when nothing arrives and nothing completes for this long, saying what we wait for.
    pub stall: Duration,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Every send and every receive completed successfully.
    Complete,
    /// Every receive completed and was verified, every send but the last completed, and the
    /// last SEND ended with RetryExcErr after the tool had exited 0: the tool's ACK of it was
    /// lost and its QP was gone before our retransmission arrived.
    LastSendAfterToolLeft,
}

/// The seed of the payloads (message `n` uses `SEED ^ n << 32`: above every block index of a
/// buffer under 32 GiB, so no two messages' fills alias at any offset).
pub const SEED: u64 = 0x5eed_0001;

/// What our `n`-th SEND carries (`n` from 1), in both roles: bytes of the shared position-keyed
/// PRNG ([`crate::prng_pattern`]), a different fill for every message, so no two segments of a
/// message are alike and no segment of one message equals one of another: a segment placed at
/// the wrong offset, duplicated, swapped, or stale from an earlier message shows.
pub fn payload(n: u32, size: usize) -> Vec<u8> {
    crate::prng_pattern(SEED ^ (u64::from(n) << 32), size)
}

/// What our `n`-th receive (`n` from 1) must hold. Another `rxe-peer` or `vur-pingpong` sends
/// [`payload`]`(n)` as its `n`-th SEND. The tool sends and receives in one buffer, so it echoes
/// what it last received: as server, its `n`-th SEND echoes our `n`-th; as client, its first SEND
/// carries its initial fill (all [`TOOL_FILL`]) and its `n`-th echoes our `(n-1)`-th. Our own
/// sends therefore define what comes back.
pub fn expected(n: u32, size: usize, we_are_client: bool, peer_is_tool: bool) -> Vec<u8> {
    match (peer_is_tool && !we_are_client, n) {
        (true, 1) => vec![TOOL_FILL; size],
        (true, n) => payload(n - 1, size),
        (false, n) => payload(n, size),
    }
}

/// What the receive buffer holds before a receive that must bring `expect`: its complement,
/// so every byte that is never placed differs.
pub fn scrub_of(expect: &[u8]) -> Vec<u8> {
    expect.iter().map(|b| !b).collect()
}

#[derive(Clone, Debug)]
pub struct Report {
    pub iters: u32,
    pub bytes: u64,
    pub secs: f64,
    /// Buffers that came back and were compared byte for byte.
    pub verified: u32,
    pub remote: Dest,
    /// Our QP's transport counters (retransmissions, NAKs, duplicates, ...).
    pub counters: rxe_core::QpCounters,
    pub end: End,
}

/// The tool's exit code, once the harness has written it to `path`.
fn tool_exit(path: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn err(msg: String) -> io::Error {
    io::Error::other(msg)
}

fn ok<T>(r: Result<T, rxe_core::VerbError>, what: &str) -> io::Result<T> {
    r.map_err(|e| err(format!("{what}: {e}")))
}

/// Our end of a run: the QP and its CQ, one MR over both buffers, and where they are.
struct Local {
    qpn: Qpn,
    cq: u32,
    mr: u32,
    /// The receive buffer: `grh` bytes of room for a UD network header, then the payload.
    rbuf: u64,
    /// The send buffer, `grh` bytes in (as the tools lay it out).
    sbuf: u64,
    grh: usize,
    recv: RecvWr,
}

impl Local {
    /// What we send: payload(n) as our n-th SEND.
    fn put_payload(&self, p: &mut Peer, o: &Opts, n: u32) {
        p.mem
            .slice_mut(self.sbuf + self.grh as u64, o.size)
            .copy_from_slice(&payload(n, o.size));
    }

    /// The receive buffer before each receive: no network header, and the complement of the
    /// payload that must arrive.
    fn scrub(&self, p: &mut Peer, o: &Opts, n: u32) {
        let expect = expected(n, o.size, o.server.is_some(), o.peer_is_tool);
        p.mem.slice_mut(self.rbuf, self.grh).fill(0);
        p.mem
            .slice_mut(self.rbuf + self.grh as u64, o.size)
            .copy_from_slice(&scrub_of(&expect));
    }
}

/// Where the loop of [`exchange`] stands.
struct Progress {
    scnt: u32,
    rcnt: u32,
    verified: u32,
    pending: u64,
    end: End,
}

pub fn run(p: &mut Peer, o: &Opts) -> io::Result<Report> {
    let l = open(p, o)?;
    let ud = o.kind == Kind::Ud;
    let psn = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        ^ l.qpn.0 << 8)
        & 0xff_ffff;
    let mine = Dest {
        lid: 0,
        qpn: l.qpn.0,
        psn,
        gid: Gid::from_ip(p.local_ip),
    };
    if ud {
        let mut a = QpAttr {
            qp_state: QpState::Rtr,
            qkey: UD_QKEY,
            ..Default::default()
        };
        ok(
            p.dev.modify_qp(l.qpn, &a, AttrMask(AttrMask::STATE)),
            "modify RTR",
        )?;
        a.qp_state = QpState::Rts;
        a.sq_psn = psn;
        ok(
            p.dev
                .modify_qp(l.qpn, &a, AttrMask(AttrMask::STATE | AttrMask::SQ_PSN)),
            "modify RTS",
        )?;
    }
    let remote = match o.server {
        Some(addr) => {
            let r = oob::client_exchange(addr, &mine, o.timeout)?;
            connect(&mut p.dev, o, l.qpn, psn, &r)?;
            r
        }
        None => {
            let dev = &mut p.dev;
            oob::server_exchange(o.listen, |r| connect(dev, o, l.qpn, psn, r).map(|_| mine))?
        }
    };
    let (secs, done) = exchange(p, o, &l, &remote)?;
    stay(p, o)?;
    let counters = p.dev.qp_counters(l.qpn).unwrap_or_default();
    Ok(Report {
        iters: o.iters,
        bytes: 2 * o.iters as u64 * o.size as u64,
        secs,
        verified: done.verified,
        remote,
        counters,
        end: done.end,
    })
}

/// Makes the PD, MR, CQ and QP (in INIT) and posts the receives, as the tools do before the
/// exchange.
fn open(p: &mut Peer, o: &Opts) -> io::Result<Local> {
    let ud = o.kind == Kind::Ud;
    let grh = if ud { 40 } else { 0 };
    let buf_len = o.size + grh;
    // Receive buffer and send buffer apart, so what comes back can be checked.
    let rbuf = MEM_BASE;
    let sbuf = MEM_BASE + ((buf_len as u64 + 4095) & !4095);
    if (sbuf - MEM_BASE) as usize + buf_len > p.mem.bytes.len() {
        return Err(err("buffer larger than peer memory".into()));
    }
    let d = &mut p.dev;
    let pd = ok(d.alloc_pd(), "alloc_pd")?;
    let span = (sbuf - rbuf) + buf_len as u64;
    let mr = ok(
        d.reg_mr(
            pd,
            rbuf,
            span,
            Access::LOCAL_WRITE,
            Backing::Contiguous { base: rbuf },
        ),
        "reg_mr",
    )?;
    let cq = ok(d.create_cq(o.rx_depth + 1), "create_cq")?;
    let qp_type = match o.kind {
        Kind::Rc => QpType::Rc,
        Kind::Uc => QpType::Uc,
        Kind::Ud => QpType::Ud,
    };
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: o.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qpn = ok(
        d.create_qp(QpInit {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap,
            sq_sig_all: false,
        }),
        "create_qp",
    )?;
    let a = QpAttr {
        qp_state: QpState::Init,
        qkey: UD_QKEY,
        ..Default::default()
    };
    let mut m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
    m |= if ud {
        AttrMask::QKEY
    } else {
        AttrMask::ACCESS_FLAGS
    };
    ok(d.modify_qp(qpn, &a, AttrMask(m)), "modify INIT")?;
    // The tools post their receives before the exchange.
    let recv = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![Sge {
            addr: rbuf,
            length: buf_len as u32,
            lkey: mr,
        }]
        .into(),
    };
    for _ in 0..o.rx_depth {
        ok(d.post_recv(qpn, recv.clone()), "post_recv")?;
    }
    Ok(Local {
        qpn,
        cq,
        mr,
        rbuf,
        sbuf,
        grh,
        recv,
    })
}

/// Moves an RC or UC QP to RTR and RTS towards the peer `r` (a UD QP is there already).
fn connect(dev: &mut rxe_core::Device, o: &Opts, qpn: Qpn, psn: u32, r: &Dest) -> io::Result<()> {
    if o.kind == Kind::Ud {
        return Ok(());
    }
    let mut a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: o.mtu,
        dest_qp_num: r.qpn,
        rq_psn: r.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        av: Av {
            dgid: r.gid,
            sgid_index: 0,
            hop_limit: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut m =
        AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    if o.kind == Kind::Rc {
        m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    }
    ok(dev.modify_qp(qpn, &a, AttrMask(m)), "modify RTR")?;
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = psn;
    a.max_rd_atomic = 1;
    let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
    if o.kind == Kind::Rc {
        m |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    }
    ok(dev.modify_qp(qpn, &a, AttrMask(m)), "modify RTS")
}

/// The ping-pong: `o.iters` messages each way, every one that arrives checked byte for byte;
/// returns its time in seconds and how it ended.
fn exchange(p: &mut Peer, o: &Opts, l: &Local, remote: &Dest) -> io::Result<(f64, Progress)> {
    let client = o.server.is_some();
    l.scrub(p, o, 1);
    l.put_payload(p, o, 1);
    let mut send = SendWr::new(
        SEND_WRID,
        SendOp::Send,
        vec![Sge {
            addr: l.sbuf + l.grh as u64,
            length: o.size as u32,
            lkey: l.mr,
        }],
    );
    if o.kind == Kind::Ud {
        send.ud = Some(UdDest {
            av: Av {
                dgid: remote.gid,
                sgid_index: 0,
                hop_limit: 1,
                ..Default::default()
            },
            remote_qpn: Qpn(remote.qpn),
            remote_qkey: UD_QKEY,
        });
    }
    let start = Wall::now();
    let deadline = start + o.timeout;
    let mut s = Progress {
        scnt: 0,
        rcnt: 0,
        verified: 0,
        pending: RECV_WRID,
        end: End::Complete,
    };
    // Progress watchdog: a datagram in or a completion out resets it.
    let mut progress_at = Wall::now();
    let mut seen = p.received;
    let waiting_for = |pending: u64, scnt: u32, rcnt: u32| {
        let mut w = Vec::new();
        if pending & SEND_WRID != 0 {
            w.push(format!("the completion (ACK) of our SEND #{}", scnt + 1));
        }
        if pending & RECV_WRID != 0 {
            w.push(format!("the tool's SEND #{}", rcnt + 1));
        }
        w.join(" and ")
    };
    if client {
        ok(p.dev.post_send(l.qpn, send.clone()), "post_send")?;
        s.pending |= SEND_WRID;
    }
    while s.scnt < o.iters || s.rcnt < o.iters {
        let (scnt, rcnt) = (s.scnt, s.rcnt);
        if Wall::now() > deadline {
            return Err(err(format!(
                "timed out after {scnt} sends and {rcnt} receives"
            )));
        }
        p.pump(Duration::from_millis(5))?;
        if p.received != seen {
            seen = p.received;
            progress_at = Wall::now();
        }
        if progress_at.elapsed() > o.stall {
            let c = p.dev.qp_counters(l.qpn).unwrap_or_default();
            return Err(err(format!(
                "stalled: nothing received and nothing completed for {:.1} s after {scnt} sends and {rcnt} receives; waiting for {}; counters: retransmits={} timeouts={} naks_sent={} naks_received={} duplicates={}",
                o.stall.as_secs_f64(),
                waiting_for(s.pending, scnt, rcnt),
                c.retransmits, c.timeouts, c.naks_sent, c.naks_received, c.duplicates
            )));
        }
        while let Some(c) = p.dev.poll_cq(l.cq) {
            progress_at = Wall::now();
            if c.status == WcStatus::RetryExcErr
                && c.wr_id == SEND_WRID
                && s.rcnt == o.iters
                && s.scnt + 1 == o.iters
            {
                if let Some(f) = &o.tool_done {
                    tool_left_before_retransmission(o, f)?;
                    s.end = End::LastSendAfterToolLeft;
                    s.scnt += 1;
                    break;
                }
            }
            if c.status != WcStatus::Success {
                return Err(err(format!(
                    "completion error {:?} for wr_id {}",
                    c.status, c.wr_id
                )));
            }
            match c.wr_id {
                SEND_WRID => s.scnt += 1,
                RECV_WRID => {
                    s.rcnt += 1;
                    check_receive(p, o, l, c.byte_len as usize, s.rcnt)?;
                    s.verified += 1;
                    // Before our next SEND, which the peer's next message answers.
                    l.scrub(p, o, s.rcnt + 1);
                    ok(p.dev.post_recv(l.qpn, l.recv.clone()), "post_recv")?;
                }
                other => return Err(err(format!("completion for unknown wr_id {other}"))),
            }
            s.pending &= !c.wr_id;
            if s.scnt < o.iters && s.pending == 0 {
                // The last SEND has completed: its buffer is ours again.
                l.put_payload(p, o, s.scnt + 1);
                ok(p.dev.post_send(l.qpn, send.clone()), "post_send")?;
                s.pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok((start.elapsed().as_secs_f64(), s))
}

/// The last SEND failed with RetryExcErr: did the tool leave (exit 0) before our
/// retransmission came?
fn tool_left_before_retransmission(o: &Opts, f: &std::path::Path) -> io::Result<()> {
    let until = Wall::now() + o.stall;
    while tool_exit(f).is_none() && Wall::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    match tool_exit(f) {
        Some(0) => Ok(()),
        rc => Err(err(format!(
            "last SEND failed with RetryExcErr and the tool's exit code is {rc:?} (want 0 in {})",
            f.display()
        ))),
    }
}

/// Checks the `rcnt`-th receive, `byte_len` bytes: its length, its payload, and for UD the
/// network header the device wrote before it.
fn check_receive(p: &Peer, o: &Opts, l: &Local, byte_len: usize, rcnt: u32) -> io::Result<()> {
    let grh = l.grh;
    if byte_len != o.size + grh {
        return Err(err(format!(
            "received {} bytes, expected {}",
            byte_len,
            o.size + grh
        )));
    }
    let got = p.mem.slice(l.rbuf + grh as u64, o.size);
    let expect = expected(rcnt, o.size, o.server.is_some(), o.peer_is_tool);
    if got != &expect[..] {
        let at = got
            .iter()
            .zip(&expect)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        return Err(err(format!(
            "iteration {rcnt}: received data differs at byte {at} ({:#04x}, expected {:#04x}{})",
            got[at],
            expect[at],
            if got[at] == !expect[at] {
                ": never placed"
            } else {
                ""
            }
        )));
    }
    if o.kind == Kind::Ud
        && p.mem.slice(l.rbuf + 20, 1)[0] != 0x45
        && p.mem.slice(l.rbuf, 1)[0] >> 4 != 6
    {
        return Err(err("UD receive without a network header".into()));
    }
    Ok(())
}

/// After the exchange: with `o.tool_done`, stays on the wire until the tool has left (our ACK
/// of its last message may be lost, and then we must be here to answer its retransmission);
/// without, lingers 300 ms to let the last ACKs out before the process goes away.
fn stay(p: &mut Peer, o: &Opts) -> io::Result<()> {
    match &o.tool_done {
        Some(f) => {
            let mut quiet_since = Wall::now();
            let mut seen = p.received;
            while tool_exit(f).is_none() {
                p.pump(Duration::from_millis(5))?;
                if p.received != seen {
                    seen = p.received;
                    quiet_since = Wall::now();
                }
                if quiet_since.elapsed() > o.stall {
                    return Err(err(format!(
                        "all {} messages done both ways, but the tool has not exited ({} absent) and nothing arrived for {:.1} s",
                        o.iters,
                        f.display(),
                        o.stall.as_secs_f64()
                    )));
                }
            }
        }
        None => {
            let linger = Wall::now() + Duration::from_millis(300);
            while Wall::now() < linger {
                p.pump(Duration::from_millis(5))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tool echoes what it last received; another rxe-peer sends what we send.
    #[test]
    fn expectations_follow_the_echo() {
        let s = 4096;
        assert!((1..=3).all(|n| expected(n, s, true, true) == payload(n, s)));
        assert_eq!(expected(1, s, false, true), vec![TOOL_FILL; s]);
        assert_eq!(expected(3, s, false, true), payload(2, s));
        assert!((1..=3).all(|n| expected(n, s, false, false) == payload(n, s)));
        // Every message differs from the one before, and the scrub from both.
        for n in 1..100 {
            let (a, b) = (payload(n, s), payload(n + 1, s));
            assert!(a.chunks(256).zip(b.chunks(256)).all(|(x, y)| x != y));
            assert!(scrub_of(&b).iter().zip(&b).all(|(x, y)| x != y));
        }
    }
}
