//! Base Transport Header (IBTA 9.2, 12 bytes).
//!
//! ```text
//!  0       opcode
//!  1       SE:1 M:1 PadCnt:2 TVer:4
//!  2..4    P_Key
//!  4       FECN:1 BECN:1 resv:6   (masked to ones in the ICRC)
//!  5..8    DestQP (24 bits)
//!  8       AckReq:1 resv:7
//!  9..12   PSN (24 bits)
//! ```

use super::field::*;
use super::opcode::{Opcode, BTH_LEN};
use super::WireError;

mod f {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const FB: usize = 4;
    pub const DQPN: usize = 5;
    pub const ACKREQ: usize = 8;
    pub const PSN: usize = 9;
}

/// A view of a BTH at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Bth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        if buf.as_ref().len() < BTH_LEN {
            return Err(WireError::Truncated);
        }
        Ok(Self { buf })
    }
    pub fn into_inner(self) -> T {
        self.buf
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[f::OPCODE])
    }
    #[inline]
    pub fn solicited(&self) -> bool {
        self.b()[f::FLAGS] & 0x80 != 0
    }
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.b()[f::FLAGS] & 0x40 != 0
    }
    #[inline]
    pub fn pad_count(&self) -> usize {
        ((self.b()[f::FLAGS] >> 4) & 3) as usize
    }
    #[inline]
    pub fn tver(&self) -> u8 {
        self.b()[f::FLAGS] & 0x0f
    }
    #[inline]
    pub fn pkey(&self) -> u16 {
        get_u16(self.b(), f::PKEY)
    }
    #[inline]
    pub fn fecn(&self) -> bool {
        self.b()[f::FB] & 0x80 != 0
    }
    #[inline]
    pub fn becn(&self) -> bool {
        self.b()[f::FB] & 0x40 != 0
    }
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.b(), f::DQPN)
    }
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.b()[f::ACKREQ] & 0x80 != 0
    }
    #[inline]
    pub fn psn(&self) -> u32 {
        get_u24(self.b(), f::PSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    #[inline]
    fn m(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    pub fn set_opcode(&mut self, op: Opcode) {
        self.m()[f::OPCODE] = op.0;
    }
    pub fn set_flags(&mut self, se: bool, mig: bool, pad: usize, tver: u8) {
        self.m()[f::FLAGS] =
            ((se as u8) << 7) | ((mig as u8) << 6) | (((pad & 3) as u8) << 4) | (tver & 0xf);
    }
    pub fn set_pkey(&mut self, v: u16) {
        set_u16(self.m(), f::PKEY, v)
    }
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.m()[f::FB] = ((fecn as u8) << 7) | ((becn as u8) << 6);
    }
    pub fn set_dest_qp(&mut self, v: u32) {
        set_u24(self.m(), f::DQPN, v & 0xff_ffff)
    }
    pub fn set_ack_req_psn(&mut self, ack_req: bool, psn: u32) {
        self.m()[f::ACKREQ] = (ack_req as u8) << 7;
        set_u24(self.m(), f::PSN, psn & 0xff_ffff)
    }
}

/// The owned form of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

impl BthRepr {
    /// A BTH as rxe sends it: default P_Key, no SE/M/FECN/BECN, TVer 0, pad filled in by
    /// `wire::emit`; the fields that vary are set on the result.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32, ack_req: bool) -> Self {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req,
            psn,
        }
    }

    pub fn parse<T: AsRef<[u8]>>(h: &Bth<T>) -> Self {
        Self {
            opcode: h.opcode(),
            solicited: h.solicited(),
            mig_req: h.mig_req(),
            pad_count: h.pad_count() as u8,
            tver: h.tver(),
            pkey: h.pkey(),
            fecn: h.fecn(),
            becn: h.becn(),
            dest_qp: h.dest_qp(),
            ack_req: h.ack_req(),
            psn: h.psn(),
        }
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Bth<T>) {
        h.set_opcode(self.opcode);
        h.set_flags(
            self.solicited,
            self.mig_req,
            self.pad_count as usize,
            self.tver,
        );
        h.set_pkey(self.pkey);
        h.set_fecn_becn(self.fecn, self.becn);
        h.set_dest_qp(self.dest_qp);
        h.set_ack_req_psn(self.ack_req, self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: true,
            mig_req: true,
            pad_count: 3,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: true,
            dest_qp: 0xabcdef,
            ack_req: true,
            psn: 0xfffffe,
        };
        let mut buf = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut buf[..]));
        assert_eq!(
            buf,
            [0x04, 0xf0, 0xff, 0xff, 0x40, 0xab, 0xcd, 0xef, 0x80, 0xff, 0xff, 0xfe]
        );
        assert_eq!(BthRepr::parse(&Bth::new_checked(&buf[..]).unwrap()), r);
        assert!(Bth::new_checked(&buf[..11]).is_err());
    }
}
