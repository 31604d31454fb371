//! A virtio-net driver for tests: connects to the daemon's `--net-socket` as a VMM and a guest
//! driver would, with a receive and a transmit queue in its own guest memory.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

use crate::error::{Error, Result};
use crate::ram::GuestRam;
use crate::virtq::Virtq;

pub const VIRTIO_NET_F_CSUM: u32 = 0;
pub const VIRTIO_NET_F_GUEST_CSUM: u32 = 1;
pub const VIRTIO_NET_F_MTU: u32 = 3;
pub const VIRTIO_NET_F_GUEST_TSO4: u32 = 7;
pub const VIRTIO_NET_F_HOST_TSO4: u32 = 11;
pub const VIRTIO_NET_F_MRG_RXBUF: u32 = 15;
pub const VIRTIO_F_VERSION_1: u32 = 32;
/// The guest's header with VERSION_1 (`num_buffers` last).
pub const HDR: usize = 12;

/// One received frame.
#[derive(Clone, Debug)]
pub struct Received {
    /// The virtio-net header the device wrote.
    pub hdr: [u8; HDR],
    /// The Ethernet frame, gathered from every buffer it took.
    pub frame: Vec<u8>,
    /// How many buffers it took.
    pub buffers: u16,
}

/// VHOST_USER_NET_SET_MTU with NEED_REPLY on the frontend's socket; the status answered.
fn net_set_mtu(mut sock: &UnixStream, mtu: u64) -> Result<u64> {
    const NET_SET_MTU: u32 = 20;
    const FLAGS: u32 = 0x1 | 0x8; // version 1, NEED_REPLY
    let mut m = Vec::with_capacity(20);
    m.extend_from_slice(&NET_SET_MTU.to_le_bytes());
    m.extend_from_slice(&FLAGS.to_le_bytes());
    m.extend_from_slice(&8u32.to_le_bytes());
    m.extend_from_slice(&mtu.to_le_bytes());
    sock.write_all(&m)?;
    let mut r = [0u8; 20];
    sock.read_exact(&mut r)?;
    let req = u32::from_le_bytes(r[..4].try_into().expect("4"));
    let flags = u32::from_le_bytes(r[4..8].try_into().expect("4"));
    if req != NET_SET_MTU || flags & 0x4 == 0 {
        return Err(Error::Timeout("an answer to NET_SET_MTU"));
    }
    Ok(u64::from_le_bytes(r[12..].try_into().expect("8")))
}

pub struct NetGuest {
    pub ram: Arc<GuestRam>,
    _fe: Frontend,
    rx: Virtq,
    tx: Virtq,
    rx_len: u32,
    /// Receive buffer of each posted head.
    rx_bufs: HashMap<u16, u64>,
    tx_area: u64,
    pub acked: u64,
}

impl NetGuest {
    /// Connects to `socket` (retrying for up to 10 s while the daemon starts), acks the
    /// offered features among `want` (VERSION_1 always), and posts `rx_n` receive buffers of
    /// `rx_len` bytes.
    pub fn connect(socket: &Path, want: u64, rx_n: u16, rx_len: u32) -> Result<NetGuest> {
        Self::connect_mtu(socket, want, rx_n, rx_len, None)
    }

    /// [`Self::connect`], and with `mtu` as a VMM with `host_mtu` does: VIRTIO_NET_F_MTU
    /// acked (when offered) and NET_SET_MTU sent with NEED_REPLY (NET_MTU and REPLY_ACK
    /// agreed first). A refused MTU is `Error::BadStatus` with the device's status.
    pub fn connect_mtu(
        socket: &Path,
        want: u64,
        rx_n: u16,
        rx_len: u32,
        mtu: Option<u64>,
    ) -> Result<NetGuest> {
        let end = Instant::now() + Duration::from_secs(10);
        let sock = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(e.into()),
            }
        };
        let raw = sock.try_clone()?;
        let mut fe = Frontend::from_stream(sock, 2);
        let want = want | mtu.map_or(0, |_| 1 << VIRTIO_NET_F_MTU);
        let ram = GuestRam::new(32 << 20)?;
        fe.set_owner()?;
        let offered = fe.get_features()?;
        let want =
            want | (1 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let acked = offered & want;
        let mut pf = VhostUserProtocolFeatures::empty();
        if acked & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            pf = fe.get_protocol_features()?
                & (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::MTU);
            fe.set_protocol_features(pf)?;
        }
        fe.set_features(acked)?;
        if let Some(mtu) = mtu {
            if acked & (1 << VIRTIO_NET_F_MTU) == 0
                || !pf
                    .contains(VhostUserProtocolFeatures::MTU | VhostUserProtocolFeatures::REPLY_ACK)
            {
                return Err(Error::Timeout("VIRTIO_NET_F_MTU and NET_MTU not offered"));
            }
            let status = net_set_mtu(&raw, mtu)?;
            if status != 0 {
                return Err(Error::BadStatus(status as u32));
            }
        }
        fe.set_mem_table(&ram.memory_regions())?;
        let size = 256u16;
        let mut qs = Vec::new();
        for i in 0..2 {
            let q = Virtq::new(&ram, size, false)?;
            fe.set_vring_num(i, q.size)?;
            fe.set_vring_addr(i, &q.config())?;
            fe.set_vring_base(i, 0)?;
            fe.set_vring_call(i, &q.call)?;
            fe.set_vring_kick(i, &q.kick)?;
            if acked & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
                fe.set_vring_enable(i, true)?;
            }
            qs.push(q);
        }
        let tx = qs.pop().expect("2 queues");
        let rx = qs.pop().expect("2 queues");
        Self::from_parts(fe, ram, rx, tx, acked, rx_n, rx_len)
    }

    /// The driver on rings a frontend has set up (a VMM's sequence replayed elsewhere, e.g.
    /// [`crate::cloud_hypervisor`]): `rx` and `tx` in `ram`, the features `acked`; posts
    /// `rx_n` receive buffers of `rx_len` bytes. `fe` keeps the connection open.
    pub fn from_parts(
        fe: Frontend,
        ram: Arc<GuestRam>,
        rx: Virtq,
        tx: Virtq,
        acked: u64,
        rx_n: u16,
        rx_len: u32,
    ) -> Result<NetGuest> {
        let tx_area = ram.alloc_contig(128 << 10, 4096)?;
        let mut g = NetGuest {
            ram,
            _fe: fe,
            rx,
            tx,
            rx_len,
            rx_bufs: HashMap::new(),
            tx_area,
            acked,
        };
        let area = g.ram.alloc_contig(rx_n as u64 * rx_len as u64, 4096)?;
        for i in 0..rx_n as u64 {
            g.post_rx(area + i * rx_len as u64)?;
        }
        Ok(g)
    }

    fn post_rx(&mut self, gpa: u64) -> Result<()> {
        let head = self
            .rx
            .add(&[(gpa, self.rx_len, true)])
            .ok_or(Error::Timeout("receive queue full"))?;
        self.rx_bufs.insert(head, gpa);
        Ok(())
    }

    /// Transmits `frame` behind `hdr` (header and frame in two descriptors of one chain) and
    /// waits for the device to use the chain.
    pub fn send(&mut self, hdr: [u8; HDR], frame: &[u8]) -> Result<()> {
        let a = self.tx_area;
        self.ram.write(a, &hdr);
        self.ram.write(a + 64, frame);
        self.send_chain(&[(a, HDR as u32, false), (a + 64, frame.len() as u32, false)])
    }

    /// Transmits a chain the caller wrote (any shape, even a bad one) and waits for its use.
    pub fn send_chain(&mut self, chain: &[(u64, u32, bool)]) -> Result<()> {
        self.tx
            .add(chain)
            .ok_or(Error::Timeout("transmit queue full"))?;
        self.tx
            .wait_used(Duration::from_secs(5))
            .ok_or(Error::Timeout("transmit buffer used"))?;
        Ok(())
    }

    /// Writes nonsense into the transmit queue's available index (`delta` past the real one,
    /// more than the ring holds) and kicks: a guest that broke its own ring.
    pub fn break_tx_ring(&mut self, delta: u16) {
        let bogus = self.tx.avail_idx.wrapping_add(delta);
        self.ram
            .atomic_u16(self.tx.avail + 2)
            .store(bogus, std::sync::atomic::Ordering::Release);
        let _ = self.tx.kick.write(1);
    }

    /// The transmit area (128 KiB of guest memory) for [`Self::send_chain`].
    pub fn tx_area(&self) -> u64 {
        self.tx_area
    }

    /// The next received frame within `timeout`; its buffers are posted again.
    pub fn recv(&mut self, timeout: Duration) -> Option<Received> {
        let end = Instant::now() + timeout;
        let (head, len) = self.rx.wait_used(timeout)?;
        let gpa = *self.rx_bufs.get(&head)?;
        let mut first = vec![0u8; len as usize];
        self.ram.read(gpa, &mut first);
        if first.len() < HDR {
            let _ = self.post_rx(gpa);
            return Some(Received {
                hdr: [0; HDR],
                frame: Vec::new(),
                buffers: 0,
            });
        }
        let hdr: [u8; HDR] = first[..HDR].try_into().expect("header");
        let buffers = u16::from_le_bytes([hdr[10], hdr[11]]);
        let mut frame = first[HDR..].to_vec();
        let _ = self.post_rx(gpa);
        for _ in 1..buffers {
            let left = end.saturating_duration_since(Instant::now());
            let (h, l) = self.rx.wait_used(left.max(Duration::from_millis(100)))?;
            let g = *self.rx_bufs.get(&h)?;
            let mut b = vec![0u8; l as usize];
            self.ram.read(g, &mut b);
            frame.extend_from_slice(&b);
            let _ = self.post_rx(g);
        }
        Some(Received {
            hdr,
            frame,
            buffers,
        })
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub fn csum(data: &[u8], mut sum: u32) -> u16 {
    for c in data.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// What the guest's stack saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub arp_requests: u32,
    pub pings: u32,
    pub roce: u32,
    pub udp: Vec<Received>,
}

/// A guest's IP stack, as small as the tests need: answers ARP for `ip` and ICMP echo to it
/// with `mac`, counts RoCE, keeps other UDP to it; until `stop`.
pub fn guest_stack(
    mut g: NetGuest,
    ip: [u8; 4],
    mac: [u8; 6],
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
) -> NetGuest {
    while !stop.load(Ordering::Relaxed) {
        let Some(r) = g.recv(Duration::from_millis(50)) else {
            continue;
        };
        let f = &r.frame;
        if f.len() < 42 {
            continue;
        }
        let mut s = seen.lock().unwrap();
        if be16(f, 12) == 0x0806 && be16(f, 20) == 1 && f[38..42] == ip {
            s.arp_requests += 1;
            let mut a = f[6..12].to_vec();
            a.extend_from_slice(&mac);
            a.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
            a.extend_from_slice(&mac);
            a.extend_from_slice(&ip);
            a.extend_from_slice(&f[22..32]);
            drop(s);
            g.send([0; HDR], &a).expect("ARP reply");
        } else if be16(f, 12) == 0x0800 && f[30..34] == ip {
            let ihl = (f[14] & 15) as usize * 4;
            let l4 = 14 + ihl;
            match f[23] {
                1 if f[l4] == 8 => {
                    s.pings += 1;
                    let mut e = f.clone();
                    e[..6].copy_from_slice(&f[6..12]);
                    e[6..12].copy_from_slice(&mac);
                    e[26..30].copy_from_slice(&f[30..34]);
                    e[30..34].copy_from_slice(&f[26..30]);
                    e[l4] = 0;
                    e[l4 + 2..l4 + 4].copy_from_slice(&[0, 0]);
                    let c = csum(&e[l4..], 0);
                    e[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
                    drop(s);
                    g.send([0; HDR], &e).expect("echo reply");
                }
                17 if be16(f, l4 + 2) == 4791 => s.roce += 1,
                17 => s.udp.push(r.clone()),
                _ => {}
            }
        }
    }
    g
}
