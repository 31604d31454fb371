//! Every ICRC is checked on the interop transport, over real loopback
//! sockets, for IPv4 and IPv6.
//!
//! A bit flipped in a covered field after the sender computed the ICRC is modelled the way a
//! UDP-socket receiver meets it: header fields the receiver sees (addresses, ports, lengths)
//! and those it assumes as rxe sends them (IPv4 DF and fragment offset 0, protocol UDP) are
//! flipped in the header the ICRC is computed over; the RoCE packet (BTH, payload, ICRC) is
//! flipped in the datagram itself. Each must be dropped and counted in `rx_icrc_bad`; flips in
//! the masked fields (TOS / traffic class, TTL / hop limit, flow label, checksums, FECN/BECN)
//! and any IPv4 identification must pass. The IPv4 identification is not a flip target: the
//! receiver cannot see it and solves for it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use rxe_core::icrc;
use rxe_core::mem::Backing;
use rxe_core::verbs::*;
use rxe_core::wire::frame::{encap, FrameMeta};
use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode, Packet, Syndrome};
use rxe_core::{DeviceConfig, Gid};
use vur_interop::peer::Peer;
use vur_interop::udp::{UdpTransport, ROCE_PORT};

/// A SEND ONLY with `PLEN` bytes of payload that carry `marker`.
const PLEN: usize = 64;

fn roce(marker: u32, dest_qp: u32, psn: u32) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let bth = BthRepr::new(Opcode::RC_SEND_ONLY, dest_qp, psn, true);
    let (n, r) = emit(&mut buf, &bth, &ExtRepr::default(), PLEN).unwrap();
    for (i, b) in buf[r].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7) ^ marker.to_le_bytes()[i % 4];
    }
    buf.truncate(n);
    buf
}

/// The IP + UDP header a datagram from `src` to `dst` travels in, with IPv4 identification
/// `id` (rxe picks it by hash; the receiver cannot see it).
fn l3l4(src: SocketAddr, dst: SocketAddr, roce_len: usize, id: u16) -> Vec<u8> {
    let mut m = FrameMeta::new(src.ip(), dst.ip(), src.port());
    m.dport = dst.port();
    m.ipv4_id = id;
    m.traffic_class = 0x02;
    m.hop_limit = 64;
    let h = m.header_len().unwrap();
    let mut buf = vec![0u8; h + roce_len];
    encap(&mut buf, &m, roce_len).unwrap();
    buf.truncate(h);
    buf
}

/// `pkt` with its ICRC filled for header `hdr`.
fn with_icrc(hdr: &[u8], mut pkt: Vec<u8>) -> Vec<u8> {
    icrc::fill(hdr, &mut pkt).unwrap();
    pkt
}

struct Rig {
    rx: UdpTransport,
    tx: UdpSocket,
    buf: Vec<u8>,
    marker: u32,
}

impl Rig {
    fn new(ip: IpAddr) -> Rig {
        let rx = UdpTransport::bind(ip, 0).expect("bind receiver");
        let tx = UdpSocket::bind(SocketAddr::new(ip, 0)).expect("bind sender");
        Rig {
            rx,
            tx,
            buf: vec![0; 65536],
            marker: 0,
        }
    }

    fn ends(&self) -> (SocketAddr, SocketAddr) {
        (self.tx.local_addr().unwrap(), self.rx.local())
    }

    fn next_packet(&mut self) -> Vec<u8> {
        self.marker += 1;
        roce(self.marker, 0x11, self.marker)
    }

    fn send(&self, pkt: &[u8]) {
        self.tx.send_to(pkt, self.rx.local()).unwrap();
    }

    /// Receives until `want` comes out; every datagram handed out before it fails the test.
    fn expect(&mut self, want: &[u8], what: &str) {
        for _ in 0..64 {
            if let Some((n, from)) = self.rx.recv(&mut self.buf, Duration::from_secs(2)).unwrap() {
                assert_eq!(from, self.tx.local_addr().unwrap());
                assert_eq!(
                    &self.buf[..n],
                    want,
                    "{what}: a corrupted datagram got through"
                );
                return;
            }
        }
        panic!("{what}: the good datagram never came");
    }

    /// Sends one datagram per entry of `bad` (each must be dropped), then a good one (which
    /// must come out next); checks the counters.
    fn all_dropped(&mut self, bad: Vec<Vec<u8>>, what: &str) {
        assert!(!bad.is_empty());
        let before = self.rx.stats();
        for p in &bad {
            self.send(p);
        }
        let (s, d) = self.ends();
        let good = self.next_packet();
        let good = with_icrc(&l3l4(s, d, good.len(), 0x5151), good);
        self.send(&good);
        self.expect(&good, what);
        let after = self.rx.stats();
        assert_eq!(
            after.rx_icrc_bad - before.rx_icrc_bad,
            bad.len() as u64,
            "{what}: every corrupted datagram counted"
        );
        assert_eq!(after.rx_icrc_ok - before.rx_icrc_ok, 1, "{what}");
    }

    /// Each datagram of `good` must come out as it was sent.
    fn all_accepted(&mut self, good: Vec<Vec<u8>>, what: &str) {
        let before = self.rx.stats();
        for p in &good {
            self.send(p);
            self.expect(p, what);
        }
        let after = self.rx.stats();
        assert_eq!(after.rx_icrc_bad, before.rx_icrc_bad, "{what}");
        assert_eq!(after.rx_icrc_ok - before.rx_icrc_ok, good.len() as u64);
    }

    /// One datagram per bit of `bytes` in the header the ICRC is computed over, flipped.
    fn header_flips(&mut self, bytes: std::ops::Range<usize>, id: u16) -> Vec<Vec<u8>> {
        let (s, d) = self.ends();
        let mut out = Vec::new();
        for byte in bytes {
            for bit in 0..8 {
                let p = self.next_packet();
                let mut h = l3l4(s, d, p.len(), id);
                h[byte] ^= 1 << bit;
                out.push(with_icrc(&h, p));
            }
        }
        out
    }

    /// One datagram per bit of `bytes` of the RoCE packet, flipped after the ICRC was filled.
    fn packet_flips(&mut self, bytes: &[usize], id: u16) -> Vec<Vec<u8>> {
        let (s, d) = self.ends();
        let mut out = Vec::new();
        for &byte in bytes {
            for bit in 0..8 {
                let p = self.next_packet();
                let mut p = with_icrc(&l3l4(s, d, p.len(), id), p);
                let i = if byte == usize::MAX {
                    p.len() - 1
                } else {
                    byte
                };
                p[i] ^= 1 << bit;
                out.push(p);
            }
        }
        out
    }
}

/// BTH bytes (all but byte 4, which holds the masked FECN/BECN/resv6), a spread of payload
/// bytes, and the ICRC.
fn roce_flip_targets() -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let bth: Vec<usize> = (0..12).filter(|&b| b != 4).collect();
    let payload: Vec<usize> = (12..12 + PLEN).step_by(5).collect();
    let icrc: Vec<usize> = (12 + PLEN..12 + PLEN + 4).collect();
    (bth, payload, icrc)
}

fn covered_roce_fields(rig: &mut Rig, id: u16) {
    let (bth, payload, icrc) = roce_flip_targets();
    let f = rig.packet_flips(&bth, id);
    rig.all_dropped(f, "BTH");
    let f = rig.packet_flips(&payload, id);
    rig.all_dropped(f, "payload");
    let f = rig.packet_flips(&icrc, id);
    rig.all_dropped(f, "ICRC");
}

#[test]
fn ipv4_every_covered_field_flip_is_dropped_and_counted() {
    let mut rig = Rig::new(IpAddr::V4(Ipv4Addr::new(127, 0, 81, 1)));
    for id in [0, 0x3c7a] {
        // IPv4: total length, flags + fragment offset, protocol, source, destination.
        for (what, r) in [
            ("IPv4 total length", 2..4),
            ("IPv4 flags/fragment", 6..8),
            ("IPv4 protocol", 9..10),
            ("IPv4 source", 12..16),
            ("IPv4 destination", 16..20),
            ("UDP source port", 20..22),
            ("UDP destination port", 22..24),
            ("UDP length", 24..26),
        ] {
            let f = rig.header_flips(r, id);
            rig.all_dropped(f, what);
        }
        covered_roce_fields(&mut rig, id);
    }
}

#[test]
fn ipv6_every_covered_field_flip_is_dropped_and_counted() {
    let mut rig = Rig::new(IpAddr::V6(Ipv6Addr::LOCALHOST));
    for (what, r) in [
        ("IPv6 payload length", 4..6),
        ("IPv6 next header", 6..7),
        ("IPv6 source", 8..24),
        ("IPv6 destination", 24..40),
        ("UDP source port", 40..42),
        ("UDP destination port", 42..44),
        ("UDP length", 44..46),
    ] {
        let f = rig.header_flips(r, 0);
        rig.all_dropped(f, what);
    }
    covered_roce_fields(&mut rig, 0);
}

#[test]
fn masked_fields_and_any_ipv4_id_are_accepted() {
    for ip in [
        IpAddr::V4(Ipv4Addr::new(127, 0, 81, 2)),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ] {
        let mut rig = Rig::new(ip);
        let masked: &[std::ops::Range<usize>] = if ip.is_ipv4() {
            // TOS, TTL, header checksum, UDP checksum.
            &[1..2, 8..9, 10..12, 26..28]
        } else {
            // Traffic class + flow label (not the version nibble), hop limit, UDP checksum.
            &[1..4, 7..8, 46..48]
        };
        for r in masked {
            let f = rig.header_flips(r.clone(), 0x0102);
            rig.all_accepted(f, "masked header field");
        }
        if ip.is_ipv6() {
            // The traffic class's high nibble shares byte 0 with the version.
            let (s, d) = rig.ends();
            let f: Vec<_> = (0..4)
                .map(|bit| {
                    let p = rig.next_packet();
                    let mut h = l3l4(s, d, p.len(), 0);
                    h[0] ^= 1 << bit;
                    with_icrc(&h, p)
                })
                .collect();
            rig.all_accepted(f, "IPv6 traffic class");
        }
        let f = rig.packet_flips(&[4], 0x0102);
        rig.all_accepted(f, "FECN/BECN/resv6");
        // Any IPv4 identification (rxe's is a hash); IPv6 has none.
        let (s, d) = rig.ends();
        let f: Vec<_> = [0u16, 1, 0x8000, 0xffff, 0x1234]
            .into_iter()
            .map(|id| {
                let p = rig.next_packet();
                with_icrc(&l3l4(s, d, p.len(), id), p)
            })
            .collect();
        rig.all_accepted(f, "IPv4 identification");
        // The real header's masked fields changed by the sender's kernel.
        let fd = rig.tx.as_raw_fd();
        let set = |level, name, v: i32| {
            // SAFETY: `v` outlives the call and the length passed is its size.
            let r = unsafe {
                libc::setsockopt(
                    fd,
                    level,
                    name,
                    (&v as *const i32).cast(),
                    std::mem::size_of::<i32>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0, "setsockopt");
        };
        if ip.is_ipv4() {
            set(libc::IPPROTO_IP, libc::IP_TOS, 0xb8);
            set(libc::IPPROTO_IP, libc::IP_TTL, 3);
        } else {
            set(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, 0xb8);
            set(libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, 3);
        }
        let p = rig.next_packet();
        let p = with_icrc(&l3l4(s, d, p.len(), 0x7777), p);
        rig.all_accepted(vec![p], "TOS/TTL set by the sender");
    }
}

/// The case rxe and the engine disagreed on: a SEND with a corrupted ICRC reached
/// the engine behind the interop transport, was ACKed and completed successfully. Now it is
/// dropped before the engine sees it, and the same SEND with a good ICRC is delivered.
#[test]
fn a_send_with_a_corrupted_icrc_reaches_no_application() {
    let me = IpAddr::V4(Ipv4Addr::new(127, 0, 81, 10));
    let them = IpAddr::V4(Ipv4Addr::new(127, 0, 81, 11));
    let mut p = Peer::new(me, DeviceConfig::default(), 1 << 16).expect("bind peer");
    let remote = UdpSocket::bind(SocketAddr::new(them, ROCE_PORT)).expect("bind remote");
    remote
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let d = &mut p.dev;
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    let base = vur_interop::peer::MEM_BASE;
    let lkey = d
        .reg_mr(
            pd,
            base,
            4096,
            Access::LOCAL_WRITE,
            Backing::Contiguous { base },
        )
        .unwrap();
    let qpn = d
        .create_qp(rxe_core::QpInit {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::LOCAL_WRITE,
        ..Default::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::M1024;
    a.dest_qp_num = 0x77;
    a.rq_psn = 0x500;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.av = Av {
        dgid: Gid::from_ip(them),
        sgid_index: 0,
        hop_limit: 64,
        ..Default::default()
    };
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
    for wr_id in 1..=2 {
        d.post_recv(
            qpn,
            RecvWr {
                wr_id,
                sg_list: vec![Sge {
                    addr: base,
                    length: 4096,
                    lkey,
                }]
                .into(),
            },
        )
        .unwrap();
    }
    let from = remote.local_addr().unwrap();
    let to = SocketAddr::new(me, ROCE_PORT);
    // rxe's IPv4 identification is a hash: use some non-zero one.
    let pkt = roce(9, qpn.0, 0x500);
    let send = with_icrc(&l3l4(from, to, pkt.len(), 0x2bad), pkt);
    let mut bad = send.clone();
    bad[20] ^= 0x01; // one payload bit
    let mut ack = [0u8; 256];
    remote.send_to(&bad, to).unwrap();
    for _ in 0..5 {
        p.pump(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(p.udp.stats().rx_icrc_bad, 1);
    assert!(
        p.dev.poll_cq(cq).is_none(),
        "no completion for a corrupted SEND"
    );
    assert!(
        remote.recv_from(&mut ack).is_err(),
        "no ACK for a corrupted SEND"
    );
    assert_eq!(p.dev.qp_counters(qpn).unwrap().rx_packets, 0);

    remote.send_to(&send, to).unwrap();
    for _ in 0..5 {
        p.pump(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(p.udp.stats().rx_icrc_ok, 1);
    let c = p.dev.poll_cq(cq).expect("the good SEND completes");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (1, WcStatus::Success, PLEN as u32)
    );
    let (n, _) = remote.recv_from(&mut ack).expect("the good SEND is ACKed");
    let pkt = Packet::new_checked(&ack[..n]).unwrap();
    assert_eq!(pkt.opcode(), Opcode::RC_ACKNOWLEDGE);
    assert_eq!(pkt.bth().psn(), 0x500);
    assert_eq!(pkt.aeth().unwrap().syndrome().to_byte(), Syndrome::ACK);
}
