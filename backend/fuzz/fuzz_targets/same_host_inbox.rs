//! The same-host inbox (`--same-host`, `backend/src/same_host.rs`): the input is a sequence of
//! operations on two ports of a hub — packets delivered from one to the other with payload
//! references into the sender's guest memory (in order or not, overlapping or not), the end of
//! the sender's batch (flush: the receiver has no driver here, so a busy worker, and what waits
//! is sealed), the sender's memory overwritten (revoked and reused), the receiver draining or
//! discarding. Checked: nothing panics; after the end of a batch nothing holds the sender's
//! memory (no reference outlives the batch); a packet taken after its batch ended carries the
//! sender's bytes as they were at the end of the batch, whatever was written since; one taken
//! during its batch comes with its references as they were delivered; packets come out in
//! order, each once.
//!
//! `cargo fuzz run same_host_inbox --sanitizer none` (from backend/fuzz), or tests/fuzz.sh.

#![no_main]

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use rxe_core::device::Transmit;
use rxe_core::{Gid, Qpn};
use vhost_user_rdma::memory::guest_mem::GuestMemoryMmap;
use vhost_user_rdma::memory::payload_ref::PayloadRef;
use vhost_user_rdma::transport::same_host::{Hub, Link, INBOX_CAP};
use vm_memory::{Bytes, GuestAddress};

const BASE: u64 = 0x10000;
const SIZE: usize = 0x4000;

/// What the test expects of a packet in the inbox.
struct Expect {
    pkt: Vec<u8>,
    refs: Vec<PayloadRef>,
    /// The whole packet as the end of its batch left it (None while the batch runs).
    sealed: Option<Vec<u8>>,
}

/// `pkt` with the referenced ranges read from `mem` now, in the references' order.
fn resolved(mem: &GuestMemoryMmap, pkt: &[u8], refs: &[PayloadRef]) -> Vec<u8> {
    let mut out = pkt.to_vec();
    for r in refs {
        let (o, n) = (r.off as usize, r.len as usize);
        mem.read_slice(&mut out[o..o + n], GuestAddress(r.gpa))
            .expect("references are generated inside memory");
    }
    out
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.byte()?, self.byte()?]))
    }
}

fuzz_target!(|data: &[u8]| {
    let hub = Hub::new();
    let a_ip: IpAddr = "127.0.0.1".parse().unwrap();
    let b_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let mut a = Link::new(hub.clone(), a_ip).unwrap();
    let b = Link::new(hub.clone(), b_ip).unwrap();
    let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(BASE), SIZE)]).unwrap());
    let fill: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
    mem.write_slice(&fill, GuestAddress(BASE)).unwrap();
    let mut waiting: VecDeque<Expect> = VecDeque::new();
    let mut input = Input(data);
    let mut seq = 0u8;
    while let Some(op) = input.byte() {
        match op % 6 {
            // A packet from a to b: 1 to 2048 bytes, up to 3 references inside it.
            0 | 1 => {
                let Some(len) = input.u16() else { break };
                if b.inbox().len() >= INBOX_CAP {
                    continue; // dropped at a full inbox: not what this target looks at
                }
                let len = 1 + len as usize % 2048;
                seq = seq.wrapping_add(1);
                let pkt: Vec<u8> = (0..len).map(|i| seq ^ (i as u8)).collect();
                let mut refs = Vec::new();
                for _ in 0..input.byte().unwrap_or(0) % 4 {
                    let (Some(o), Some(n), Some(g)) = (input.u16(), input.u16(), input.u16())
                    else {
                        break;
                    };
                    let off = o as usize % len;
                    let n = 1 + n as usize % (len - off);
                    let gpa = BASE + (g as usize % (SIZE - n + 1)) as u64;
                    refs.push(PayloadRef {
                        gpa,
                        off: off as u32,
                        len: n as u32,
                    });
                }
                let t = Transmit {
                    len,
                    src: Gid::from_ip(a_ip),
                    dst: Gid::from_ip(b_ip),
                    sport: 49152,
                    traffic_class: 0,
                    hop_limit: 64,
                    flow_label: 0,
                    dmac: [0; 6],
                    qpn: Qpn(0x11),
                };
                assert!(a.deliver_refs(&t, &pkt, &refs, Some(&mem)));
                waiting.push_back(Expect {
                    pkt,
                    refs,
                    sealed: None,
                });
            }
            // The end of a's batch: b (no driver: busy) has what waits sealed.
            2 => {
                for e in waiting.iter_mut().filter(|e| e.sealed.is_none()) {
                    e.sealed = Some(resolved(&mem, &e.pkt, &e.refs));
                }
                a.flush();
                assert_eq!(
                    Arc::strong_count(&mem),
                    1,
                    "a reference outlived the sender's batch"
                );
            }
            // a's memory revoked and reused.
            3 => {
                let (Some(at), Some(n), Some(v)) = (input.u16(), input.u16(), input.byte()) else {
                    break;
                };
                let at = at as usize % SIZE;
                let n = (n as usize % 4096).min(SIZE - at);
                mem.write_slice(&vec![v; n], GuestAddress(BASE + at as u64))
                    .unwrap();
            }
            // b takes some.
            4 => {
                let max = input.byte().unwrap_or(0) as usize % 8;
                let n = b.inbox().drain(max, |_, bytes, src| {
                    let e = waiting.pop_front().expect("no more packets than were sent");
                    match (&e.sealed, src) {
                        (Some(whole), None) => {
                            assert!(
                                bytes == &whole[..],
                                "a sealed packet changed after its batch"
                            )
                        }
                        (None, Some((m, refs))) => {
                            assert_eq!(refs, &e.refs[..]);
                            assert!(std::ptr::eq(m, &*mem));
                            assert_eq!(bytes.len(), e.pkt.len());
                            // What the receiver's RefRam makes of it: the references from
                            // memory, the rest from the packet.
                            assert!(
                                resolved(&mem, bytes, refs) == resolved(&mem, &e.pkt, &e.refs),
                                "the packet's own bytes"
                            );
                        }
                        (None, None) if e.refs.is_empty() => assert!(bytes == &e.pkt[..]),
                        (s, src) => {
                            panic!("sealed {} but references {}", s.is_some(), src.is_some())
                        }
                    }
                });
                assert!(n <= max);
            }
            // b has no frontend: what waits is dropped.
            _ => {
                let max = input.byte().unwrap_or(0) as usize % 8;
                let n = b.inbox().discard(max);
                for _ in 0..n {
                    waiting.pop_front().expect("no more packets than were sent");
                }
            }
        }
        let unsealed = waiting
            .iter()
            .filter(|e| e.sealed.is_none() && !e.refs.is_empty())
            .count();
        assert_eq!(Arc::strong_count(&mem), 1 + unsealed, "holds on a's memory");
        assert_eq!(b.inbox().len(), waiting.len());
    }
});
