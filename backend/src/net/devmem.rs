//! Devmem receive of RoCEv2: a probe that says, step by step, why the daemon cannot have the
//! NIC put received RoCEv2 payloads straight into a dma-buf.
//!
//! Linux "devmem TCP" binds a dma-buf to NIC RX queues with the generic-netlink family
//! `netdev`, command NETDEV_CMD_BIND_RX (include/uapi/linux/netdev.h; handled by
//! `netdev_nl_bind_rx_doit` in net/core/netdev-genl.c). The binding lives as long as the
//! netlink socket that made it (Documentation/networking/devmem.rst, "NIC Setup": "unbind
//! ... by closing the netlink socket"). The kernel refuses it with EOPNOTSUPP on a driver
//! without the queue-management API (`netdev_need_ops_lock` in `netdev_nl_bind_rx_doit`;
//! before that, `queue_mgmt_ops` in `netdev_rx_queue_restart`, net/core/netdev_rx_queue.c);
//! on a queue whose device has `tcp-data-split` off or `hds-thresh` above zero, is virtual
//! (no parent device), has XDP or a memory provider already (`__net_mp_open_rxq`, same file,
//! with words in the extended ack); on a file that is not a dma-buf (EINVAL from
//! `dma_buf_get` in drivers/dma-buf/dma-buf.c, via `net_devmem_bind_dmabuf` in
//! net/core/devmem.c); and without CAP_NET_ADMIN (the op is GENL_ADMIN_PERM in
//! net/core/netdev-genl-gen.c). Which check comes first differs between kernels; the probe
//! reports the one this kernel hit.
//!
//! Even a bound queue does not help RoCEv2: devmem receive is TCP only. Payloads in the
//! dma-buf reach user space only through `tcp_recvmsg_dmabuf` (net/ipv4/tcp.c, recvmsg with
//! MSG_SOCK_DEVMEM); for every other reader the skb's net_iov frags are "unreadable":
//! `__skb_datagram_iter` (net/core/datagram.c, behind `skb_copy_datagram_iter`, which UDP's
//! `udp_recvmsg` in net/ipv4/udp.c and AF_PACKET's `packet_recvmsg` use) stops at them
//! (`!skb_frags_readable(skb)`) with EFAULT (devmem.rst, "Unreadable skbs"). io_uring's
//! zero-copy receive, the other user of the same memory providers, is TCP only as well
//! (`io_zcrx_recv` in io_uring/zcrx.c: EPROTONOSUPPORT unless the socket's recvmsg is
//! `tcp_recvmsg`). So [`probe_rx`] always ends in a [`DevmemRefusal`] today; what it adds is
//! the exact step at which a host falls short.

use std::convert::Infallible;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use thiserror::Error;

use super::netlink::{
    ack_errno, ack_text, ack_tlv, Msg, NETLINK_CAP_ACK, NETLINK_EXT_ACK, NLA_F_NESTED,
    NLMSGERR_ATTR_OFFS, NLMSG_ERROR, SOL_NETLINK,
};

/// The generic-netlink controller's id (include/uapi/linux/genetlink.h).
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_NEWFAMILY: u8 = 1;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const CTRL_ATTR_OPS: u16 = 6;
const CTRL_ATTR_OP_ID: u16 = 1;
/// NETDEV_FAMILY_NAME and NETDEV_FAMILY_VERSION (include/uapi/linux/netdev.h).
const NETDEV_FAMILY: &str = "netdev";
const NETDEV_FAMILY_VERSION: u8 = 1;
/// NETDEV_CMD_BIND_RX: the 13th command of the netdev family (Linux 6.12 and later).
const NETDEV_CMD_BIND_RX: u8 = 13;
/// The "dmabuf" attribute set.
const NETDEV_A_DMABUF_IFINDEX: u16 = 1;
const NETDEV_A_DMABUF_QUEUES: u16 = 2;
const NETDEV_A_DMABUF_FD: u16 = 3;
const NETDEV_A_DMABUF_ID: u16 = 4;
/// The "queue" attribute set, nested in NETDEV_A_DMABUF_QUEUES.
const NETDEV_A_QUEUE_ID: u16 = 1;
const NETDEV_A_QUEUE_TYPE: u16 = 3;
const NETDEV_QUEUE_TYPE_RX: u32 = 0;
/// How long the kernel may take to answer one request.
const RCV_TIMEOUT_S: i64 = 5;

/// What the last step always adds: the kernel's devmem receive serves TCP only.
const TCP_ONLY: &str = "devmem receive serves TCP sockets only (tcp_recvmsg with \
MSG_SOCK_DEVMEM); UDP recvmsg and AF_PACKET cannot copy an skb's unreadable net_iov frags \
(EFAULT in __skb_datagram_iter), so RoCEv2 (UDP port 4791) payloads cannot be received into \
a bound dma-buf";

/// What the probe found, step by step, ending in why devmem receive is unavailable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevmemRefusal {
    pub iface: String,
    pub steps: Vec<String>,
    pub reason: String,
}

impl std::fmt::Display for DevmemRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "devmem receive on {} is unavailable: {} (checked: {})",
            self.iface,
            self.reason,
            self.steps.join("; ")
        )
    }
}

impl std::error::Error for DevmemRefusal {}

/// A generic-netlink answer that is not what was asked for.
#[derive(Debug, Error, PartialEq, Eq)]
enum ReplyError {
    /// The kernel's NLMSG_ERROR: errno, its words, and the attribute it pointed at.
    #[error("{}{}{}", io::Error::from_raw_os_error(*.errno),
        .text.as_ref().map(|t| format!(", the kernel says: {t}")).unwrap_or_default(),
        .attr.as_ref().map(|a| format!(", at the {a} attribute")).unwrap_or_default())]
    Kernel {
        errno: i32,
        text: Option<String>,
        attr: Option<&'static str>,
    },
    #[error("a malformed answer: {0}")]
    Malformed(&'static str),
}

/// A family as the generic-netlink controller describes it.
#[derive(Debug, PartialEq, Eq)]
struct Family {
    id: u16,
    ops: Vec<u32>,
}

/// CTRL_CMD_GETFAMILY of `name`: the controller answers with the family or an error.
fn getfamily_request(name: &str) -> Vec<u8> {
    let mut m = Msg::genl(GENL_ID_CTRL, 0, CTRL_CMD_GETFAMILY, 1);
    m.str_attr(CTRL_ATTR_FAMILY_NAME, name);
    m.finish()
}

/// NETDEV_CMD_BIND_RX of dma-buf `fd` to the RX `queues` of `ifindex`, to the netdev family
/// `family`: ifindex, one nested queue (id, type RX) per queue, then the fd. Without
/// NLM_F_ACK: the kernel answers with the binding's id or an error.
fn bind_rx_request(family: u16, ifindex: u32, queues: &[u32], fd: u32) -> Vec<u8> {
    let mut m = Msg::genl(family, 0, NETDEV_CMD_BIND_RX, NETDEV_FAMILY_VERSION);
    m.u32_attr(NETDEV_A_DMABUF_IFINDEX, ifindex);
    for &q in queues {
        let at = m.begin(NETDEV_A_DMABUF_QUEUES);
        m.u32_attr(NETDEV_A_QUEUE_ID, q);
        m.u32_attr(NETDEV_A_QUEUE_TYPE, NETDEV_QUEUE_TYPE_RX);
        m.end(at);
    }
    m.u32_attr(NETDEV_A_DMABUF_FD, fd);
    m.finish()
}

/// The attributes (type without NLA_F_NESTED, payload) of `b`; an attribute that overruns
/// `b`, is shorter than its header, or is cut inside its header is an error.
fn attrs(mut b: &[u8]) -> Result<Vec<(u16, &[u8])>, ReplyError> {
    let mut v = Vec::new();
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let ty = u16::from_ne_bytes([b[2], b[3]]) & !NLA_F_NESTED;
        if len < 4 || len > b.len() {
            return Err(ReplyError::Malformed("an attribute overruns its message"));
        }
        v.push((ty, &b[4..len]));
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    if !b.is_empty() {
        return Err(ReplyError::Malformed("a cut attribute"));
    }
    Ok(v)
}

/// The generic-netlink payload (attributes after genlmsghdr) of the first message of `b`,
/// checked to be of `kind` with command `cmd`; the kernel's error when it sent one. `req` is
/// the request, to name the attribute an error points at.
fn genl_payload<'a>(b: &'a [u8], kind: u16, cmd: u8, req: &[u8]) -> Result<&'a [u8], ReplyError> {
    let head = b
        .get(..16)
        .ok_or(ReplyError::Malformed("shorter than a netlink header"))?;
    let len = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let ty = u16::from_ne_bytes([head[4], head[5]]);
    if len < 16 || len > b.len() {
        return Err(ReplyError::Malformed("a netlink length beyond the answer"));
    }
    let msg = &b[..len];
    if ty == NLMSG_ERROR {
        let errno = ack_errno(msg).ok_or(ReplyError::Malformed("a cut error message"))?;
        if errno == 0 {
            return Err(ReplyError::Malformed("an acknowledgement, no answer"));
        }
        let attr = ack_tlv(msg, NLMSGERR_ATTR_OFFS)
            .and_then(|o| Some(u32::from_ne_bytes(o.get(..4)?.try_into().ok()?)))
            .and_then(|o| attr_at(req, o as usize));
        return Err(ReplyError::Kernel {
            errno,
            text: ack_text(msg),
            attr,
        });
    }
    if ty != kind || msg.len() < 20 || msg[16] != cmd {
        return Err(ReplyError::Malformed("an answer of another kind"));
    }
    Ok(&msg[20..])
}

/// The name of the attribute of our BIND_RX request `req` that starts at byte `off` (what
/// NLMSGERR_ATTR_OFFS says).
fn attr_at(req: &[u8], off: usize) -> Option<&'static str> {
    let mut at = 20;
    while at + 4 <= req.len() {
        let len = u16::from_ne_bytes([req[at], req[at + 1]]) as usize;
        let ty = u16::from_ne_bytes([req[at + 2], req[at + 3]]) & !NLA_F_NESTED;
        if len < 4 {
            return None;
        }
        if at == off {
            return Some(match ty {
                NETDEV_A_DMABUF_IFINDEX => "ifindex",
                NETDEV_A_DMABUF_QUEUES => "queues",
                NETDEV_A_DMABUF_FD => "fd",
                _ => "unknown",
            });
        }
        if ty == NETDEV_A_DMABUF_QUEUES && off > at && off < at + len {
            let inner = off - at - 4;
            let a = attrs(req.get(at + 4..at + len)?).ok()?;
            let mut o = 0;
            for (t, p) in a {
                if o == inner {
                    return Some(match t {
                        NETDEV_A_QUEUE_ID => "queue id",
                        NETDEV_A_QUEUE_TYPE => "queue type",
                        _ => "unknown",
                    });
                }
                o += (4 + p.len() + 3) & !3;
            }
            return None;
        }
        at += (len + 3) & !3;
    }
    None
}

/// The family id and op ids in the controller's answer `b` to [`getfamily_request`] `req`.
fn parse_family(b: &[u8], req: &[u8]) -> Result<Family, ReplyError> {
    let payload = genl_payload(b, GENL_ID_CTRL, CTRL_CMD_NEWFAMILY, req)?;
    let mut id = None;
    let mut ops = Vec::new();
    for (ty, p) in attrs(payload)? {
        match ty {
            CTRL_ATTR_FAMILY_ID => {
                let v = p
                    .get(..2)
                    .ok_or(ReplyError::Malformed("a short family id"))?;
                id = Some(u16::from_ne_bytes([v[0], v[1]]));
            }
            CTRL_ATTR_OPS => {
                for (_, op) in attrs(p)? {
                    for (t, v) in attrs(op)? {
                        if t == CTRL_ATTR_OP_ID {
                            let v = v.get(..4).ok_or(ReplyError::Malformed("a short op id"))?;
                            ops.push(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let id = id.ok_or(ReplyError::Malformed("no family id"))?;
    Ok(Family { id, ops })
}

/// The binding id in the netdev family's (`family`) answer `b` to BIND_RX request `req`.
fn parse_bind_reply(b: &[u8], family: u16, req: &[u8]) -> Result<u32, ReplyError> {
    let payload = genl_payload(b, family, NETDEV_CMD_BIND_RX, req)?;
    for (ty, p) in attrs(payload)? {
        if ty == NETDEV_A_DMABUF_ID {
            let v = p
                .get(..4)
                .ok_or(ReplyError::Malformed("a short binding id"))?;
            return Ok(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]));
        }
    }
    Err(ReplyError::Malformed("no binding id"))
}

/// Sends `req` on `fd` and returns the kernel's one answer.
fn transact(fd: &OwnedFd, req: &[u8]) -> io::Result<Vec<u8>> {
    crate::sys::netlink_send(fd.as_raw_fd(), req)?;
    let mut buf = vec![0u8; 65536];
    // SAFETY: the kernel writes at most `buf.len()` bytes into the live buffer.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// A generic-netlink socket that asks for the kernel's words with its errors (old kernels
/// refuse the options: no words then).
fn genl_socket() -> io::Result<OwnedFd> {
    let fd = crate::sys::netlink_socket(libc::NETLINK_GENERIC, RCV_TIMEOUT_S)?;
    for opt in [NETLINK_EXT_ACK, NETLINK_CAP_ACK] {
        let _ = crate::sys::setsockopt(fd.as_raw_fd(), SOL_NETLINK, opt, &1i32);
    }
    Ok(fd)
}

/// The number of RX queues of `iface`: its `queues/rx-*` in sysfs, which net/core/net-sysfs.c
/// (`net_rx_queue_update_kobjects`) keeps at `real_num_rx_queues`, the bound BIND_RX checks
/// queue ids against.
fn rx_queues(iface: &str) -> io::Result<u32> {
    let dir = std::path::Path::new("/sys/class/net")
        .join(iface)
        .join("queues");
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        if e?.file_name().to_string_lossy().starts_with("rx-") {
            n += 1;
        }
    }
    Ok(n)
}

/// Why the kernel's refusal of BIND_RX means what it does, where the errno alone says it.
fn bind_hint(e: &ReplyError) -> &'static str {
    match e {
        ReplyError::Kernel {
            errno: libc::EOPNOTSUPP,
            ..
        } => "the driver has no queue-management API (netdev queue_mgmt_ops), which binding a dma-buf to an RX queue needs",
        ReplyError::Kernel {
            errno: libc::EPERM, ..
        } => "binding a dma-buf to an RX queue needs CAP_NET_ADMIN",
        ReplyError::Kernel {
            errno: libc::EINVAL,
            text: None,
            ..
        } => "the fd may not be a dma-buf (dma_buf_get refuses other files with EINVAL)",
        ReplyError::Kernel { .. } => "the kernel refused to bind the dma-buf to an RX queue",
        ReplyError::Malformed(_) => "the kernel's answer to the bind could not be read",
    }
}

/// Steps 1 to 4 of [`probe_rx`], each recorded in `steps`; the error is the reason of the
/// first that fell short.
fn checks(iface: &str, dmabuf: BorrowedFd<'_>, steps: &mut Vec<String>) -> Result<(), String> {
    // 1. The interface.
    let Ok(name) = CString::new(iface) else {
        steps.push(format!("{iface:?} has a NUL byte"));
        return Err(format!("{iface:?} is not an interface name"));
    };
    // SAFETY: a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        let e = io::Error::last_os_error();
        steps.push(format!("if_nametoindex({iface}): {e}"));
        return Err(format!("there is no interface named {iface:?}"));
    }
    steps.push(format!("{iface} is ifindex {ifindex}"));

    // 2. The netdev family and its bind-rx op.
    let fd = genl_socket().map_err(|e| {
        steps.push(format!("a NETLINK_GENERIC socket: {e}"));
        format!("no generic-netlink socket: {e}")
    })?;
    let req = getfamily_request(NETDEV_FAMILY);
    let fam = transact(&fd, &req)
        .map_err(ReplyError::from_io)
        .and_then(|b| parse_family(&b, &req));
    let fam = match fam {
        Ok(f) => f,
        Err(e) => {
            steps.push(format!(
                "CTRL_CMD_GETFAMILY of the generic-netlink family \"{NETDEV_FAMILY}\": {e}"
            ));
            return Err(match e {
                ReplyError::Kernel {
                    errno: libc::ENOENT,
                    ..
                } => format!("this kernel has no generic-netlink family \"{NETDEV_FAMILY}\" (devmem receive needs Linux 6.12 or later)"),
                e => format!("the generic-netlink family \"{NETDEV_FAMILY}\" could not be looked up: {e}"),
            });
        }
    };
    let has_bind = fam.ops.contains(&u32::from(NETDEV_CMD_BIND_RX));
    steps.push(format!(
        "the generic-netlink family \"{NETDEV_FAMILY}\" is id {} with {} ops, bind-rx (op {NETDEV_CMD_BIND_RX}) {}",
        fam.id,
        fam.ops.len(),
        if has_bind { "among them" } else { "not among them" }
    ));
    if !has_bind {
        return Err(format!(
            "the \"{NETDEV_FAMILY}\" family of this kernel has no bind-rx op (devmem receive needs Linux 6.12 or later)"
        ));
    }

    // 3. The RX queues.
    let queues = match rx_queues(iface) {
        Ok(n) if n > 0 => n,
        Ok(_) => {
            steps.push(format!("/sys/class/net/{iface}/queues lists no rx-* queue"));
            return Err(format!("{iface} has no RX queue to bind"));
        }
        Err(e) => {
            steps.push(format!("/sys/class/net/{iface}/queues: {e}"));
            return Err(format!(
                "the RX queues of {iface} could not be counted: {e}"
            ));
        }
    };
    let last = queues - 1;
    steps.push(format!(
        "{iface} has {queues} RX queue{} (sysfs)",
        if queues == 1 { "" } else { "s" }
    ));

    // 4. The bind, on the last queue (where RSS is most easily steered away from).
    let req = bind_rx_request(fam.id, ifindex, &[last], dmabuf.as_raw_fd() as u32);
    let what = format!(
        "NETDEV_CMD_BIND_RX of the dma-buf (fd {}) to RX queue {last} of {iface}",
        dmabuf.as_raw_fd()
    );
    let r = transact(&fd, &req)
        .map_err(ReplyError::from_io)
        .and_then(|b| parse_bind_reply(&b, fam.id, &req));
    // Closing the socket unbinds whatever it bound.
    drop(fd);
    match r {
        Ok(id) => {
            steps.push(format!(
                "{what}: bound as binding {id}, unbound again by closing the netlink socket"
            ));
            Ok(())
        }
        Err(e) => {
            steps.push(format!("{what}: refused, {e}"));
            Err(format!("{}: {e}", bind_hint(&e)))
        }
    }
}

impl ReplyError {
    /// A failed send or receive, as the kernel's errno (no words, no attribute).
    fn from_io(e: io::Error) -> ReplyError {
        ReplyError::Kernel {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            text: None,
            attr: None,
        }
    }
}

/// Probes devmem receive of RoCEv2 on `iface` with `dmabuf` (a dma-buf fd the daemon holds,
/// e.g. a udmabuf): 1) the interface exists (if_nametoindex), 2) the kernel has the
/// generic-netlink family "netdev" (CTRL_CMD_GETFAMILY) and it lists the bind-rx op
/// (CTRL_ATTR_OPS / CTRL_ATTR_OP_ID 13), 3) the number of RX queues (sysfs
/// `queues/rx-*`), 4) tries NETDEV_CMD_BIND_RX of `dmabuf` to the last RX queue and records
/// the kernel's answer (errno and extended-ack words, or the binding id; the socket is then
/// closed, which unbinds), 5) the kernel's devmem receive serves TCP only (see the module's
/// documentation). Always an error today, with every step recorded; the reason is the first
/// step that fell short or, when the bind succeeded, the TCP-only fact.
///
/// On a NIC that takes the bind, the kernel restarts that RX queue on binding and again on
/// unbinding (`netdev_rx_queue_restart`), and what RSS sends to it meanwhile lands in the
/// dma-buf, unreadable to all but TCP: call it at start-up, not on a busy port.
pub fn probe_rx(iface: &str, dmabuf: BorrowedFd<'_>) -> Result<Infallible, DevmemRefusal> {
    let mut steps = Vec::new();
    let reason = match checks(iface, dmabuf, &mut steps) {
        Err(r) => r,
        Ok(()) => "the kernel serves devmem receive to TCP sockets only and RoCEv2 is UDP (port 4791): its payloads cannot be received into a bound dma-buf".to_string(),
    };
    steps.push(TCP_ONLY.to_string());
    Err(DevmemRefusal {
        iface: iface.to_string(),
        steps,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The top-level attributes of a generic-netlink message, raw type kept (NLA_F_NESTED
    /// included), with the offset of each.
    fn top(m: &[u8]) -> Vec<(usize, u16, Vec<u8>)> {
        let mut v = Vec::new();
        let mut at = 20;
        while at + 4 <= m.len() {
            let len = u16::from_ne_bytes([m[at], m[at + 1]]) as usize;
            let ty = u16::from_ne_bytes([m[at + 2], m[at + 3]]);
            v.push((at, ty, m[at + 4..at + len].to_vec()));
            at += (len + 3) & !3;
        }
        assert_eq!(at, m.len(), "the attributes fill the message exactly");
        v
    }

    fn header_ok(m: &[u8], kind: u16, cmd: u8, version: u8) {
        assert_eq!(
            u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        assert!(m.len().is_multiple_of(4), "NLMSG_ALIGNed");
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), kind);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 1, "NLM_F_REQUEST only");
        assert_eq!(&m[16..20], &[cmd, version, 0, 0], "genlmsghdr");
    }

    #[test]
    fn a_getfamily_request_is_laid_out_as_the_controller_reads_it() {
        let m = getfamily_request("netdev");
        header_ok(&m, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1);
        // nlmsghdr 16, genlmsghdr 4, attribute header 4, "netdev\0" 7 padded to 8.
        assert_eq!(m.len(), 32);
        let a = top(&m);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].1, CTRL_ATTR_FAMILY_NAME);
        assert_eq!(a[0].2, b"netdev\0");
        assert_eq!(
            u16::from_ne_bytes([m[20], m[21]]),
            11,
            "the length leaves the pad out"
        );
    }

    #[test]
    fn a_bind_rx_request_is_laid_out_as_the_kernel_reads_it() {
        let m = bind_rx_request(42, 7, &[3, 15], 9);
        header_ok(&m, 42, NETDEV_CMD_BIND_RX, NETDEV_FAMILY_VERSION);
        // 20 of headers, ifindex 8, two queues of 4 + 8 + 8, fd 8.
        assert_eq!(m.len(), 20 + 8 + 2 * 20 + 8);
        let a = top(&m);
        for (at, _, _) in &a {
            assert!(at.is_multiple_of(4), "attribute at {at} aligned");
        }
        let types: Vec<u16> = a.iter().map(|x| x.1).collect();
        let q = NETDEV_A_DMABUF_QUEUES | NLA_F_NESTED;
        assert_eq!(
            types,
            [NETDEV_A_DMABUF_IFINDEX, q, q, NETDEV_A_DMABUF_FD],
            "ifindex, the queues (nested), the fd"
        );
        assert_eq!(a[0].2, 7u32.to_ne_bytes());
        assert_eq!(a[3].2, 9u32.to_ne_bytes());
        for (i, want) in [(1, 3u32), (2, 15)] {
            let inner = attrs(&a[i].2).unwrap();
            assert_eq!(inner.len(), 2);
            assert_eq!(inner[0], (NETDEV_A_QUEUE_ID, &want.to_ne_bytes()[..]));
            assert_eq!(
                inner[1],
                (NETDEV_A_QUEUE_TYPE, &NETDEV_QUEUE_TYPE_RX.to_ne_bytes()[..])
            );
        }
        // An error pointing at an attribute is named after it.
        assert_eq!(attr_at(&m, a[0].0), Some("ifindex"));
        assert_eq!(attr_at(&m, a[2].0), Some("queues"));
        assert_eq!(attr_at(&m, a[2].0 + 4), Some("queue id"));
        assert_eq!(attr_at(&m, a[2].0 + 12), Some("queue type"));
        assert_eq!(attr_at(&m, a[3].0), Some("fd"));
        assert_eq!(attr_at(&m, 3), None);
        assert_eq!(attr_at(&m, 999), None);
    }

    /// The controller's answer describing a family `id` with `ops`, as ctrl_fill_info lays it
    /// out: id, name, then the ops, each a nested entry of id and flags.
    fn family_reply(id: u16, ops: &[u32]) -> Vec<u8> {
        let mut m = Msg::genl(GENL_ID_CTRL, 0, CTRL_CMD_NEWFAMILY, 2);
        m.attr(CTRL_ATTR_FAMILY_ID, &id.to_ne_bytes());
        m.str_attr(CTRL_ATTR_FAMILY_NAME, "netdev");
        let all = m.begin(CTRL_ATTR_OPS);
        for (i, &op) in ops.iter().enumerate() {
            let e = m.begin(i as u16 + 1);
            m.u32_attr(CTRL_ATTR_OP_ID, op);
            m.u32_attr(2, 0x0a);
            m.end(e);
        }
        m.end(all);
        m.finish()
    }

    /// An NLMSG_ERROR with `errno`, the capped request header, and optionally the kernel's
    /// words and an attribute offset.
    fn error_reply(errno: i32, text: Option<&str>, offs: Option<u32>) -> Vec<u8> {
        let mut m = vec![0u8; 36];
        m[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        m[16..20].copy_from_slice(&(-errno).to_ne_bytes());
        let mut tlv = |ty: u16, p: &[u8]| {
            m.extend_from_slice(&((4 + p.len()) as u16).to_ne_bytes());
            m.extend_from_slice(&ty.to_ne_bytes());
            m.extend_from_slice(p);
            while !m.len().is_multiple_of(4) {
                m.push(0);
            }
        };
        if let Some(t) = text {
            tlv(1, format!("{t}\0").as_bytes());
        }
        if let Some(o) = offs {
            tlv(NLMSGERR_ATTR_OFFS, &o.to_ne_bytes());
        }
        if m.len() > 36 {
            m[6..8].copy_from_slice(&(0x100u16 | 0x200).to_ne_bytes());
        }
        let len = m.len() as u32;
        m[..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn the_controllers_answer_is_read() {
        let req = getfamily_request("netdev");
        let f = parse_family(&family_reply(29, &[1, 5, 10, 13, 14]), &req).unwrap();
        assert_eq!(f.id, 29);
        assert!(f.ops.contains(&13));
        assert_eq!(f.ops.len(), 5);
        let f = parse_family(&family_reply(29, &[1, 2, 3, 10, 11, 12]), &req).unwrap();
        assert!(!f.ops.contains(&13), "a kernel before 6.12");
        let f = parse_family(&family_reply(31, &[]), &req).unwrap();
        assert_eq!(
            f,
            Family {
                id: 31,
                ops: vec![]
            }
        );
        // No such family: the kernel's errno (and words when it gave some).
        let e = parse_family(&error_reply(libc::ENOENT, None, None), &req).unwrap_err();
        assert_eq!(
            e,
            ReplyError::Kernel {
                errno: libc::ENOENT,
                text: None,
                attr: None
            }
        );
        assert!(matches!(
            parse_family(&error_reply(0, None, None), &req),
            Err(ReplyError::Malformed(_))
        ));
    }

    #[test]
    fn cut_or_garbage_answers_are_errors_never_panics() {
        let req = getfamily_request("netdev");
        let good = family_reply(29, &[1, 13]);
        for n in 0..good.len() {
            assert!(parse_family(&good[..n], &req).is_err(), "cut at {n}");
        }
        // The netlink length says less than the attributes need.
        let mut short = good.clone();
        short[..4].copy_from_slice(&30u32.to_ne_bytes());
        assert!(parse_family(&short, &req).is_err());
        // An op entry whose id is cut.
        let mut m = Msg::genl(GENL_ID_CTRL, 0, CTRL_CMD_NEWFAMILY, 2);
        m.attr(CTRL_ATTR_FAMILY_ID, &5u16.to_ne_bytes());
        let all = m.begin(CTRL_ATTR_OPS);
        let e = m.begin(1);
        m.attr(CTRL_ATTR_OP_ID, &[13]);
        m.end(e);
        m.end(all);
        assert!(parse_family(&m.finish(), &req).is_err());
        // Another kind of message.
        assert!(parse_family(&bind_rx_request(29, 1, &[0], 3), &req).is_err());
        // Pseudo-random bytes, with and without a plausible header.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..2000 {
            let n = (round % 97) + 1;
            let mut b: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if round % 2 == 0 && b.len() >= 20 {
                let n = b.len() as u32;
                b[..4].copy_from_slice(&n.to_ne_bytes());
                b[4..6].copy_from_slice(&GENL_ID_CTRL.to_ne_bytes());
                b[16] = CTRL_CMD_NEWFAMILY;
            }
            let _ = parse_family(&b, &req);
            let _ = parse_bind_reply(&b, 29, &req);
        }
    }

    #[test]
    fn the_bind_answer_is_read() {
        let req = bind_rx_request(29, 1, &[0], 3);
        let mut m = Msg::genl(29, 0, NETDEV_CMD_BIND_RX, 1);
        m.u32_attr(NETDEV_A_DMABUF_ID, 4);
        assert_eq!(parse_bind_reply(&m.finish(), 29, &req), Ok(4));
        let e = parse_bind_reply(
            &error_reply(libc::EINVAL, Some("tcp-data-split is disabled"), Some(20)),
            29,
            &req,
        )
        .unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.contains("the kernel says: tcp-data-split is disabled"),
            "{shown}"
        );
        assert!(shown.contains("at the ifindex attribute"), "{shown}");
        assert_eq!(
            bind_hint(&e),
            "the kernel refused to bind the dma-buf to an RX queue"
        );
        let e =
            parse_bind_reply(&error_reply(libc::EOPNOTSUPP, None, Some(20)), 29, &req).unwrap_err();
        assert!(bind_hint(&e).contains("queue-management"));
    }

    #[test]
    fn a_refusal_reads_as_one_paragraph() {
        let r = DevmemRefusal {
            iface: "eth1".into(),
            steps: vec!["eth1 is ifindex 3".into(), "no netdev family".into()],
            reason: "this kernel has no generic-netlink family \"netdev\"".into(),
        };
        assert_eq!(
            r.to_string(),
            "devmem receive on eth1 is unavailable: this kernel has no generic-netlink family \"netdev\" (checked: eth1 is ifindex 3; no netdev family)"
        );
        let e: Box<dyn std::error::Error> = Box::new(r);
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn a_missing_interface_is_the_first_step() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let r = probe_rx("devmem-none0", std::os::fd::AsFd::as_fd(&f)).unwrap_err();
        assert!(r.reason.contains("no interface named"), "{r}");
        assert_eq!(r.steps.len(), 2, "{r}");
        assert_eq!(r.steps[1], TCP_ONLY);
    }

    /// The real probe on loopback: refused (lo has no queue-management API, and a memfd is no
    /// dma-buf), with the netdev family found on the way when the kernel has it.
    #[test]
    fn the_probe_refuses_on_loopback() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: the loopback probe is skipped");
            return;
        }
        // SAFETY: a valid NUL-terminated name; the fd is checked and owned right away.
        let fd = unsafe { libc::memfd_create(c"devmem-probe".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: `fd` is new and nobody else owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let r = probe_rx("lo", std::os::fd::AsFd::as_fd(&fd)).unwrap_err();
        println!("{r}");
        assert_eq!(r.iface, "lo");
        assert!(
            r.steps.iter().any(|s| s.contains("\"netdev\"")),
            "the netdev family is checked: {r}"
        );
        assert_eq!(r.steps.last().map(String::as_str), Some(TCP_ONLY));
    }
}
