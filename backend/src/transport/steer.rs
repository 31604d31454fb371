//! A group of UDP sockets on one address among which the kernel steers RoCE packets by the
//! BTH's destination QPN: socket `k` of `n` receives the packets whose QPN is `k` modulo `n`,
//! the engine shard that QPN lives in (`rxe_core::Device::shard_of`). Each shard's worker can
//! then read its own socket and never hand a packet to another shard.
//!
//! The sockets share the port with `SO_REUSEPORT`; a classic BPF program attached to the group
//! (`SO_ATTACH_REUSEPORT_CBPF`) returns the socket index. For UDP the kernel runs it with the
//! packet's data starting at the UDP payload, where the BTH is: bytes 5..8 are the QPN. A
//! datagram too short to hold them ends the program with 0 (socket 0), and an index the group
//! does not have falls back to the kernel's hash; neither can happen to a BTH.
//!
//! The group lives and dies whole: closing one socket would move the last one into its index.

use std::io;
use std::net::{SocketAddr, UdpSocket};

use crate::sys::setsockopt;

/// `SO_ATTACH_REUSEPORT_CBPF` (asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

// Classic BPF opcodes (linux/bpf_common.h): BPF_LD (0) | BPF_W (0) | BPF_ABS (0x20), ...
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_ALU_AND_K: u16 = 0x04 | 0x50;
const BPF_ALU_MOD_K: u16 = 0x04 | 0x90;
const BPF_RET_A: u16 = 0x06 | 0x10;

/// The program: A = the 32-bit word at BTH offset 4 (reserved byte and QPN, network order);
/// A &= 0xffffff; A %= n; return A.
fn qpn_program(n: u32) -> [libc::sock_filter; 4] {
    let ins = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    [
        ins(BPF_LD_W_ABS, 4),
        ins(BPF_ALU_AND_K, 0x00ff_ffff),
        ins(BPF_ALU_MOD_K, n),
        ins(BPF_RET_A, 0),
    ]
}

/// One non-blocking UDP socket with `SO_REUSEPORT`, bound to `addr`.
fn reuseport_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let fd = crate::sys::bound_udp_socket(addr, |fd| {
        setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEPORT,
            &(1 as libc::c_int),
        )
    })?;
    Ok(UdpSocket::from(fd))
}

/// `n` (1 to 64) non-blocking UDP sockets bound to `addr` (port 0: one the kernel picks,
/// the same for all), the kernel steering each RoCE packet to socket `QPN % n`.
pub fn bind_steered(addr: SocketAddr, n: u32) -> io::Result<Vec<UdpSocket>> {
    if !(1..=64).contains(&n) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a steered socket group has 1 to 64 sockets, not {n}"),
        ));
    }
    let first = reuseport_socket(addr)?;
    let at = first.local_addr()?;
    let mut socks = vec![first];
    for _ in 1..n {
        socks.push(reuseport_socket(at)?);
    }
    let prog = qpn_program(n);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // `fprog` points at `prog`, which outlives the call (the kernel copies the program).
    setsockopt(
        std::os::fd::AsRawFd::as_raw_fd(&socks[0]),
        libc::SOL_SOCKET,
        SO_ATTACH_REUSEPORT_CBPF,
        &fprog,
    )?;
    Ok(socks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A BTH (and a little payload) for destination QP `qpn`.
    fn bth(qpn: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = 0x04; // RC SEND ONLY
        b[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
        b[4] = 0xc0; // FECN and BECN set: the mask must keep them out of the index
        b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        b
    }

    fn steer(addr: &str, n: u32) {
        let socks = bind_steered(addr.parse().unwrap(), n).unwrap();
        let at = socks[0].local_addr().unwrap();
        assert!(socks.iter().all(|s| s.local_addr().unwrap() == at));
        let any: SocketAddr = if at.is_ipv4() {
            "127.0.0.1:0"
        } else {
            "[::1]:0"
        }
        .parse()
        .unwrap();
        let tx = UdpSocket::bind(any).unwrap();
        // QPNs across the 24 bits, the high ones included.
        let qpns: Vec<u32> = (0x11..0x11 + 40).chain([0xff_fffe, 0xab_cdef]).collect();
        for &q in &qpns {
            tx.send_to(&bth(q), at).unwrap();
        }
        let mut got: Vec<Vec<u32>> = vec![Vec::new(); n as usize];
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 64];
        while got.iter().map(Vec::len).sum::<usize>() < qpns.len() {
            assert!(
                Instant::now() < deadline,
                "waited 5 s for {} datagrams sent to {at} over loopback, {} came",
                qpns.len(),
                got.iter().map(Vec::len).sum::<usize>()
            );
            let mut any = false;
            for (k, s) in socks.iter().enumerate() {
                while let Ok(len) = s.recv(&mut buf) {
                    assert_eq!(len, 16);
                    got[k].push(u32::from_be_bytes([0, buf[5], buf[6], buf[7]]));
                    any = true;
                }
            }
            if !any {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        for (k, g) in got.iter().enumerate() {
            let want: Vec<u32> = qpns.iter().copied().filter(|q| q % n == k as u32).collect();
            assert_eq!(g, &want, "socket {k} of {n}");
        }
    }

    #[test]
    fn each_packet_goes_to_the_socket_of_its_qpns_shard() {
        steer("127.0.0.1:0", 2);
        steer("127.0.0.1:0", 3);
        steer("[::1]:0", 4);
    }

    #[test]
    fn a_group_of_one_takes_everything_and_sizes_are_checked() {
        steer("127.0.0.1:0", 1);
        assert!(bind_steered("127.0.0.1:0".parse().unwrap(), 0).is_err());
        assert!(bind_steered("127.0.0.1:0".parse().unwrap(), 65).is_err());
    }
}
