//! The BTH opcode table (IBTA 9.2.1, Linux `rxe_opcode.c`), kept as data.
//!
//! Each known opcode maps to an [`OpInfo`] with its name, its class bits and the offsets of every
//! extension header it carries. The receive path looks an opcode up once and then reads headers
//! at fixed offsets.

use core::fmt;

/// An 8-bit BTH opcode (transport class in the top 3 bits, operation in the low 5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// Properties of an opcode, as bit flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpFlags(pub u32);

impl OpFlags {
    pub const RETH: Self = Self(1 << 0);
    pub const AETH: Self = Self(1 << 1);
    pub const ATMETH: Self = Self(1 << 2);
    pub const ATMACK: Self = Self(1 << 3);
    pub const DETH: Self = Self(1 << 4);
    pub const IMMDT: Self = Self(1 << 5);
    pub const IETH: Self = Self(1 << 6);
    pub const FETH: Self = Self(1 << 7);
    /// Carries a payload.
    pub const PAYLOAD: Self = Self(1 << 8);
    /// Sent by a requester (as opposed to a response).
    pub const REQ: Self = Self(1 << 9);
    /// A response (ACK, READ response, atomic ACK).
    pub const RESP: Self = Self(1 << 10);
    pub const SEND: Self = Self(1 << 11);
    pub const WRITE: Self = Self(1 << 12);
    pub const READ: Self = Self(1 << 13);
    pub const ATOMIC: Self = Self(1 << 14);
    pub const ATOMIC_WRITE: Self = Self(1 << 15);
    pub const FLUSH: Self = Self(1 << 16);
    /// First packet of a multi-packet message.
    pub const FIRST: Self = Self(1 << 17);
    pub const MIDDLE: Self = Self(1 << 18);
    /// Last packet of a message (`ONLY` packets are both first and last).
    pub const LAST: Self = Self(1 << 19);
    /// Consumes a receive WQE at the responder (SEND, or WRITE with immediate).
    pub const RWR: Self = Self(1 << 20);
    /// Congestion notification packet.
    pub const CNP: Self = Self(1 << 21);
    /// XRC request: the XRCETH (the target XRC SRQ number) follows the BTH (IBTA A14).
    pub const XRCETH: Self = Self(1 << 22);
    pub const ONLY: Self = Self(Self::FIRST.0 | Self::LAST.0);

    #[inline]
    pub const fn contains(self, o: Self) -> bool {
        self.0 & o.0 == o.0
    }
    #[inline]
    pub const fn intersects(self, o: Self) -> bool {
        self.0 & o.0 != 0
    }
    #[inline]
    pub const fn union(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
}

/// Transport service class of an opcode (IBTA table 37).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Rc,
    Uc,
    Rd,
    Ud,
    Cnp,
    /// Extended reliable connected (class 0b101, IBTA annex A14).
    Xrc,
}

pub const BTH_LEN: usize = 12;
pub const RETH_LEN: usize = 16;
pub const AETH_LEN: usize = 4;
pub const ATMETH_LEN: usize = 28;
pub const ATMACK_LEN: usize = 8;
pub const DETH_LEN: usize = 8;
pub const IMMDT_LEN: usize = 4;
pub const IETH_LEN: usize = 4;
pub const FETH_LEN: usize = 4;
pub const XRCETH_LEN: usize = 4;
/// ICRC trailer length.
pub const ICRC_LEN: usize = 4;
/// CNP carries 16 reserved bytes after the BTH.
pub const CNP_RSVD_LEN: usize = 16;

/// Everything the engine needs to know about one opcode.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub name: &'static str,
    pub flags: OpFlags,
    /// Length of BTH plus every extension header.
    pub hdr_len: u8,
    pub feth: u8,
    pub reth: u8,
    pub atmeth: u8,
    pub aeth: u8,
    pub atmack: u8,
    pub deth: u8,
    pub immdt: u8,
    pub ieth: u8,
    pub xrceth: u8,
}

use OpFlags as F;

const fn f(parts: &[OpFlags]) -> OpFlags {
    let mut acc = 0;
    let mut i = 0;
    while i < parts.len() {
        acc |= parts[i].0;
        i += 1;
    }
    OpFlags(acc)
}

// Shorthand flag groups.
const SEND_REQ: OpFlags = f(&[F::REQ, F::SEND, F::PAYLOAD, F::RWR]);
const WRITE_REQ: OpFlags = f(&[F::REQ, F::WRITE, F::PAYLOAD]);
const XSEND: OpFlags = f(&[SEND_REQ, F::XRCETH]);
const XWRITE: OpFlags = f(&[WRITE_REQ, F::XRCETH]);
const READ_RESP: OpFlags = f(&[F::RESP, F::READ, F::PAYLOAD]);

/// The table rows: (opcode, name, flags). Extension header offsets are derived from the flags.
const ROWS: &[(u8, &str, OpFlags)] = &[
    (0x00, "RC_SEND_FIRST", f(&[SEND_REQ, F::FIRST])),
    (0x01, "RC_SEND_MIDDLE", f(&[SEND_REQ, F::MIDDLE])),
    (0x02, "RC_SEND_LAST", f(&[SEND_REQ, F::LAST])),
    (
        0x03,
        "RC_SEND_LAST_WITH_IMMEDIATE",
        f(&[SEND_REQ, F::LAST, F::IMMDT]),
    ),
    (0x04, "RC_SEND_ONLY", f(&[SEND_REQ, F::ONLY])),
    (
        0x05,
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        f(&[SEND_REQ, F::ONLY, F::IMMDT]),
    ),
    (
        0x06,
        "RC_RDMA_WRITE_FIRST",
        f(&[WRITE_REQ, F::FIRST, F::RETH]),
    ),
    (0x07, "RC_RDMA_WRITE_MIDDLE", f(&[WRITE_REQ, F::MIDDLE])),
    (0x08, "RC_RDMA_WRITE_LAST", f(&[WRITE_REQ, F::LAST])),
    (
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        f(&[WRITE_REQ, F::LAST, F::IMMDT, F::RWR]),
    ),
    (
        0x0a,
        "RC_RDMA_WRITE_ONLY",
        f(&[WRITE_REQ, F::ONLY, F::RETH]),
    ),
    (
        0x0b,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        f(&[WRITE_REQ, F::ONLY, F::RETH, F::IMMDT, F::RWR]),
    ),
    (
        0x0c,
        "RC_RDMA_READ_REQUEST",
        f(&[F::REQ, F::READ, F::ONLY, F::RETH]),
    ),
    (
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        f(&[F::RESP, F::READ, F::PAYLOAD, F::FIRST, F::AETH]),
    ),
    (
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        f(&[F::RESP, F::READ, F::PAYLOAD, F::MIDDLE]),
    ),
    (
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        f(&[F::RESP, F::READ, F::PAYLOAD, F::LAST, F::AETH]),
    ),
    (
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        f(&[F::RESP, F::READ, F::PAYLOAD, F::ONLY, F::AETH]),
    ),
    (0x11, "RC_ACKNOWLEDGE", f(&[F::RESP, F::ONLY, F::AETH])),
    (
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        f(&[F::RESP, F::ATOMIC, F::ONLY, F::AETH, F::ATMACK]),
    ),
    (
        0x13,
        "RC_COMPARE_SWAP",
        f(&[F::REQ, F::ATOMIC, F::ONLY, F::ATMETH]),
    ),
    (
        0x14,
        "RC_FETCH_ADD",
        f(&[F::REQ, F::ATOMIC, F::ONLY, F::ATMETH]),
    ),
    (
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        f(&[SEND_REQ, F::LAST, F::IETH]),
    ),
    (
        0x17,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        f(&[SEND_REQ, F::ONLY, F::IETH]),
    ),
    (
        0x1c,
        "RC_FLUSH",
        f(&[F::REQ, F::FLUSH, F::ONLY, F::FETH, F::RETH]),
    ),
    (
        0x1d,
        "RC_ATOMIC_WRITE",
        f(&[F::REQ, F::ATOMIC_WRITE, F::PAYLOAD, F::ONLY, F::RETH]),
    ),
    (0x20, "UC_SEND_FIRST", f(&[SEND_REQ, F::FIRST])),
    (0x21, "UC_SEND_MIDDLE", f(&[SEND_REQ, F::MIDDLE])),
    (0x22, "UC_SEND_LAST", f(&[SEND_REQ, F::LAST])),
    (
        0x23,
        "UC_SEND_LAST_WITH_IMMEDIATE",
        f(&[SEND_REQ, F::LAST, F::IMMDT]),
    ),
    (0x24, "UC_SEND_ONLY", f(&[SEND_REQ, F::ONLY])),
    (
        0x25,
        "UC_SEND_ONLY_WITH_IMMEDIATE",
        f(&[SEND_REQ, F::ONLY, F::IMMDT]),
    ),
    (
        0x26,
        "UC_RDMA_WRITE_FIRST",
        f(&[WRITE_REQ, F::FIRST, F::RETH]),
    ),
    (0x27, "UC_RDMA_WRITE_MIDDLE", f(&[WRITE_REQ, F::MIDDLE])),
    (0x28, "UC_RDMA_WRITE_LAST", f(&[WRITE_REQ, F::LAST])),
    (
        0x29,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        f(&[WRITE_REQ, F::LAST, F::IMMDT, F::RWR]),
    ),
    (
        0x2a,
        "UC_RDMA_WRITE_ONLY",
        f(&[WRITE_REQ, F::ONLY, F::RETH]),
    ),
    (
        0x2b,
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        f(&[WRITE_REQ, F::ONLY, F::RETH, F::IMMDT, F::RWR]),
    ),
    (0x64, "UD_SEND_ONLY", f(&[SEND_REQ, F::ONLY, F::DETH])),
    (
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        f(&[SEND_REQ, F::ONLY, F::DETH, F::IMMDT]),
    ),
    (0x81, "CNP", f(&[F::CNP, F::ONLY])),
    // XRC (IBTA annex A14): the RC operations in class 0b101, each request with the XRCETH;
    // the responses carry none. No XRC FLUSH or ATOMIC_WRITE (Wireshark knows neither).
    (0xa0, "XRC_SEND_FIRST", f(&[XSEND, F::FIRST])),
    (0xa1, "XRC_SEND_MIDDLE", f(&[XSEND, F::MIDDLE])),
    (0xa2, "XRC_SEND_LAST", f(&[XSEND, F::LAST])),
    (
        0xa3,
        "XRC_SEND_LAST_WITH_IMMEDIATE",
        f(&[XSEND, F::LAST, F::IMMDT]),
    ),
    (0xa4, "XRC_SEND_ONLY", f(&[XSEND, F::ONLY])),
    (
        0xa5,
        "XRC_SEND_ONLY_WITH_IMMEDIATE",
        f(&[XSEND, F::ONLY, F::IMMDT]),
    ),
    (
        0xa6,
        "XRC_RDMA_WRITE_FIRST",
        f(&[XWRITE, F::FIRST, F::RETH]),
    ),
    (0xa7, "XRC_RDMA_WRITE_MIDDLE", f(&[XWRITE, F::MIDDLE])),
    (0xa8, "XRC_RDMA_WRITE_LAST", f(&[XWRITE, F::LAST])),
    (
        0xa9,
        "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        f(&[XWRITE, F::LAST, F::IMMDT, F::RWR]),
    ),
    (0xaa, "XRC_RDMA_WRITE_ONLY", f(&[XWRITE, F::ONLY, F::RETH])),
    (
        0xab,
        "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        f(&[XWRITE, F::ONLY, F::RETH, F::IMMDT, F::RWR]),
    ),
    (
        0xac,
        "XRC_RDMA_READ_REQUEST",
        f(&[F::REQ, F::READ, F::ONLY, F::RETH, F::XRCETH]),
    ),
    (
        0xad,
        "XRC_RDMA_READ_RESPONSE_FIRST",
        f(&[READ_RESP, F::FIRST, F::AETH]),
    ),
    (
        0xae,
        "XRC_RDMA_READ_RESPONSE_MIDDLE",
        f(&[READ_RESP, F::MIDDLE]),
    ),
    (
        0xaf,
        "XRC_RDMA_READ_RESPONSE_LAST",
        f(&[READ_RESP, F::LAST, F::AETH]),
    ),
    (
        0xb0,
        "XRC_RDMA_READ_RESPONSE_ONLY",
        f(&[READ_RESP, F::ONLY, F::AETH]),
    ),
    (0xb1, "XRC_ACKNOWLEDGE", f(&[F::RESP, F::ONLY, F::AETH])),
    (
        0xb2,
        "XRC_ATOMIC_ACKNOWLEDGE",
        f(&[F::RESP, F::ATOMIC, F::ONLY, F::AETH, F::ATMACK]),
    ),
    (
        0xb3,
        "XRC_COMPARE_SWAP",
        f(&[F::REQ, F::ATOMIC, F::ONLY, F::ATMETH, F::XRCETH]),
    ),
    (
        0xb4,
        "XRC_FETCH_ADD",
        f(&[F::REQ, F::ATOMIC, F::ONLY, F::ATMETH, F::XRCETH]),
    ),
    (
        0xb6,
        "XRC_SEND_LAST_WITH_INVALIDATE",
        f(&[XSEND, F::LAST, F::IETH]),
    ),
    (
        0xb7,
        "XRC_SEND_ONLY_WITH_INVALIDATE",
        f(&[XSEND, F::ONLY, F::IETH]),
    ),
];

const fn take(off: &mut u8, present: bool, len: usize) -> u8 {
    if present {
        let at = *off;
        *off += len as u8;
        at
    } else {
        0
    }
}

const fn build(name: &'static str, flags: OpFlags) -> OpInfo {
    let mut off = BTH_LEN as u8;
    let xrceth = take(&mut off, flags.contains(F::XRCETH), XRCETH_LEN);
    let feth = take(&mut off, flags.contains(F::FETH), FETH_LEN);
    let reth = take(&mut off, flags.contains(F::RETH), RETH_LEN);
    let atmeth = take(&mut off, flags.contains(F::ATMETH), ATMETH_LEN);
    let aeth = take(&mut off, flags.contains(F::AETH), AETH_LEN);
    let atmack = take(&mut off, flags.contains(F::ATMACK), ATMACK_LEN);
    let deth = take(&mut off, flags.contains(F::DETH), DETH_LEN);
    let immdt = take(&mut off, flags.contains(F::IMMDT), IMMDT_LEN);
    let ieth = take(&mut off, flags.contains(F::IETH), IETH_LEN);
    take(&mut off, flags.contains(F::CNP), CNP_RSVD_LEN);
    OpInfo {
        name,
        flags,
        hdr_len: off,
        feth,
        reth,
        atmeth,
        aeth,
        atmack,
        deth,
        immdt,
        ieth,
        xrceth,
    }
}

static TABLE: [Option<OpInfo>; 256] = {
    let mut t: [Option<OpInfo>; 256] = [None; 256];
    let mut i = 0;
    while i < ROWS.len() {
        let (op, name, flags) = ROWS[i];
        t[op as usize] = Some(build(name, flags));
        i += 1;
    }
    t
};

impl Opcode {
    pub const RC_SEND_FIRST: Self = Self(0x00);
    pub const RC_SEND_MIDDLE: Self = Self(0x01);
    pub const RC_SEND_LAST: Self = Self(0x02);
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Self = Self(0x03);
    pub const RC_SEND_ONLY: Self = Self(0x04);
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Self = Self(0x05);
    pub const RC_RDMA_WRITE_FIRST: Self = Self(0x06);
    pub const RC_RDMA_WRITE_MIDDLE: Self = Self(0x07);
    pub const RC_RDMA_WRITE_LAST: Self = Self(0x08);
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Self = Self(0x09);
    pub const RC_RDMA_WRITE_ONLY: Self = Self(0x0a);
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Self = Self(0x0b);
    pub const RC_RDMA_READ_REQUEST: Self = Self(0x0c);
    pub const RC_RDMA_READ_RESPONSE_FIRST: Self = Self(0x0d);
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Self = Self(0x0e);
    pub const RC_RDMA_READ_RESPONSE_LAST: Self = Self(0x0f);
    pub const RC_RDMA_READ_RESPONSE_ONLY: Self = Self(0x10);
    pub const RC_ACKNOWLEDGE: Self = Self(0x11);
    pub const RC_ATOMIC_ACKNOWLEDGE: Self = Self(0x12);
    pub const RC_COMPARE_SWAP: Self = Self(0x13);
    pub const RC_FETCH_ADD: Self = Self(0x14);
    pub const RC_SEND_LAST_WITH_INVALIDATE: Self = Self(0x16);
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Self = Self(0x17);
    pub const RC_FLUSH: Self = Self(0x1c);
    pub const RC_ATOMIC_WRITE: Self = Self(0x1d);
    pub const UC_SEND_FIRST: Self = Self(0x20);
    pub const UC_SEND_ONLY: Self = Self(0x24);
    pub const UC_RDMA_WRITE_FIRST: Self = Self(0x26);
    pub const UD_SEND_ONLY: Self = Self(0x64);
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Self = Self(0x65);
    pub const CNP: Self = Self(0x81);
    pub const XRC_SEND_FIRST: Self = Self(0xa0);
    pub const XRC_SEND_ONLY: Self = Self(0xa4);
    pub const XRC_RDMA_WRITE_ONLY: Self = Self(0xaa);
    pub const XRC_RDMA_READ_REQUEST: Self = Self(0xac);
    pub const XRC_ACKNOWLEDGE: Self = Self(0xb1);
    pub const XRC_COMPARE_SWAP: Self = Self(0xb3);
    /// The class bits of XRC opcodes.
    pub const XRC_BASE: u8 = 0xa0;

    /// The table entry, or `None` for an opcode this engine does not implement.
    #[inline]
    pub fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    #[inline]
    pub fn flags(self) -> OpFlags {
        self.info().map(|i| i.flags).unwrap_or_default()
    }

    pub fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            5 => Transport::Xrc,
            _ => Transport::Cnp,
        }
    }

    /// The RC opcode of the same operation for an XRC opcode (XRC carries RC's operations
    /// under its own class bits); any other opcode as it is.
    #[inline]
    pub const fn rc_op(self) -> Self {
        if self.0 >> 5 == 5 {
            Self(self.0 & 0x1f)
        } else {
            self
        }
    }

    /// The same operation in another transport class (RC opcode → UC opcode etc.).
    #[inline]
    pub const fn with_transport(self, base: u8) -> Self {
        Self(base | (self.0 & 0x1f))
    }

    /// Every opcode the table knows, in order.
    pub fn all() -> impl Iterator<Item = Opcode> {
        ROWS.iter().map(|r| Opcode(r.0))
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => write!(f, "{}({:#04x})", i.name, self.0),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

impl fmt::Debug for OpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpFlags({:#x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_match_rxe() {
        let len = |op: u8| Opcode(op).info().unwrap().hdr_len as usize;
        assert_eq!(len(0x04), 12);
        assert_eq!(len(0x05), 16);
        assert_eq!(len(0x0a), 28);
        assert_eq!(len(0x0b), 32);
        assert_eq!(len(0x0c), 28);
        assert_eq!(len(0x10), 16);
        assert_eq!(len(0x12), 24);
        assert_eq!(len(0x13), 40);
        assert_eq!(len(0x17), 16);
        assert_eq!(len(0x1c), 32);
        assert_eq!(len(0x1d), 28);
        assert_eq!(len(0x64), 20);
        assert_eq!(len(0x65), 24);
        assert_eq!(len(0x81), 28);
        let i = Opcode::RC_FLUSH.info().unwrap();
        assert_eq!((i.feth, i.reth), (12, 16));
        let i = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!((i.aeth, i.atmack), (12, 16));
        assert!(Opcode(0x15).info().is_none());
        assert_eq!(Opcode::all().count(), 63);
    }

    #[test]
    fn xrc_opcodes_are_rc_operations_with_the_xrceth() {
        let mut n = 0;
        for op in Opcode::all().filter(|o| o.transport() == Transport::Xrc) {
            n += 1;
            let x = op.info().unwrap();
            let rc = op.rc_op().info().unwrap();
            assert_eq!(x.name.strip_prefix("XRC_"), rc.name.strip_prefix("RC_"));
            assert_eq!(x.flags.0 & !OpFlags::XRCETH.0, rc.flags.0, "{op:?}");
            let req = x.flags.contains(OpFlags::REQ);
            assert_eq!(x.flags.contains(OpFlags::XRCETH), req, "{op:?}");
            let grow = if req { XRCETH_LEN as u8 } else { 0 };
            assert_eq!(x.hdr_len, rc.hdr_len + grow, "{op:?}");
            if req {
                assert_eq!(x.xrceth, 12);
                for (a, b) in [(x.reth, rc.reth), (x.atmeth, rc.atmeth)] {
                    assert_eq!(a, if b == 0 { 0 } else { b + 4 }, "{op:?}");
                }
                for (a, b) in [(x.immdt, rc.immdt), (x.ieth, rc.ieth)] {
                    assert_eq!(a, if b == 0 { 0 } else { b + 4 }, "{op:?}");
                }
            } else {
                assert_eq!((x.aeth, x.atmack), (rc.aeth, rc.atmack));
            }
            assert_eq!(Opcode(op.0 & 0x1f).with_transport(Opcode::XRC_BASE), op);
        }
        assert_eq!(n, 23);
        let len = |op: u8| Opcode(op).info().unwrap().hdr_len as usize;
        assert_eq!(
            (len(0xa4), len(0xab), len(0xac), len(0xb3)),
            (16, 36, 32, 44)
        );
        assert_eq!((len(0xb0), len(0xb1), len(0xb2)), (16, 16, 24));
        assert!(Opcode(0xb5).info().is_none() && Opcode(0xbc).info().is_none());
        assert_eq!(Opcode(0xa0).transport(), Transport::Xrc);
        assert_eq!(Opcode(0x81).transport(), Transport::Cnp);
    }
}
