//! The scale benchmark: thousands of idle RC QPs in one daemon and traffic on a few, against
//! the same traffic with no idle QPs, measured in one run. What an idle QP may cost: nothing
//! per event (timers, scheduling and completion paths visit the QPs with work), a little
//! memory, and its share of the create and destroy commands.

use std::io;
use std::time::{Duration, Instant};

use rxe_core::verbs::*;
use rxe_core::Gid;

use crate::driver::Guest;
use crate::error::{Error, Result};
use crate::node::{bring_up, connect_qps, ConnOpts, End, Node};
use crate::rings::{Mr, Qp, Srq};

/// The traffic of one measurement.
#[derive(Clone, Copy, Debug, Default)]
pub struct Traffic {
    pub msgs_per_s: f64,
    /// CPU time of both daemons, per message delivered.
    pub daemon_cpu_ns_per_msg: f64,
}

/// CPU time a process (all its threads) has run so far (ns), from `/proc/PID/task/*/schedstat`.
pub fn cpu_ns(pid: u32) -> io::Result<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let Ok(s) = std::fs::read_to_string(t?.path().join("schedstat")) else {
            continue; // the thread ended
        };
        total += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// A process's anonymous resident memory (bytes): its heap, not the guest memory it maps.
pub fn rss_anon(pid: u32) -> io::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::other("RssAnon"))
}

/// Options of the active pairs: a CQ each, room for the window, 64 B inline SENDs.
fn active_opts(window: u32) -> ConnOpts {
    ConnOpts {
        cqe: 4 * window.max(16) - 1,
        // 67 ms: a shared machine can stall a daemon for longer than the default 17 ms.
        timeout: 14,
        cap: QpCap {
            max_send_wr: window,
            max_recv_wr: 2 * window,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        ..Default::default()
    }
}

/// One active pair: the QPs, and the buffer b receives into.
pub struct Pair {
    pub a: End,
    pub b: End,
    pub rbuf: Mr,
}

/// `n` connected RC pairs between the nodes, for [`run_traffic`].
pub fn connect_active(a: &mut Node, b: &mut Node, n: usize, window: u32) -> Result<Vec<Pair>> {
    let o = active_opts(window);
    (0..n)
        .map(|_| {
            let (x, y) = connect_qps(a, b, &o)?;
            let rbuf = b.guest.reg_mr(y.pd, 4096, Access::LOCAL_WRITE)?;
            Ok(Pair { a: x, b: y, rbuf })
        })
        .collect()
}

/// `count` 64 B inline SENDs from a to b spread evenly over `pairs`, at most `window`
/// outstanding on each; messages/s and the daemons' CPU per message.
pub fn run_traffic(
    a: &mut Node,
    b: &mut Node,
    pairs: &[Pair],
    count: u64,
    window: u32,
) -> Result<Traffic> {
    let n = pairs.len() as u64;
    let quota: Vec<u64> = (0..n)
        .map(|i| count / n + u64::from(i < count % n))
        .collect();
    let (mut posted, mut done, mut rposted, mut recvd) = (
        vec![0u64; n as usize],
        vec![0u64; n as usize],
        vec![0u64; n as usize],
        vec![0u64; n as usize],
    );
    let pids = [a.daemon.pid(), b.daemon.pid()];
    let cpu0: u64 = pids.iter().map(|&p| cpu_ns(p).unwrap_or(0)).sum();
    let start = Instant::now();
    let end = start + Duration::from_secs(60);
    let mut total = 0u64;
    let mut wr = SendWr::new(0, SendOp::Send, vec![]);
    wr.flags |= SEND_INLINE;
    wr.inline_data = vec![0x5a; 64];
    while total < count {
        if Instant::now() > end {
            return Err(Error::Timeout("scale traffic"));
        }
        for (i, p) in pairs.iter().enumerate() {
            let (ea, eb) = (&p.a, &p.b);
            while rposted[i] < quota[i] && rposted[i] - recvd[i] < 2 * window as u64 {
                b.guest.post_recv(
                    &eb.qp,
                    &RecvWr {
                        wr_id: rposted[i],
                        sg_list: vec![p.rbuf.sge(0, 64)].into(),
                    },
                )?;
                rposted[i] += 1;
            }
            while posted[i] < quota[i]
                && posted[i] - done[i] < window as u64
                && posted[i] < rposted[i]
            {
                wr.wr_id = posted[i];
                a.guest.post_send(&ea.qp, &wr)?;
                posted[i] += 1;
            }
            for w in a.guest.poll_cq(&ea.cq, 256) {
                if w.status != 0 {
                    return Err(Error::BadStatus(w.status));
                }
                done[i] += 1;
            }
            for w in b.guest.poll_cq(&eb.cq, 256) {
                if w.status != 0 {
                    return Err(Error::BadStatus(w.status));
                }
                recvd[i] += 1;
                total += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // The last sends complete with the ACKs of the last receives: collect them, so the next
    // measurement starts with nothing outstanding.
    for (i, p) in pairs.iter().enumerate() {
        let ea = &p.a;
        while done[i] < posted[i] {
            if Instant::now() > end {
                return Err(Error::Timeout("scale traffic: last sends"));
            }
            done[i] += a.guest.poll_cq(&ea.cq, 256).len() as u64;
        }
    }
    let cpu1: u64 = pids.iter().map(|&p| cpu_ns(p).unwrap_or(0)).sum();
    Ok(Traffic {
        msgs_per_s: count as f64 / secs.max(1e-9),
        daemon_cpu_ns_per_msg: cpu1.saturating_sub(cpu0) as f64 / count as f64,
    })
}

/// Idle RC QPs on one guest: the smallest SQ ring (one WQE), receives from one shared SRQ,
/// one shared CQ, each moved to RTS towards a QPN on `peer` that never sends.
pub struct Idle {
    pub pd: u32,
    pub cq: crate::rings::Cq,
    pub srq: Srq,
    pub qps: Vec<Qp>,
}

/// How long the idle QPs took.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdleTimes {
    pub create: Duration,
    pub bring_up: Duration,
}

pub fn create_idle(g: &mut Guest, peer: Gid, n: usize) -> Result<(Idle, IdleTimes)> {
    let pd = g.alloc_pd()?;
    let cq = g.create_cq(63)?;
    let srq = g.create_srq(pd, 16, 1, 0)?;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let t = Instant::now();
    let mut qps = Vec::with_capacity(n);
    for _ in 0..n {
        qps.push(g.create_qp(QpType::Rc, pd, &cq, &cq, Some(&srq), cap)?);
    }
    let create = t.elapsed();
    let t = Instant::now();
    let o = ConnOpts::default();
    for (i, qp) in qps.iter().enumerate() {
        bring_up(g, qp, peer, 0xf0_0000 + i as u32, &o)?;
    }
    let times = IdleTimes {
        create,
        bring_up: t.elapsed(),
    };
    Ok((Idle { pd, cq, srq, qps }, times))
}

/// Destroys the idle QPs and their CQ, SRQ and PD; how long destroying the QPs took.
pub fn destroy_idle(g: &mut Guest, idle: Idle) -> Result<Duration> {
    let t = Instant::now();
    for qp in idle.qps {
        g.destroy_qp(qp)?;
    }
    let d = t.elapsed();
    g.destroy_srq(idle.srq)?;
    g.destroy_cq(idle.cq)?;
    g.dealloc_pd(idle.pd)?;
    Ok(d)
}

/// One round: traffic alone, then `total_qps` QPs in each daemon (idle ones beside the
/// active pairs), the same traffic again, then the idle QPs destroyed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Round {
    pub base: Traffic,
    pub loaded: Traffic,
    /// Daemon A's anonymous memory per idle QP (bytes; the rings are guest memory).
    pub rss_per_idle_qp: f64,
    pub creates_per_s: f64,
    /// Creates and moves to RTS (three MODIFY_QP commands), QPs/s.
    pub bring_ups_per_s: f64,
    pub destroys_per_s: f64,
}

pub fn round(
    a: &mut Node,
    b: &mut Node,
    pairs: &[Pair],
    idle_per_node: usize,
    count: u64,
    window: u32,
) -> Result<Round> {
    let base = run_traffic(a, b, pairs, count, window)?;
    let rss0 = rss_anon(a.daemon.pid())?;
    let (ia, ta) = create_idle(&mut a.guest, b.gid, idle_per_node)?;
    let rss1 = rss_anon(a.daemon.pid())?;
    let (ib, _) = create_idle(&mut b.guest, a.gid, idle_per_node)?;
    let loaded = run_traffic(a, b, pairs, count, window)?;
    let destroy = destroy_idle(&mut a.guest, ia)?;
    destroy_idle(&mut b.guest, ib)?;
    let n = idle_per_node.max(1) as f64;
    Ok(Round {
        base,
        loaded,
        rss_per_idle_qp: rss1.saturating_sub(rss0) as f64 / n,
        creates_per_s: n / ta.create.as_secs_f64().max(1e-9),
        bring_ups_per_s: n / (ta.create + ta.bring_up).as_secs_f64().max(1e-9),
        destroys_per_s: n / destroy.as_secs_f64().max(1e-9),
    })
}

/// The median of `v` (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}
