//! Capture file writers: classic pcap (nanosecond timestamps, Ethernet) and pcapng with one
//! interface block per tapped interface and direction, each packet marked inbound or
//! outbound (`epb_flags`), so Wireshark shows where and which way a frame was seen.

use std::io::{self, Write};

use crate::bpf::Direction;

/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u16 = 1;

/// The file format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Pcap,
    Pcapng,
}

/// One frame to write.
pub struct Frame<'a> {
    /// Nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Index into the interface list the writer was made with.
    pub iface: usize,
    pub direction: Direction,
    pub orig_len: u32,
    pub data: &'a [u8],
}

pub struct Writer<W: Write> {
    w: W,
    format: Format,
}

impl<W: Write> Writer<W> {
    /// Writes the file header: for pcapng the section header and one interface description
    /// per (interface, direction), numbered `2 * i + (egress as usize)`.
    pub fn new(w: W, format: Format, ifaces: &[String], snaplen: u32) -> io::Result<Self> {
        Self::with_hook(w, format, ifaces, snaplen, "tcx")
    }

    /// As [`Writer::new`], naming the hook the frames were taken at (`tcx`, or `tc` for the
    /// clsact attachment) in the interface descriptions.
    pub fn with_hook(
        mut w: W,
        format: Format,
        ifaces: &[String],
        snaplen: u32,
        hook: &str,
    ) -> io::Result<Self> {
        match format {
            Format::Pcap => {
                let mut h = Vec::with_capacity(24);
                h.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes()); // nanosecond magic
                h.extend_from_slice(&2u16.to_le_bytes());
                h.extend_from_slice(&4u16.to_le_bytes());
                h.extend_from_slice(&[0; 8]); // thiszone, sigfigs
                h.extend_from_slice(&snaplen.to_le_bytes());
                h.extend_from_slice(&u32::from(LINKTYPE_ETHERNET).to_le_bytes());
                w.write_all(&h)?;
            }
            Format::Pcapng => {
                // Section header block: byte-order magic, version 1.0, section length unknown.
                let mut body = Vec::new();
                body.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
                body.extend_from_slice(&1u16.to_le_bytes());
                body.extend_from_slice(&0u16.to_le_bytes());
                body.extend_from_slice(&(-1i64).to_le_bytes());
                let mut opts = Vec::new();
                let appl = format!("vhost-user-rdma tap (eBPF {hook})");
                option(&mut opts, 4, appl.as_bytes()); // shb_userappl
                end_options(&mut opts);
                body.extend_from_slice(&opts);
                block(&mut w, 0x0a0d_0d0a, &body)?;
                for name in ifaces {
                    for dir in [Direction::Ingress, Direction::Egress] {
                        let mut body = Vec::new();
                        body.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
                        body.extend_from_slice(&0u16.to_le_bytes());
                        body.extend_from_slice(&snaplen.to_le_bytes());
                        let mut opts = Vec::new();
                        option(&mut opts, 2, name.as_bytes()); // if_name
                        let descr = format!("{name} {hook} {}", dir.name());
                        option(&mut opts, 3, descr.as_bytes()); // if_description
                        option(&mut opts, 9, &[9]); // if_tsresol: nanoseconds
                        end_options(&mut opts);
                        body.extend_from_slice(&opts);
                        block(&mut w, 1, &body)?;
                    }
                }
            }
        }
        Ok(Writer { w, format })
    }

    pub fn write(&mut self, f: &Frame<'_>) -> io::Result<()> {
        let cap = f.data.len() as u32;
        match self.format {
            Format::Pcap => {
                let mut h = [0u8; 16];
                h[..4].copy_from_slice(&((f.ts_ns / 1_000_000_000) as u32).to_le_bytes());
                h[4..8].copy_from_slice(&((f.ts_ns % 1_000_000_000) as u32).to_le_bytes());
                h[8..12].copy_from_slice(&cap.to_le_bytes());
                h[12..].copy_from_slice(&f.orig_len.max(cap).to_le_bytes());
                self.w.write_all(&h)?;
                self.w.write_all(f.data)
            }
            Format::Pcapng => {
                let id = 2 * f.iface as u32 + u32::from(f.direction == Direction::Egress);
                let mut body = Vec::with_capacity(f.data.len() + 40);
                body.extend_from_slice(&id.to_le_bytes());
                body.extend_from_slice(&((f.ts_ns >> 32) as u32).to_le_bytes());
                body.extend_from_slice(&(f.ts_ns as u32).to_le_bytes());
                body.extend_from_slice(&cap.to_le_bytes());
                body.extend_from_slice(&f.orig_len.max(cap).to_le_bytes());
                body.extend_from_slice(f.data);
                pad4(&mut body);
                // epb_flags: bits 0-1 direction, 1 inbound, 2 outbound.
                let flags: u32 = match f.direction {
                    Direction::Ingress => 1,
                    Direction::Egress => 2,
                };
                option(&mut body, 2, &flags.to_le_bytes());
                end_options(&mut body);
                block(&mut self.w, 6, &body)
            }
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

fn pad4(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
}

fn option(v: &mut Vec<u8>, code: u16, value: &[u8]) {
    v.extend_from_slice(&code.to_le_bytes());
    v.extend_from_slice(&(value.len() as u16).to_le_bytes());
    v.extend_from_slice(value);
    pad4(v);
}

fn end_options(v: &mut Vec<u8>) {
    v.extend_from_slice(&[0; 4]);
}

/// A pcapng block: type, total length, body (4-aligned), total length again.
fn block<W: Write>(w: &mut W, kind: u32, body: &[u8]) -> io::Result<()> {
    debug_assert!(body.len().is_multiple_of(4));
    let total = (body.len() + 12) as u32;
    let mut b = Vec::with_capacity(total as usize);
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&total.to_le_bytes());
    b.extend_from_slice(body);
    b.extend_from_slice(&total.to_le_bytes());
    w.write_all(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(data: &[u8], direction: Direction) -> Frame<'_> {
        Frame {
            ts_ns: 1_700_000_000_123_456_789,
            iface: 0,
            direction,
            orig_len: 100,
            data,
        }
    }

    #[test]
    fn pcap_layout() {
        let mut w = Writer::new(Vec::new(), Format::Pcap, &["x".into()], 9216).unwrap();
        w.write(&frame(&[1, 2, 3], Direction::Ingress)).unwrap();
        let b = w.w;
        assert_eq!(&b[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(
            u32::from_le_bytes(b[24..28].try_into().unwrap()),
            1_700_000_000
        );
        assert_eq!(
            u32::from_le_bytes(b[28..32].try_into().unwrap()),
            123_456_789
        );
        assert_eq!(u32::from_le_bytes(b[36..40].try_into().unwrap()), 100);
    }

    /// Walks the blocks: every length matches at both ends and the sizes add up.
    #[test]
    fn pcapng_blocks_are_well_formed() {
        let ifaces = ["a".to_string(), "b".to_string()];
        let mut w = Writer::new(Vec::new(), Format::Pcapng, &ifaces, 9216).unwrap();
        w.write(&frame(&[1, 2, 3, 4, 5], Direction::Egress))
            .unwrap();
        let b = w.w;
        let mut off = 0;
        let mut kinds = Vec::new();
        while off < b.len() {
            let kind = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
            let len = u32::from_le_bytes(b[off + 4..off + 8].try_into().unwrap()) as usize;
            assert_eq!(len % 4, 0);
            let tail = u32::from_le_bytes(b[off + len - 4..off + len].try_into().unwrap());
            assert_eq!(tail as usize, len);
            if kind == 6 {
                // interface 0 egress = id 1
                assert_eq!(
                    u32::from_le_bytes(b[off + 8..off + 12].try_into().unwrap()),
                    1
                );
            }
            kinds.push(kind);
            off += len;
        }
        assert_eq!(off, b.len());
        assert_eq!(kinds, [0x0a0d_0d0a, 1, 1, 1, 1, 6]);
    }
}
