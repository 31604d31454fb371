//! Newtypes for the numbers RDMA is full of: a PSN is not a QPN.

use core::fmt;

/// A 24-bit packet sequence number with wrapping arithmetic (IBTA 9.7.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

pub const PSN_MASK: u32 = 0x00ff_ffff;

impl Psn {
    #[inline]
    pub const fn new(v: u32) -> Self {
        Self(v & PSN_MASK)
    }
    #[inline]
    pub const fn get(self) -> u32 {
        self.0
    }
    #[inline]
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & PSN_MASK)
    }
    #[inline]
    pub const fn sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & PSN_MASK)
    }
    #[inline]
    pub const fn next(self) -> Self {
        self.add(1)
    }
    /// Signed distance `self - other` in the 24-bit circle, in `-2^23 .. 2^23`.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }
    #[inline]
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
    #[inline]
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "psn:{:#x}", self.0)
    }
}

/// A 24-bit queue pair number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(pub u32);

impl Qpn {
    /// The general services (GSI) QP.
    pub const GSI: Qpn = Qpn(1);
    /// The destination QPN of multicast packets.
    pub const MULTICAST: Qpn = Qpn(0x00ff_ffff);
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "qpn:{:#x}", self.0)
    }
}

/// A 128-bit GID; RoCEv2 GIDs are IPv6 addresses or IPv4-mapped `::ffff:a.b.c.d`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    pub fn from_ipv4(a: [u8; 4]) -> Self {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        Gid(g)
    }
    pub fn from_ip(ip: std::net::IpAddr) -> Self {
        match ip {
            std::net::IpAddr::V4(a) => Self::from_ipv4(a.octets()),
            std::net::IpAddr::V6(a) => Gid(a.octets()),
        }
    }
    /// The IPv4 address if this is an IPv4-mapped GID.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        (self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff)
            .then(|| [self.0[12], self.0[13], self.0[14], self.0[15]])
    }
    pub fn to_ip(&self) -> std::net::IpAddr {
        match self.ipv4() {
            Some(a) => std::net::IpAddr::from(a),
            None => std::net::IpAddr::from(self.0),
        }
    }
    /// IPv6 multicast (ff00::/8) or IPv4-mapped multicast (224.0.0.0/4).
    pub fn is_multicast(&self) -> bool {
        match self.ipv4() {
            Some(a) => a[0] & 0xf0 == 0xe0,
            None => self.0[0] == 0xff,
        }
    }
    /// The link-local GID derived from a MAC address (fe80::EUI-64).
    pub fn link_local_from_mac(mac: [u8; 6]) -> Self {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8] = mac[0] ^ 2;
        g[9] = mac[1];
        g[10] = mac[2];
        g[11] = 0xff;
        g[12] = 0xfe;
        g[13] = mac[3];
        g[14] = mac[4];
        g[15] = mac[5];
        Gid(g)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_ip())
    }
}

/// Engine time in nanoseconds from an arbitrary epoch chosen by the caller.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug)]
pub struct Instant(pub u64);

impl Instant {
    #[inline]
    pub fn plus_ns(self, ns: u64) -> Self {
        Instant(self.0.saturating_add(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps() {
        let a = Psn::new(0xff_fffe);
        assert_eq!(a.add(3).get(), 1);
        assert!(a.before(a.add(3)));
        assert_eq!(a.add(3).diff(a), 3);
        assert_eq!(a.diff(a.add(3)), -3);
        assert_eq!(Psn::new(0).sub(1).get(), 0xff_ffff);
        assert_eq!(Psn::new(0x80_0000).diff(Psn::new(0)), -0x80_0000);
    }

    #[test]
    fn gids() {
        let g = Gid::from_ipv4([10, 0, 0, 1]);
        assert_eq!(g.ipv4(), Some([10, 0, 0, 1]));
        assert!(!g.is_multicast());
        assert!(Gid::from_ipv4([239, 1, 1, 1]).is_multicast());
        let ll = Gid::link_local_from_mac([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(format!("{ll:?}"), "fe80::5054:ff:fe12:3456");
    }
}

/// A xorshift generator: deterministic, seedable, no dependency.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn ppm(&mut self, p: u32) -> bool {
        p > 0 && (self.next_u64() % 1_000_000) < p as u64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}
