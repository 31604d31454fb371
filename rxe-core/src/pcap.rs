//! Classic libpcap files: a writer for dumping frames (the engine is sans-IO, so timestamps are
//! passed in), and a reader for the records of captures taken elsewhere (both byte orders,
//! microsecond or nanosecond timestamps). pcapng is not supported.
//!
//! Used by the tests that check our frames against Wireshark's dissector and by anything that
//! wants to dump what the engine sends; see [`write_frames_pcap`].

use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

/// A pcap link-layer header type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkType(pub u32);

impl LinkType {
    /// Ethernet II frames (`LINKTYPE_ETHERNET`).
    pub const ETHERNET: Self = Self(1);
    /// Bare IPv4 or IPv6 datagrams (`LINKTYPE_RAW`).
    pub const RAW: Self = Self(101);
}

const MAGIC_US: u32 = 0xa1b2_c3d4;
const MAGIC_NS: u32 = 0xa1b2_3c4d;
const GLOBAL_HDR_LEN: usize = 24;
const RECORD_HDR_LEN: usize = 16;
/// Snap length written in the global header.
pub const DEFAULT_SNAPLEN: u32 = 262_144;
/// The reader refuses records larger than this (a corrupt length would otherwise make it
/// allocate gigabytes).
pub const MAX_RECORD_LEN: u32 = 16 << 20;

/// Writes a classic pcap (little-endian, microsecond timestamps).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    w: W,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header.
    pub fn new(w: W, linktype: LinkType) -> io::Result<Self> {
        Self::with_snaplen(w, linktype, DEFAULT_SNAPLEN)
    }

    /// Writes the global header with the given snap length; longer packets are truncated to it
    /// (their original length is still recorded).
    pub fn with_snaplen(mut w: W, linktype: LinkType, snaplen: u32) -> io::Result<Self> {
        let mut h = [0u8; GLOBAL_HDR_LEN];
        h[0..4].copy_from_slice(&MAGIC_US.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&linktype.0.to_le_bytes());
        w.write_all(&h)?;
        Ok(Self { w, snaplen })
    }

    /// Appends one record with timestamp `ts` (time since the epoch, or since any origin).
    pub fn write_packet(&mut self, ts: Duration, data: &[u8]) -> io::Result<()> {
        let secs = u32::try_from(ts.as_secs())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "timestamp past 2106"))?;
        let orig = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "packet too long"))?;
        let incl = orig.min(self.snaplen);
        let mut h = [0u8; RECORD_HDR_LEN];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&incl.to_le_bytes());
        h[12..16].copy_from_slice(&orig.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(&data[..incl as usize])
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.w
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Writes `frames` to a new pcap file at `path`, one record per frame, frame `i` stamped at
/// `i` microseconds. `linktype` says what the frames start with: [`LinkType::ETHERNET`] for
/// Ethernet frames, [`LinkType::RAW`] for IP datagrams. Returns the number of frames written.
pub fn write_frames_pcap<I>(path: &Path, linktype: LinkType, frames: I) -> io::Result<usize>
where
    I: IntoIterator,
    I::Item: AsRef<[u8]>,
{
    let f = io::BufWriter::new(std::fs::File::create(path)?);
    let mut w = PcapWriter::new(f, linktype)?;
    let mut n = 0;
    for fr in frames {
        w.write_packet(Duration::from_micros(n as u64), fr.as_ref())?;
        n += 1;
    }
    w.into_inner()?.into_inner().map_err(|e| e.into_error())?;
    Ok(n)
}

/// The header of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub ts: Duration,
    /// Bytes captured (the length of the data that follows).
    pub incl_len: u32,
    /// Length of the packet on the wire.
    pub orig_len: u32,
}

/// One record, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub ts: Duration,
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// Reads a classic pcap file record by record.
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    r: R,
    swapped: bool,
    nanos: bool,
    linktype: LinkType,
    snaplen: u32,
}

fn bad(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Fills `buf` completely, or returns `Ok(false)` if the reader is at EOF before the first
/// byte. EOF in the middle is an `UnexpectedEof` error.
fn read_full_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "truncated pcap record header",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the global header.
    pub fn new(mut r: R) -> io::Result<Self> {
        let mut h = [0u8; GLOBAL_HDR_LEN];
        r.read_exact(&mut h)?;
        let le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let be = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let (swapped_vs_le, nanos) = match (le, be) {
            (MAGIC_US, _) => (false, false),
            (MAGIC_NS, _) => (false, true),
            (_, MAGIC_US) => (true, false),
            (_, MAGIC_NS) => (true, true),
            _ if &h[0..4] == b"\x0a\x0d\x0d\x0a" => return Err(bad("pcapng is not supported")),
            _ => return Err(bad("not a pcap file")),
        };
        let mut p = Self {
            r,
            // `swapped` means "fields are big-endian".
            swapped: swapped_vs_le,
            nanos,
            linktype: LinkType(0),
            snaplen: 0,
        };
        if p.u16(&h[4..6]) != 2 {
            return Err(bad("unsupported pcap major version"));
        }
        p.snaplen = p.u32(&h[16..20]);
        // The top bits of the link type field may carry FCS information (pcap-linktype(7)).
        p.linktype = LinkType(p.u32(&h[20..24]) & 0x0fff_ffff);
        Ok(p)
    }

    #[inline]
    fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.swapped {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }
    #[inline]
    fn u16(&self, b: &[u8]) -> u16 {
        let a = [b[0], b[1]];
        if self.swapped {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        }
    }

    pub fn linktype(&self) -> LinkType {
        self.linktype
    }
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }
    /// Whether timestamps have nanosecond resolution.
    pub fn is_nanos(&self) -> bool {
        self.nanos
    }

    /// Reads the next record into `buf` (replacing its contents). `Ok(None)` at the end of the
    /// file.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> io::Result<Option<RecordHeader>> {
        let mut h = [0u8; RECORD_HDR_LEN];
        if !read_full_or_eof(&mut self.r, &mut h)? {
            return Ok(None);
        }
        let secs = self.u32(&h[0..4]);
        let frac = self.u32(&h[4..8]);
        let incl_len = self.u32(&h[8..12]);
        let orig_len = self.u32(&h[12..16]);
        if incl_len > MAX_RECORD_LEN {
            return Err(bad("pcap record longer than MAX_RECORD_LEN"));
        }
        let sub = if self.nanos {
            frac as u64
        } else {
            frac as u64 * 1000
        };
        let ts = Duration::from_secs(secs as u64) + Duration::from_nanos(sub);
        buf.clear();
        buf.resize(incl_len as usize, 0);
        self.r.read_exact(buf)?;
        Ok(Some(RecordHeader {
            ts,
            incl_len,
            orig_len,
        }))
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = io::Result<Record>;
    fn next(&mut self) -> Option<Self::Item> {
        let mut data = Vec::new();
        match self.next_into(&mut data) {
            Ok(Some(h)) => Some(Ok(Record {
                ts: h.ts,
                orig_len: h.orig_len,
                data,
            })),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = PcapWriter::new(Vec::new(), LinkType::ETHERNET).unwrap();
        w.write_packet(Duration::new(5, 123_456_789), &[1, 2, 3])
            .unwrap();
        w.write_packet(Duration::ZERO, &[]).unwrap();
        let bytes = w.into_inner().unwrap();
        assert_eq!(bytes.len(), 24 + 16 + 3 + 16);
        assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(&bytes[20..24], &[1, 0, 0, 0]);
        let mut r = PcapReader::new(&bytes[..]).unwrap();
        assert_eq!(r.linktype(), LinkType::ETHERNET);
        assert_eq!(r.snaplen(), DEFAULT_SNAPLEN);
        assert!(!r.is_nanos());
        let a = r.next().unwrap().unwrap();
        assert_eq!(a.ts, Duration::new(5, 123_456_000));
        assert_eq!((a.orig_len, &a.data[..]), (3, &[1u8, 2, 3][..]));
        let b = r.next().unwrap().unwrap();
        assert_eq!((b.ts, b.data.len()), (Duration::ZERO, 0));
        assert!(r.next().is_none());
    }

    #[test]
    fn snaplen_truncates() {
        let mut w = PcapWriter::with_snaplen(Vec::new(), LinkType::RAW, 2).unwrap();
        w.write_packet(Duration::from_micros(1), &[9, 8, 7])
            .unwrap();
        let bytes = w.into_inner().unwrap();
        let rec: Vec<_> = PcapReader::new(&bytes[..])
            .unwrap()
            .collect::<io::Result<_>>()
            .unwrap();
        assert_eq!(rec.len(), 1);
        assert_eq!((rec[0].orig_len, &rec[0].data[..]), (3, &[9u8, 8][..]));
    }

    /// A big-endian, nanosecond pcap written by hand.
    #[test]
    fn reads_big_endian_nanos() {
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC_NS.to_be_bytes());
        f.extend_from_slice(&2u16.to_be_bytes());
        f.extend_from_slice(&4u16.to_be_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_be_bytes());
        f.extend_from_slice(&101u32.to_be_bytes());
        f.extend_from_slice(&7u32.to_be_bytes());
        f.extend_from_slice(&999_999_999u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&60u32.to_be_bytes());
        f.extend_from_slice(&[0xaa, 0xbb]);
        let mut r = PcapReader::new(&f[..]).unwrap();
        assert!(r.is_nanos());
        assert_eq!(r.linktype(), LinkType::RAW);
        assert_eq!(r.snaplen(), 65535);
        let mut buf = Vec::new();
        let h = r.next_into(&mut buf).unwrap().unwrap();
        assert_eq!(h.ts, Duration::new(7, 999_999_999));
        assert_eq!((h.incl_len, h.orig_len), (2, 60));
        assert_eq!(buf, [0xaa, 0xbb]);
        assert!(r.next_into(&mut buf).unwrap().is_none());

        // A record cut short is an error, not a silent end.
        let cut = &f[..f.len() - 1];
        let mut r = PcapReader::new(cut).unwrap();
        assert!(r.next().unwrap().is_err());
        let cut = &f[..24 + 5];
        let mut r = PcapReader::new(cut).unwrap();
        assert_eq!(
            r.next().unwrap().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(PcapReader::new(&[0u8; 24][..]).is_err());
        assert!(PcapReader::new(&[0xd4, 0xc3, 0xb2, 0xa1][..]).is_err());
        let mut ng = [0u8; 24];
        ng[..4].copy_from_slice(b"\x0a\x0d\x0d\x0a");
        assert!(PcapReader::new(&ng[..]).is_err());
        // An absurd record length is refused before allocating.
        let mut w = PcapWriter::new(Vec::new(), LinkType::RAW).unwrap();
        w.write_packet(Duration::ZERO, &[1]).unwrap();
        let mut b = w.into_inner().unwrap();
        b[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(PcapReader::new(&b[..]).unwrap().next().unwrap().is_err());
    }

    #[test]
    fn frames_to_file() {
        let p = std::env::temp_dir().join(format!(
            "rxe-core-pcap-unit-{}-{:?}.pcap",
            std::process::id(),
            std::thread::current().id()
        ));
        let n = write_frames_pcap(&p, LinkType::RAW, [&[0x45u8, 0][..], &[0x60u8][..]]).unwrap();
        assert_eq!(n, 2);
        let f = std::fs::File::open(&p).unwrap();
        let recs: Vec<_> = PcapReader::new(f)
            .unwrap()
            .collect::<io::Result<_>>()
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].ts, Duration::from_micros(1));
        assert_eq!(recs[0].data, [0x45, 0]);
    }
}
