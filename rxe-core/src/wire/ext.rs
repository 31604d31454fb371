//! Extension transport headers (IBTA 9.3): RETH, AETH, AtomicETH, AtomicAckETH, DETH, ImmDt,
//! IETH, FETH and XRCETH. Each is a small fixed-size view; [`super::packet::Packet`] finds them at the
//! offsets of the opcode table.

use super::field::*;
use super::opcode::*;
use super::WireError;

macro_rules! view {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name<T: AsRef<[u8]>> {
            buf: T,
        }
        impl<T: AsRef<[u8]>> $name<T> {
            pub const LEN: usize = $len;
            pub const fn new_unchecked(buf: T) -> Self {
                Self { buf }
            }
            pub fn new_checked(buf: T) -> Result<Self, WireError> {
                if buf.as_ref().len() < $len {
                    return Err(WireError::Truncated);
                }
                Ok(Self { buf })
            }
            #[inline]
            #[allow(dead_code)]
            fn b(&self) -> &[u8] {
                self.buf.as_ref()
            }
        }
        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            #[inline]
            #[allow(dead_code)]
            fn m(&mut self) -> &mut [u8] {
                self.buf.as_mut()
            }
        }
    };
}

view!(
    /// RDMA ETH: virtual address, R_Key, DMA length.
    Reth, RETH_LEN
);
impl<T: AsRef<[u8]>> Reth<T> {
    pub fn va(&self) -> u64 {
        get_u64(self.b(), 0)
    }
    pub fn rkey(&self) -> u32 {
        get_u32(self.b(), 8)
    }
    pub fn dma_len(&self) -> u32 {
        get_u32(self.b(), 12)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    pub fn set(&mut self, va: u64, rkey: u32, len: u32) {
        set_u64(self.m(), 0, va);
        set_u32(self.m(), 8, rkey);
        set_u32(self.m(), 12, len);
    }
}

/// AETH syndrome classes (IBTA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// ACK with a credit count (rxe sends 0x1f: "invalid credit count").
    Ack(u8),
    /// RNR NAK with the timer value.
    RnrNak(u8),
    /// NAK with its code.
    Nak(NakCode),
    /// The reserved class 01.
    Reserved(u8),
}

/// NAK codes (syndrome 0x60 | code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    PsnSeqError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    Other(u8),
}

impl Syndrome {
    /// The ACK syndrome rxe puts on every positive ACK.
    pub const ACK: u8 = 0x1f;
    pub fn from_byte(b: u8) -> Self {
        match b >> 5 {
            0 => Syndrome::Ack(b & 0x1f),
            1 => Syndrome::RnrNak(b & 0x1f),
            3 => Syndrome::Nak(match b & 0x1f {
                0 => NakCode::PsnSeqError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                c => NakCode::Other(c),
            }),
            _ => Syndrome::Reserved(b),
        }
    }
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack(c) => c & 0x1f,
            Syndrome::RnrNak(t) => 0x20 | (t & 0x1f),
            Syndrome::Nak(c) => {
                0x60 | match c {
                    NakCode::PsnSeqError => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccessError => 2,
                    NakCode::RemoteOperationalError => 3,
                    NakCode::InvalidRdRequest => 4,
                    NakCode::Other(c) => c & 0x1f,
                }
            }
            Syndrome::Reserved(b) => b,
        }
    }
}

view!(
    /// ACK ETH: syndrome and MSN.
    Aeth, AETH_LEN
);
impl<T: AsRef<[u8]>> Aeth<T> {
    pub fn syndrome_byte(&self) -> u8 {
        self.b()[0]
    }
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.b()[0])
    }
    pub fn msn(&self) -> u32 {
        get_u24(self.b(), 1)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    pub fn set(&mut self, syndrome: u8, msn: u32) {
        self.m()[0] = syndrome;
        set_u24(self.m(), 1, msn & 0xff_ffff);
    }
}

view!(
    /// Atomic ETH: VA, R_Key, swap (or add) data, compare data.
    AtomicEth, ATMETH_LEN
);
impl<T: AsRef<[u8]>> AtomicEth<T> {
    pub fn va(&self) -> u64 {
        get_u64(self.b(), 0)
    }
    pub fn rkey(&self) -> u32 {
        get_u32(self.b(), 8)
    }
    pub fn swap_add(&self) -> u64 {
        get_u64(self.b(), 12)
    }
    pub fn compare(&self) -> u64 {
        get_u64(self.b(), 20)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    pub fn set(&mut self, va: u64, rkey: u32, swap_add: u64, compare: u64) {
        set_u64(self.m(), 0, va);
        set_u32(self.m(), 8, rkey);
        set_u64(self.m(), 12, swap_add);
        set_u64(self.m(), 20, compare);
    }
}

view!(
    /// Atomic ACK ETH: the original remote data.
    AtomicAckEth, ATMACK_LEN
);
impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    pub fn orig(&self) -> u64 {
        get_u64(self.b(), 0)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    pub fn set(&mut self, orig: u64) {
        set_u64(self.m(), 0, orig)
    }
}

view!(
    /// Datagram ETH: Q_Key and source QP.
    Deth, DETH_LEN
);
impl<T: AsRef<[u8]>> Deth<T> {
    pub fn qkey(&self) -> u32 {
        get_u32(self.b(), 0)
    }
    pub fn src_qp(&self) -> u32 {
        get_u24(self.b(), 5)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    pub fn set(&mut self, qkey: u32, src_qp: u32) {
        set_u32(self.m(), 0, qkey);
        self.m()[4] = 0;
        set_u24(self.m(), 5, src_qp & 0xff_ffff);
    }
}

view!(
    /// Immediate data (carried as 4 opaque bytes, big-endian on the wire).
    ImmDt, IMMDT_LEN
);
impl<T: AsRef<[u8]>> ImmDt<T> {
    pub fn imm(&self) -> u32 {
        get_u32(self.b(), 0)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    pub fn set(&mut self, v: u32) {
        set_u32(self.m(), 0, v)
    }
}

view!(
    /// Invalidate ETH: the R_Key to invalidate at the responder.
    Ieth, IETH_LEN
);
impl<T: AsRef<[u8]>> Ieth<T> {
    pub fn rkey(&self) -> u32 {
        get_u32(self.b(), 0)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    pub fn set(&mut self, rkey: u32) {
        set_u32(self.m(), 0, rkey)
    }
}

view!(
    /// Flush ETH (IBTA 1.5 annex): selectivity level (bits 5:4) and placement type (bits 3:0).
    Feth, FETH_LEN
);
impl<T: AsRef<[u8]>> Feth<T> {
    pub fn placement_type(&self) -> u8 {
        (get_u32(self.b(), 0) & 0xf) as u8
    }
    pub fn selectivity(&self) -> u8 {
        ((get_u32(self.b(), 0) >> 4) & 0x3) as u8
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    pub fn set(&mut self, selectivity: u8, placement_type: u8) {
        let v = ((selectivity as u32 & 3) << 4) | (placement_type as u32 & 0xf);
        set_u32(self.m(), 0, v)
    }
}

view!(
    /// XRC ETH (IBTA annex A14): 8 reserved bits, then the 24-bit XRC SRQ number.
    Xrceth, XRCETH_LEN
);
impl<T: AsRef<[u8]>> Xrceth<T> {
    pub fn srqn(&self) -> u32 {
        get_u24(self.b(), 1)
    }
}
impl<T: AsRef<[u8]> + AsMut<[u8]>> Xrceth<T> {
    pub fn set(&mut self, srqn: u32) {
        self.m()[0] = 0;
        set_u24(self.m(), 1, srqn & 0xff_ffff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes() {
        for b in 0..=255u8 {
            if b >> 5 == 2 {
                continue;
            }
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::Ack(0x1f));
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSeqError)
        );
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak(0x0e));
    }

    #[test]
    fn deth_and_atomic() {
        let mut b = [0u8; 28];
        Deth::new_unchecked(&mut b[..]).set(0x8001_0000, 1);
        assert_eq!(&b[..8], &[0x80, 1, 0, 0, 0, 0, 0, 1]);
        let mut a = AtomicEth::new_checked(&mut b[..]).unwrap();
        a.set(0x1122334455667788, 0xaabbccdd, 5, 7);
        let a = AtomicEth::new_unchecked(&b[..]);
        assert_eq!(
            (a.va(), a.rkey(), a.swap_add(), a.compare()),
            (0x1122334455667788, 0xaabbccdd, 5, 7)
        );
        assert!(AtomicEth::new_checked(&b[..27]).is_err());
    }
}
