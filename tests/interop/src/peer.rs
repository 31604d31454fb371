//! One engine instance on one UDP socket, pumped by a blocking loop.

use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant as Wall};

use rxe_core::device::RecvMeta;
use rxe_core::mem::VecMemory;
use rxe_core::{Device, DeviceConfig, Gid, Instant};

use crate::udp::{UdpTransport, ROCE_PORT};

pub struct Peer {
    pub dev: Device,
    pub mem: VecMemory,
    pub udp: UdpTransport,
    pub local_ip: IpAddr,
    start: Wall,
    buf: Vec<u8>,
    pub sent: u64,
    pub received: u64,
}

/// Where peer memory starts (a non-zero base catches address mix-ups).
pub const MEM_BASE: u64 = 0x10_0000;

impl Peer {
    pub fn new(local_ip: IpAddr, cfg: DeviceConfig, mem_len: usize) -> io::Result<Self> {
        let udp = UdpTransport::bind(local_ip, ROCE_PORT)?;
        let mut dev = Device::new(cfg);
        dev.add_gid(0, Gid::from_ip(local_ip)).expect("gid 0");
        Ok(Peer {
            dev,
            mem: VecMemory::new(MEM_BASE, mem_len),
            udp,
            local_ip,
            start: Wall::now(),
            buf: vec![0; 65536],
            sent: 0,
            received: 0,
        })
    }

    pub fn now(&self) -> Instant {
        Instant(self.start.elapsed().as_nanos() as u64)
    }

    /// Sends what the engine has, waits up to `max_wait` for one datagram (less if a timer is
    /// due sooner), feeds it in, and fires due timers.
    pub fn pump(&mut self, max_wait: Duration) -> io::Result<()> {
        let now = self.now();
        while let Some(tx) = self.dev.poll_transmit(now, &mut self.mem, &mut self.buf) {
            self.udp.send(tx.dst.to_ip(), &mut self.buf[..tx.len])?;
            self.sent += 1;
        }
        let mut wait = max_wait;
        if let Some(t) = self.dev.poll_timeout() {
            wait = wait.min(Duration::from_nanos(t.0.saturating_sub(now.0)));
        }
        // Take what has arrived: the first datagram may be waited for, the rest only if queued.
        let mut budget = 64;
        while let Some((n, from)) = self.udp.recv(&mut self.buf, wait)? {
            self.received += 1;
            let meta = RecvMeta {
                src: Gid::from_ip(from.ip()),
                dst: Gid::from_ip(self.local_ip),
                sport: from.port(),
                hop_limit: 64,
                ..Default::default()
            };
            let now = self.now();
            let _ = self
                .dev
                .handle_packet(now, &meta, &self.buf[..n], &mut self.mem);
            budget -= 1;
            if budget == 0 {
                break;
            }
            wait = Duration::ZERO;
        }
        let now = self.now();
        if self.dev.poll_timeout().is_some_and(|t| t <= now) {
            self.dev.handle_timeout(now);
        }
        Ok(())
    }
}
