//! Where the guest may send RoCE packets. RoCE has no authentication, so a guest that can
//! aim a QP anywhere can reach the host's loopback services and other tenants' daemons; the
//! operator names the peers (`--allow-peer CIDR`), and without a list only destinations that
//! can never be a RoCE peer of this daemon are refused: unspecified and broadcast addresses,
//! loopback (unless the daemon is bound there) and link-local (169.254.0.0/16, fe80::/10,
//! unless the daemon is bound there): a link-local address beside a real one is where hosts
//! keep services for their guests (the cloud metadata service at 169.254.169.254), not peers.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address prefix: `10.77.0.0/16`, `fd77::/64`, or one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.len as u32).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.len as u32).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?}: not an address/prefix"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { addr, len })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// The destinations the guest may send to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Only these, when set (`--allow-peer`).
    pub allow: Option<Vec<Cidr>>,
    /// Loopback destinations are reachable only from a daemon bound to loopback: one bound
    /// to a network address has no RoCE peer on the host's loopback, only other services.
    pub deny_loopback: bool,
    /// Link-local destinations likewise: reachable only from a daemon bound to a link-local
    /// address itself.
    pub deny_link_local: bool,
}

impl EgressPolicy {
    /// The policy for a daemon bound to `local` with the `--allow-peer` list `allow`
    /// (empty: no list).
    pub fn new(local: IpAddr, allow: Vec<Cidr>) -> Self {
        EgressPolicy {
            allow: (!allow.is_empty()).then_some(allow),
            deny_loopback: !local.to_canonical().is_loopback(),
            deny_link_local: !is_link_local(local.to_canonical()),
        }
    }

    /// Whether a packet may go to `ip`.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if let Some(list) = &self.allow {
            return list.iter().any(|c| c.contains(ip));
        }
        let never = match ip {
            IpAddr::V4(a) => a.is_unspecified() || a.is_broadcast(),
            IpAddr::V6(a) => a.is_unspecified(),
        };
        let loopback = self.deny_loopback && ip.is_loopback();
        let link_local = self.deny_link_local && is_link_local(ip);
        !(never || loopback || link_local)
    }
}

/// 169.254.0.0/16 and fe80::/10.
fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_match_their_addresses_only() {
        let c: Cidr = "10.77.0.0/16".parse().unwrap();
        assert!(c.contains(ip("10.77.3.4")) && !c.contains(ip("10.78.0.1")));
        assert!(c.contains(ip("::ffff:10.77.0.9")), "IPv4-mapped");
        assert!(!c.contains(ip("fd77::1")));
        let c6: Cidr = "fd77::/64".parse().unwrap();
        assert!(c6.contains(ip("fd77::2")) && !c6.contains(ip("fd77:0:0:1::2")));
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.1")));
        for bad in ["10.0.0.0/33", "fd77::/129", "x/8", "10.0.0.0/"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn without_a_list_only_what_is_never_a_peer_is_refused() {
        let p = EgressPolicy::new(ip("10.77.0.1"), vec![]);
        assert!(p.allows(ip("10.77.0.2")) && p.allows(ip("fd77::2")));
        assert!(p.allows(ip("239.1.2.3")), "UD multicast");
        for never in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "0.0.0.0",
            "::",
            "255.255.255.255",
        ] {
            assert!(!p.allows(ip(never)), "{never}");
        }
        assert!(!p.allows(ip("::ffff:127.0.0.1")));
        for link_local in [
            "169.254.169.254",
            "169.254.0.1",
            "fe80::1",
            "febf::1",
            "::ffff:169.254.1.1",
        ] {
            assert!(!p.allows(ip(link_local)), "{link_local}");
        }
        assert!(p.allows(ip("fec0::1")), "fe80::/10 ends at febf");
        // A daemon on loopback talks to loopback peers (the tests' two daemons on 127.X.Y.*).
        let lo = EgressPolicy::new(ip("127.64.0.1"), vec![]);
        assert!(lo.allows(ip("127.64.0.2")));
        assert!(!lo.allows(ip("169.254.169.254")));
        // A daemon on a link-local address talks to its link's peers; a list names them too.
        let ll = EgressPolicy::new(ip("fe80::2"), vec![]);
        assert!(ll.allows(ip("fe80::3")) && !ll.allows(ip("::1")));
        let listed = EgressPolicy::new(ip("10.77.0.1"), vec!["169.254.7.0/24".parse().unwrap()]);
        assert!(listed.allows(ip("169.254.7.7")) && !listed.allows(ip("169.254.169.254")));
    }

    #[test]
    fn a_list_allows_its_prefixes_only() {
        let p = EgressPolicy::new(
            ip("10.77.0.1"),
            vec![
                "10.77.0.0/24".parse().unwrap(),
                "127.0.0.0/8".parse().unwrap(),
            ],
        );
        assert!(
            p.allows(ip("10.77.0.9")) && p.allows(ip("127.0.0.1")),
            "listed"
        );
        assert!(!p.allows(ip("10.77.1.1")) && !p.allows(ip("fd77::1")));
    }
}
