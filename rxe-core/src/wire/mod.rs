//! Wire formats: InfiniBand transport headers as carried by RoCEv2, as zero-copy views over byte
//! buffers (the smoltcp `wire` style) plus owned `Repr`s where building is easier that way.

mod field;

pub mod bth;
pub mod ext;
pub mod frame;
pub mod ip;
pub mod opcode;
pub mod packet;

pub use bth::{Bth, BthRepr};
pub use ext::{
    Aeth, AtomicAckEth, AtomicEth, Deth, Feth, Ieth, ImmDt, NakCode, Reth, Syndrome, Xrceth,
};
pub use frame::{encap, parse_frame, FrameMeta};
pub use opcode::{OpFlags, OpInfo, Opcode, Transport};
pub use packet::{emit, packet_len, pad_for, ExtRepr, Packet};

/// A packet that cannot be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than its headers say.
    Truncated,
    /// An opcode this engine does not know.
    UnknownOpcode(u8),
    /// Pad count larger than the payload, or payload + pad not a multiple of four.
    BadPad,
    /// A payload on an opcode that carries none.
    UnexpectedPayload,
    /// A length field that contradicts the opcode.
    BadLength,
    /// A header field with a value the protocol does not allow.
    BadField,
    /// A checksum or ICRC that does not match.
    BadChecksum,
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated packet"),
            WireError::UnknownOpcode(op) => write!(f, "unknown opcode {op:#04x}"),
            WireError::BadPad => f.write_str("bad pad count"),
            WireError::UnexpectedPayload => f.write_str("payload on an opcode without one"),
            WireError::BadLength => f.write_str("length does not match opcode"),
            WireError::BadField => f.write_str("invalid header field"),
            WireError::BadChecksum => f.write_str("checksum mismatch"),
        }
    }
}

impl std::error::Error for WireError {}
