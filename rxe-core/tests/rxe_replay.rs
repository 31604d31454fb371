//! Byte-for-byte wire equivalence with Linux rxe.
//!
//! The golden capture (`tests/data/rxe-6.12-capture.pcap`, two rxe 6.12 guests, see its README)
//! is replayed with our engine standing in for guest A (10.77.0.2): every packet guest B sent is
//! fed to our device, and every packet guest A sent must come out of our device identical —
//! BTH, extension headers, payload and pad — and, encapsulated with A's IP header (its IPv4
//! identification and TTL), identical to the captured frame down to the ICRC. That pins opcode
//! choice, AckReq, MSN, syndromes, PSNs, the UDP source port and READ response segmentation to
//! what rxe does.
//!
//! B's requests carry rxe's R_Keys; ours differ, so RETH/AtomicETH R_Keys are rewritten to the
//! key of the MR we registered at the same IOVA before the packet is fed in. Memory behind that
//! MR is filled with what A's READ responses and atomic ACKs show A's memory held.

use std::collections::HashMap;
use std::net::IpAddr;

use rxe_core::device::RecvMeta;
use rxe_core::mem::{Backing, VecMemory};
use rxe_core::pcap::PcapReader;
use rxe_core::verbs::*;
use rxe_core::wire::frame::{self, FrameMeta};
use rxe_core::wire::{OpFlags, Packet};
use rxe_core::{Device, DeviceConfig, Gid, Instant, QpInit};

struct Frame {
    no: usize,
    raw: Vec<u8>,
    meta: FrameMeta,
    roce: Vec<u8>,
}

fn load() -> Vec<Frame> {
    let bytes = include_bytes!("data/rxe-6.12-capture.pcap");
    let r = PcapReader::new(&bytes[..]).unwrap();
    r.enumerate()
        .map(|(i, rec)| {
            let rec = rec.unwrap();
            let (meta, roce) = frame::parse_frame(&rec.data, true).unwrap();
            let roce = roce.to_vec();
            Frame {
                no: i + 1,
                raw: rec.data,
                meta,
                roce,
            }
        })
        .collect()
}

const A4: [u8; 4] = [10, 77, 0, 2];

fn is_a(f: &Frame) -> bool {
    match f.meta.src_ip {
        IpAddr::V4(a) => a.octets() == A4,
        IpAddr::V6(a) => a.octets()[15] == 2 && a.octets()[0] == 0xfd,
    }
}

fn pkt(f: &Frame) -> Packet<&[u8]> {
    Packet::new_checked(&f.roce[..]).unwrap()
}

const MEM_BASE: u64 = 0x4000_0000;

/// Replays frames `first..=last` (1-based, as in the capture's README) with our device as A.
fn replay(first: usize, last: usize, qp_type: QpType) -> usize {
    replay_with(first, last, qp_type, true)
}

/// `drain_each`: take our packets out after every packet from B (as rxe's responder does);
/// otherwise feed B's packets until A's next one is due, so responses queue up in our engine.
fn replay_with(first: usize, last: usize, qp_type: QpType, drain_each: bool) -> usize {
    let all = load();
    let frames: Vec<&Frame> = all
        .iter()
        .filter(|f| f.no >= first && f.no <= last)
        .collect();
    let a_ip = frames.iter().find(|f| is_a(f)).unwrap().meta.src_ip;
    let b_ip = frames.iter().find(|f| !is_a(f)).unwrap().meta.src_ip;
    // QPNs and first PSNs from the packets themselves.
    let from_b: Vec<&&Frame> = frames.iter().filter(|f| !is_a(f)).collect();
    let from_a: Vec<&&Frame> = frames.iter().filter(|f| is_a(f)).collect();
    let a_qpn = pkt(from_b[0]).bth().dest_qp();
    let b_qpn = pkt(from_a[0]).bth().dest_qp();
    let b_first_req = from_b
        .iter()
        .find(|f| pkt(f).flags().contains(OpFlags::REQ))
        .map(|f| pkt(f).bth().psn())
        .unwrap();
    let a_first_req = from_a
        .iter()
        .find(|f| pkt(f).flags().contains(OpFlags::REQ))
        .map(|f| pkt(f).bth().psn());

    let mut dev = Device::new(DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    });
    dev.add_gid(0, Gid::from_ip(a_ip)).unwrap();
    let mut mem = VecMemory::new(MEM_BASE, 4 << 20);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 256,
    };
    let init = QpInit {
        qp_type,
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        xrcd: None,
        cap,
        sq_sig_all: false,
    };
    // Our QPNs are handed out from 0x11 upwards: take them until A's comes up.
    let qpn = loop {
        let q = dev.create_qp(init).unwrap();
        if q.0 == a_qpn {
            break q;
        }
        assert!(q.0 < a_qpn, "A's QPN {a_qpn:#x} is below ours");
    };
    let rc = qp_type == QpType::Rc;
    let access = Access::LOCAL_WRITE.union(Access::REMOTE);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: access,
        ..Default::default()
    };
    dev.modify_qp(
        qpn,
        &a,
        AttrMask(AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS),
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::M1024;
    a.dest_qp_num = b_qpn;
    a.rq_psn = b_first_req;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.av = Av {
        dgid: Gid::from_ip(b_ip),
        sgid_index: 0,
        hop_limit: 64,
        ..Default::default()
    };
    let mut m =
        AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    if rc {
        m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    }
    dev.modify_qp(qpn, &a, AttrMask(m)).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = a_first_req.unwrap_or(0);
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
    if rc {
        m |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    }
    dev.modify_qp(qpn, &a, AttrMask(m)).unwrap();

    // Receive buffers, and a send buffer.
    let rbuf = MEM_BASE;
    let rkey_local = dev
        .reg_mr(
            pd,
            rbuf,
            1 << 20,
            access,
            Backing::Contiguous { base: rbuf },
        )
        .unwrap();
    for i in 0..64 {
        dev.post_recv(
            qpn,
            RecvWr {
                wr_id: i,
                sg_list: vec![Sge {
                    addr: rbuf,
                    length: 65536,
                    lkey: rkey_local,
                }]
                .into(),
            },
        )
        .unwrap();
    }
    let sbuf = MEM_BASE + (1 << 20);
    let skey = dev
        .reg_mr(
            pd,
            sbuf,
            1 << 20,
            access,
            Backing::Contiguous { base: sbuf },
        )
        .unwrap();

    // B's remote accesses: one MR of ours per rxe R_Key, at the same IOVAs, holding what A's
    // memory held (from A's READ responses and atomic ACKs).
    let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
    for f in &from_b {
        let p = pkt(f);
        let (va, rkey, len) = if let Some(r) = p.reth() {
            (r.va(), r.rkey(), r.dma_len().max(8) as u64)
        } else if let Some(x) = p.atomic_eth() {
            (x.va(), x.rkey(), 8)
        } else {
            continue;
        };
        let e = spans.entry(rkey).or_insert((va, va + len));
        e.0 = e.0.min(va);
        e.1 = e.1.max(va + len);
    }
    let mut next = MEM_BASE + (2 << 20);
    let mut keymap = HashMap::new();
    let mut placed: Vec<(u32, u64, u64)> = Vec::new(); // (rkey, iova, base)
    for (rkey, (lo, hi)) in &spans {
        let base = next;
        next += (hi - lo + 4095) & !4095;
        let k = dev
            .reg_mr(pd, *lo, hi - lo, access, Backing::Contiguous { base })
            .unwrap();
        keymap.insert(*rkey, k);
        placed.push((*rkey, *lo, base));
    }
    let at = |placed: &[(u32, u64, u64)], va: u64| -> u64 {
        let (_, lo, base) = placed
            .iter()
            .filter(|(_, lo, _)| *lo <= va)
            .max_by_key(|(_, lo, _)| *lo)
            .unwrap();
        base + (va - lo)
    };
    // Pre-fill from A's answers: READ responses (matched to their requests by PSN) and the
    // original value of the first atomic on each address.
    let mut reads: Vec<(u32, u64, u32)> = Vec::new(); // (first psn, va, len)
    let mut atomics: HashMap<u32, u64> = HashMap::new(); // psn -> va
    for f in &from_b {
        let p = pkt(f);
        let psn = p.bth().psn();
        if p.opcode().0 == 0x0c {
            let r = p.reth().unwrap();
            reads.push((psn, r.va(), r.dma_len()));
        } else if let Some(x) = p.atomic_eth() {
            atomics.insert(psn, x.va());
        }
    }
    let mut seen_atomic_va = std::collections::HashSet::new();
    for f in &from_a {
        let p = pkt(f);
        let psn = p.bth().psn();
        if p.flags().contains(OpFlags::READ) && p.payload_len() > 0 {
            let (first, va, _) = reads
                .iter()
                .filter(|(fp, _, _)| *fp <= psn)
                .max_by_key(|(fp, _, _)| *fp)
                .unwrap();
            let off = (psn - first) as u64 * 1024;
            let addr = at(&placed, va + off);
            mem.slice_mut(addr, p.payload_len())
                .copy_from_slice(p.payload());
        }
        if let (Some(ack), Some(va)) = (p.atomic_ack_eth(), atomics.get(&psn)) {
            if seen_atomic_va.insert(*va) {
                let addr = at(&placed, *va);
                mem.slice_mut(addr, 8)
                    .copy_from_slice(&ack.orig().to_le_bytes());
            }
        }
    }

    let meta_b = RecvMeta {
        src: Gid::from_ip(b_ip),
        dst: Gid::from_ip(a_ip),
        hop_limit: 64,
        ..Default::default()
    };
    let mut buf = vec![0u8; 9000];
    let mut out = vec![0u8; 9100];
    let mut compared = 0;
    let mut pending = std::collections::VecDeque::new();
    let now = Instant(1_000_000);
    for f in &frames {
        if !is_a(f) {
            let mut bytes = f.roce.clone();
            let p = pkt(f);
            let info = p.info();
            let rkey_at = if p.reth().is_some() {
                Some(info.reth as usize + 8)
            } else if p.atomic_eth().is_some() {
                Some(info.atmeth as usize + 8)
            } else {
                None
            };
            if let Some(o) = rkey_at {
                let theirs = u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap());
                if let Some(ours) = keymap.get(&theirs) {
                    bytes[o..o + 4].copy_from_slice(&ours.to_be_bytes());
                }
            }
            dev.handle_packet(now, &meta_b, &bytes, &mut mem)
                .unwrap_or_else(|e| panic!("frame {}: dropped: {e:?}", f.no));
            // rxe's responder answers each packet before it takes the next one; so do we here
            // (left to itself our responder coalesces ACKs that queue up — see docs/interop.md).
            if drain_each {
                while let Some(tx) = dev.poll_transmit(now, &mut mem, &mut buf) {
                    pending.push_back((tx, buf[..tx.len].to_vec()));
                }
            }
            continue;
        }
        let p = pkt(f);
        if p.flags().contains(OpFlags::REQ) {
            // A's application posted a send here: post the same one.
            assert!(
                p.flags().contains(OpFlags::SEND),
                "frame {}: only SENDs from A are replayed",
                f.no
            );
            if p.flags().contains(OpFlags::FIRST) {
                let len = from_a
                    .iter()
                    .skip_while(|g| g.no != f.no)
                    .take_while(|g| {
                        let q = pkt(g);
                        q.flags().contains(OpFlags::SEND)
                            && (g.no == f.no || !q.flags().contains(OpFlags::FIRST))
                    })
                    .fold(Vec::new(), |mut v, g| {
                        v.extend_from_slice(pkt(g).payload());
                        v
                    });
                mem.slice_mut(sbuf, len.len()).copy_from_slice(&len);
                let op = match p.imm() {
                    Some(i) => SendOp::SendWithImm(i),
                    None => SendOp::Send,
                };
                let mut wr = SendWr::new(
                    f.no as u64,
                    op,
                    vec![Sge {
                        addr: sbuf,
                        length: len.len() as u32,
                        lkey: skey,
                    }],
                );
                if !p.bth().solicited() {
                    wr.flags &= !SEND_SOLICITED;
                }
                dev.post_send(qpn, wr).unwrap();
            }
        }
        if pending.is_empty() {
            if let Some(tx) = dev.poll_transmit(now, &mut mem, &mut buf) {
                pending.push_back((tx, buf[..tx.len].to_vec()));
            }
        }
        let (tx, ours) = pending.pop_front().unwrap_or_else(|| {
            panic!("frame {}: rxe sent {:?}, we sent nothing", f.no, p.opcode())
        });
        let ours = &ours[..];
        let n = ours.len();
        assert_eq!(
            &ours[..n - 4],
            &f.roce[..f.roce.len() - 4],
            "frame {}: rxe sent {:?}, we sent {:?}",
            f.no,
            p.opcode(),
            Packet::new_checked(ours).map(|q| q.opcode())
        );
        assert_eq!(tx.sport, f.meta.sport, "frame {}: UDP source port", f.no);
        // The whole frame, with A's Ethernet and IP header fields, down to the ICRC.
        let fl = frame::build(&mut out, &f.meta, ours).unwrap();
        assert_eq!(
            &out[..fl],
            &f.raw[..fl.max(f.raw.len()).min(f.raw.len())],
            "frame {}: whole frame",
            f.no
        );
        compared += 1;
        while let Some(c) = dev.poll_cq(cq) {
            assert_eq!(c.status, WcStatus::Success, "frame {}: {c:?}", f.no);
        }
    }
    assert!(
        pending.is_empty() && dev.poll_transmit(now, &mut mem, &mut buf).is_none(),
        "we had more to send than rxe did"
    );
    compared
}

#[test]
fn rc_send_64b_pingpong_is_byte_identical() {
    assert_eq!(replay(1, 20, QpType::Rc), 10);
}

#[test]
fn rc_multi_packet_send_is_byte_identical() {
    assert_eq!(replay(21, 60, QpType::Rc), 20);
}

#[test]
fn uc_send_is_byte_identical() {
    assert_eq!(replay(61, 100, QpType::Uc), 20);
}

#[test]
fn rdma_write_acks_are_byte_identical() {
    assert_eq!(replay(111, 135, QpType::Rc), 5);
}

#[test]
fn read_responses_are_byte_identical() {
    assert_eq!(replay(136, 160, QpType::Rc), 20);
}

#[test]
fn pipelined_read_responses_carry_the_msn_of_their_request() {
    // All five READ requests arrive before the first response goes out; each response must
    // still carry the MSN of its own request, as rxe's do.
    assert_eq!(replay_with(136, 160, QpType::Rc, false), 20);
    assert_eq!(replay_with(161, 170, QpType::Rc, false), 5);
}

#[test]
fn atomic_acks_are_byte_identical() {
    assert_eq!(replay(161, 170, QpType::Rc), 5);
    assert_eq!(replay(171, 180, QpType::Rc), 5);
}

#[test]
fn send_lat_is_byte_identical() {
    assert_eq!(replay(181, 200, QpType::Rc), 10);
}

#[test]
fn ipv6_gid_pingpong_is_byte_identical() {
    assert_eq!(replay(201, 220, QpType::Rc), 10);
}

#[test]
fn write_only_imm_and_small_reads_are_byte_identical() {
    assert_eq!(replay(221, 230, QpType::Rc), 5);
    assert_eq!(replay(231, 240, QpType::Rc), 5);
    assert_eq!(replay(241, 250, QpType::Rc), 5);
}
