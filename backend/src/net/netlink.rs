//! `vhost-user-rdma link`: makes the host side of a guest's NIC — a netkit pair in L2 mode or a
//! veth pair — through rtnetlink, optionally with the peer enslaved to a bridge or moved into
//! a network namespace, and deletes it again. The daemon then runs with `--iface NAME`.
//!
//! ```text
//! vhost-user-rdma link add vh0 --peer vh0p --kind netkit --bridge br0
//! vhost-user-rdma link add vh0 --peer eth0 --kind veth --peer-netns tenant1
//! vhost-user-rdma link del vh0
//! ```

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use thiserror::Error;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
pub(crate) const NLM_F_REQUEST: u16 = 1;
pub(crate) const NLM_F_ACK: u16 = 4;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const SOL_NETLINK: i32 = 270;
pub(crate) const NETLINK_CAP_ACK: i32 = 10;
pub(crate) const NETLINK_EXT_ACK: i32 = 11;
/// In an NLMSG_ERROR's flags: the error carries TLVs after the (capped) request header.
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;
/// In an extended acknowledgement: the byte offset, in the request, of the attribute the
/// kernel found wanting (a u32).
pub(crate) const NLMSGERR_ATTR_OFFS: u16 = 2;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
/// VETH_INFO_PEER and IFLA_NETKIT_PEER_INFO: the peer's ifinfomsg and attributes.
const PEER_INFO: u16 = 1;
const IFLA_NETKIT_MODE: u16 = 5;
const NETKIT_L2: u32 = 0;
pub(crate) const NLA_F_NESTED: u16 = 1 << 15;
const IFF_UP: u32 = 1;
const IFNAMSIZ: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LinkKind {
    /// A netkit pair in L2 mode (Linux 6.7 or later, CONFIG_NETKIT).
    Netkit,
    /// A veth pair.
    Veth,
}

/// Create or delete the host side of a guest's NIC (for `--iface`).
#[derive(Parser, Debug)]
#[command(name = "vhost-user-rdma link")]
pub struct LinkArgs {
    #[command(subcommand)]
    pub cmd: LinkCmd,
}

#[derive(Subcommand, Debug)]
pub enum LinkCmd {
    /// Create a pair: NAME is the daemon's end (`--iface NAME`), --peer the segment's end.
    Add {
        name: String,
        /// The other end: put on the guest's segment (--bridge) or into a namespace.
        #[arg(long)]
        peer: String,
        #[arg(long, value_enum, default_value_t = LinkKind::Netkit)]
        kind: LinkKind,
        /// Enslave the peer to this bridge.
        #[arg(long)]
        bridge: Option<String>,
        /// Move the peer into this network namespace (a name under /run/netns, or a path).
        #[arg(long)]
        peer_netns: Option<String>,
        /// MTU of both ends.
        #[arg(long)]
        mtu: Option<u32>,
    },
    /// Delete a pair by either end in this namespace.
    Del { name: String },
}

#[derive(Debug, Error)]
pub enum LinkError {
    #[error("{0:?} is not a valid interface name (1 to 15 bytes, no '/', ':' or whitespace)")]
    Name(String),
    #[error("{0}: creating network interfaces needs CAP_NET_ADMIN, which this process does not have (run as root)")]
    NoCapNetAdmin(String),
    #[error("{0}: this kernel has no {1} support (netkit needs Linux 6.7 or later with CONFIG_NETKIT; --kind veth works everywhere)")]
    NoKind(String, &'static str),
    #[error("{0}: an interface of that name exists already")]
    Exists(String),
    #[error("{0}: no such interface")]
    NoSuchInterface(String),
    #[error("--peer-netns {0}: {1}")]
    Netns(String, io::Error),
    #[error("--bridge {0}: not a bridge (a pair's peer can only be enslaved to a bridge)")]
    NotABridge(String),
    #[error("{0}: {1}")]
    Netlink(String, io::Error),
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() < IFNAMSIZ
        && n != "."
        && n != ".."
        && !n
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

/// A netlink attribute writer over a message buffer: an rtnetlink request here, a
/// generic-netlink one for `net::devmem`.
pub(crate) struct Msg(Vec<u8>);

impl Msg {
    /// A generic-netlink request to `family` (its id; GENL_ID_CTRL for the controller):
    /// nlmsghdr with NLM_F_REQUEST and `nl_flags`, then genlmsghdr {cmd, version, 0}.
    pub(crate) fn genl(family: u16, nl_flags: u16, cmd: u8, version: u8) -> Msg {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&family.to_ne_bytes());
        b[6..8].copy_from_slice(&(nl_flags | NLM_F_REQUEST).to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&[cmd, version, 0, 0]);
        Msg(b)
    }

    /// A request: nlmsghdr, then an ifinfomsg for `index` with `flags`/`change`.
    fn new(kind: u16, nl_flags: u16, index: i32, flags: u32, change: u32) -> Msg {
        let mut b = vec![0u8; 16];
        b[4..6].copy_from_slice(&kind.to_ne_bytes());
        b[6..8].copy_from_slice(&(nl_flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let mut m = Msg(b);
        m.ifinfo(index, flags, change);
        m
    }

    /// struct ifinfomsg: family 0, type, index, flags, change.
    fn ifinfo(&mut self, index: i32, flags: u32, change: u32) {
        self.0.extend_from_slice(&[0, 0, 0, 0]);
        self.0.extend_from_slice(&index.to_ne_bytes());
        self.0.extend_from_slice(&flags.to_ne_bytes());
        self.0.extend_from_slice(&change.to_ne_bytes());
    }

    pub(crate) fn attr(&mut self, ty: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    pub(crate) fn str_attr(&mut self, ty: u16, s: &str) {
        let mut p = s.as_bytes().to_vec();
        p.push(0);
        self.attr(ty, &p);
    }

    pub(crate) fn u32_attr(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_ne_bytes());
    }

    /// Opens a nested attribute; [`Msg::end`] closes it.
    pub(crate) fn begin(&mut self, ty: u16) -> usize {
        let at = self.0.len();
        self.0.extend_from_slice(&[0, 0]);
        self.0.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        at
    }

    pub(crate) fn end(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

/// The RTM_NEWLINK request that creates the pair `name`/`peer` of `kind`.
fn new_pair_request(
    name: &str,
    peer: &str,
    kind: LinkKind,
    mtu: Option<u32>,
    peer_netns_fd: Option<i32>,
) -> Vec<u8> {
    let mut m = Msg::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0, 0, 0);
    m.str_attr(IFLA_IFNAME, name);
    if let Some(v) = mtu {
        m.u32_attr(IFLA_MTU, v);
    }
    let li = m.begin(IFLA_LINKINFO);
    m.str_attr(
        IFLA_INFO_KIND,
        match kind {
            LinkKind::Netkit => "netkit",
            LinkKind::Veth => "veth",
        },
    );
    let data = m.begin(IFLA_INFO_DATA);
    let p = m.begin(PEER_INFO);
    m.ifinfo(0, 0, 0);
    m.str_attr(IFLA_IFNAME, peer);
    if let Some(v) = mtu {
        m.u32_attr(IFLA_MTU, v);
    }
    if let Some(fd) = peer_netns_fd {
        m.u32_attr(IFLA_NET_NS_FD, fd as u32);
    }
    m.end(p);
    if kind == LinkKind::Netkit {
        m.u32_attr(IFLA_NETKIT_MODE, NETKIT_L2);
    }
    m.end(data);
    m.end(li);
    m.finish()
}

/// Sends one request and reads its acknowledgement: the kernel's errno as an error, with the
/// kernel's own words (its extended acknowledgement) when it gave some.
fn request(msg: &[u8]) -> io::Result<()> {
    let fd = crate::sys::route_netlink(0, 5)?;
    // Old kernels refuse: no text then.
    for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
        let _ = crate::sys::setsockopt(fd.as_raw_fd(), SOL_NETLINK, opt, &1i32);
    }
    crate::sys::netlink_send(fd.as_raw_fd(), msg)?;
    let mut buf = [0u8; 8192];
    loop {
        // SAFETY: the kernel writes at most `buf.len()` bytes into the live buffer.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let b = &buf[..n as usize];
        match ack_errno(b) {
            Some(0) => return Ok(()),
            Some(e) => {
                let os = io::Error::from_raw_os_error(e);
                return Err(match ack_text(b) {
                    Some(t) => io::Error::new(os.kind(), Said { os, text: t }),
                    None => os,
                });
            }
            None => continue,
        }
    }
}

/// The errno of the first NLMSG_ERROR in `b` (0: an acknowledgement), if there is one.
pub(crate) fn ack_errno(b: &[u8]) -> Option<i32> {
    let mut at = 0;
    while at + 20 <= b.len() {
        let len = u32::from_ne_bytes(b[at..at + 4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(b[at + 4..at + 6].try_into().ok()?);
        if len < 16 {
            return None;
        }
        if ty == NLMSG_ERROR {
            let e = i32::from_ne_bytes(b[at + 16..at + 20].try_into().ok()?);
            return Some(-e);
        }
        at += (len + 3) & !3;
    }
    None
}

/// The kernel's words in the first NLMSG_ERROR of `b` (NLMSGERR_ATTR_MSG of an extended
/// acknowledgement whose request header was capped), if it gave any.
pub(crate) fn ack_text(b: &[u8]) -> Option<String> {
    let v = ack_tlv(b, NLMSGERR_ATTR_MSG)?;
    let v = v.split(|&c| c == 0).next().unwrap_or(v);
    let text = String::from_utf8_lossy(v).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// The payload of TLV `ty` in the first NLMSG_ERROR of `b` (an extended acknowledgement
/// whose request header was capped), if it is there whole.
pub(crate) fn ack_tlv(b: &[u8], ty: u16) -> Option<&[u8]> {
    let len = u32::from_ne_bytes(b.get(..4)?.try_into().ok()?) as usize;
    let kind = u16::from_ne_bytes(b.get(4..6)?.try_into().ok()?);
    let flags = u16::from_ne_bytes(b.get(6..8)?.try_into().ok()?);
    if kind != NLMSG_ERROR || flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    // nlmsghdr, the error, the request's nlmsghdr (capped), then the TLVs.
    let msg = b.get(..len.min(b.len()))?;
    let mut at = 16 + 4 + 16;
    while at + 4 <= msg.len() {
        let l = u16::from_ne_bytes(msg[at..at + 2].try_into().ok()?) as usize;
        let t = u16::from_ne_bytes(msg[at + 2..at + 4].try_into().ok()?) & !NLA_F_NESTED;
        if l < 4 || at + l > msg.len() {
            return None;
        }
        if t == ty {
            return Some(&msg[at + 4..at + l]);
        }
        at += (l + 3) & !3;
    }
    None
}

/// An errno with the kernel's explanation of it.
#[derive(Debug)]
pub(crate) struct Said {
    pub(crate) os: io::Error,
    pub(crate) text: String,
}

impl std::fmt::Display for Said {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (the kernel says: {})", self.os, self.text)
    }
}

impl std::error::Error for Said {}

/// The errno of `e`, also when it carries the kernel's words ([`Said`]).
fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        e.get_ref()
            .and_then(|i| i.downcast_ref::<Said>())
            .and_then(|s| s.os.raw_os_error())
    })
}

fn index_of(name: &str) -> Option<i32> {
    let c = CString::new(name).ok()?;
    // SAFETY: a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i as i32)
}

fn set_link(name: &str, index: i32, master: Option<i32>) -> Result<(), LinkError> {
    let mut m = Msg::new(RTM_NEWLINK, 0, index, IFF_UP, IFF_UP);
    if let Some(b) = master {
        m.u32_attr(IFLA_MASTER, b as u32);
    }
    request(&m.finish()).map_err(|e| match errno(&e) {
        // Not "no veth support": the pair exists; what failed is bringing it up or
        // enslaving it.
        Some(libc::EOPNOTSUPP) => LinkError::Netlink(name.to_string(), e),
        _ => classify(name, e, LinkKind::Veth),
    })
}

fn classify(name: &str, e: io::Error, kind: LinkKind) -> LinkError {
    match errno(&e) {
        Some(libc::EPERM) | Some(libc::EACCES) => LinkError::NoCapNetAdmin(name.to_string()),
        Some(libc::EOPNOTSUPP) => LinkError::NoKind(
            name.to_string(),
            match kind {
                LinkKind::Netkit => "netkit",
                LinkKind::Veth => "veth",
            },
        ),
        Some(libc::EEXIST) => LinkError::Exists(name.to_string()),
        Some(libc::ENODEV) => LinkError::NoSuchInterface(name.to_string()),
        _ => LinkError::Netlink(name.to_string(), e),
    }
}

/// Creates the pair and brings the daemon's end up (and the peer, when it stays here).
pub fn add(
    name: &str,
    peer: &str,
    kind: LinkKind,
    bridge: Option<&str>,
    peer_netns: Option<&str>,
    mtu: Option<u32>,
) -> Result<(), LinkError> {
    for n in [name, peer] {
        if !valid_name(n) {
            return Err(LinkError::Name(n.to_string()));
        }
    }
    let master = match bridge {
        Some(b) => Some(index_of(b).ok_or_else(|| LinkError::NoSuchInterface(b.to_string()))?),
        None => None,
    };
    let ns = match peer_netns {
        Some(n) => {
            let path = if n.contains('/') {
                PathBuf::from(n)
            } else {
                PathBuf::from("/run/netns").join(n)
            };
            Some(std::fs::File::open(&path).map_err(|e| LinkError::Netns(n.to_string(), e))?)
        }
        None => None,
    };
    let msg = new_pair_request(name, peer, kind, mtu, ns.as_ref().map(|f| f.as_raw_fd()));
    request(&msg).map_err(|e| {
        // Which name clashed is not said; both are ours to report.
        let e = classify(name, e, kind);
        match e {
            LinkError::Exists(_) if index_of(name).is_none() => LinkError::Exists(peer.to_string()),
            e => e,
        }
    })?;
    let up = |n: &str, master| -> Result<(), LinkError> {
        let i = index_of(n).ok_or_else(|| LinkError::NoSuchInterface(n.to_string()))?;
        set_link(n, i, master)
    };
    let r = up(name, None).and_then(|()| {
        if ns.is_none() {
            up(peer, master).map_err(|e| match (&e, bridge) {
                // Enslaving to an interface that cannot take ports: the kernel says only
                // EOPNOTSUPP.
                (LinkError::Netlink(_, io), Some(b)) if errno(io) == Some(libc::EOPNOTSUPP) => {
                    LinkError::NotABridge(b.to_string())
                }
                _ => e,
            })
        } else {
            Ok(())
        }
    });
    if r.is_err() {
        let _ = del(name);
    }
    r
}

/// Deletes interface `name` (a pair goes with either end).
pub fn del(name: &str) -> Result<(), LinkError> {
    if !valid_name(name) {
        return Err(LinkError::Name(name.to_string()));
    }
    let i = index_of(name).ok_or_else(|| LinkError::NoSuchInterface(name.to_string()))?;
    let m = Msg::new(RTM_DELLINK, 0, i, 0, 0);
    request(&m.finish()).map_err(|e| classify(name, e, LinkKind::Veth))
}

/// `vhost-user-rdma link …`.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = match LinkArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let r = match &a.cmd {
        LinkCmd::Add {
            name,
            peer,
            kind,
            bridge,
            peer_netns,
            mtu,
        } => add(
            name,
            peer,
            *kind,
            bridge.as_deref(),
            peer_netns.as_deref(),
            *mtu,
        ),
        LinkCmd::Del { name } => del(name),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vhost-user-rdma link: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes (type, payload) of a buffer of attributes.
    fn attrs(mut b: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut v = Vec::new();
        while b.len() >= 4 {
            let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
            let ty = u16::from_ne_bytes([b[2], b[3]]) & !NLA_F_NESTED;
            v.push((ty, b[4..len].to_vec()));
            b = &b[((len + 3) & !3).min(b.len())..];
        }
        v
    }

    fn find(a: &[(u16, Vec<u8>)], ty: u16) -> Vec<u8> {
        a.iter()
            .find(|(t, _)| *t == ty)
            .unwrap_or_else(|| panic!("no attribute {ty}"))
            .1
            .clone()
    }

    #[test]
    fn a_netkit_pair_request_is_laid_out_as_the_kernel_reads_it() {
        let m = new_pair_request("vh0", "vh0p", LinkKind::Netkit, Some(9000), Some(7));
        assert_eq!(
            u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), RTM_NEWLINK);
        let flags = u16::from_ne_bytes([m[6], m[7]]);
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        let top = attrs(&m[32..]);
        assert_eq!(find(&top, IFLA_IFNAME), b"vh0\0");
        assert_eq!(find(&top, IFLA_MTU), 9000u32.to_ne_bytes());
        let li = attrs(&find(&top, IFLA_LINKINFO));
        assert_eq!(find(&li, IFLA_INFO_KIND), b"netkit\0");
        let data = attrs(&find(&li, IFLA_INFO_DATA));
        assert_eq!(find(&data, IFLA_NETKIT_MODE), NETKIT_L2.to_ne_bytes());
        let peer = find(&data, PEER_INFO);
        assert_eq!(&peer[..16], &[0u8; 16], "the peer's ifinfomsg");
        let pa = attrs(&peer[16..]);
        assert_eq!(find(&pa, IFLA_IFNAME), b"vh0p\0");
        assert_eq!(find(&pa, IFLA_NET_NS_FD), 7u32.to_ne_bytes());
        let v = new_pair_request("a", "b", LinkKind::Veth, None, None);
        let li = attrs(&find(&attrs(&v[32..]), IFLA_LINKINFO));
        assert_eq!(find(&li, IFLA_INFO_KIND), b"veth\0");
        let data = attrs(&find(&li, IFLA_INFO_DATA));
        assert_eq!(data.len(), 1, "veth: the peer only");
    }

    #[test]
    fn acknowledgements_and_errors_are_read() {
        let mut ack = vec![0u8; 36];
        ack[..4].copy_from_slice(&36u32.to_ne_bytes());
        ack[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert_eq!(ack_errno(&ack), Some(0));
        ack[16..20].copy_from_slice(&(-libc::EOPNOTSUPP).to_ne_bytes());
        assert_eq!(ack_errno(&ack), Some(libc::EOPNOTSUPP));
        assert_eq!(ack_errno(&ack[..19]), None, "cut short");
        let mut bad = ack.clone();
        bad[..4].copy_from_slice(&3u32.to_ne_bytes());
        assert_eq!(ack_errno(&bad), None, "a length below the header");
    }

    /// An extended acknowledgement as the kernel sends it with NETLINK_CAP_ACK: the error,
    /// the request's header alone, then NLMSGERR_ATTR_MSG.
    #[test]
    fn the_kernels_words_are_kept() {
        let text = b"mtu greater than device maximum\0";
        let tlv_len = 4 + text.len();
        let len = 36 + ((tlv_len + 3) & !3);
        let mut m = vec![0u8; len];
        m[..4].copy_from_slice(&(len as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m[6..8].copy_from_slice(&(0x100 | NLM_F_ACK_TLVS).to_ne_bytes());
        m[16..20].copy_from_slice(&(-libc::EINVAL).to_ne_bytes());
        m[36..38].copy_from_slice(&(tlv_len as u16).to_ne_bytes());
        m[38..40].copy_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        m[40..40 + text.len()].copy_from_slice(text);
        assert_eq!(ack_errno(&m), Some(libc::EINVAL));
        assert_eq!(
            ack_text(&m).as_deref(),
            Some("mtu greater than device maximum")
        );
        // Without the flag, or cut inside the TLV, there are no words.
        let mut plain = m.clone();
        plain[6..8].copy_from_slice(&0x100u16.to_ne_bytes());
        assert_eq!(ack_text(&plain), None);
        assert_eq!(ack_text(&m[..44]), None);
        // The words reach the error the user reads, and the errno its classification.
        let os = io::Error::from_raw_os_error(libc::EINVAL);
        let e = io::Error::new(
            os.kind(),
            Said {
                os,
                text: "mtu greater than device maximum".into(),
            },
        );
        assert_eq!(errno(&e), Some(libc::EINVAL));
        let shown = classify("vh0", e, LinkKind::Veth).to_string();
        assert!(
            shown.contains("the kernel says: mtu greater than device maximum"),
            "{shown}"
        );
    }

    #[test]
    fn interface_names() {
        for ok in ["vh0", "a", "vur-guest-0123"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "0123456789abcdef", "a/b", "a:b", "a b", ".", ".."] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
