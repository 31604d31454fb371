//! Measurements shared by the demo and the bench.

use std::io;
use std::time::{Duration, Instant};

use rxe_core::verbs::*;

use vhost_user_rdma::abi;

use crate::daemon::loopback_pair;
use crate::driver::Guest;
use crate::error::{Error, Result};
use crate::node::{connect_qps, ConnOpts, Node};
use crate::rings::{Cq, Mr, Wc};

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

/// How the benchmarks wait for a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Busy-poll the CQ ring (`ibv_rc_pingpong` without `-e`).
    Spin,
    /// Poll briefly, then arm the CQ and sleep until the device's COMPLETION event
    /// (`ibv_rc_pingpong -e`): leaves the CPU to the daemons.
    Event,
}

/// Waits for one successful completion on `cq`.
pub fn wait_one(g: &mut Guest, cq: &Cq, mode: WaitMode, timeout: Duration) -> Result<Wc> {
    match mode {
        WaitMode::Spin => spin_one(g, cq, timeout),
        WaitMode::Event => event_one(g, cq, timeout),
    }
}

/// Polls a little, then arms the CQ and blocks on the event queue.
pub fn event_one(g: &mut Guest, cq: &Cq, timeout: Duration) -> Result<Wc> {
    let end = Instant::now() + timeout;
    loop {
        for _ in 0..64 {
            if let Some(w) = g.poll_cq(cq, 1).pop() {
                if w.status != 0 {
                    return Err(Error::BadStatus(w.status));
                }
                return Ok(w);
            }
            std::hint::spin_loop();
        }
        if g.req_notify_cq(cq, false) {
            continue; // missed events: the ring is not empty
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout("completion"));
        }
        let cqn = cq.cqn;
        g.wait_event(left, |e| {
            e.kind == abi::event::KIND_COMPLETION && e.object == cqn
        });
    }
}

/// Busy-polls `cq` until one completion arrives.
pub fn spin_one(g: &mut Guest, cq: &Cq, timeout: Duration) -> Result<Wc> {
    let end = Instant::now() + timeout;
    let mut i = 0u32;
    loop {
        if let Some(w) = g.poll_cq(cq, 1).pop() {
            if w.status != 0 {
                return Err(Error::BadStatus(w.status));
            }
            return Ok(w);
        }
        i = i.wrapping_add(1);
        if i.is_multiple_of(1024) && Instant::now() > end {
            return Err(Error::Timeout("completion"));
        }
        std::hint::spin_loop();
    }
}

/// RC SEND ping-pong of `size` bytes, busy-polling; returns the mean half round trip.
pub fn rc_pingpong(a: &mut Node, b: &mut Node, size: u32, iters: u32) -> Result<Duration> {
    rc_pingpong_wait(a, b, size, iters, WaitMode::Spin)
}

/// RC SEND ping-pong of `size` bytes; returns the mean half round trip.
pub fn rc_pingpong_wait(
    a: &mut Node,
    b: &mut Node,
    size: u32,
    iters: u32,
    mode: WaitMode,
) -> Result<Duration> {
    let (ea, eb) = connect_qps(a, b, &ConnOpts::default())?;
    let ma = a.guest.reg_mr(ea.pd, 4096, ALL)?;
    let mb = b.guest.reg_mr(eb.pd, 4096, ALL)?;
    let t = Duration::from_secs(10);
    let warm = 100;
    let mut start = Instant::now();
    for i in 0..iters + warm {
        if i == warm {
            start = Instant::now();
        }
        b.guest.post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 1,
                sg_list: vec![mb.sge(0, 4096)].into(),
            },
        )?;
        a.guest.post_recv(
            &ea.qp,
            &RecvWr {
                wr_id: 2,
                sg_list: vec![ma.sge(2048, 2048)].into(),
            },
        )?;
        a.guest
            .post_send(&ea.qp, &SendWr::new(3, SendOp::Send, vec![ma.sge(0, size)]))?;
        wait_one(&mut b.guest, &eb.cq, mode, t)?; // recv at b
        b.guest
            .post_send(&eb.qp, &SendWr::new(4, SendOp::Send, vec![mb.sge(0, size)]))?;
        wait_one(&mut a.guest, &ea.cq, mode, t)?; // send done or recv at a
        wait_one(&mut a.guest, &ea.cq, mode, t)?;
        wait_one(&mut b.guest, &eb.cq, mode, t)?; // send done at b
    }
    Ok(start.elapsed() / (2 * iters))
}

/// RC WRITE stream of `size`-byte messages with `depth` outstanding; returns bytes/s.
pub fn rc_write_bw(a: &mut Node, b: &mut Node, size: u32, total: u64, depth: u32) -> Result<f64> {
    // The largest path MTU the port allows (4096 with a netdev MTU >= 4176).
    let mtu = Mtu::from_enum(a.guest.config.active_mtu).unwrap_or(Mtu::M1024);
    let o = ConnOpts {
        cqe: 4095,
        mtu,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(a, b, &o)?;
    let ma = a.guest.reg_mr(ea.pd, size as usize, ALL)?;
    let mb = b.guest.reg_mr(eb.pd, size as usize, ALL)?;
    let n = total.div_ceil(size as u64);
    let (mut posted, mut done) = (0u64, 0u64);
    let t = Duration::from_secs(30);
    let start = Instant::now();
    while done < n {
        while posted < n && posted - done < depth as u64 {
            a.guest
                .post_send(&ea.qp, &write_wr(posted, &ma, &mb, size))?;
            posted += 1;
        }
        let w = a.guest.wait_cq(&ea.cq, 1, t);
        if w.is_empty() {
            return Err(Error::Timeout("write completion"));
        }
        if w[0].status != 0 {
            return Err(Error::BadStatus(w[0].status));
        }
        done += 1;
        done += a.guest.poll_cq(&ea.cq, 64).len() as u64;
    }
    let _ = eb;
    Ok((n * size as u64) as f64 / start.elapsed().as_secs_f64())
}

/// [`rc_write_bw`] over `qps` RC pairs at once, `total` bytes spread evenly over them,
/// `depth` outstanding on each; bytes/s from the first post to the last completion.
pub fn rc_write_bw_qps(
    a: &mut Node,
    b: &mut Node,
    qps: usize,
    size: u32,
    total: u64,
    depth: u32,
) -> Result<f64> {
    // The largest path MTU the port allows (4096 with a netdev MTU >= 4176).
    let mtu = Mtu::from_enum(a.guest.config.active_mtu).unwrap_or(Mtu::M1024);
    let o = ConnOpts {
        cqe: 4095,
        mtu,
        ..Default::default()
    };
    let mut ends = Vec::new();
    for _ in 0..qps.max(1) {
        let (ea, eb) = connect_qps(a, b, &o)?;
        let ma = a.guest.reg_mr(ea.pd, size as usize, ALL)?;
        let mb = b.guest.reg_mr(eb.pd, size as usize, ALL)?;
        ends.push((ea, ma, mb));
    }
    let per = total.div_ceil(size as u64).div_ceil(ends.len() as u64);
    let mut posted = vec![0u64; ends.len()];
    let mut done = vec![0u64; ends.len()];
    let t = Duration::from_secs(30);
    let start = Instant::now();
    let end = start + t;
    while done.iter().any(|&d| d < per) {
        if Instant::now() > end {
            return Err(Error::Timeout("write completions"));
        }
        for (i, (ea, ma, mb)) in ends.iter().enumerate() {
            while posted[i] < per && posted[i] - done[i] < depth as u64 {
                let wr = SendWr::new(
                    posted[i],
                    SendOp::Write {
                        remote_addr: mb.addr(0),
                        rkey: mb.rkey,
                    },
                    vec![ma.sge(0, size)],
                );
                a.guest.post_send(&ea.qp, &wr)?;
                posted[i] += 1;
            }
            for w in a.guest.poll_cq(&ea.cq, 64) {
                if w.status != 0 {
                    return Err(Error::BadStatus(w.status));
                }
                done[i] += 1;
            }
        }
    }
    let n = per * ends.len() as u64;
    Ok((n * size as u64) as f64 / start.elapsed().as_secs_f64())
}

/// The reference of the same-host WRITE row: `total` bytes copied with memcpy in blocks
/// of `size`, from one page-aligned buffer of `size` bytes to another (what a WRITE of one
/// registered buffer into another moves); bytes/s. Page-aligned as the benchmark's MRs
/// are: two heap blocks side by side would put the destination a few bytes past the
/// source's offset in its page, where `rep movsb` stalls on 4 KiB aliasing (20x slower
/// here), which is no baseline.
pub fn memcpy_bw(size: usize, total: u64) -> f64 {
    let mut src = vec![0u8; size + 4096];
    let mut dst = vec![0u8; size + 4096];
    let align = |v: &Vec<u8>| (4096 - v.as_ptr() as usize % 4096) % 4096;
    let (so, d0) = (align(&src), align(&dst));
    for (i, b) in src[so..so + size].iter_mut().enumerate() {
        *b = i as u8;
    }
    let n = total.div_ceil(size as u64);
    let start = Instant::now();
    for _ in 0..n {
        dst[d0..d0 + size].copy_from_slice(std::hint::black_box(&src[so..so + size]));
        std::hint::black_box(&mut dst);
    }
    (n * size as u64) as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

/// Round trips of a control command (QUERY_PORT) on the device of `a`: `n` with nothing
/// else to do, then `n` while `a` keeps `depth` RC WRITEs of `size` bytes in flight to
/// `b` (one command after each top-up of the send queue). Returns the sorted round trips,
/// idle and under load: whether the control queue waits behind bulk data.
pub fn ctrl_under_write(
    a: &mut Node,
    b: &mut Node,
    size: u32,
    depth: u32,
    n: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mtu = Mtu::from_enum(a.guest.config.active_mtu).unwrap_or(Mtu::M1024);
    let o = ConnOpts {
        cqe: 4095,
        mtu,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(a, b, &o)?;
    let ma = a.guest.reg_mr(ea.pd, size as usize, ALL)?;
    let mb = b.guest.reg_mr(eb.pd, size as usize, ALL)?;
    let timed = |g: &mut Guest| -> Result<Duration> {
        let t0 = Instant::now();
        g.query_port()?;
        Ok(t0.elapsed())
    };
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        idle.push(timed(&mut a.guest)?);
    }
    let mut loaded = Vec::with_capacity(n);
    let (mut posted, mut done) = (0u64, 0u64);
    let t = Duration::from_secs(30);
    while loaded.len() < n {
        while posted - done < depth as u64 {
            a.guest
                .post_send(&ea.qp, &write_wr(posted, &ma, &mb, size))?;
            posted += 1;
        }
        loaded.push(timed(&mut a.guest)?);
        let w = a.guest.wait_cq(&ea.cq, 1, t);
        if w.is_empty() {
            return Err(Error::Timeout("write completion"));
        }
        if w[0].status != 0 {
            return Err(Error::BadStatus(w[0].status));
        }
        done += 1;
        done += a.guest.poll_cq(&ea.cq, 64).len() as u64;
    }
    // the rest of the WRITEs, so that the QPs go down quiet
    while done < posted {
        let w = a.guest.wait_cq(&ea.cq, 1, t);
        if w.is_empty() {
            return Err(Error::Timeout("write completion"));
        }
        done += w.len() as u64;
    }
    let _ = eb;
    idle.sort();
    loaded.sort();
    Ok((idle, loaded))
}

/// 64-byte RC SENDs with `depth` outstanding; returns messages/s.
pub fn rc_msg_rate(a: &mut Node, b: &mut Node, size: u32, count: u64, depth: u32) -> Result<f64> {
    let o = ConnOpts {
        cqe: 4095,
        cap: QpCap {
            max_send_wr: 512,
            max_recv_wr: 1024,
            ..ConnOpts::default().cap
        },
        ..Default::default()
    };
    let (ea, eb) = connect_qps(a, b, &o)?;
    let ma = a.guest.reg_mr(ea.pd, 4096, ALL)?;
    let mb = b.guest.reg_mr(eb.pd, 4096, ALL)?;
    let (mut posted, mut done, mut recvd, mut rposted) = (0u64, 0u64, 0u64, 0u64);
    let t = Instant::now() + Duration::from_secs(60);
    let start = Instant::now();
    while recvd < count {
        if Instant::now() > t {
            return Err(Error::Timeout("message rate"));
        }
        while rposted < count && rposted - recvd < 1000 {
            b.guest.post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: rposted,
                    sg_list: vec![mb.sge(0, 4096)].into(),
                },
            )?;
            rposted += 1;
        }
        while posted < count && posted - done < depth as u64 && posted < rposted {
            let mut wr = SendWr::new(posted, SendOp::Send, vec![]);
            wr.flags |= SEND_INLINE;
            wr.inline_data = vec![0x5a; size as usize];
            a.guest.post_send(&ea.qp, &wr)?;
            posted += 1;
        }
        for w in a.guest.poll_cq(&ea.cq, 256) {
            if w.status != 0 {
                return Err(Error::BadStatus(w.status));
            }
            done += 1;
        }
        recvd += b.guest.poll_cq(&eb.cq, 256).len() as u64;
    }
    let _ = ma;
    Ok(count as f64 / start.elapsed().as_secs_f64())
}

/// Plain UDP ping-pong between two sockets on loopback (two threads); mean half round trip.
pub fn udp_pingpong(size: usize, iters: u32) -> io::Result<Duration> {
    let (x, y) = loopback_pair(0);
    let a = std::net::UdpSocket::bind(x)?;
    let b = std::net::UdpSocket::bind(y)?;
    let (aa, ba) = (a.local_addr()?, b.local_addr()?);
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..iters + 100 {
            if b.recv(&mut buf).is_err() {
                return;
            }
            let _ = b.send_to(&buf[..size], aa);
        }
    });
    let mut buf = vec![0u8; 2048];
    a.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut start = Instant::now();
    for i in 0..iters + 100 {
        if i == 100 {
            start = Instant::now();
        }
        a.send_to(&buf[..size], ba)?;
        a.recv(&mut buf)?;
    }
    let d = start.elapsed() / (2 * iters);
    let _ = echo.join();
    Ok(d)
}

/// A stream of `count` UDP datagrams of `size` bytes between two loopback sockets (the
/// receiver in a thread); datagrams received per second.
pub fn udp_stream_rate(size: usize, count: u64) -> io::Result<f64> {
    let (x, y) = loopback_pair(0);
    let a = std::net::UdpSocket::bind(x)?;
    let b = std::net::UdpSocket::bind(y)?;
    let ba = b.local_addr()?;
    b.set_read_timeout(Some(Duration::from_millis(200)))?;
    let rx = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut n = 0u64;
        let mut first = None;
        let mut last = Instant::now();
        while n < count {
            if b.recv(&mut buf).is_err() {
                break;
            }
            last = Instant::now();
            first.get_or_insert(last);
            n += 1;
        }
        (n, first.map_or(Duration::ZERO, |f| last - f))
    });
    let buf = vec![0x5au8; size];
    for _ in 0..count {
        a.send_to(&buf, ba)?;
    }
    let (n, d) = rx
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))?;
    Ok(n as f64 / d.as_secs_f64().max(1e-9))
}

/// A TCP loopback stream of `total` bytes in `chunk` writes; bytes/s.
pub fn tcp_stream(chunk: usize, total: u64) -> io::Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let rx = std::thread::spawn(move || -> io::Result<u64> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0u64;
        loop {
            let r = s.read(&mut buf)?;
            if r == 0 {
                return Ok(n);
            }
            n += r as u64;
        }
    });
    let mut s = std::net::TcpStream::connect(addr)?;
    let buf = vec![0x5au8; chunk];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        s.write_all(&buf)?;
        sent += chunk as u64;
    }
    drop(s);
    let got = rx
        .join()
        .map_err(|_| io::Error::other("receiver panicked"))??;
    Ok(got as f64 / start.elapsed().as_secs_f64())
}

/// WRITE number `id`: the first `size` bytes of `from` to the start of `to`.
fn write_wr(id: u64, from: &Mr, to: &Mr, size: u32) -> SendWr {
    SendWr::new(
        id,
        SendOp::Write {
            remote_addr: to.addr(0),
            rkey: to.rkey,
        },
        vec![from.sge(0, size)],
    )
}
