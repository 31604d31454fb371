//! `rxe-blast`: a RoCEv2 packet source for rate measurements. Sends the same RC SEND_ONLY
//! datagram (BTH to `--qpn`, `--size` payload bytes, a correct ICRC) from a UDP socket on
//! `--local-ip` to `--dst`:4791 as fast as the kernel takes it, with `sendmmsg` in batches,
//! for `--duration` seconds, then prints one line:
//!
//! ```text
//! rxe-blast --local-ip 10.77.8.1 --dst 10.77.8.2 [--size 64] [--duration 1] [--qpn 0x11]
//! sent 812345 packets of 64 B payload in 1.000 s: 812345 packets/s; 0.990 s CPU: 820550 packets per CPU second (0 ENOBUFS)
//! rxe-blast --local-ip 10.77.8.2 --sink SECS   # bind 4791 and read nothing (no ICMP back)
//! ```
//!
//! Nothing here is a RoCE endpoint: the receiver is expected to drop the packets (`--sink`
//! binds the port with the smallest receive buffer so the kernel does, without answering).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rxe_core::wire::frame::icrc_for_udp_socket;

const BATCH: usize = 64;

fn usage() -> ExitCode {
    eprintln!(
        "usage: rxe-blast --local-ip IP --dst IP [--size BYTES] [--duration SECS] [--qpn N]\n       rxe-blast --local-ip IP --sink SECS"
    );
    ExitCode::from(2)
}

fn set_int(fd: i32, level: i32, opt: i32, v: i32) -> std::io::Result<()> {
    // SAFETY: `v` outlives the call and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const i32).cast(),
            core::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// CPU time of this thread (user + system, which includes the kernel's transmit path and the
/// receive processing it runs inline on this CPU), in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut local, mut dst, mut sink): (Option<IpAddr>, Option<IpAddr>, Option<f64>) =
        (None, None, None);
    let (mut size, mut duration, mut qpn) = (64usize, 1.0f64, 0x11u32);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        let ok = match a.as_str() {
            "--local-ip" => val().parse().map(|v| local = Some(v)).is_ok(),
            "--dst" => val().parse().map(|v| dst = Some(v)).is_ok(),
            "--sink" => val().parse().map(|v| sink = Some(v)).is_ok(),
            "--size" => val().parse().map(|v| size = v).is_ok(),
            "--duration" => val().parse().map(|v| duration = v).is_ok(),
            "--qpn" => parse_num(&val())
                .filter(|&v| v <= 0xff_ffff)
                .map(|v| qpn = v as u32)
                .is_some(),
            _ => false,
        };
        if !ok {
            eprintln!("rxe-blast: bad argument {a:?}");
            return usage();
        }
    }
    let Some(local) = local else { return usage() };
    if let Some(secs) = sink {
        let sock = match UdpSocket::bind(SocketAddr::new(local, 4791)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("rxe-blast: cannot bind {local}:4791: {e}");
                return ExitCode::FAILURE;
            }
        };
        // The kernel rounds this up to its minimum; what does not fit is dropped, silently.
        let _ = set_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 1);
        std::thread::sleep(Duration::from_secs_f64(secs.clamp(0.0, 3600.0)));
        return ExitCode::SUCCESS;
    }
    let Some(dst) = dst else { return usage() };
    if !((1..=8192).contains(&size) && duration > 0.0 && duration <= 600.0) {
        eprintln!("rxe-blast: --size 1..=8192, --duration 0..600");
        return ExitCode::from(2);
    }
    let sock = match UdpSocket::bind(SocketAddr::new(local, 0)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rxe-blast: cannot bind {local}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let fd = sock.as_raw_fd();
    // DF set and IPv4 identification 0, so the ICRC computed below is the one on the wire.
    if local.is_ipv4() {
        if let Err(e) = set_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        ) {
            eprintln!("rxe-blast: IP_MTU_DISCOVER: {e}");
            return ExitCode::FAILURE;
        }
    }
    let to = SocketAddr::new(dst, 4791);
    if let Err(e) = sock.connect(to) {
        eprintln!("rxe-blast: connect {to}: {e}");
        return ExitCode::FAILURE;
    }
    let from = sock.local_addr().expect("bound socket has an address");
    // BTH: RC SEND_ONLY, P_Key 0xffff, destination QP, PSN 0; the payload; the ICRC.
    let mut pkt = vec![0u8; 12 + size + 4];
    pkt[0] = 0x04;
    pkt[2..4].copy_from_slice(&[0xff, 0xff]);
    pkt[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    for (i, b) in pkt[12..12 + size].iter_mut().enumerate() {
        *b = i as u8;
    }
    if let Err(e) = icrc_for_udp_socket(from, to, &mut pkt) {
        eprintln!("rxe-blast: ICRC: {e:?}");
        return ExitCode::FAILURE;
    }
    let mut iov = libc::iovec {
        iov_base: pkt.as_mut_ptr().cast(),
        iov_len: pkt.len(),
    };
    // SAFETY: mmsghdr is plain data; all-zero is a valid value (no name, no control).
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    for m in &mut msgs {
        m.msg_hdr.msg_iov = &mut iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    let limit = Duration::from_secs_f64(duration);
    let cpu0 = thread_cpu_ns();
    let start = Instant::now();
    let mut sent: u64 = 0;
    let mut errors: u64 = 0;
    while start.elapsed() < limit {
        // SAFETY: `msgs` holds BATCH valid headers whose iovec points at `pkt`; both outlive
        // the call.
        let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), BATCH as libc::c_uint, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            // A full queue on the way (ENOBUFS) is the rate limit, not a failure.
            if e.raw_os_error() != Some(libc::ENOBUFS) {
                eprintln!("rxe-blast: sendmmsg: {e}");
                return ExitCode::FAILURE;
            }
            errors += 1;
            continue;
        }
        sent += n as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = (thread_cpu_ns() - cpu0) as f64 / 1e9;
    println!(
        "sent {sent} packets of {size} B payload in {secs:.3} s: {:.0} packets/s; {cpu:.3} s CPU: {:.0} packets per CPU second ({errors} ENOBUFS)",
        sent as f64 / secs,
        sent as f64 / cpu.max(1e-9)
    );
    ExitCode::SUCCESS
}
