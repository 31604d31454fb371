//! A relay between a VMM's vhost-user connection and the vhost crate's request handler, for
//! the virtio-net device: every message goes through unchanged (its fds too), except a
//! SET_VRING_ENABLE that comes before the first SET_FEATURES, and the MTU (below).
//!
//! QEMU's vhost-user-net frontend enables a queue pair's rings when the guest's virtio-net
//! driver negotiates its features, which is before QEMU sends the features to the backend;
//! the vhost crate refuses SET_VRING_ENABLE until SET_FEATURES has acked
//! VHOST_USER_F_PROTOCOL_FEATURES, and ends the connection (without that feature QEMU does
//! not start vhost-user-net at all). QEMU does not say it again when it starts the device.
//! So the relay answers an early SET_VRING_ENABLE itself (an ack when one is asked for),
//! remembers the state asked for each ring, and hands the handler those states right after
//! the SET_FEATURES that lets it take them (without NEED_REPLY: no answer comes back).
//!
//! The relay also speaks VHOST_USER_PROTOCOL_F_NET_MTU, which the vhost crate does not: it
//! adds the bit to the backend's GET_PROTOCOL_FEATURES answer and answers NET_SET_MTU itself,
//! accepting an MTU the host interface can carry (68 up to its MTU) and refusing any other
//! (a non-zero status, so that QEMU's `host_mtu` fails at start instead of a guest sending
//! frames the interface drops).

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

const SET_FEATURES: u32 = 2;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_VRING_ENABLE: u32 = 18;
const NET_SET_MTU: u32 = 20;
/// VHOST_USER_PROTOCOL_F_NET_MTU.
pub const PROTOCOL_F_NET_MTU: u64 = 1 << 4;
/// The smallest MTU an IPv4 host must take (RFC 791), as Linux's ETH_MIN_MTU.
const MIN_MTU: u64 = 68;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;
const HDR: usize = 12;
/// Largest payload passed on (the largest vhost-user message is far smaller).
const MAX_PAYLOAD: usize = 64 << 10;
/// Most fds one message carries (SET_MEM_TABLE: 8; the vhost crate accepts 32).
const MAX_FDS: usize = 32;

/// One vhost-user message: header and payload, and the fds that came with it.
pub struct Msg {
    pub bytes: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Msg {
    pub fn request(&self) -> u32 {
        u32::from_le_bytes(self.bytes[..4].try_into().expect("header"))
    }

    pub fn flags(&self) -> u32 {
        u32::from_le_bytes(self.bytes[4..8].try_into().expect("header"))
    }
}

/// Reads up to `buf.len()` bytes with their fds (appended to `fds`); 0 at the end.
fn recv_some(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    // Room for MAX_FDS fds in one control message.
    let mut cbuf = [0u64; (MAX_FDS * 4 + 32) / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `mh` points at live buffers of the sizes it gives.
        let n = unsafe { libc::recvmsg(sock, &mut mh, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control messages the kernel wrote into `cbuf` with the libc
    // macros, which stay within `msg_controllen`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "more fds than a vhost-user message carries",
        ));
    }
    Ok(n)
}

fn recv_exact(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        let n = recv_some(sock, &mut buf[got..], fds)?;
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(true)
}

/// The next message on `sock`, or `None` at the end of the connection.
pub fn recv_msg(sock: &UnixStream) -> io::Result<Option<Msg>> {
    let mut fds = Vec::new();
    let mut bytes = vec![0u8; HDR];
    if !recv_exact(sock.as_raw_fd(), &mut bytes, &mut fds)? {
        return Ok(None);
    }
    let size = u32::from_le_bytes(bytes[8..12].try_into().expect("header")) as usize;
    if size > MAX_PAYLOAD {
        return Err(io::Error::other(format!(
            "a {size}-byte vhost-user message"
        )));
    }
    bytes.resize(HDR + size, 0);
    if !recv_exact(sock.as_raw_fd(), &mut bytes[HDR..], &mut fds)? && size > 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(Msg { bytes, fds }))
}

/// Sends `m` on `sock`, its fds with its first byte.
pub fn send_msg(sock: &UnixStream, m: &Msg) -> io::Result<()> {
    let mut sent = 0;
    while sent < m.bytes.len() {
        let mut cbuf = [0u64; (MAX_FDS * 4 + 32) / 8];
        let mut iov = libc::iovec {
            iov_base: m.bytes[sent..].as_ptr() as *mut libc::c_void,
            iov_len: m.bytes.len() - sent,
        };
        // SAFETY: msghdr is plain data; all-zero is a valid value.
        let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        if sent == 0 && !m.fds.is_empty() {
            let n = m.fds.len().min(MAX_FDS);
            // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic; the header and data written stay
            // within `cbuf`, which holds MAX_FDS fds.
            unsafe {
                mh.msg_control = cbuf.as_mut_ptr().cast();
                mh.msg_controllen = libc::CMSG_SPACE((n * 4) as u32) as usize;
                let c = libc::CMSG_FIRSTHDR(&mh);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN((n * 4) as u32) as usize;
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for (i, fd) in m.fds.iter().take(n).enumerate() {
                    data.add(i).write_unaligned(fd.as_raw_fd());
                }
            }
        }
        // SAFETY: `mh` points at live buffers of the sizes it gives.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += r as usize;
    }
    Ok(())
}

/// The ack a frontend that asked for one (NEED_REPLY) gets for `req`: `status` (0 success).
fn ack(req: u32, status: u64) -> Msg {
    let mut bytes = Vec::with_capacity(HDR + 8);
    bytes.extend_from_slice(&req.to_le_bytes());
    bytes.extend_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
    bytes.extend_from_slice(&8u32.to_le_bytes());
    bytes.extend_from_slice(&status.to_le_bytes());
    Msg {
        bytes,
        fds: Vec::new(),
    }
}

/// What the relay does with a message from the frontend.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Forward,
    /// Forwarded, then these SET_VRING_ENABLE requests (the early ones' states).
    ForwardThen(Vec<Msg>),
    /// Dropped, and answered with an ack of `status` when one was asked for.
    Answer {
        ack: bool,
        status: u64,
    },
}

impl PartialEq for Msg {
    fn eq(&self, o: &Msg) -> bool {
        self.bytes == o.bytes && self.fds.len() == o.fds.len()
    }
}

impl Eq for Msg {}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Msg({}, {:?})", self.request(), &self.bytes[HDR..])
    }
}

/// The MTU a frontend may set (NET_SET_MTU), and where the one it set is kept.
#[derive(Clone)]
pub struct MtuPolicy {
    /// The largest MTU accepted: the host interface's.
    pub max: u32,
    /// The MTU the frontend set (0: none), for the counters.
    pub set: Arc<AtomicU64>,
}

/// The relay's state: whether SET_FEATURES went by, and the ring states asked for before.
pub struct Relay {
    features_set: bool,
    /// (ring index, enable) of the early SET_VRING_ENABLE requests, the last one per ring.
    early: Vec<(u32, u32)>,
    mtu: MtuPolicy,
}

impl Relay {
    pub fn new(mtu: MtuPolicy) -> Relay {
        Relay {
            features_set: false,
            early: Vec::new(),
            mtu,
        }
    }

    pub fn verdict(&mut self, m: &Msg) -> Verdict {
        let ack = m.flags() & FLAG_NEED_REPLY != 0;
        match m.request() {
            NET_SET_MTU => {
                let mtu = (m.bytes.len() >= HDR + 8)
                    .then(|| u64::from_le_bytes(m.bytes[HDR..HDR + 8].try_into().expect("8")));
                let status = match mtu {
                    Some(v) if (MIN_MTU..=self.mtu.max as u64).contains(&v) => {
                        log::info!("virtio-net: the frontend set the MTU to {v}");
                        self.mtu.set.store(v, Ordering::Relaxed);
                        0
                    }
                    Some(v) => {
                        log::error!(
                            "virtio-net: MTU {v} refused: the host interface takes {MIN_MTU} up to {} \
                             (raise its MTU, or lower the VMM's host_mtu)",
                            self.mtu.max
                        );
                        1
                    }
                    None => {
                        log::error!("virtio-net: NET_SET_MTU without its 8-byte value, refused");
                        1
                    }
                };
                Verdict::Answer { ack, status }
            }
            SET_FEATURES if !self.features_set => {
                self.features_set = true;
                let replay = std::mem::take(&mut self.early)
                    .into_iter()
                    .map(|(index, num)| {
                        let mut bytes = Vec::with_capacity(HDR + 8);
                        bytes.extend_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                        bytes.extend_from_slice(&FLAG_VERSION.to_le_bytes());
                        bytes.extend_from_slice(&8u32.to_le_bytes());
                        bytes.extend_from_slice(&index.to_le_bytes());
                        bytes.extend_from_slice(&num.to_le_bytes());
                        Msg {
                            bytes,
                            fds: Vec::new(),
                        }
                    })
                    .collect();
                Verdict::ForwardThen(replay)
            }
            SET_VRING_ENABLE if !self.features_set => {
                if m.bytes.len() >= HDR + 8 {
                    let index = u32::from_le_bytes(m.bytes[HDR..HDR + 4].try_into().expect("4"));
                    let num = u32::from_le_bytes(m.bytes[HDR + 4..HDR + 8].try_into().expect("4"));
                    self.early.retain(|&(i, _)| i != index);
                    // (at most one entry per ring; a frontend cannot grow this past 256)
                    if self.early.len() < 256 {
                        self.early.push((index, num));
                    }
                }
                Verdict::Answer { ack, status: 0 }
            }
            _ => Verdict::Forward,
        }
    }
}

/// A reply of the backend on its way to the frontend: GET_PROTOCOL_FEATURES gains NET_MTU,
/// which the relay serves.
fn adjust_reply(m: &mut Msg) {
    if m.request() == GET_PROTOCOL_FEATURES
        && m.flags() & FLAG_REPLY != 0
        && m.bytes.len() == HDR + 8
    {
        let f = u64::from_le_bytes(m.bytes[HDR..].try_into().expect("8")) | PROTOCOL_F_NET_MTU;
        m.bytes[HDR..].copy_from_slice(&f.to_le_bytes());
    }
}

/// Relays between `front` (the VMM) and `back` (the vhost crate's handler) until either
/// side ends; then shuts both down. Returns the two relay threads.
pub fn spawn(
    front: UnixStream,
    back: UnixStream,
    mtu: MtuPolicy,
) -> io::Result<[JoinHandle<()>; 2]> {
    let front_w = Arc::new(Mutex::new(front.try_clone()?));
    let back_r = back.try_clone()?;
    let (f2, b2) = (front.try_clone()?, back.try_clone()?);
    let fw = front_w.clone();
    let to_back = std::thread::Builder::new()
        .name("vhost-user-net relay".into())
        .spawn(move || {
            let mut relay = Relay::new(mtu);
            let r: io::Result<()> = (|| {
                while let Some(m) = recv_msg(&front)? {
                    let v = relay.verdict(&m);
                    log::debug!(
                        "vhost-user-net request {} flags {:#x}, {} bytes, {} fds: {v:?}",
                        m.request(),
                        m.flags(),
                        m.bytes.len() - HDR,
                        m.fds.len()
                    );
                    match v {
                        Verdict::Forward => send_msg(&back, &m)?,
                        Verdict::ForwardThen(replay) => {
                            send_msg(&back, &m)?;
                            for r in &replay {
                                send_msg(&back, r)?;
                            }
                        }
                        Verdict::Answer { ack: true, status } => send_msg(
                            &fw.lock().unwrap_or_else(|e| e.into_inner()),
                            &ack(m.request(), status),
                        )?,
                        Verdict::Answer { ack: false, .. } => {}
                    }
                }
                Ok(())
            })();
            if let Err(e) = r {
                log::debug!("vhost-user-net relay, frontend side: {e}");
            }
            let _ = front.shutdown(Shutdown::Both);
            let _ = back.shutdown(Shutdown::Both);
        })?;
    let to_front = std::thread::Builder::new()
        .name("vhost-user-net relay".into())
        .spawn(move || {
            let r: io::Result<()> = (|| {
                while let Some(mut m) = recv_msg(&back_r)? {
                    adjust_reply(&mut m);
                    log::debug!(
                        "vhost-user-net reply {} flags {:#x}",
                        m.request(),
                        m.flags()
                    );
                    send_msg(&front_w.lock().unwrap_or_else(|e| e.into_inner()), &m)?;
                }
                Ok(())
            })();
            if let Err(e) = r {
                log::debug!("vhost-user-net relay, backend side: {e}");
            }
            let _ = f2.shutdown(Shutdown::Both);
            let _ = b2.shutdown(Shutdown::Both);
        })?;
    Ok([to_back, to_front])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(req: u32, flags: u32, payload: &[u8]) -> Msg {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&req.to_le_bytes());
        bytes.extend_from_slice(&flags.to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(payload);
        Msg {
            bytes,
            fds: Vec::new(),
        }
    }

    fn policy(max: u32) -> MtuPolicy {
        MtuPolicy {
            max,
            set: Arc::new(AtomicU64::new(0)),
        }
    }

    #[test]
    fn net_set_mtu_is_answered_here_within_the_interface_mtu() {
        let p = policy(9000);
        let mut r = Relay::new(p.clone());
        let need = FLAG_VERSION | FLAG_NEED_REPLY;
        let set = |v: u64| msg(NET_SET_MTU, need, &v.to_le_bytes());
        assert_eq!(
            r.verdict(&set(9000)),
            Verdict::Answer {
                ack: true,
                status: 0
            }
        );
        assert_eq!(p.set.load(Ordering::Relaxed), 9000);
        for bad in [9001, 67, 0, u64::MAX] {
            assert_eq!(
                r.verdict(&set(bad)),
                Verdict::Answer {
                    ack: true,
                    status: 1
                },
                "MTU {bad}"
            );
        }
        assert_eq!(
            p.set.load(Ordering::Relaxed),
            9000,
            "a refused MTU is not kept"
        );
        assert_eq!(
            r.verdict(&msg(NET_SET_MTU, need, &[0; 4])),
            Verdict::Answer {
                ack: true,
                status: 1
            },
            "a short message"
        );
        assert_eq!(
            r.verdict(&msg(NET_SET_MTU, FLAG_VERSION, &1500u64.to_le_bytes())),
            Verdict::Answer {
                ack: false,
                status: 0
            }
        );
        // The backend's protocol features gain NET_MTU on their way to the frontend; other
        // replies and requests are left alone.
        let mut m = msg(
            GET_PROTOCOL_FEATURES,
            FLAG_VERSION | FLAG_REPLY,
            &9u64.to_le_bytes(),
        );
        adjust_reply(&mut m);
        assert_eq!(m.bytes[HDR..], (9 | PROTOCOL_F_NET_MTU).to_le_bytes());
        let mut m = msg(GET_PROTOCOL_FEATURES, FLAG_VERSION, &9u64.to_le_bytes());
        adjust_reply(&mut m);
        assert_eq!(m.bytes[HDR..], 9u64.to_le_bytes());
        let mut m = msg(1, FLAG_VERSION | FLAG_REPLY, &9u64.to_le_bytes());
        adjust_reply(&mut m);
        assert_eq!(m.bytes[HDR..], 9u64.to_le_bytes());
    }

    #[test]
    fn early_ring_enables_are_answered_here_and_replayed_after_the_features() {
        let mut r = Relay::new(policy(1500));
        let enable =
            |i: u8, on: u8, flags| msg(SET_VRING_ENABLE, flags, &[i, 0, 0, 0, on, 0, 0, 0]);
        let need = FLAG_VERSION | FLAG_NEED_REPLY;
        assert_eq!(
            r.verdict(&enable(0, 0, need)),
            Verdict::Answer {
                ack: true,
                status: 0
            }
        );
        assert_eq!(
            r.verdict(&enable(1, 1, FLAG_VERSION)),
            Verdict::Answer {
                ack: false,
                status: 0
            }
        );
        assert_eq!(
            r.verdict(&enable(0, 1, need)),
            Verdict::Answer {
                ack: true,
                status: 0
            }
        );
        assert_eq!(r.verdict(&msg(1, FLAG_VERSION, &[])), Verdict::Forward);
        // the last state of each ring, without NEED_REPLY (no answer comes back)
        assert_eq!(
            r.verdict(&msg(SET_FEATURES, 1, &[0; 8])),
            Verdict::ForwardThen(vec![enable(1, 1, FLAG_VERSION), enable(0, 1, FLAG_VERSION)])
        );
        assert_eq!(
            r.verdict(&enable(0, 0, need)),
            Verdict::Forward,
            "after SET_FEATURES"
        );
        assert_eq!(r.verdict(&msg(SET_FEATURES, 1, &[0; 8])), Verdict::Forward);
        let a = ack(SET_VRING_ENABLE, 0);
        assert_eq!(a.request(), SET_VRING_ENABLE);
        assert_eq!(a.flags(), FLAG_VERSION | FLAG_REPLY);
        assert_eq!(&a.bytes[8..], &[8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn messages_and_their_fds_go_through() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut m = msg(5, FLAG_VERSION, b"payload!");
        let f = std::fs::File::open("/dev/null").unwrap();
        m.fds.push(OwnedFd::from(f));
        send_msg(&a, &m).unwrap();
        send_msg(&a, &msg(7, FLAG_VERSION, &[])).unwrap();
        let r = recv_msg(&b).unwrap().unwrap();
        assert_eq!(r.bytes, m.bytes);
        assert_eq!(r.fds.len(), 1);
        let r = recv_msg(&b).unwrap().unwrap();
        assert_eq!((r.request(), r.bytes.len(), r.fds.len()), (7, HDR, 0));
        drop(a);
        assert!(recv_msg(&b).unwrap().is_none(), "the end");
        // A header that announces more than a vhost-user message is refused.
        let (a, b) = UnixStream::pair().unwrap();
        let mut big = msg(5, FLAG_VERSION, &[]);
        big.bytes[8..12].copy_from_slice(&(1u32 << 30).to_le_bytes());
        send_msg(&a, &big).unwrap();
        assert!(recv_msg(&b).is_err());
    }

    #[test]
    fn the_relay_answers_the_early_enable_and_passes_the_rest() {
        let (vmm, front) = UnixStream::pair().unwrap();
        let (back, backend) = UnixStream::pair().unwrap();
        let threads = spawn(front, back, policy(1500)).unwrap();
        send_msg(
            &vmm,
            &msg(SET_VRING_ENABLE, FLAG_VERSION | FLAG_NEED_REPLY, &[0; 8]),
        )
        .unwrap();
        let a = recv_msg(&vmm).unwrap().unwrap();
        assert_eq!(
            (a.request(), a.flags()),
            (SET_VRING_ENABLE, FLAG_VERSION | FLAG_REPLY)
        );
        send_msg(&vmm, &msg(SET_FEATURES, FLAG_VERSION, &[0; 8])).unwrap();
        send_msg(&vmm, &msg(SET_VRING_ENABLE, FLAG_VERSION, &[1; 8])).unwrap();
        assert_eq!(recv_msg(&backend).unwrap().unwrap().request(), SET_FEATURES);
        let replayed = recv_msg(&backend).unwrap().unwrap();
        assert_eq!(
            (replayed.request(), replayed.flags()),
            (SET_VRING_ENABLE, FLAG_VERSION)
        );
        let e = recv_msg(&backend).unwrap().unwrap();
        assert_eq!((e.request(), e.bytes[HDR]), (SET_VRING_ENABLE, 1));
        send_msg(&backend, &msg(1, FLAG_VERSION | FLAG_REPLY, &[9; 8])).unwrap();
        assert_eq!(recv_msg(&vmm).unwrap().unwrap().bytes[HDR..], [9; 8]);
        // The VMM hangs up: the backend sees the end, both threads finish.
        drop(vmm);
        assert!(recv_msg(&backend).unwrap().is_none());
        for t in threads {
            t.join().unwrap();
        }
    }
}
