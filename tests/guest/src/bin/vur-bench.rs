//! Benchmarks, side by side with the kernel's own loopback paths, in one run:
//! 64 B RC SEND ping-pong half-RTT vs a UDP-socket ping-pong; 64 KiB RC WRITE throughput vs a
//! TCP loopback stream; 64 B RC SEND message rate vs a UDP-socket stream of 64 B datagrams.
//!
//! Both sides of a row do the same work under the same rules: the same iterations (and 100
//! warm-up round trips) for the ping-pongs; the same bytes in the same 64 KiB writes for WRITE
//! vs TCP, timed from the first write to the last byte delivered; the same number of 64 B
//! messages with the same window (256 in flight) for SEND vs UDP, timed from the first send
//! to the last receive, and a lost datagram fails the run (RC loses none).
//!
//! The WRITE row is measured again between two daemons on 127.0.0.1 and on ::1 with
//! `--udp-gso` (UDP GSO and GRO), against the same TCP stream.
//!
//! Run: `cargo build --release -p vur-testguest && target/release/vur-bench`.
//! `--compare PATH` adds a column for a second daemon binary (e.g. an older build), measured
//! in the same run; `--only pingpong|write|rate` runs one row; `--wait spin|event` chooses how
//! the test guest waits for completions (busy polling, or CQ events like `ibv_rc_pingpong -e`);
//! `--poll-us N` adds a column for the same daemon in poll mode (`--poll-us N`), same run.
//! The `ctrl` row times a control command (QUERY_PORT) on the idle device and again while
//! 16 RC WRITEs of 64 KiB are in flight: how long the control queue waits behind bulk data.
//!
//! `--only scale` runs the scale table instead: 64 B SENDs on 16 RC pairs (16 outstanding on
//! each) with no other QP, then with 16 384 RC QPs in each daemon (the rest idle, in RTS), in
//! `--rounds` interleaved rounds; messages/s and the daemons' CPU per message side by side,
//! the daemon's anonymous memory per idle QP, and the QP create / destroy rates.
//!
//! `--only io-thread` runs the I/O-thread table: two daemons on loopback without and with
//! `--io-thread` (the socket's work on a second thread of each daemon), in `--rounds`
//! interleaved rounds: 64 KiB RC WRITE, 64 B SEND rate and half RTT beside the kernel's TCP
//! stream, UDP stream and UDP ping-pong of the same round, and the daemons' CPU per WRITE
//! and per message.
//!
//! `--only shard-threads` runs the shard-threads table: two daemons on loopback with their
//! engines in two shards, one worker driving both and then (`--shard-threads`) the second
//! shard on a thread and socket of its own, in `--rounds` interleaved rounds: 64 B SENDs over
//! four RC pairs (two in each shard) and 64 KiB WRITEs over two (one in each), beside the
//! kernel's UDP and TCP streams of the same round, and the daemons' CPU per message.
//!
//! `--only raw` (root) compares the transports on a veth pair whose ends are in two network
//! namespaces it creates (and that vanish with it): two `udp` daemons on addresses the
//! namespaces' kernels hold, then two `raw` daemons (`--iface`) on the same ends, each pair
//! measuring the 64 B RC SEND half RTT and the 64 KiB RC WRITE throughput, in `--rounds`
//! interleaved rounds; medians and ranges. `--link netkit` puts a netkit pair (L2 mode) there
//! instead of the veth pair.

use std::path::PathBuf;

use clap::Parser;
use rxe_core::Gid;
use vur_testguest::perf::{self, WaitMode};
use vur_testguest::{find_daemon, loopback_pair, netns, Daemon, Guest, GuestOpts, Node};

#[derive(Parser, Debug)]
#[command(about = "vhost-user-rdma benchmarks, side by side with kernel UDP/TCP loopback")]
struct Args {
    /// Daemon binary (default: $VUR_DAEMON, or next to this executable).
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// A second daemon binary measured in the same run (an extra column).
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Run one row only.
    #[arg(long, value_parser = ["pingpong", "write", "same-host", "io-thread", "shard-threads", "rate", "ctrl", "scale", "raw", "gso"])]
    only: Option<String>,
    /// How the guest waits for completions.
    #[arg(long, default_value = "spin", value_parser = ["spin", "event"])]
    wait: String,
    /// Ping-pong iterations.
    #[arg(long, default_value_t = 5000)]
    iters: u32,
    /// Bytes written in the WRITE test (and streamed over TCP for the baseline).
    #[arg(long, default_value_t = 1 << 30)]
    write_bytes: u64,
    /// Pin the daemons to this CPU and the guest (this process) to the others, as a VMM would
    /// keep vCPU threads and the vhost-user backend apart. Default: no pinning.
    #[arg(long)]
    daemon_cpu: Option<usize>,
    /// Also measure the daemon in poll mode with this window (`--poll-us N`): an extra
    /// column, same run.
    #[arg(long, value_name = "N")]
    poll_us: Option<u32>,
    /// Messages sent in the message-rate test (and UDP datagrams for the baseline).
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Scale table: RC QPs in each daemon, active ones included.
    #[arg(long, default_value_t = 16_384)]
    scale_qps: usize,
    /// Scale table: QP pairs that carry traffic.
    #[arg(long, default_value_t = 16)]
    scale_active: usize,
    /// Scale table: messages per measurement.
    #[arg(long, default_value_t = 100_000)]
    scale_messages: u64,
    /// Interleaved rounds of the tables that take them, medians reported: scale (each round:
    /// traffic alone, QPs created, traffic again, QPs destroyed), gso, same-host, io-thread,
    /// shard-threads and raw.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Raw table: the pair between the two namespaces, a veth pair or a netkit pair in L2
    /// mode (made by `vhost-user-rdma link add`; Linux 6.7 and later).
    #[arg(long, default_value = "veth", value_parser = ["veth", "netkit"])]
    link: String,
}

/// Messages in flight in the message-rate rows, RC and UDP alike.
const RATE_WINDOW: u32 = 256;

/// The UDP side of the message-rate row, under the RC side's rules: `count` datagrams of
/// `size` bytes between two loopback sockets (the receiver in a thread), at most `window` sent
/// and not yet received, timed from the first send to the last receive; messages/s. A lost
/// datagram is an error (the receiver gives up after 5 s without one), not a faster run.
fn udp_rate(size: usize, count: u64, window: u64) -> std::io::Result<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let (x, y) = loopback_pair(0);
    let a = std::net::UdpSocket::bind(x)?;
    let b = std::net::UdpSocket::bind(y)?;
    let to = b.local_addr()?;
    b.set_read_timeout(Some(Duration::from_secs(5)))?;
    // The daemons' sockets ask for 4 MiB; the default (about 200 KiB) holds fewer than the
    // window's 256 datagrams at their truesize, and the stream would lose some.
    let rcvbuf: libc::c_int = 4 << 20;
    // SAFETY: a valid socket and a c_int option value of its size.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&b),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&rcvbuf as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let got = Arc::new(AtomicU64::new(0));
    let seen = got.clone();
    let rx = std::thread::spawn(move || -> std::io::Result<Instant> {
        let mut buf = [0u8; 2048];
        for n in 1..=count {
            b.recv(&mut buf).map_err(|e| {
                std::io::Error::other(format!("UDP baseline: datagram {n} of {count}: {e}"))
            })?;
            seen.store(n, Ordering::Release);
        }
        Ok(Instant::now())
    });
    let buf = vec![0x5au8; size];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < count {
        if sent - got.load(Ordering::Acquire) < window {
            a.send_to(&buf, to)?;
            sent += 1;
        } else if rx.is_finished() {
            break; // the receiver failed; its error is returned below
        } else {
            std::hint::spin_loop();
        }
    }
    let end = rx
        .join()
        .map_err(|_| std::io::Error::other("receiver panicked"))??;
    Ok(count as f64 / (end - start).as_secs_f64().max(1e-9))
}

/// Datagrams per send call in the GSO table: what one 64 KiB RC WRITE is at path MTU 4096
/// (16 packets), less one so that a UDP_SEGMENT send stays within 64 KiB.
const GSO_SEGS: usize = 15;
/// One RoCEv2 WRITE_MIDDLE packet on a UDP socket: BTH, 4096 bytes of payload, ICRC.
const GSO_SEG_LEN: usize = 12 + 4096 + 4;

/// This thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain syscall writing into `t`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One GSO-table run: `bursts` × [`GSO_SEGS`] datagrams of [`GSO_SEG_LEN`] bytes between two
/// loopback sockets, each burst one `sendmmsg` (`gso` false) or one `sendmsg` with
/// UDP_SEGMENT (true), at most `window` datagrams sent and not yet received (none is lost:
/// a lost one fails the run). Returns (payload Gbit/s from the first send to the last
/// receive, the sender's CPU ns per datagram).
fn gso_run(gso: bool, bursts: u64, window: u64) -> std::io::Result<(f64, f64)> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let (x, y) = loopback_pair(0);
    let a = std::net::UdpSocket::bind(x)?;
    let b = std::net::UdpSocket::bind(y)?;
    a.connect(b.local_addr()?)?;
    b.set_read_timeout(Some(Duration::from_secs(5)))?;
    // Room for the window (root may exceed rmem_max; others get what it allows).
    let room: libc::c_int = 8 << 20;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: plain setsockopt with an int.
        let r = unsafe {
            libc::setsockopt(
                b.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&room as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            break;
        }
    }
    let count = bursts * GSO_SEGS as u64;
    let got = Arc::new(AtomicU64::new(0));
    let seen = got.clone();
    let rx = std::thread::spawn(move || -> std::io::Result<Instant> {
        let mut buf = vec![0u8; 65536];
        let mut n = 0u64;
        while n < count {
            let len = b.recv(&mut buf).map_err(|e| {
                std::io::Error::other(format!("GSO table: datagram {} of {count}: {e}", n + 1))
            })?;
            if len != GSO_SEG_LEN {
                return Err(std::io::Error::other(format!(
                    "GSO table: a datagram of {len} bytes, not {GSO_SEG_LEN}"
                )));
            }
            n += 1;
            seen.store(n, Ordering::Release);
        }
        Ok(Instant::now())
    });
    let mut data = vec![0x5au8; GSO_SEGS * GSO_SEG_LEN];
    let fd = a.as_raw_fd();
    // sendmmsg: one message per datagram; UDP_SEGMENT: one message, the segment size in a cmsg.
    let mut iovs: Vec<libc::iovec> = (0..GSO_SEGS)
        .map(|i| libc::iovec {
            // SAFETY: in bounds: i * GSO_SEG_LEN < data.len().
            iov_base: unsafe { data.as_mut_ptr().add(i * GSO_SEG_LEN) }.cast(),
            iov_len: GSO_SEG_LEN,
        })
        .collect();
    let mut whole = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: mmsghdr is plain data; all-zero is valid.
    let mut msgs: Vec<libc::mmsghdr> = (0..GSO_SEGS)
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    let mut cmsg = [0u64; 4];
    // SAFETY: as above.
    let mut gmsg: libc::msghdr = unsafe { std::mem::zeroed() };
    gmsg.msg_iov = &mut whole;
    gmsg.msg_iovlen = 1;
    gmsg.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    gmsg.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
    // SAFETY: the control buffer holds CMSG_SPACE(2) bytes (32 >= 24); the header and its u16
    // are written inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&gmsg);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), GSO_SEG_LEN as u16);
    }
    let cpu0 = thread_cpu_ns();
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < count {
        if sent + GSO_SEGS as u64 - got.load(Ordering::Acquire) > window {
            if rx.is_finished() {
                break; // the receiver failed; its error is returned below
            }
            std::hint::spin_loop();
            continue;
        }
        // SAFETY: the headers point at `data`, `iovs`, `whole` and `cmsg`, all alive here.
        let r = unsafe {
            if gso {
                libc::sendmsg(fd, &gmsg, 0) as i64 / GSO_SEG_LEN as i64
            } else {
                libc::sendmmsg(fd, msgs.as_mut_ptr(), GSO_SEGS as u32, 0) as i64
            }
        };
        if r != GSO_SEGS as i64 {
            return Err(std::io::Error::other(format!(
                "GSO table: a send of {GSO_SEGS} datagrams sent {r}: {}",
                std::io::Error::last_os_error()
            )));
        }
        sent += GSO_SEGS as u64;
    }
    let cpu = thread_cpu_ns() - cpu0;
    let end = rx
        .join()
        .map_err(|_| std::io::Error::other("receiver panicked"))??;
    let secs = (end - start).as_secs_f64().max(1e-9);
    Ok((
        (count * 4096 * 8) as f64 / secs / 1e9,
        cpu as f64 / count as f64,
    ))
}

/// The GSO table (`--only gso`): what UDP_SEGMENT buys on the kernel side alone.
fn gso_table(a: &Args) {
    let bursts = (a.write_bytes / (GSO_SEGS as u64 * 4096)).max(1);
    let mut rows: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for round in 0..a.rounds.max(1) {
        for (i, gso) in [false, true].into_iter().enumerate() {
            match gso_run(gso, bursts, 4 * GSO_SEGS as u64) {
                Ok(r) => rows[i].push(r),
                Err(e) => {
                    println!("GSO table: round {}: {e}", round + 1);
                    std::process::exit(1);
                }
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    let col = |i: usize| {
        let mut g: Vec<f64> = rows[i].iter().map(|r| r.0).collect();
        let mut c: Vec<f64> = rows[i].iter().map(|r| r.1).collect();
        (med(&mut g), med(&mut c))
    };
    let (m, g) = (col(0), col(1));
    println!(
        "UDP loopback, {GSO_SEGS} datagrams of {GSO_SEG_LEN} B per call     sendmmsg   UDP_SEGMENT   ratio"
    );
    println!(
        "payload Gbit/s (first send to last receive)   {:>11.2} {:>13.2} {:>7.2}x",
        m.0,
        g.0,
        g.0 / m.0
    );
    println!(
        "sender CPU ns per datagram                    {:>11.0} {:>13.0} {:>7.2}x",
        m.1,
        g.1,
        g.1 / m.1
    );
    println!(
        "medians of {} rounds, {} MiB each",
        a.rounds.max(1),
        (bursts * GSO_SEGS as u64 * 4096) >> 20
    );
}

/// The daemon half of the GSO table (`--only gso`, root): two udp daemons on IPv6 addresses
/// of a namespace's loopback (path MTU 4096), 64 KiB RC WRITEs without and with UDP GSO in
/// interleaved rounds; WRITE Gbit/s and the two daemons' CPU per 64 KiB, medians.
fn gso_daemon_table(bin: &std::path::Path, a: &Args) {
    if let Some(why) = netns::unavailable() {
        println!("daemons with and without GSO: skipped: {why}");
        return;
    }
    let (bin, bytes, rounds, cpu) = (
        bin.to_path_buf(),
        a.write_bytes,
        a.rounds.max(1),
        a.daemon_cpu,
    );
    let r = netns::run_in_new_netns(move || -> Result<[Vec<(f64, f64)>; 3], String> {
        for ip in ["fd79:8::1/128", "fd79:8::2/128"] {
            netns::ip(&["addr", "add", ip, "dev", "lo"]).map_err(|e| e.to_string())?;
        }
        let cpus = cpu.map(|c| [c]);
        let mut rows: [Vec<(f64, f64)>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..rounds {
            let tcp = perf::tcp_stream(64 << 10, bytes).map_err(|e| format!("TCP: {e}"))?;
            rows[2].push((tcp * 8.0 / 1e9, 0.0));
            for (i, gso) in [false, true].into_iter().enumerate() {
                let mut extra = vec!["--mtu", "9000"];
                if gso {
                    extra.push("--udp-gso");
                }
                let start = |ip: &str| {
                    let addr = std::net::SocketAddr::new(ip.parse().unwrap(), 4791);
                    Node::start_on(&bin, addr, &extra, cpus.as_ref().map(|c| &c[..]))
                        .map_err(|e| format!("daemon on {ip}: {e}"))
                };
                let (mut x, mut y) = (start("fd79:8::1")?, start("fd79:8::2")?);
                let cpu_now = |x: &Node, y: &Node| {
                    vur_testguest::scale::cpu_ns(x.daemon.pid()).unwrap_or(0)
                        + vur_testguest::scale::cpu_ns(y.daemon.pid()).unwrap_or(0)
                };
                let c0 = cpu_now(&x, &y);
                let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, bytes, 16)
                    .map_err(|e| format!("WRITE (GSO {gso}): {e}"))?;
                let c1 = cpu_now(&x, &y);
                let c = x.daemon.counters().map_err(|e| e.to_string())?;
                let sends = vur_testguest::json_u64(&c, "transport", "tx_gso_sends").unwrap_or(0);
                if gso != (sends > 0) {
                    return Err(format!("GSO {gso} but {sends} GSO sends: {c}"));
                }
                let writes = bytes.div_ceil(64 << 10) as f64;
                rows[i].push((bw * 8.0 / 1e9, (c1 - c0) as f64 / writes));
            }
        }
        Ok(rows)
    });
    let rows = match r {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) | Err(e) => {
            println!("daemons with and without GSO: {e}");
            std::process::exit(1);
        }
    };
    println!();
    print_pair_table(
        "two daemons, IPv6 on a namespace's loopback, 64 KiB RC WRITE   no GSO (range)  GSO+GRO (range)   ratio",
        &rows,
        "kernel TCP stream, same bytes (Gbit/s)  ",
        "GSO / TCP",
        "daemon CPU us per 64 KiB WRITE (both daemons)",
    );
    println!("medians of {rounds} rounds, {} MiB each", bytes >> 20);
}

/// The same-host table (`--only same-host`): 64 KiB RC WRITEs between two devices of one
/// daemon process (loopback addresses), through the kernel's UDP sockets, with `--same-host`
/// in packets of one path MTU (`--same-host-segment 0`) and in segments (the default, 64
/// KiB), beside memcpy of the same bytes in 64 KiB blocks, in interleaved rounds; Gbit/s
/// and the daemon's CPU per WRITE, medians and ranges.
fn same_host_table(bin: &std::path::Path, a: &Args) {
    let rounds = a.rounds.max(1);
    let cpus = a.daemon_cpu.map(|c| [c]);
    let cpus = cpus.as_ref().map(|c| &c[..]);
    let writes = a.write_bytes.div_ceil(64 << 10) as f64;
    const SETUPS: [&[&str]; 3] = [
        &[],
        &["--same-host", "--same-host-segment", "0"],
        &["--same-host"],
    ];
    // [udp, same-host packets, same-host segments, memcpy]: (Gbit/s, daemon CPU ns per
    // WRITE); the nodes of a round are dropped (their daemon stopped) before an error ends
    // the run.
    let mut rows: [Vec<(f64, f64)>; 4] = Default::default();
    let round = |rows: &mut [Vec<(f64, f64)>; 4]| -> Result<(), String> {
        let m = perf::memcpy_bw(64 << 10, a.write_bytes);
        rows[3].push((m * 8.0 / 1e9, 0.0));
        for (i, flag) in SETUPS.into_iter().enumerate() {
            let (aa, ba) = loopback_pair(4791);
            let mut extra = vec!["--mtu", "9000"];
            extra.extend_from_slice(flag);
            let (mut x, mut y) = Node::start_two(bin, aa, ba, &extra, cpus)
                .map_err(|e| format!("two devices in one daemon ({flag:?}): {e}"))?;
            let pid = x.daemon.pid();
            let c0 = vur_testguest::scale::cpu_ns(pid).unwrap_or(0);
            let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16)
                .map_err(|e| format!("WRITE ({flag:?}): {e}"))?;
            let c1 = vur_testguest::scale::cpu_ns(pid).unwrap_or(0);
            let c = x.daemon.counters().unwrap_or_default();
            let refs = vur_testguest::json_u64(&c, "same_host", "tx_ref_bytes").unwrap_or(0);
            let segs = vur_testguest::json_u64(&c, "port", "tx_segments").unwrap_or(0);
            if (i > 0) != (refs > 0) || (i == 2) != (segs > 0) {
                return Err(format!(
                    "{flag:?} but {refs} bytes sent as references, {segs} segments: {c}"
                ));
            }
            rows[i].push((bw * 8.0 / 1e9, (c1 - c0) as f64 / writes));
        }
        Ok(())
    };
    for _ in 0..rounds {
        if let Err(e) = round(&mut rows) {
            println!("same-host table: {e}");
            std::process::exit(1);
        }
    }
    let col = |i: usize, f: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<f64> = rows[i].iter().map(f).collect();
        med_range(&mut v)
    };
    let cell = |m: (f64, f64, f64)| format!("{:.2} ({:.2}-{:.2})", m.0, m.1, m.2);
    println!(
        "two devices of one daemon, 64 KiB RC WRITE   {:>22} {:>22} {:>22} {:>22}",
        "kernel UDP", "--same-host packets", "--same-host segments", "memcpy"
    );
    let bw: Vec<_> = (0..4).map(|i| col(i, |r| r.0)).collect();
    println!(
        "{:<44} {:>22} {:>22} {:>22} {:>22}",
        "Gbit/s (range)",
        cell(bw[0]),
        cell(bw[1]),
        cell(bw[2]),
        cell(bw[3])
    );
    let cpu: Vec<_> = (0..3).map(|i| col(i, |r| r.1 / 1e3)).collect();
    println!(
        "{:<44} {:>22} {:>22} {:>22}",
        "daemon CPU us per WRITE (range)",
        cell(cpu[0]),
        cell(cpu[1]),
        cell(cpu[2])
    );
    println!(
        "segments / packets: {:.2}x Gbit/s, {:.2}x CPU; segments / kernel UDP: {:.2}x; \
         segments / memcpy: {:.3}x (packets / memcpy: {:.3}x)",
        bw[2].0 / bw[1].0,
        cpu[2].0 / cpu[1].0,
        bw[2].0 / bw[0].0,
        bw[2].0 / bw[3].0,
        bw[1].0 / bw[3].0
    );
    println!(
        "medians of {rounds} rounds, {} MiB each",
        a.write_bytes >> 20
    );
}

/// The I/O-thread table (`--only io-thread`): two daemons on loopback, the worker alone and
/// with `--io-thread`, in interleaved rounds beside the kernel's loopback paths measured in
/// the same round; medians and ranges, and CPU of both daemons (every thread) per operation.
fn io_thread_table(bin: &std::path::Path, a: &Args, wait: WaitMode) {
    let rounds = a.rounds.max(1);
    let cpus = a.daemon_cpu.map(|c| [c]);
    let cpus = cpus.as_ref().map(|c| &c[..]);
    let writes = a.write_bytes.div_ceil(64 << 10) as f64;
    // Per setup [worker, --io-thread, kernel]: WRITE Gbit/s, rate k/s, half RTT us, CPU us
    // per WRITE, CPU ns per message.
    let mut m: [[Vec<f64>; 5]; 3] = Default::default();
    let round = |m: &mut [[Vec<f64>; 5]; 3]| -> Result<(), String> {
        for (i, flag) in [&[][..], &["--io-thread"][..]].into_iter().enumerate() {
            let (aa, ba) = loopback_pair(4791);
            let mut extra = vec!["--mtu", "9000"];
            extra.extend_from_slice(flag);
            let mut x = Node::start_on(bin, aa, &extra, cpus).map_err(|e| format!("{e}"))?;
            let mut y = Node::start_on(bin, ba, &extra, cpus).map_err(|e| format!("{e}"))?;
            let pids = [x.daemon.pid(), y.daemon.pid()];
            let cpu = || {
                pids.iter()
                    .map(|&p| vur_testguest::scale::cpu_ns(p).unwrap_or(0))
                    .sum::<u64>()
            };
            let c0 = cpu();
            let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16)
                .map_err(|e| format!("WRITE ({flag:?}): {e}"))?;
            let c1 = cpu();
            let rate = perf::rc_msg_rate(&mut x, &mut y, 64, a.messages, RATE_WINDOW)
                .map_err(|e| format!("rate ({flag:?}): {e}"))?;
            let c2 = cpu();
            let rtt = perf::rc_pingpong_wait(&mut x, &mut y, 64, a.iters, wait)
                .map_err(|e| format!("ping-pong ({flag:?}): {e}"))?;
            let c = x.daemon.counters().unwrap_or_default();
            let batches = vur_testguest::json_u64(&c, "io_thread", "tx_batches").unwrap_or(0);
            if (i == 1) != (batches > 0) {
                return Err(format!("{flag:?} but {batches} I/O-thread batches: {c}"));
            }
            m[i][0].push(bw * 8.0 / 1e9);
            m[i][1].push(rate / 1e3);
            m[i][2].push(rtt.as_secs_f64() * 1e6);
            m[i][3].push((c1 - c0) as f64 / writes / 1e3);
            m[i][4].push((c2 - c1) as f64 / a.messages as f64);
        }
        let tcp = perf::tcp_stream(64 << 10, a.write_bytes).map_err(|e| format!("tcp: {e}"))?;
        m[2][0].push(tcp * 8.0 / 1e9);
        // The kernel's stream may lose a datagram under load (a lost run, not a slow one):
        // up to three tries.
        let udp = (0..3)
            .map(|_| udp_rate(64, a.messages, RATE_WINDOW as u64))
            .find_map(Result::ok)
            .ok_or("udp: three runs lost datagrams")?;
        m[2][1].push(udp / 1e3);
        let pp = perf::udp_pingpong(64, a.iters).map_err(|e| format!("udp pp: {e}"))?;
        m[2][2].push(pp.as_secs_f64() * 1e6);
        Ok(())
    };
    for _ in 0..rounds {
        if let Err(e) = round(&mut m) {
            println!("io-thread table: {e}");
            std::process::exit(1);
        }
    }
    let head = [
        "two daemons on loopback",
        "worker alone (range)",
        "--io-thread (range)",
        "ratio",
        "kernel (range)",
        "io/kernel",
    ];
    let rows = [
        ("64 KiB RC WRITE Gbit/s (TCP)", 0, 2),
        ("64 B RC SEND rate k/s (UDP)", 1, 0),
        ("64 B SEND half RTT us (UDP pp)", 2, 1),
        ("daemon CPU us per 64 KiB WRITE", 3, 1),
        ("daemon CPU ns per 64 B message", 4, 0),
    ];
    range_table(34, head, &rows, &mut m, 3);
    println!(
        "medians of {rounds} rounds; WRITE {} MiB, {} messages, {} round trips; daemons {}",
        a.write_bytes >> 20,
        a.messages,
        a.iters,
        a.daemon_cpu
            .map_or("not pinned".to_string(), |c| format!("pinned to CPU {c}"))
    );
}

/// The shard-threads table (`--only shard-threads`): two daemons on loopback with
/// `--engine-shards 2`, one worker for both shards and then a thread per shard, in
/// interleaved rounds beside the kernel's streams of the same round.
fn shard_threads_table(bin: &std::path::Path, a: &Args) {
    use vur_testguest::scale;
    let rounds = a.rounds.max(1);
    // Per setup [one worker, --shard-threads, kernel]: rate k/s, WRITE Gbit/s, CPU ns per
    // message.
    let mut m: [[Vec<f64>; 3]; 3] = Default::default();
    let round = |m: &mut [[Vec<f64>; 3]; 3]| -> Result<(), String> {
        for (i, flag) in [&[][..], &["--shard-threads"][..]].into_iter().enumerate() {
            let (aa, ba) = loopback_pair(4791);
            let mut extra = vec!["--mtu", "9000", "--engine-shards", "2"];
            extra.extend_from_slice(flag);
            let mut x = Node::start(bin, aa, &extra).map_err(|e| format!("{e}"))?;
            let mut y = Node::start(bin, ba, &extra).map_err(|e| format!("{e}"))?;
            // QPs go to the shards in turn: four pairs are two in each shard on both sides.
            let pairs = scale::connect_active(&mut x, &mut y, 4, SCALE_WINDOW)
                .map_err(|e| format!("pairs: {e}"))?;
            scale::run_traffic(&mut x, &mut y, &pairs, a.messages / 10 + 1, SCALE_WINDOW)
                .map_err(|e| format!("warm-up ({flag:?}): {e}"))?;
            let t = scale::run_traffic(&mut x, &mut y, &pairs, a.messages, SCALE_WINDOW)
                .map_err(|e| format!("rate ({flag:?}): {e}"))?;
            let bw = perf::rc_write_bw_qps(&mut x, &mut y, 2, 64 << 10, a.write_bytes, 16)
                .map_err(|e| format!("WRITE ({flag:?}): {e}"))?;
            let c = x.daemon.counters().unwrap_or_default();
            let threaded = c.contains("\"shard_sockets\"");
            if (i == 1) != threaded {
                return Err(format!("{flag:?} but shard sockets {threaded}: {c}"));
            }
            m[i][0].push(t.msgs_per_s / 1e3);
            m[i][1].push(bw * 8.0 / 1e9);
            m[i][2].push(t.daemon_cpu_ns_per_msg);
        }
        let udp = (0..3)
            .map(|_| udp_rate(64, a.messages, RATE_WINDOW as u64))
            .find_map(Result::ok)
            .ok_or("udp: three runs lost datagrams")?;
        m[2][0].push(udp / 1e3);
        let tcp = perf::tcp_stream(64 << 10, a.write_bytes).map_err(|e| format!("tcp: {e}"))?;
        m[2][1].push(tcp * 8.0 / 1e9);
        Ok(())
    };
    for _ in 0..rounds {
        if let Err(e) = round(&mut m) {
            println!("shard-threads table: {e}");
            std::process::exit(1);
        }
    }
    let head = [
        "two daemons, --engine-shards 2",
        "one worker (range)",
        "--shard-threads",
        "ratio",
        "kernel (range)",
        "vs kernel",
    ];
    let rows = [
        ("64 B SEND rate k/s, 4 RC pairs (UDP)", 0, 0),
        ("64 KiB WRITE Gbit/s, 2 RC pairs (TCP)", 1, 2),
        ("daemon CPU ns per 64 B message", 2, 0),
    ];
    range_table(40, head, &rows, &mut m, 2);
    println!(
        "medians of {rounds} rounds; {} messages ({SCALE_WINDOW} outstanding per pair), WRITE {} \
         MiB; {} CPUs",
        a.messages,
        a.write_bytes >> 20,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
}

/// Prints a table of two setups measured in interleaved rounds, beside a reference: `rows`
/// are (Gbit/s, daemon CPU ns per WRITE) per round, for the first setup, the second and the
/// reference; medians with their ranges, and the second's ratios to the first and to the
/// reference.
fn print_pair_table(
    header: &str,
    rows: &[Vec<(f64, f64)>; 3],
    reference: &str,
    vs_reference: &str,
    cpu: &str,
) {
    let col = |i: usize, f: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<f64> = rows[i].iter().map(f).collect();
        med_range(&mut v)
    };
    println!("{header}");
    let (x, y) = (col(0, |r| r.0), col(1, |r| r.0));
    println!(
        "{:<46} {:>8.2} ({:.2}-{:.2}) {:>8.2} ({:.2}-{:.2}) {:>6.2}x",
        "WRITE Gbit/s",
        x.0,
        x.1,
        x.2,
        y.0,
        y.1,
        y.2,
        y.0 / x.0
    );
    let r = col(2, |r| r.0);
    println!(
        "{reference:<46} {:>8.2} ({:.2}-{:.2})   {vs_reference} {:.3}x",
        r.0,
        r.1,
        r.2,
        y.0 / r.0
    );
    let (x, y) = (col(0, |r| r.1 / 1e3), col(1, |r| r.1 / 1e3));
    println!(
        "{cpu:<46} {:>8.1} ({:.1}-{:.1}) {:>8.1} ({:.1}-{:.1}) {:>6.2}x",
        x.0,
        x.1,
        x.2,
        y.0,
        y.1,
        y.2,
        y.0 / x.0
    );
}

#[derive(Default, Clone, Copy)]
struct Row {
    half_rtt_us: f64,
    /// The same ping-pong between two devices of one daemon with `--same-host` (None: a
    /// daemon that does not take the flag).
    half_rtt_same_us: Option<f64>,
    write_gbit: f64,
    /// The same WRITEs between two daemons on 127.0.0.1 with `--udp-gso` (None: a daemon
    /// that does not take the flag, or one that takes it on IPv6 only).
    write4_gso_gbit: Option<f64>,
    /// The same WRITEs between two daemons on ::1 with `--udp-gso` (None: no IPv6 loopback,
    /// or a daemon that does not take the flag).
    write6_gbit: Option<f64>,
    /// The same WRITEs between two devices of one daemon with `--same-host` (None: a daemon
    /// that does not take the flag).
    write_same_gbit: Option<f64>,
    msg_rate: f64,
    /// QUERY_PORT round trip, µs: median idle, median and 99th percentile under WRITEs.
    ctrl_us: [f64; 3],
}

fn run_daemon(bin: &std::path::Path, a: &Args, wait: WaitMode, poll_us: Option<u32>) -> Row {
    let (aa, ba) = loopback_pair(4791);
    let cpus = a.daemon_cpu.map(|c| [c]);
    let cpus = cpus.as_ref().map(|c| &c[..]);
    let poll = poll_us.map(|p| p.to_string());
    let mut extra = vec!["--mtu", "9000"];
    if let Some(p) = &poll {
        extra.extend(["--poll-us", p.as_str()]);
    }
    let mut x = Node::start_on(bin, aa, &extra, cpus).expect("node a");
    let mut y = Node::start_on(bin, ba, &extra, cpus).expect("node b");
    let want = |w: &str| a.only.as_deref().is_none_or(|o| o == w);
    let mut r = Row::default();
    if want("pingpong") {
        let d = perf::rc_pingpong_wait(&mut x, &mut y, 64, a.iters, wait).expect("ping-pong");
        r.half_rtt_us = d.as_secs_f64() * 1e6;
        r.half_rtt_same_us = pingpong_same_host(bin, a, &extra, cpus, wait);
    }
    if want("write") {
        let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16).expect("write");
        r.write_gbit = bw * 8.0 / 1e9;
        r.write4_gso_gbit = write_gso(bin, a, &extra, cpus, std::net::Ipv4Addr::LOCALHOST.into());
        r.write6_gbit = write_gso(bin, a, &extra, cpus, std::net::Ipv6Addr::LOCALHOST.into());
    }
    if want("write") {
        r.write_same_gbit = write_same_host(bin, a, &extra, cpus);
    }
    if want("rate") {
        r.msg_rate =
            perf::rc_msg_rate(&mut x, &mut y, 64, a.messages, RATE_WINDOW).expect("msg rate");
    }
    if want("ctrl") {
        let (idle, loaded) =
            perf::ctrl_under_write(&mut x, &mut y, 64 << 10, 16, CTRL_SAMPLES).expect("ctrl");
        let us = |v: &[std::time::Duration], q: f64| {
            v[((v.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6
        };
        r.ctrl_us = [us(&idle, 0.5), us(&loaded, 0.5), us(&loaded, 0.99)];
    }
    r
}

/// The ping-pong again between two devices of one daemon process with `--same-host`. None
/// when the daemon does not start that way (an older `--compare` build).
fn pingpong_same_host(
    bin: &std::path::Path,
    a: &Args,
    extra: &[&str],
    cpus: Option<&[usize]>,
    wait: WaitMode,
) -> Option<f64> {
    let (aa, ba) = loopback_pair(4791);
    let mut extra = extra.to_vec();
    extra.push("--same-host");
    let (mut x, mut y) = Node::start_two(bin, aa, ba, &extra, cpus).ok()?;
    let d = perf::rc_pingpong_wait(&mut x, &mut y, 64, a.iters, wait).ok()?;
    // Every SEND crossed between the devices in memory, none through a socket.
    let c = x.daemon.counters().unwrap_or_default();
    let crossed = vur_testguest::json_u64(&c, "same_host", "tx_packets").unwrap_or(0);
    if crossed < a.iters as u64 {
        println!(
            "  --same-host ping-pong: {crossed} packets crossed in memory, fewer than {} SENDs",
            a.iters
        );
        return None;
    }
    Some(d.as_secs_f64() * 1e6)
}

/// The WRITE row again between two devices of one daemon process with `--same-host`: the
/// packets go from one worker to the other through memory. None when the daemon does not
/// start that way (an older `--compare` build).
fn write_same_host(
    bin: &std::path::Path,
    a: &Args,
    extra: &[&str],
    cpus: Option<&[usize]>,
) -> Option<f64> {
    let (aa, ba) = loopback_pair(4791);
    let mut extra = extra.to_vec();
    extra.push("--same-host");
    let (mut x, mut y) = Node::start_two(bin, aa, ba, &extra, cpus).ok()?;
    let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16).ok()?;
    Some(bw * 8.0 / 1e9)
}

/// The WRITE row again between two daemons on `ip` (127.0.0.1 or ::1) with `--udp-gso`: one
/// address, so each daemon has its own port and sends to the other's. None when `ip` cannot
/// be bound, a daemon does not start (an older `--compare` build), or it made no GSO send
/// (a build that takes the flag on IPv6 only).
fn write_gso(
    bin: &std::path::Path,
    a: &Args,
    extra: &[&str],
    cpus: Option<&[usize]>,
    ip: std::net::IpAddr,
) -> Option<f64> {
    let free_port = || {
        std::net::UdpSocket::bind((ip, 0))
            .and_then(|s| s.local_addr())
            .map(|a| a.port())
    };
    let (pa, pb) = match (free_port(), free_port()) {
        (Ok(pa), Ok(pb)) if pa != pb => (pa, pb),
        _ => return None,
    };
    let node = |port: u16, peer: u16| {
        let peer = peer.to_string();
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["--udp-gso", "--peer-port", &peer]);
        Node::start_on(bin, std::net::SocketAddr::new(ip, port), &args, cpus).ok()
    };
    let (mut x, mut y) = (node(pa, pb)?, node(pb, pa)?);
    let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16).ok()?;
    let c = x.daemon.counters().ok()?;
    (vur_testguest::json_u64(&c, "transport", "tx_gso_sends")? > 0).then_some(bw * 8.0 / 1e9)
}

/// Control commands timed idle and under WRITEs (`ctrl` row).
const CTRL_SAMPLES: usize = 2000;

const VETH_A: (&str, [u8; 6]) = ("vurb-a", [0x02, 0x79, 0xbe, 0, 0, 0x0a]);
const VETH_B: (&str, [u8; 6]) = ("vurb-b", [0x02, 0x79, 0xbe, 0, 0, 0x0b]);

/// The MAC of `iface` in the calling thread's namespace (`ip -br link`).
fn mac_of(iface: &str) -> [u8; 6] {
    let o = std::process::Command::new("ip")
        .args(["-br", "link", "show", "dev", iface])
        .output()
        .expect("ip -br link");
    let text = String::from_utf8_lossy(&o.stdout);
    let mac = text.split_whitespace().nth(2).unwrap_or_default();
    let v: Vec<u8> = mac
        .split(':')
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect();
    v.try_into()
        .unwrap_or_else(|_| panic!("no MAC for {iface} in {text:?}"))
}

/// Starts a daemon (in the calling thread's namespace) and attaches a test guest to it.
fn veth_node(d: std::io::Result<Daemon>, ip: &str, mac: [u8; 6]) -> Node {
    let daemon = d.expect("daemon");
    let mut guest = Guest::connect(&daemon.socket, GuestOpts::default()).expect("guest");
    let gid = Gid::from_ip(ip.parse().unwrap());
    guest.add_gid(0, gid).expect("add_gid");
    Node {
        daemon,
        guest,
        gid,
        mac,
    }
}

/// One pair on the veth: (half RTT in µs, WRITE Gbit/s).
fn veth_pair_run(
    bin: &std::path::Path,
    peer: &netns::NsThread,
    ring: Option<&str>,
    macs: ([u8; 6], [u8; 6]),
    a: &Args,
    wait: WaitMode,
) -> (f64, f64) {
    let raw = ring.is_some();
    let (ip_a, ip_b) = if raw {
        ("10.79.4.1", "10.79.4.2")
    } else {
        ("10.79.3.1", "10.79.3.2")
    };
    let args = |iface: &str, ip: &str| -> Vec<String> {
        let mut v = vec!["--mtu".to_string(), "9000".into()];
        if raw {
            v.extend([
                "--iface".into(),
                iface.into(),
                "--raw-addr".into(),
                ip.into(),
                "--raw-ring".into(),
                ring.unwrap_or("v3").into(),
            ]);
        }
        v
    };
    let cpus = a.daemon_cpu.map(|c| vec![c]);
    let spawn = |ip: &str, args: Vec<String>, cpus: Option<Vec<usize>>| {
        let addr = format!("{ip}:4791").parse().unwrap();
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        Daemon::spawn_on(bin, addr, &args, cpus.as_deref())
    };
    let mut x = veth_node(
        spawn(ip_a, args(VETH_A.0, ip_a), cpus.clone()),
        ip_a,
        macs.0,
    );
    let (bin_b, args_b, cpus_b, ip_b_s) = (
        bin.to_path_buf(),
        args(VETH_B.0, ip_b),
        cpus.clone(),
        ip_b.to_string(),
    );
    let db = peer.run(move || {
        let addr = format!("{ip_b_s}:4791").parse().unwrap();
        let args: Vec<&str> = args_b.iter().map(|s| s.as_str()).collect();
        Daemon::spawn_on(&bin_b, addr, &args, cpus_b.as_deref())
    });
    let mut y = veth_node(db, ip_b, macs.1);
    let d = perf::rc_pingpong_wait(&mut x, &mut y, 64, a.iters, wait).expect("ping-pong");
    let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16).expect("write");
    (d.as_secs_f64() * 1e6, bw * 8.0 / 1e9)
}

/// A table of medians and ranges over rounds: the `head` row, then per row (name, index in
/// `m`, precision) the daemon without (`m[0]`) and with (`m[1]`) the option, their ratio, and
/// the kernel (`m[2]`) for the indices below `kernel_below`; names `width` wide.
fn range_table<const N: usize>(
    width: usize,
    head: [&str; 6],
    rows: &[(&str, usize, usize)],
    m: &mut [[Vec<f64>; N]; 3],
    kernel_below: usize,
) {
    let [h0, h1, h2, h3, h4, h5] = head;
    println!("{h0:<width$} {h1:>22} {h2:>22} {h3:>7} {h4:>22} {h5:>9}");
    for &(name, k, prec) in rows {
        let (w, t) = (med_range(&mut m[0][k]), med_range(&mut m[1][k]));
        let f = |v: (f64, f64, f64)| format!("{:.p$} ({:.p$}-{:.p$})", v.0, v.1, v.2, p = prec);
        let kernel = (k < kernel_below).then(|| med_range(&mut m[2][k]));
        println!(
            "{name:<width$} {:>22} {:>22} {:>6.2}x {:>22} {:>9}",
            f(w),
            f(t),
            t.0 / w.0,
            kernel.map_or(String::new(), f),
            kernel.map_or(String::new(), |kv| format!("{:.2}x", t.0 / kv.0)),
        );
    }
}

/// Median and range of `v`.
fn med_range(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// The transport table (`--only raw`): udp vs raw daemons on a veth pair between two
/// namespaces of its own.
fn raw_vs_udp(bin: &std::path::Path, a: &Args, wait: WaitMode) {
    if let Some(why) = netns::unavailable() {
        println!("raw vs udp: skipped: {why}");
        return;
    }
    let (bin, a2) = (
        bin.to_path_buf(),
        (
            a.iters,
            a.write_bytes,
            a.rounds,
            a.daemon_cpu,
            a.link.clone(),
        ),
    );
    let link = a.link.clone();
    let bin_in = bin.clone();
    let r = netns::run_in_new_netns(move || {
        let bin = bin_in;
        let a = Args {
            iters: a2.0,
            write_bytes: a2.1,
            rounds: a2.2.max(1),
            daemon_cpu: a2.3,
            link: a2.4,
            ..Args::parse_from(["vur-bench"])
        };
        let peer = netns::NsThread::new().expect("second namespace");
        let (na, ma) = VETH_A;
        let (nb, mb) = VETH_B;
        let netkit = a.link == "netkit";
        if netkit {
            // Made as a user would (rtnetlink); its MACs are the kernel's.
            let o = std::process::Command::new(&bin)
                .args(["link", "add", na, "--peer", nb, "--kind", "netkit"])
                .output()
                .map_err(|e| e.to_string())?;
            if !o.status.success() {
                return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
            }
        } else {
            netns::ip(&["link", "add", na, "type", "veth", "peer", "name", nb]).expect("veth");
        }
        netns::ip(&["link", "set", nb, "netns", &peer.tid.to_string()]).expect("move the peer");
        let (ma, mb) = (netns::mac_str(ma), netns::mac_str(mb));
        for (ns_ip, cmds) in [
            (
                false,
                vec![
                    vec!["link", "set", na, "address", &ma],
                    vec!["link", "set", na, "mtu", "9000"],
                    vec!["addr", "add", "10.79.3.1/24", "dev", na],
                    vec!["link", "set", na, "up"],
                ],
            ),
            (
                true,
                vec![
                    vec!["link", "set", nb, "address", &mb],
                    vec!["link", "set", nb, "mtu", "9000"],
                    vec!["addr", "add", "10.79.3.2/24", "dev", nb],
                    vec!["link", "set", nb, "up"],
                ],
            ),
        ] {
            let cmds: Vec<Vec<String>> = cmds
                .into_iter()
                // netkit keeps the MACs the kernel gave it
                .filter(|c| !(netkit && c[3] == "address"))
                .map(|c| c.into_iter().map(String::from).collect())
                .collect();
            let go = move || {
                for c in &cmds {
                    let c: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
                    netns::ip(&c).expect("ip");
                }
            };
            if ns_ip {
                peer.run(go);
            } else {
                go();
            }
        }
        let macs = (mac_of(na), peer.run(move || mac_of(nb)));
        let kinds = [None, Some("v3"), Some("v2")];
        let mut lat = vec![vec![]; kinds.len()];
        let mut bw = vec![vec![]; kinds.len()];
        for round in 0..a.rounds {
            let mut line = format!("round {}:", round + 1);
            for (i, k) in kinds.iter().enumerate() {
                let (l, b) = veth_pair_run(&bin, &peer, *k, macs, &a, wait);
                lat[i].push(l);
                bw[i].push(b);
                line += &format!(" {} {l:.1} us {b:.2} Gbit/s;", k.unwrap_or("udp"));
            }
            eprintln!("{line}");
        }
        let lat: Vec<_> = lat.iter_mut().map(|v| med_range(v)).collect();
        let bw: Vec<_> = bw.iter_mut().map(|v| med_range(v)).collect();
        Ok((lat, bw))
    })
    .and_then(|r| r);
    let Ok((lat, bw)) = r.inspect_err(|why| println!("raw vs udp: skipped: {why}")) else {
        return;
    };
    let cell = |m: (f64, f64, f64), p: usize| format!("{:.p$} ({:.p$}-{:.p$})", m.0, m.1, m.2);
    println!(
        "{:<28} {:>22} {:>22} {:>22}",
        format!("{link}, 2 namespaces"),
        "udp",
        "raw --raw-ring v3",
        "raw --raw-ring v2"
    );
    println!(
        "{:<28} {:>22} {:>22} {:>22}",
        "64 B RC SEND half RTT, us",
        cell(lat[0], 1),
        cell(lat[1], 1),
        cell(lat[2], 1)
    );
    println!(
        "{:<28} {:>22} {:>22} {:>22}",
        "64 KiB RC WRITE, Gbit/s",
        cell(bw[0], 2),
        cell(bw[1], 2),
        cell(bw[2], 2)
    );
    println!("median (min-max) of the rounds");
    println!(
        "rounds: {}; iterations: {}; WRITE bytes: {}; wait mode: {}; daemon: {}",
        a.rounds,
        a.iters,
        a.write_bytes,
        a.wait,
        bin.display()
    );
}

/// Messages in flight on each active pair of the scale table.
const SCALE_WINDOW: u32 = 16;

/// The scale table (`--only scale`).
fn scale(bin: &std::path::Path, a: &Args) {
    use vur_testguest::scale::{self, median};
    let (aa, ba) = loopback_pair(4791);
    let cpus = a.daemon_cpu.map(|c| [c]);
    let cpus = cpus.as_ref().map(|c| &c[..]);
    let max_qp = a.scale_qps.to_string();
    let extra = ["--mtu", "9000", "--max-qp", &max_qp];
    // Room for one SQ page per idle QP, and the active pairs' rings and buffers.
    let opts = vur_testguest::GuestOpts {
        mem_size: (64 << 20) + a.scale_qps as u64 * 2 * 4096,
        ..Default::default()
    };
    let mut x = Node::start_with(bin, aa, &extra, cpus, opts.clone()).expect("node a");
    let mut y = Node::start_with(bin, ba, &extra, cpus, opts).expect("node b");
    let pairs =
        scale::connect_active(&mut x, &mut y, a.scale_active, SCALE_WINDOW).expect("active pairs");
    let idle = a.scale_qps.saturating_sub(a.scale_active);
    // Warm-up: the first traffic on fresh QPs grows their queues.
    scale::run_traffic(
        &mut x,
        &mut y,
        &pairs,
        a.scale_messages / 10 + 1,
        SCALE_WINDOW,
    )
    .expect("warm-up");
    let rounds: Vec<scale::Round> = (0..a.rounds.max(1))
        .map(|_| {
            scale::round(&mut x, &mut y, &pairs, idle, a.scale_messages, SCALE_WINDOW)
                .unwrap_or_else(|e| {
                    for n in [&x, &y] {
                        eprintln!("{}", n.daemon.counters().unwrap_or_default());
                    }
                    panic!("scale round: {e}")
                })
        })
        .collect();
    let m = |f: fn(&scale::Round) -> f64| median(rounds.iter().map(f).collect());
    let (base_rate, loaded_rate) = (m(|r| r.base.msgs_per_s), m(|r| r.loaded.msgs_per_s));
    let (base_cpu, loaded_cpu) = (
        m(|r| r.base.daemon_cpu_ns_per_msg),
        m(|r| r.loaded.daemon_cpu_ns_per_msg),
    );
    let total = a.scale_qps;
    let act = a.scale_active;
    println!(
        "{:<46} {:>14} {:>14} {:>8}",
        "",
        format!("{act} QPs"),
        format!("{total} QPs"),
        "ratio"
    );
    let line = |name: &str, base: f64, loaded: f64, unit: &str, prec: usize| {
        let ratio = if base > 0.0 { loaded / base } else { 0.0 };
        println!("{name:<46} {base:>7.prec$} {unit:<6} {loaded:>7.prec$} {unit:<6} {ratio:>7.2}x");
    };
    line(
        &format!("64 B SEND rate, {act} pairs x {SCALE_WINDOW} outstanding"),
        base_rate / 1e3,
        loaded_rate / 1e3,
        "k/s",
        0,
    );
    line(
        "daemon CPU per message (both daemons)",
        base_cpu / 1e3,
        loaded_cpu / 1e3,
        "us",
        2,
    );
    // The first round grows the daemon's heap; later ones reuse what the destroyed QPs
    // freed: the largest is the cost of a QP in a fresh daemon.
    println!(
        "{:<46} {:>29.0} B",
        "daemon anonymous memory per idle QP",
        rounds.iter().map(|r| r.rss_per_idle_qp).fold(0.0, f64::max)
    );
    println!(
        "{:<46} {:>29.0} /s",
        "QP create (CREATE_QP)",
        m(|r| r.creates_per_s)
    );
    println!(
        "{:<46} {:>29.0} /s",
        "QP create + INIT/RTR/RTS",
        m(|r| r.bring_ups_per_s)
    );
    println!(
        "{:<46} {:>29.0} /s",
        "QP destroy (DESTROY_QP)",
        m(|r| r.destroys_per_s)
    );
    println!(
        "medians of {} rounds, {} messages each; {} idle QPs per daemon; daemon: {}",
        rounds.len(),
        a.scale_messages,
        idle,
        bin.display()
    );
}

fn main() {
    let a = Args::parse();
    let Some(bin) = a.daemon.clone().or_else(find_daemon) else {
        eprintln!("vur-bench: daemon binary not found (build vur-daemon or set VUR_DAEMON)");
        std::process::exit(2);
    };
    let wait = if a.wait == "event" {
        WaitMode::Event
    } else {
        WaitMode::Spin
    };
    if let Some(c) = a.daemon_cpu {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let others: Vec<usize> = (0..n).filter(|&x| x != c).collect();
        if !others.is_empty() {
            vur_testguest::pin_current_thread(&others).expect("sched_setaffinity");
        }
    }
    if a.only
        .as_deref()
        .is_some_and(|only| own_table(only, &bin, &a, wait))
    {
        return;
    }
    let ours = run_daemon(&bin, &a, wait, None);
    let polled = a.poll_us.map(|p| run_daemon(&bin, &a, wait, Some(p)));
    let other = a.compare.as_ref().map(|c| run_daemon(c, &a, wait, None));
    let k = kernel_row(&a);
    print_table(&bin, &a, &ours, &k, other, polled);
}

/// Runs the benchmark `only` names if it has a table of its own (true), else nothing (false).
fn own_table(only: &str, bin: &std::path::Path, a: &Args, wait: WaitMode) -> bool {
    match only {
        "scale" => scale(bin, a),
        "raw" => raw_vs_udp(bin, a, wait),
        "same-host" => same_host_table(bin, a),
        "io-thread" => io_thread_table(bin, a, wait),
        "shard-threads" => shard_threads_table(bin, a),
        "gso" => {
            gso_table(a);
            gso_daemon_table(bin, a);
        }
        _ => return false,
    }
    true
}

/// The kernel's counterparts of the measurements `a.only` asks for.
fn kernel_row(a: &Args) -> Row {
    let want = |w: &str| a.only.as_deref().is_none_or(|o| o == w);
    let mut k = Row::default();
    if want("pingpong") {
        k.half_rtt_us = perf::udp_pingpong(64, a.iters).expect("udp").as_secs_f64() * 1e6;
    }
    if want("write") {
        k.write_gbit = perf::tcp_stream(64 << 10, a.write_bytes).expect("tcp") * 8.0 / 1e9;
    }
    if want("write") {
        k.write_same_gbit = Some(perf::memcpy_bw(64 << 10, a.write_bytes) * 8.0 / 1e9);
    }
    if want("rate") {
        k.msg_rate = udp_rate(64, a.messages, RATE_WINDOW as u64).expect("udp stream");
    }
    k
}

/// The main table: ours, the kernel, their ratio, the compare column and the poll-mode column.
fn print_table(
    bin: &std::path::Path,
    a: &Args,
    ours: &Row,
    k: &Row,
    other: Option<Row>,
    polled: Option<Row>,
) {
    let want = |w: &str| a.only.as_deref().is_none_or(|o| o == w);
    let cmp_hdr = if other.is_some() { "compare" } else { "" };
    let poll_hdr = a
        .poll_us
        .map_or(String::new(), |p| format!("poll {p} us   ratio"));
    println!(
        "{:<34} {:>16} {:>16} {:>8} {:>16} {:>24}",
        "", "vhost-user-rdma", "kernel", "ratio", cmp_hdr, poll_hdr
    );
    // ours, kernel, ratio; the compare column; the poll-mode column and its ratio to the kernel.
    let line = |name: &str, v: f64, kv: f64, o: Option<f64>, p: Option<f64>, unit: &str, prec| {
        let ratio = |x: f64| if kv > 0.0 { x / kv } else { 0.0 };
        let o = o.map_or(" ".repeat(16), |o| format!("{o:>9.prec$} {unit:<6}"));
        let p = p.map_or(String::new(), |p| {
            format!("{p:>9.prec$} {unit:<6} {:>7.2}x", ratio(p))
        });
        println!(
            "{name:<34} {v:>9.prec$} {unit:<6} {kv:>9.prec$} {unit:<6} {:>7.2}x {o} {p}",
            ratio(v)
        );
    };
    if want("pingpong") {
        line(
            "64 B RC SEND half RTT (UDP pp)",
            ours.half_rtt_us,
            k.half_rtt_us,
            other.map(|o| o.half_rtt_us),
            polled.map(|o| o.half_rtt_us),
            "us",
            1,
        );
        match ours.half_rtt_same_us {
            Some(v) => line(
                "  --same-host (UDP pp)",
                v,
                k.half_rtt_us,
                other.as_ref().and_then(|o| o.half_rtt_same_us),
                polled.as_ref().and_then(|o| o.half_rtt_same_us),
                "us",
                1,
            ),
            None => println!(
                "  one daemon, --same-host: not measured (the daemon did not start two devices, or their packets did not cross in memory)"
            ),
        }
    }
    if want("write") {
        line(
            "64 KiB RC WRITE (TCP stream)",
            ours.write_gbit,
            k.write_gbit,
            other.map(|o| o.write_gbit),
            polled.map(|o| o.write_gbit),
            "Gbit/s",
            2,
        );
        // The same WRITEs with --udp-gso, per family.
        type Pick = fn(&Row) -> Option<f64>;
        let gso_rows: [(&str, Pick); 2] = [
            ("  IPv4, --udp-gso", |r| r.write4_gso_gbit),
            ("  IPv6 ::1, --udp-gso", |r| r.write6_gbit),
        ];
        for (name, of) in gso_rows {
            match of(ours) {
                Some(w) => line(
                    &format!("{name} (TCP stream)"),
                    w,
                    k.write_gbit,
                    other.as_ref().and_then(of),
                    polled.as_ref().and_then(of),
                    "Gbit/s",
                    2,
                ),
                None => println!(
                    "{name}: not measured (the address cannot be bound, a daemon did not start, or it made no GSO send)"
                ),
            }
        }
    }
    if want("write") {
        if let Some(ws) = ours.write_same_gbit {
            line(
                "64 KiB WRITE, --same-host (memcpy)",
                ws,
                k.write_same_gbit.unwrap_or(0.0),
                other.and_then(|o| o.write_same_gbit),
                polled.and_then(|o| o.write_same_gbit),
                "Gbit/s",
                2,
            );
        } else {
            println!(
                "  one daemon, --same-host: not measured (the daemon did not start two devices)"
            );
        }
    }
    if want("rate") {
        line(
            "64 B RC SEND rate (UDP stream)",
            ours.msg_rate / 1e3,
            k.msg_rate / 1e3,
            other.map(|o| o.msg_rate / 1e3),
            polled.map(|o| o.msg_rate / 1e3),
            "k/s",
            0,
        );
    }
    if want("ctrl") {
        // no kernel counterpart: the reference is the same command on the idle device
        let c = |r: &Row| {
            format!(
                "{:.1} us idle, {:.1} us (p99 {:.1}) loaded",
                r.ctrl_us[0], r.ctrl_us[1], r.ctrl_us[2]
            )
        };
        println!(
            "{:<34} {}  ratio {:.2}x",
            "QUERY_PORT under 16 x 64 KiB WRITEs",
            c(ours),
            ours.ctrl_us[1] / ours.ctrl_us[0].max(1e-9)
        );
        if let Some(o) = &other {
            println!("{:<34} {}", "  compare", c(o));
        }
        if let Some(p) = &polled {
            println!("{:<34} {}", "  poll mode", c(p));
        }
    }
    println!("wait mode: {}; daemon: {}", a.wait, bin.display());
    if let Some(c) = &a.compare {
        println!("compare: {}", c.display());
    }
    if let Some(p) = a.poll_us {
        println!("poll mode column: the same daemon with --poll-us {p}");
    }
}
