//! A whole RoCE transport packet: BTH, extension headers, payload, pad and ICRC — the UDP
//! payload of a RoCEv2 datagram.

use super::bth::{Bth, BthRepr};
use super::ext::*;
use super::opcode::*;
use super::WireError;

/// A validated view of a RoCE packet (BTH through ICRC).
///
/// `new_checked` looks the opcode up, checks the buffer holds every header it implies, the pad
/// count fits in the payload, and the ICRC trailer is present; after that the accessors cannot
/// index out of bounds.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
    info: &'static OpInfo,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let b = buf.as_ref();
        if b.len() < BTH_LEN + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let bth = Bth::new_unchecked(b);
        let info = bth
            .opcode()
            .info()
            .ok_or(WireError::UnknownOpcode(bth.opcode().0))?;
        let hdr = info.hdr_len as usize;
        if b.len() < hdr + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let rest = b.len() - hdr - ICRC_LEN;
        let pad = bth.pad_count();
        if pad > rest {
            return Err(WireError::BadPad);
        }
        let payload = rest - pad;
        if !info.flags.contains(OpFlags::PAYLOAD) && rest != 0 {
            return Err(WireError::UnexpectedPayload);
        }
        // Payload plus pad is always a multiple of four bytes (IBTA 9.2.1.2).
        if !rest.is_multiple_of(4) {
            return Err(WireError::BadPad);
        }
        if info.flags.contains(OpFlags::ATOMIC_WRITE) && payload != 8 {
            return Err(WireError::BadLength);
        }
        Ok(Self { buf, info })
    }

    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    pub fn info(&self) -> &'static OpInfo {
        self.info
    }
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[0])
    }
    #[inline]
    pub fn flags(&self) -> OpFlags {
        self.info.flags
    }
    #[inline]
    pub fn bth(&self) -> Bth<&[u8]> {
        Bth::new_unchecked(&self.b()[..BTH_LEN])
    }
    #[inline]
    fn at(&self, off: u8, len: usize) -> &[u8] {
        &self.b()[off as usize..off as usize + len]
    }
    pub fn reth(&self) -> Option<Reth<&[u8]>> {
        self.flags()
            .contains(OpFlags::RETH)
            .then(|| Reth::new_unchecked(self.at(self.info.reth, RETH_LEN)))
    }
    pub fn aeth(&self) -> Option<Aeth<&[u8]>> {
        self.flags()
            .contains(OpFlags::AETH)
            .then(|| Aeth::new_unchecked(self.at(self.info.aeth, AETH_LEN)))
    }
    pub fn atomic_eth(&self) -> Option<AtomicEth<&[u8]>> {
        self.flags()
            .contains(OpFlags::ATMETH)
            .then(|| AtomicEth::new_unchecked(self.at(self.info.atmeth, ATMETH_LEN)))
    }
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEth<&[u8]>> {
        self.flags()
            .contains(OpFlags::ATMACK)
            .then(|| AtomicAckEth::new_unchecked(self.at(self.info.atmack, ATMACK_LEN)))
    }
    pub fn deth(&self) -> Option<Deth<&[u8]>> {
        self.flags()
            .contains(OpFlags::DETH)
            .then(|| Deth::new_unchecked(self.at(self.info.deth, DETH_LEN)))
    }
    pub fn imm(&self) -> Option<u32> {
        self.flags()
            .contains(OpFlags::IMMDT)
            .then(|| ImmDt::new_unchecked(self.at(self.info.immdt, IMMDT_LEN)).imm())
    }
    pub fn ieth(&self) -> Option<u32> {
        self.flags()
            .contains(OpFlags::IETH)
            .then(|| Ieth::new_unchecked(self.at(self.info.ieth, IETH_LEN)).rkey())
    }
    pub fn feth(&self) -> Option<Feth<&[u8]>> {
        self.flags()
            .contains(OpFlags::FETH)
            .then(|| Feth::new_unchecked(self.at(self.info.feth, FETH_LEN)))
    }
    /// The XRC SRQ number of an XRC request's XRCETH.
    pub fn xrceth(&self) -> Option<u32> {
        self.flags()
            .contains(OpFlags::XRCETH)
            .then(|| Xrceth::new_unchecked(self.at(self.info.xrceth, XRCETH_LEN)).srqn())
    }
    /// Length of the payload, without pad.
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.b().len() - self.info.hdr_len as usize - ICRC_LEN - self.bth().pad_count()
    }
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let s = self.info.hdr_len as usize;
        &self.b()[s..s + self.payload_len()]
    }
    /// Everything the ICRC covers after the masked BTH: headers, payload and pad.
    #[inline]
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.b();
        &b[..b.len() - ICRC_LEN]
    }
    /// The ICRC as carried on the wire (little-endian).
    #[inline]
    pub fn icrc(&self) -> u32 {
        let b = self.b();
        let n = b.len();
        u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]])
    }
    pub fn as_bytes(&self) -> &[u8] {
        self.b()
    }
}

/// Values of every extension header a packet may carry; the opcode decides which are emitted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtRepr {
    /// (va, rkey, dma length)
    pub reth: (u64, u32, u32),
    /// (syndrome, msn)
    pub aeth: (u8, u32),
    /// (va, rkey, swap_add, compare)
    pub atomic: (u64, u32, u64, u64),
    pub atomic_orig: u64,
    /// (qkey, src qpn)
    pub deth: (u32, u32),
    pub imm: u32,
    pub ieth: u32,
    /// (selectivity level, placement type)
    pub feth: (u8, u8),
    /// The XRC SRQ number an XRC request's XRCETH names.
    pub xrc_srqn: u32,
}

/// Number of pad bytes that round `payload_len` up to a multiple of four.
#[inline]
pub const fn pad_for(payload_len: usize) -> usize {
    (4 - (payload_len & 3)) & 3
}

/// Total on-wire length of a packet with this opcode and payload (BTH through ICRC).
#[inline]
pub fn packet_len(info: &OpInfo, payload_len: usize) -> usize {
    info.hdr_len as usize + payload_len + pad_for(payload_len) + ICRC_LEN
}

/// Writes the headers of a packet into `buf`, zeroes the pad and the ICRC slot, and returns the
/// total length and the payload range. The caller copies the payload into that range and then
/// fills the ICRC once the IP/UDP headers it will travel in are known.
pub fn emit(
    buf: &mut [u8],
    bth: &BthRepr,
    ext: &ExtRepr,
    payload_len: usize,
) -> Result<(usize, core::ops::Range<usize>), WireError> {
    let info = bth
        .opcode
        .info()
        .ok_or(WireError::UnknownOpcode(bth.opcode.0))?;
    let pad = pad_for(payload_len);
    let total = packet_len(info, payload_len);
    if buf.len() < total {
        return Err(WireError::Truncated);
    }
    let mut b = *bth;
    b.pad_count = pad as u8;
    b.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
    let fl = info.flags;
    let at = |o: u8, l: usize| o as usize..o as usize + l;
    if fl.contains(OpFlags::XRCETH) {
        Xrceth::new_unchecked(&mut buf[at(info.xrceth, XRCETH_LEN)]).set(ext.xrc_srqn);
    }
    if fl.contains(OpFlags::FETH) {
        Feth::new_unchecked(&mut buf[at(info.feth, FETH_LEN)]).set(ext.feth.0, ext.feth.1);
    }
    if fl.contains(OpFlags::RETH) {
        Reth::new_unchecked(&mut buf[at(info.reth, RETH_LEN)])
            .set(ext.reth.0, ext.reth.1, ext.reth.2);
    }
    if fl.contains(OpFlags::ATMETH) {
        let a = ext.atomic;
        AtomicEth::new_unchecked(&mut buf[at(info.atmeth, ATMETH_LEN)]).set(a.0, a.1, a.2, a.3);
    }
    if fl.contains(OpFlags::AETH) {
        Aeth::new_unchecked(&mut buf[at(info.aeth, AETH_LEN)]).set(ext.aeth.0, ext.aeth.1);
    }
    if fl.contains(OpFlags::ATMACK) {
        AtomicAckEth::new_unchecked(&mut buf[at(info.atmack, ATMACK_LEN)]).set(ext.atomic_orig);
    }
    if fl.contains(OpFlags::DETH) {
        Deth::new_unchecked(&mut buf[at(info.deth, DETH_LEN)]).set(ext.deth.0, ext.deth.1);
    }
    if fl.contains(OpFlags::IMMDT) {
        ImmDt::new_unchecked(&mut buf[at(info.immdt, IMMDT_LEN)]).set(ext.imm);
    }
    if fl.contains(OpFlags::IETH) {
        Ieth::new_unchecked(&mut buf[at(info.ieth, IETH_LEN)]).set(ext.ieth);
    }
    if fl.contains(OpFlags::CNP) {
        buf[BTH_LEN..BTH_LEN + CNP_RSVD_LEN].fill(0);
    }
    let ps = info.hdr_len as usize;
    buf[ps + payload_len..total].fill(0);
    Ok((total, ps..ps + payload_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bth(op: Opcode) -> BthRepr {
        BthRepr::new(op, 0x11, 7, true)
    }

    #[test]
    fn every_opcode_roundtrips() {
        for op in Opcode::all() {
            let info = op.info().unwrap();
            let plen = if info.flags.contains(OpFlags::ATOMIC_WRITE) {
                8
            } else if info.flags.contains(OpFlags::PAYLOAD) {
                13
            } else {
                0
            };
            let ext = ExtRepr {
                reth: (0x1000, 0x1234, 99),
                aeth: (0x1f, 5),
                atomic: (8, 9, 10, 11),
                atomic_orig: 12,
                deth: (0x8001_0000, 1),
                imm: 0xdeadbeef,
                ieth: 0x55,
                feth: (1, 2),
                xrc_srqn: 0xab_cdef,
            };
            let mut buf = [0u8; 128];
            let (n, pr) = emit(&mut buf, &bth(op), &ext, plen).unwrap();
            buf[pr.clone()].fill(0xab);
            let p = Packet::new_checked(&buf[..n]).unwrap();
            assert_eq!(p.opcode(), op);
            assert_eq!(p.payload_len(), plen, "{op:?}");
            assert_eq!(p.bth().pad_count(), pad_for(plen));
            assert!(p.payload().iter().all(|&x| x == 0xab));
            if let Some(r) = p.reth() {
                assert_eq!((r.va(), r.rkey(), r.dma_len()), (0x1000, 0x1234, 99));
            }
            if let Some(a) = p.aeth() {
                assert_eq!((a.syndrome_byte(), a.msn()), (0x1f, 5));
            }
            if let Some(d) = p.deth() {
                assert_eq!((d.qkey(), d.src_qp()), (0x8001_0000, 1));
            }
            if info.flags.contains(OpFlags::IMMDT) {
                assert_eq!(p.imm(), Some(0xdeadbeef));
            }
            if let Some(f) = p.feth() {
                assert_eq!((f.selectivity(), f.placement_type()), (1, 2));
            }
            if info.flags.contains(OpFlags::XRCETH) {
                assert_eq!(p.xrceth(), Some(0xab_cdef));
                assert_eq!(&buf[12..16], &[0, 0xab, 0xcd, 0xef], "{op:?}");
            } else {
                assert_eq!(p.xrceth(), None);
            }
        }
    }

    #[test]
    fn rejects_malformed() {
        let mut buf = [0u8; 64];
        let (n, _) = emit(&mut buf, &bth(Opcode::RC_SEND_ONLY), &ExtRepr::default(), 5).unwrap();
        assert!(Packet::new_checked(&buf[..n]).is_ok());
        assert!(Packet::new_checked(&buf[..n - 1]).is_err());
        assert!(Packet::new_checked(&buf[..15]).is_err());
        buf[0] = 0x15;
        assert_eq!(
            Packet::new_checked(&buf[..n]).unwrap_err(),
            WireError::UnknownOpcode(0x15)
        );
        let (n, _) = emit(
            &mut buf,
            &bth(Opcode::RC_ACKNOWLEDGE),
            &ExtRepr::default(),
            0,
        )
        .unwrap();
        assert_eq!(
            Packet::new_checked(&buf[..n + 4]).unwrap_err(),
            WireError::UnexpectedPayload
        );
        // READ request with a payload is malformed.
        let (n, _) = emit(
            &mut buf,
            &bth(Opcode::RC_RDMA_READ_REQUEST),
            &ExtRepr::default(),
            0,
        )
        .unwrap();
        assert!(Packet::new_checked(&buf[..n + 4]).is_err());
    }
}
