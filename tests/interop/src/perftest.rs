//! Our side of perftest 25.01 (`ib_send_lat`, `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`):
//! the same out-of-band TCP exchange, the same QP attributes and the same buffer layout, so the
//! unmodified tool in a guest running Linux `rdma_rxe` can be either end.
//!
//! # The exchange (`-F`, no `-R`; see `tests/vm/oob-notes.md`)
//!
//! Every step is a fixed-size write/read pair: the client writes first and then reads, the
//! server reads first and then writes. In order:
//!
//! | step | bytes | content |
//! |------|-------|---------|
//! | version | 16 | `"6.24"`, NUL-padded; peers older than 5.70 are refused |
//! | cycle buffer | 4 | big-endian int (page size); both take the larger |
//! | cache line | 4 | big-endian int; both take the larger |
//! | MTU | 2 | `ibv_mtu` enum as ASCII + NUL; both take the smaller |
//! | keys | 108 | `LID:out_reads:QPN:PSN:rkey:VA:16 GID bytes:SRQN:` + NUL ([`Keys`]) |
//!
//! then key exchanges as barriers: H1 (after which both sides move to RTR/RTS), H2, H3; then
//! - `ib_send_lat`: both post receives, H4, ping-pong, H5 (close);
//! - the bandwidth tools: the client runs while the server is passive; H4, the report
//!   exchange ([`BwReport`], five 8-byte big-endian values), H5 (close).
//!
//! # Buffers
//!
//! As in perftest, one MR of `2 × INC(BUFF_SIZE)` bytes: the first half is the local source
//! (SEND, WRITE source), the advertised VA is `buf + BUFF_SIZE(size, cycle)`. When
//! `size <= cycle / 2` consecutive operations step through the cycle buffer by
//! `INC(size, cache_line)` on both ends. The whole buffer is filled with [`pattern`] repeated
//! with period `min(PATTERN_LEN, size)` — exactly what the tool does with
//! `--payload_file_path` given [`payload_file`] — so each side knows the other's buffer. The
//! pattern is PRNG bytes, so within a message nothing repeats (and `PATTERN_LEN` is no multiple
//! of a path MTU): a segment placed at the wrong offset, duplicated or swapped shows. Because
//! that fill is everywhere, a buffer that is to receive bytes is first poisoned with the
//! complement of what it must receive ([`poison_of`]), so that a segment that is never placed
//! shows too:
//! - as READ client, each outstanding READ has a sink of its own (after the perftest buffer, in
//!   the same MR; perftest reads into the local half, where READs of one slot share a sink),
//!   poisoned before the READ is posted; its completion is compared with the remote buffer
//!   byte for byte;
//! - `ib_send_lat` receives are compared with the sender's buffer, and the receive buffer is
//!   poisoned before the receives are posted and again after each check (the next message can
//!   only come after our next SEND);
//! - as `ib_write_bw` server our target half starts scrubbed ([`SCRUB`]) and afterwards must
//!   hold exactly the peer's writes;
//! - atomics: every value an atomic returns is predicted ([`AtomicPlan`]), and as server the
//!   final contents of every slot are checked.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant as Wall};

use rxe_core::mem::Backing;
use rxe_core::verbs::*;
use rxe_core::{Gid, QpInit, Qpn};

use crate::peer::{Peer, MEM_BASE};

/// perftest's internal protocol version (what 25.01 sends).
pub const VERSION: &str = "6.24";
/// The oldest peer version perftest accepts (`check_version_compatibility`).
pub const MIN_PEER_VERSION: f64 = 5.70;
pub const VERSION_LEN: usize = 16;
pub const KEY_MSG_LEN: usize = 108;
pub const DEF_PORT: u16 = 18515;
pub const PAGE_SIZE: u32 = 4096;
pub const CACHE_LINE: u32 = 64;
/// Outstanding READs / atomics we accept as responder (rxe's `max_qp_rd_atom`).
pub const MAX_OUT_READS: u16 = 128;
pub const MIN_RNR_TIMER: u8 = 12;
pub const QP_TIMEOUT: u8 = 14;
/// Length of the payload pattern (the tool's `--payload_file_path` file holds it): longer
/// than the largest message the interop tests send (64 KiB), a multiple of 4 (the file holds
/// DWORDs) and of no path MTU, so the fill never repeats at a segment boundary.
pub const PATTERN_LEN: usize = 65536 + 4;
/// What the target half of our buffer holds before an `ib_write_bw` peer writes into it.
pub const SCRUB: u8 = 0xe5;
/// At most this many bytes of READ sinks (one per outstanding READ, see the module
/// documentation); fewer sinks than the send queue depth limit the outstanding READs.
pub const READ_SINK_BYTES: u64 = 16 << 20;
/// perftest's fetch-and-add operand (`ATOMIC_ADD_VALUE`); compare-and-swap uses compare 0,
/// swap 0 (`ATOMIC_SWAP_VALUE`, compare left zeroed).
pub const TOOL_ADD: u64 = 1;
/// Our fetch-and-add operand: crosses the 32-bit boundary.
pub const OUR_ADD: u64 = 0x0000_0001_0000_0101;
/// Our compare-and-swap step: a successful swap adds this to the slot.
pub const OUR_SWAP_STEP: u64 = 0x0000_0100_0001_0001;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicKind {
    CmpSwap,
    FetchAdd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    SendLat,
    WriteBw,
    ReadBw,
    AtomicBw(AtomicKind),
}

impl Test {
    /// The perftest default message size of the tool.
    pub fn default_size(self) -> usize {
        match self {
            Test::SendLat => 2,
            Test::WriteBw | Test::ReadBw => 65536,
            Test::AtomicBw(_) => 8,
        }
    }
    pub fn tool(self) -> &'static str {
        match self {
            Test::SendLat => "ib_send_lat",
            Test::WriteBw => "ib_write_bw",
            Test::ReadBw => "ib_read_bw",
            Test::AtomicBw(_) => "ib_atomic_bw",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Test::SendLat => "send_lat",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::AtomicBw(AtomicKind::CmpSwap) => "atomic_bw_cs",
            Test::AtomicBw(AtomicKind::FetchAdd) => "atomic_bw_fa",
        }
    }
    pub fn is_bw(self) -> bool {
        self != Test::SendLat
    }
    /// What we advertise in the keys: READ and atomic tests use the device maximum.
    pub fn out_reads(self) -> u16 {
        match self {
            Test::ReadBw | Test::AtomicBw(_) => MAX_OUT_READS,
            _ => 1,
        }
    }
    /// MR and QP access, as perftest sets them per verb.
    fn mr_access(self) -> Access {
        match self {
            Test::SendLat => Access::LOCAL_WRITE,
            Test::WriteBw => Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
            Test::ReadBw => Access::LOCAL_WRITE.union(Access::REMOTE_READ),
            Test::AtomicBw(_) => Access::LOCAL_WRITE.union(Access::REMOTE_ATOMIC),
        }
    }
    fn qp_access(self) -> Access {
        match self {
            Test::SendLat => Access::REMOTE_WRITE.union(Access::LOCAL_WRITE),
            Test::WriteBw => Access::REMOTE_WRITE,
            Test::ReadBw => Access::REMOTE_READ,
            Test::AtomicBw(_) => Access::REMOTE_ATOMIC,
        }
    }
}

/// Who the other end is: it decides which operands a bandwidth client uses, which the server's
/// final memory check must predict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    /// The stock perftest tool, run with `--payload_file_path` holding [`payload_file`].
    Tool,
    /// Another instance of this module.
    Ours,
}

/// The perftest connection keys (`KEY_PRINT_FMT_GID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    pub lid: u16,
    pub out_reads: u16,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: Gid,
    pub srqn: u32,
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl Keys {
    pub fn encode(&self) -> [u8; KEY_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid.0 {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG_LEN];
        let n = s.len().min(KEY_MSG_LEN - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    pub fn decode(m: &[u8]) -> io::Result<Keys> {
        let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
        let s = std::str::from_utf8(&m[..end]).map_err(|_| bad("keys: not ASCII"))?;
        let f: Vec<&str> = s.split(':').collect();
        // 6 fields, 16 GID bytes, SRQN, and the empty tail after the last ':'.
        if f.len() != 24 || !f[23].is_empty() {
            return Err(bad("keys: wrong number of fields"));
        }
        let hex = |i: usize, max: usize| -> io::Result<u64> {
            let v = f[i];
            if v.is_empty() || v.len() > max || !v.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad("keys: malformed field"));
            }
            u64::from_str_radix(v, 16).map_err(|_| bad("keys: malformed field"))
        };
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = hex(6 + i, 2)? as u8;
        }
        Ok(Keys {
            lid: hex(0, 4)? as u16,
            out_reads: hex(1, 4)? as u16,
            qpn: hex(2, 6)? as u32,
            psn: hex(3, 6)? as u32,
            rkey: hex(4, 8)? as u32,
            vaddr: hex(5, 16)?,
            gid: Gid(gid),
            srqn: hex(22, 8)? as u32,
        })
    }
}

/// The bandwidth report the client sends after its run (the server answers with its own).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwReport {
    pub size: u64,
    pub iters: u64,
    /// MiB/s.
    pub bw_peak: f64,
    /// MiB/s.
    pub bw_avg: f64,
    /// Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    fn fields(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }
    fn from_fields(f: &[[u8; 8]; 5]) -> BwReport {
        let d = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        BwReport {
            size: u64::from_be_bytes(f[0]),
            iters: u64::from_be_bytes(f[1]),
            bw_peak: d(f[2]),
            bw_avg: d(f[3]),
            msg_rate: d(f[4]),
        }
    }
}

/// The payload both ends put in their buffers (period `min(PATTERN_LEN, size)`): bytes of a
/// position-keyed PRNG (splitmix64 of the 8-byte block index).
pub fn pattern() -> Vec<u8> {
    crate::prng_pattern(0x5eed_0002, PATTERN_LEN)
}

/// The period of the fill of a `size`-byte test (perftest stops reading the payload file at
/// `size` bytes).
pub fn fill_period(size: usize) -> usize {
    PATTERN_LEN.min(size.max(1))
}

/// The byte a perftest-style buffer of a `size`-byte test holds at `offset` from its start.
pub fn fill_byte(pat: &[u8], size: usize, offset: u64) -> u8 {
    pat[(offset % fill_period(size) as u64) as usize]
}

/// What a buffer that must receive `want` is poisoned with first: the complement, so every byte
/// that is never placed differs.
pub fn poison_of(want: &[u8]) -> Vec<u8> {
    want.iter().map(|b| !b).collect()
}

/// Checks once that a poison differs from the expected bytes everywhere (a poison that equalled
/// them would let a missing segment pass).
fn check_poison(poison: &[u8], want: &[u8], what: &str) -> io::Result<()> {
    match poison.iter().zip(want).position(|(a, b)| a == b) {
        Some(at) => Err(err(format!(
            "{what}: the poison equals the expected bytes at byte {at}"
        ))),
        None if poison.len() != want.len() => Err(err(format!("{what}: poison length"))),
        None => Ok(()),
    }
}

/// The `--payload_file_path` file for perftest: the pattern as little-endian DWORDs,
/// `0xDDCCBBAA` for bytes AA BB CC DD, comma-separated (no spaces: perftest wants every token
/// exactly 10 characters long).
pub fn payload_file() -> String {
    pattern()
        .chunks(4)
        .map(|c| format!("0x{:02x}{:02x}{:02x}{:02x}", c[3], c[2], c[1], c[0]))
        .collect::<Vec<_>>()
        .join(",")
}

/// perftest's `BUFF_SIZE`.
pub fn buff_size(size: u64, cycle: u64) -> u64 {
    size.max(cycle)
}

/// perftest's `INC`.
pub fn inc(size: u64, cache_line: u64) -> u64 {
    if size > cache_line {
        size.div_ceil(cache_line) * cache_line
    } else {
        cache_line
    }
}

/// The buffer geometry both ends derive from the negotiated values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub size: u64,
    pub cycle: u64,
    pub cache_line: u64,
}

impl Layout {
    /// Offset of the advertised VA from the buffer start.
    pub fn remote_off(&self) -> u64 {
        buff_size(self.size, self.cycle)
    }
    /// Length of the whole buffer (both halves).
    pub fn total(&self) -> u64 {
        inc(buff_size(self.size, self.cycle), self.cache_line) * 2
    }
    /// Operations cycle through the buffer when the message is at most half a cycle buffer.
    pub fn cycles(&self) -> bool {
        self.size <= self.cycle / 2
    }
    pub fn step(&self) -> u64 {
        inc(self.size, self.cache_line)
    }
    /// How many distinct addresses the operations visit.
    pub fn wrap(&self) -> u64 {
        if self.cycles() {
            (self.cycle / self.step()).max(1)
        } else {
            1
        }
    }
    /// Offset of operation `k` from the start of either half.
    pub fn op_off(&self, k: u64) -> u64 {
        (k % self.wrap()) * self.step()
    }
}

/// Predicts every atomic of a bandwidth run: operands and returned values, and the final
/// contents of every slot. Operation `k` goes to slot `k % wrap`, slots start at `initial`.
#[derive(Clone, Debug)]
pub struct AtomicPlan {
    pub kind: AtomicKind,
    pub by: PeerKind,
    current: Vec<u64>,
    rounds: Vec<u64>,
}

/// One predicted atomic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicOp {
    pub slot: u64,
    /// FETCH_AND_ADD: the add operand; CMP_AND_SWAP: the swap value.
    pub swap_add: u64,
    pub compare: u64,
    /// What the responder must return.
    pub orig: u64,
}

impl AtomicPlan {
    pub fn new(kind: AtomicKind, by: PeerKind, initial: Vec<u64>) -> Self {
        let n = initial.len();
        AtomicPlan {
            kind,
            by,
            current: initial,
            rounds: vec![0; n],
        }
    }
    /// The next operation on `slot`.
    pub fn next(&mut self, slot: u64) -> AtomicOp {
        let j = slot as usize;
        let cur = self.current[j];
        let r = self.rounds[j];
        self.rounds[j] += 1;
        let (compare, swap_add, new) = match (self.kind, self.by) {
            (AtomicKind::FetchAdd, PeerKind::Tool) => (0, TOOL_ADD, cur.wrapping_add(TOOL_ADD)),
            (AtomicKind::FetchAdd, PeerKind::Ours) => (0, OUR_ADD, cur.wrapping_add(OUR_ADD)),
            // compare 0, swap 0: a zero slot is rewritten with zero, anything else stays.
            (AtomicKind::CmpSwap, PeerKind::Tool) => (0, 0, cur),
            // Every fourth compare on a slot is made to miss: the slot must stay unchanged.
            (AtomicKind::CmpSwap, PeerKind::Ours) if r % 4 == 3 => {
                (cur ^ 0x5a5a_0000_0000_a5a5, cur.wrapping_add(7), cur)
            }
            (AtomicKind::CmpSwap, PeerKind::Ours) => {
                let s = cur.wrapping_add(OUR_SWAP_STEP);
                (cur, s, s)
            }
        };
        self.current[j] = new;
        AtomicOp {
            slot,
            swap_add,
            compare,
            orig: cur,
        }
    }
    pub fn current(&self) -> &[u64] {
        &self.current
    }
}

/// The initial value of every atomic slot of a perftest-style buffer.
pub fn initial_slots(l: &Layout, pat: &[u8]) -> Vec<u64> {
    (0..l.wrap())
        .map(|j| {
            let off = l.remote_off() + l.op_off(j);
            let mut b = [0u8; 8];
            for (i, x) in b.iter_mut().enumerate() {
                *x = fill_byte(pat, l.size as usize, off + i as u64);
            }
            u64::from_le_bytes(b)
        })
        .collect()
}

#[derive(Clone, Debug)]
pub struct Opts {
    pub test: Test,
    /// `Some(addr)`: we are the client and the tool listens at `addr`; `None`: we listen.
    pub server: Option<SocketAddr>,
    /// Where we listen when we are the server.
    pub listen: SocketAddr,
    pub size: usize,
    pub iters: u32,
    /// The MTU we offer; the smaller of both ends is used.
    pub mtu: Mtu,
    /// Work requests we keep outstanding as a bandwidth client.
    pub tx_depth: u32,
    pub timeout: Duration,
    pub peer: PeerKind,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub test: Test,
    pub client: bool,
    pub size: usize,
    pub iters: u32,
    /// Our successful completions (sends + receives for `send_lat`).
    pub completions: u64,
    /// Buffers / returned values / memory regions compared with their predicted contents.
    pub verified: u64,
    pub bytes: u64,
    pub secs: f64,
    pub mtu: Mtu,
    pub peer_version: String,
    pub local: Keys,
    pub remote: Keys,
    /// The report the peer sent (bandwidth tests).
    pub peer_report: Option<BwReport>,
    pub our_report: Option<BwReport>,
    pub counters: rxe_core::QpCounters,
}

fn err(msg: String) -> io::Error {
    io::Error::other(msg)
}

fn ok<T>(r: Result<T, rxe_core::VerbError>, what: &str) -> io::Result<T> {
    r.map_err(|e| err(format!("{what}: {e}")))
}

/// The TCP side channel; every wait for the peer keeps the engine running, since the peer may
/// still need our responses (a passive server waits on TCP while the client's requests come
/// in) or our ACKs.
pub struct Oob {
    s: TcpStream,
    client: bool,
    deadline: Wall,
}

impl Oob {
    /// Connects to a listening tool, retrying until `deadline` (it may not listen yet).
    pub fn connect(server: SocketAddr, deadline: Wall) -> io::Result<Oob> {
        loop {
            match TcpStream::connect_timeout(&server, Duration::from_secs(2)) {
                Ok(s) => return Oob::new(s, true, deadline),
                Err(e) if Wall::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Accepts one client.
    pub fn accept(listen: SocketAddr, deadline: Wall) -> io::Result<Oob> {
        let l = TcpListener::bind(listen)?;
        Oob::accept_on(&l, deadline)
    }

    pub fn accept_on(l: &TcpListener, deadline: Wall) -> io::Result<Oob> {
        l.set_nonblocking(true)?;
        loop {
            match l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    return Oob::new(s, false, deadline);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Wall::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "no client connected",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn new(s: TcpStream, client: bool, deadline: Wall) -> io::Result<Oob> {
        s.set_nodelay(true)?;
        Ok(Oob {
            s,
            client,
            deadline,
        })
    }

    fn write(&mut self, m: &[u8]) -> io::Result<()> {
        self.s.set_nonblocking(false)?;
        self.s.write_all(m)
    }

    fn read(&mut self, mut p: Option<&mut Peer>, n: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        let mut got = 0;
        self.s.set_nonblocking(true)?;
        while got < n {
            match self.s.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("peer closed the connection after {got} of {n} bytes"),
                    ))
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Wall::now() >= self.deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("timed out waiting for {n} bytes from the peer"),
                        ));
                    }
                    match p.as_deref_mut() {
                        Some(p) => p.pump(Duration::from_millis(2))?,
                        None => std::thread::sleep(Duration::from_millis(2)),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(buf)
    }

    /// One `ctx_xchg_data` step: same size both ways, client writes first.
    pub fn xchg(&mut self, p: Option<&mut Peer>, mine: &[u8]) -> io::Result<Vec<u8>> {
        if self.client {
            self.write(mine)?;
            self.read(p, mine.len())
        } else {
            let theirs = self.read(p, mine.len())?;
            self.write(mine)?;
            Ok(theirs)
        }
    }

    /// One `ctx_hand_shake`.
    pub fn keys(&mut self, p: Option<&mut Peer>, mine: &Keys) -> io::Result<Keys> {
        Keys::decode(&self.xchg(p, &mine.encode())?)
    }

    /// `xchg_bw_reports` (peer version >= 5.33: 64-bit iterations).
    pub fn reports(&mut self, mut p: Option<&mut Peer>, mine: &BwReport) -> io::Result<BwReport> {
        let mut theirs = [[0u8; 8]; 5];
        for (i, f) in mine.fields().iter().enumerate() {
            let t = self.xchg(p.as_deref_mut(), f)?;
            theirs[i].copy_from_slice(&t);
        }
        Ok(BwReport::from_fields(&theirs))
    }
}

/// perftest reads the version with `atof()`: the leading decimal number.
pub fn parse_version(m: &[u8]) -> (String, f64) {
    let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    let s = String::from_utf8_lossy(&m[..end]).to_string();
    let num: String = s
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (s.clone(), num.parse().unwrap_or(0.0))
}

/// The setup phase every tool shares: version, cycle buffer, cache line, MTU.
pub struct Negotiated {
    pub peer_version: String,
    pub cycle: u32,
    pub cache_line: u32,
    pub mtu: Mtu,
}

pub fn negotiate(oob: &mut Oob, our_mtu: Mtu) -> io::Result<Negotiated> {
    let mut v = [0u8; VERSION_LEN];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let theirs = oob.xchg(None, &v)?;
    let (peer_version, num) = parse_version(&theirs);
    if num < MIN_PEER_VERSION {
        return Err(err(format!(
            "peer perftest version {peer_version:?} is older than {MIN_PEER_VERSION}"
        )));
    }
    let int = |b: Vec<u8>| -> io::Result<u32> {
        let a: [u8; 4] = b.try_into().map_err(|_| bad("short int"))?;
        Ok(i32::from_be_bytes(a).max(0) as u32)
    };
    let cycle = int(oob.xchg(None, &(PAGE_SIZE as i32).to_be_bytes())?)?.max(PAGE_SIZE);
    let cache_line = int(oob.xchg(None, &(CACHE_LINE as i32).to_be_bytes())?)?.max(CACHE_LINE);
    // The MTU goes as "%d" in a 2-byte buffer: one digit and a NUL.
    let m = [b'0' + our_mtu as u8, 0];
    let t = oob.xchg(None, &m)?;
    let end = t.iter().position(|&b| b == 0).unwrap_or(t.len());
    let rem: u8 = std::str::from_utf8(&t[..end])
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    // perftest keeps its own MTU when the peer's is not a valid enum.
    let mtu = match Mtu::from_enum(rem) {
        Some(r) if r < our_mtu => r,
        _ => our_mtu,
    };
    if cycle > 1 << 20 || cache_line > 4096 || !cycle.is_power_of_two() {
        return Err(err(format!(
            "unexpected cycle buffer {cycle} / cache line {cache_line} from the peer"
        )));
    }
    Ok(Negotiated {
        peer_version,
        cycle,
        cache_line,
        mtu,
    })
}

/// How many bytes of peer memory a run with `tx_depth` outstanding operations needs at most
/// (before negotiation; the peer's cycle buffer is assumed to be at most 64 KiB).
pub fn mem_needed(size: usize, tx_depth: u32) -> usize {
    let l = Layout {
        size: size as u64,
        cycle: 65536,
        cache_line: 4096,
    };
    let sinks = (tx_depth as u64 * l.step()).min(READ_SINK_BYTES.max(l.step()));
    (l.total() + sinks) as usize + 4096
}

/// How many READ sinks a READ client has (one per outstanding READ): bounded by the depth,
/// the iterations and [`READ_SINK_BYTES`]; sink `k % n` is at `total() + (k % n) * step()`.
fn read_sinks(o: &Opts, l: &Layout) -> u64 {
    if o.test != Test::ReadBw || o.server.is_none() {
        return 0;
    }
    (o.tx_depth.max(1) as u64)
        .min(o.iters.max(1) as u64)
        .min((READ_SINK_BYTES / l.step()).max(1))
}

const RECV_WRID: u64 = 1 << 62;

struct Qp {
    qpn: Qpn,
    cq: u32,
    mr: u32,
    buf: u64,
    layout: Layout,
    mine: Keys,
}

fn create(p: &mut Peer, o: &Opts, layout: Layout, rx_depth: u32) -> io::Result<Qp> {
    let buf = MEM_BASE;
    let total = layout.total();
    // As READ client, the sinks follow the perftest buffer in the same MR.
    let mr_len = total + read_sinks(o, &layout) * layout.step();
    if mr_len as usize > p.mem.bytes.len() {
        return Err(err(format!(
            "buffer of {mr_len} bytes does not fit the peer memory ({})",
            p.mem.bytes.len()
        )));
    }
    // Fill like perftest with the payload file: the pattern over the whole buffer. As write
    // target, scrub the half the peer writes into so its writes show.
    let pat = pattern();
    for (i, b) in p.mem.slice_mut(buf, total as usize).iter_mut().enumerate() {
        *b = fill_byte(&pat, o.size, i as u64);
    }
    if o.test == Test::WriteBw && o.server.is_none() {
        let off = layout.remote_off();
        p.mem
            .slice_mut(buf + off, (total - off) as usize)
            .fill(SCRUB);
    }
    let d = &mut p.dev;
    let pd = ok(d.alloc_pd(), "alloc_pd")?;
    let mr = ok(
        d.reg_mr(
            pd,
            buf,
            mr_len,
            o.test.mr_access(),
            Backing::Contiguous { base: buf },
        ),
        "reg_mr",
    )?;
    let cq = ok(d.create_cq(o.tx_depth + rx_depth + 16), "create_cq")?;
    let qpn = ok(
        d.create_qp(QpInit {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap: QpCap {
                max_send_wr: o.tx_depth,
                max_recv_wr: rx_depth.max(1),
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        }),
        "create_qp",
    )?;
    let a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: o.test.qp_access(),
        ..Default::default()
    };
    ok(
        d.modify_qp(
            qpn,
            &a,
            AttrMask(
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            ),
        ),
        "modify INIT",
    )?;
    let psn = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        .wrapping_mul(2654435761)
        ^ qpn.0)
        & 0xff_ffff;
    let mine = Keys {
        lid: 0,
        out_reads: o.test.out_reads(),
        qpn: qpn.0,
        psn,
        rkey: mr,
        vaddr: buf + layout.remote_off(),
        gid: Gid::from_ip(p.local_ip),
        srqn: 0,
    };
    Ok(Qp {
        qpn,
        cq,
        mr,
        buf,
        layout,
        mine,
    })
}

/// RTR then RTS with perftest's attributes (`ctx_modify_qp_to_rtr` / `_rts`).
fn connect(p: &mut Peer, q: &Qp, r: &Keys, mtu: Mtu) -> io::Result<()> {
    if q.mine.gid.ipv4().is_some() != r.gid.ipv4().is_some() {
        return Err(err(format!(
            "GID types differ (ours {:?}, theirs {:?}): perftest refuses this",
            q.mine.gid, r.gid
        )));
    }
    let mut a = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: r.qpn,
        rq_psn: r.psn,
        max_dest_rd_atomic: q.mine.out_reads.min(MAX_OUT_READS) as u8,
        min_rnr_timer: MIN_RNR_TIMER,
        av: Av {
            dgid: r.gid,
            sgid_index: 0,
            hop_limit: 64,
            ..Default::default()
        },
        ..Default::default()
    };
    ok(
        p.dev.modify_qp(
            q.qpn,
            &a,
            AttrMask(
                AttrMask::STATE
                    | AttrMask::AV
                    | AttrMask::PATH_MTU
                    | AttrMask::DEST_QPN
                    | AttrMask::RQ_PSN
                    | AttrMask::MIN_RNR_TIMER
                    | AttrMask::MAX_DEST_RD_ATOMIC,
            ),
        ),
        "modify RTR",
    )?;
    a.qp_state = QpState::Rts;
    a.sq_psn = q.mine.psn;
    a.timeout = QP_TIMEOUT;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    // The initiator depth is the peer's responder resources.
    a.max_rd_atomic = r.out_reads.clamp(1, MAX_OUT_READS) as u8;
    ok(
        p.dev.modify_qp(
            q.qpn,
            &a,
            AttrMask(
                AttrMask::STATE
                    | AttrMask::SQ_PSN
                    | AttrMask::TIMEOUT
                    | AttrMask::RETRY_CNT
                    | AttrMask::RNR_RETRY
                    | AttrMask::MAX_QP_RD_ATOMIC,
            ),
        ),
        "modify RTS",
    )
}

fn check_cqe(c: &rxe_core::verbs::Cqe, op: WcOpcode, len: usize) -> io::Result<()> {
    if c.status != WcStatus::Success {
        return Err(err(format!(
            "completion error {:?} (vendor_err {:#x}) for wr_id {:#x}",
            c.status, c.vendor_err, c.wr_id
        )));
    }
    if c.opcode != op || c.byte_len as usize != len {
        return Err(err(format!(
            "completion {:?} of {} bytes for wr_id {:#x}, expected {:?} of {len}",
            c.opcode, c.byte_len, c.wr_id, op
        )));
    }
    Ok(())
}

fn first_diff(got: &[u8], want: impl Fn(usize) -> u8) -> Option<usize> {
    got.iter().enumerate().position(|(i, &b)| b != want(i))
}

/// Runs one test against a peer (the tool or another instance).
pub fn run(p: &mut Peer, o: &Opts) -> io::Result<Report> {
    let client = o.server.is_some();
    let deadline = Wall::now() + o.timeout;
    if o.size == 0 || (matches!(o.test, Test::AtomicBw(_)) && o.size != 8) {
        return Err(err(format!("bad size {} for {}", o.size, o.test.name())));
    }
    let mut oob = match o.server {
        Some(a) => Oob::connect(a, deadline)?,
        None => Oob::accept(o.listen, deadline)?,
    };
    let neg = negotiate(&mut oob, o.mtu)?;
    let layout = Layout {
        size: o.size as u64,
        cycle: neg.cycle as u64,
        cache_line: neg.cache_line as u64,
    };
    let rx_depth = if o.test == Test::SendLat {
        o.iters.min(512)
    } else {
        1
    };
    let q = create(p, o, layout, rx_depth)?;
    // H1: the keys; then both sides connect.
    let remote = oob.keys(Some(p), &q.mine)?;
    connect(p, &q, &remote, neg.mtu)?;
    // H2 (the "remote address" print) and H3 (after RTR).
    oob.keys(Some(p), &q.mine)?;
    oob.keys(Some(p), &q.mine)?;
    let pat = pattern();
    let start = Wall::now();
    let mut rep = Report {
        test: o.test,
        client,
        size: o.size,
        iters: o.iters,
        completions: 0,
        verified: 0,
        bytes: 0,
        secs: 0.0,
        mtu: neg.mtu,
        peer_version: neg.peer_version,
        local: q.mine,
        remote,
        peer_report: None,
        our_report: None,
        counters: Default::default(),
    };
    match (o.test, client) {
        (Test::SendLat, _) => {
            send_lat(p, o, &q, &mut oob, &mut rep, deadline)?;
            rep.secs = start.elapsed().as_secs_f64();
            oob.keys(Some(p), &q.mine)?;
        }
        (_, true) => {
            bw_client(p, o, &q, &remote, &mut rep, deadline)?;
            rep.secs = start.elapsed().as_secs_f64();
            let ours = BwReport {
                size: o.size as u64,
                iters: rep.completions,
                bw_peak: rep.bytes as f64 / rep.secs / 1048576.0,
                bw_avg: rep.bytes as f64 / rep.secs / 1048576.0,
                msg_rate: rep.completions as f64 / rep.secs / 1e6,
            };
            oob.keys(Some(p), &q.mine)?;
            rep.peer_report = Some(oob.reports(Some(p), &ours)?);
            rep.our_report = Some(ours);
            oob.keys(Some(p), &q.mine)?;
        }
        (_, false) => {
            // Passive: the client runs; its H4 says it is done.
            oob.keys(Some(p), &q.mine)?;
            rep.secs = start.elapsed().as_secs_f64();
            // Like perftest's server: size and nothing measured.
            let ours = BwReport {
                size: o.size as u64,
                ..Default::default()
            };
            let theirs = oob.reports(Some(p), &ours)?;
            rep.peer_report = Some(theirs);
            rep.our_report = Some(ours);
            oob.keys(Some(p), &q.mine)?;
            if theirs.size != o.size as u64 || theirs.iters != o.iters as u64 {
                return Err(err(format!(
                    "the client reports {} iterations of {} bytes, expected {} of {}",
                    theirs.iters, theirs.size, o.iters, o.size
                )));
            }
            bw_server_verify(p, o, &q, &pat, &mut rep)?;
        }
    }
    // Let the last ACKs out before the process goes away.
    let linger = Wall::now() + Duration::from_millis(200);
    while Wall::now() < linger {
        p.pump(Duration::from_millis(5))?;
    }
    rep.counters = p.dev.qp_counters(q.qpn).unwrap_or_default();
    Ok(rep)
}

fn send_lat(
    p: &mut Peer,
    o: &Opts,
    q: &Qp,
    oob: &mut Oob,
    rep: &mut Report,
    deadline: Wall,
) -> io::Result<()> {
    let rbuf = q.buf + q.layout.total() / 2;
    let recv = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![Sge {
            addr: rbuf,
            length: o.size as u32,
            lkey: q.mr,
        }]
        .into(),
    };
    let pat = pattern();
    // The peer sends the start of its buffer, every time.
    let expect: Vec<u8> = (0..o.size as u64)
        .map(|i| fill_byte(&pat, o.size, i))
        .collect();
    // Every receive lands in the one receive buffer, which already holds the pattern (at
    // offset `total / 2`, a multiple of the fill period for small sizes): poison it before the
    // receives are posted and after each check, so that a receive that places nothing shows.
    let poison = poison_of(&expect);
    check_poison(&poison, &expect, "send_lat receive buffer")?;
    p.mem.slice_mut(rbuf, o.size).copy_from_slice(&poison);
    let depth = o.iters.min(512);
    for _ in 0..depth {
        ok(p.dev.post_recv(q.qpn, recv.clone()), "post_recv")?;
    }
    let mut posted_recv = depth;
    // H4: both sides have their receives posted.
    oob.keys(Some(p), &q.mine)?;
    let client = o.server.is_some();
    let send = |k: u64| {
        SendWr::new(
            k,
            SendOp::Send,
            vec![Sge {
                addr: q.buf,
                length: o.size as u32,
                lkey: q.mr,
            }],
        )
    };
    let (mut sent, mut scnt, mut rcnt) = (0u32, 0u32, 0u32);
    if client {
        ok(p.dev.post_send(q.qpn, send(0)), "post_send")?;
        sent = 1;
    }
    while scnt < o.iters || rcnt < o.iters {
        if Wall::now() > deadline {
            return Err(err(format!(
                "timed out after {scnt} sends and {rcnt} receives"
            )));
        }
        p.pump(Duration::from_millis(5))?;
        while let Some(c) = p.dev.poll_cq(q.cq) {
            if c.wr_id == RECV_WRID {
                check_cqe(&c, WcOpcode::Recv, o.size)?;
                rcnt += 1;
                let got = p.mem.slice(rbuf, o.size);
                if got != &expect[..] {
                    let at = first_diff(got, |i| expect[i]).unwrap_or(0);
                    return Err(err(format!(
                        "receive {rcnt}: byte {at} is {:#04x}, the sender's buffer has {:#04x}",
                        got[at], expect[at]
                    )));
                }
                rep.verified += 1;
                // Before our next SEND, the only thing the peer's next message answers.
                p.mem.slice_mut(rbuf, o.size).copy_from_slice(&poison);
                if posted_recv < o.iters {
                    ok(p.dev.post_recv(q.qpn, recv.clone()), "post_recv")?;
                    posted_recv += 1;
                }
                if sent < o.iters {
                    ok(p.dev.post_send(q.qpn, send(sent as u64)), "post_send")?;
                    sent += 1;
                }
            } else {
                check_cqe(&c, WcOpcode::Send, o.size)?;
                scnt += 1;
            }
            rep.completions += 1;
        }
    }
    rep.bytes = 2 * o.iters as u64 * o.size as u64;
    Ok(())
}

/// What a bandwidth client checks when operation `k` completes.
enum Expect {
    None,
    Read { k: u64 },
    Atomic { res: u64, orig: u64, k: u64 },
}

fn bw_client(
    p: &mut Peer,
    o: &Opts,
    q: &Qp,
    r: &Keys,
    rep: &mut Report,
    deadline: Wall,
) -> io::Result<()> {
    let l = q.layout;
    let pat = pattern();
    let iters = o.iters as u64;
    let mut depth = o.tx_depth.max(1) as u64;
    // READ sinks: one per outstanding READ, so each can be poisoned before its READ is posted
    // without touching bytes an earlier READ of the same slot placed.
    let sinks = read_sinks(o, &l);
    if o.test == Test::ReadBw {
        depth = depth.min(sinks.max(1));
    }
    let sink = |k: u64| q.buf + l.total() + (k % sinks.max(1)) * l.step();
    // Atomic results go to their own 8-byte slots in the local half, one per outstanding op.
    let ring = depth.min(l.total() / 2 / 8);
    let depth = depth.min(ring.max(1));
    let mut plan = match o.test {
        Test::AtomicBw(kind) => Some(AtomicPlan::new(
            kind,
            PeerKind::Ours,
            initial_slots(&l, &pat),
        )),
        _ => None,
    };
    let read_expect = read_expectations(o, &l, &pat);
    let read_poison: Vec<Vec<u8>> = read_expect.iter().map(|w| poison_of(w)).collect();
    for (w, x) in read_expect.iter().zip(&read_poison) {
        check_poison(x, w, "READ sink")?;
    }
    let mut pending: VecDeque<Expect> = VecDeque::new();
    let (mut posted, mut done) = (0u64, 0u64);
    let (op, len) = match o.test {
        Test::WriteBw => (WcOpcode::RdmaWrite, o.size),
        Test::ReadBw => (WcOpcode::RdmaRead, o.size),
        Test::AtomicBw(AtomicKind::CmpSwap) => (WcOpcode::CompSwap, 8),
        Test::AtomicBw(AtomicKind::FetchAdd) => (WcOpcode::FetchAdd, 8),
        Test::SendLat => unreachable!("send_lat is not a bandwidth test"),
    };
    while done < iters {
        if Wall::now() > deadline {
            return Err(err(format!(
                "timed out after {posted} posted and {done} completed operations"
            )));
        }
        while posted < iters && posted - done < depth {
            let k = posted;
            let loc = q.buf + l.op_off(k);
            let rem = r.vaddr + l.op_off(k);
            let (wr_op, sge, exp) = match o.test {
                Test::WriteBw => (
                    SendOp::Write {
                        remote_addr: rem,
                        rkey: r.rkey,
                    },
                    loc,
                    Expect::None,
                ),
                Test::ReadBw => {
                    // Its own sink, poisoned: the READ that used it last has completed.
                    p.mem
                        .slice_mut(sink(k), o.size)
                        .copy_from_slice(&read_poison[(k % l.wrap()) as usize]);
                    (
                        SendOp::Read {
                            remote_addr: rem,
                            rkey: r.rkey,
                        },
                        sink(k),
                        Expect::Read { k },
                    )
                }
                Test::AtomicBw(kind) => {
                    let plan = plan.as_mut().expect("atomic plan");
                    let a = plan.next(k % l.wrap());
                    let res = q.buf + (k % ring) * 8;
                    let op = match kind {
                        AtomicKind::FetchAdd => SendOp::FetchAdd {
                            remote_addr: rem,
                            rkey: r.rkey,
                            add: a.swap_add,
                        },
                        AtomicKind::CmpSwap => SendOp::CompSwap {
                            remote_addr: rem,
                            rkey: r.rkey,
                            compare: a.compare,
                            swap: a.swap_add,
                        },
                    };
                    // Poison the result slot so a missing write shows.
                    p.mem.slice_mut(res, 8).fill(0xcc);
                    (
                        op,
                        res,
                        Expect::Atomic {
                            res,
                            orig: a.orig,
                            k,
                        },
                    )
                }
                Test::SendLat => unreachable!(),
            };
            let wr = SendWr::new(
                k,
                wr_op,
                vec![Sge {
                    addr: sge,
                    length: len as u32,
                    lkey: q.mr,
                }],
            );
            ok(p.dev.post_send(q.qpn, wr), "post_send")?;
            pending.push_back(exp);
            posted += 1;
        }
        p.pump(Duration::from_millis(5))?;
        while let Some(c) = p.dev.poll_cq(q.cq) {
            check_cqe(&c, op, len)?;
            if c.wr_id != done {
                return Err(err(format!(
                    "completion for wr_id {} out of order (expected {done})",
                    c.wr_id
                )));
            }
            match pending.pop_front() {
                Some(Expect::None) => {}
                Some(exp) => {
                    check_result(p, o, &l, &exp, sink, &read_expect)?;
                    rep.verified += 1;
                }
                None => return Err(err("completion without a posted operation".into())),
            }
            done += 1;
            rep.completions += 1;
        }
    }
    rep.bytes = iters * o.size as u64;
    Ok(())
}

/// What each READ of a bandwidth client must bring back: the remote buffer at the operation's
/// offset (nothing for the other tests).
fn read_expectations(o: &Opts, l: &Layout, pat: &[u8]) -> Vec<Vec<u8>> {
    if o.test != Test::ReadBw {
        return Vec::new();
    }
    (0..l.wrap().min(o.iters as u64))
        .map(|j| {
            let base = l.remote_off() + l.op_off(j);
            (0..o.size as u64)
                .map(|i| fill_byte(pat, o.size, base + i))
                .collect()
        })
        .collect()
}

/// Checks what a completed READ (in its sink, `sink(k)`) or atomic (in its result slot)
/// brought back.
fn check_result(
    p: &Peer,
    o: &Opts,
    l: &Layout,
    exp: &Expect,
    sink: impl Fn(u64) -> u64,
    read_expect: &[Vec<u8>],
) -> io::Result<()> {
    match *exp {
        Expect::Read { k } => {
            let got = p.mem.slice(sink(k), o.size);
            let want = &read_expect[(k % l.wrap()) as usize];
            // A plain slice compare: a slow byte loop here (debug builds) lets the
            // UDP socket overflow while the peer keeps sending.
            if got != &want[..] {
                let at = first_diff(got, |i| want[i]).unwrap_or(0);
                return Err(err(format!(
                    "READ {k}: byte {at} is {:#04x}, the remote buffer holds {:#04x}",
                    got[at], want[at]
                )));
            }
        }
        Expect::Atomic { res, orig, k } => {
            let mut b = [0u8; 8];
            b.copy_from_slice(p.mem.slice(res, 8));
            let got = u64::from_le_bytes(b);
            if got != orig {
                return Err(err(format!(
                    "atomic {k} on slot {}: returned {got:#018x}, expected {orig:#018x}",
                    k % l.wrap()
                )));
            }
        }
        Expect::None => {}
    }
    Ok(())
}

/// After a passive run: what the client did must be in our memory.
fn bw_server_verify(
    p: &mut Peer,
    o: &Opts,
    q: &Qp,
    pat: &[u8],
    rep: &mut Report,
) -> io::Result<()> {
    let l = q.layout;
    let off = l.remote_off();
    let target = q.buf + off;
    let span = (l.total() - off) as usize;
    let mem = p.mem.slice(target, span);
    let iters = o.iters as u64;
    match o.test {
        Test::WriteBw => {
            // Written: pattern at the same offset from the source buffer start; elsewhere the
            // scrub byte.
            let mut want = vec![SCRUB; span];
            for k in 0..iters.min(l.wrap()) {
                let s = l.op_off(k) as usize;
                for (i, w) in want[s..s + o.size].iter_mut().enumerate() {
                    *w = fill_byte(pat, o.size, (s + i) as u64);
                }
            }
            if let Some(at) = first_diff(mem, |i| want[i]) {
                return Err(err(format!(
                    "write target byte {at} is {:#04x}, expected {:#04x}",
                    mem[at], want[at]
                )));
            }
            rep.verified += iters.min(l.wrap());
        }
        Test::ReadBw => {
            if let Some(at) = first_diff(mem, |i| fill_byte(pat, o.size, off + i as u64)) {
                return Err(err(format!("read source byte {at} changed")));
            }
            rep.verified += 1;
        }
        Test::AtomicBw(kind) => {
            let mut plan = AtomicPlan::new(kind, o.peer, initial_slots(&l, pat));
            for k in 0..iters {
                plan.next(k % l.wrap());
            }
            for (j, want) in plan.current().iter().enumerate() {
                let s = l.op_off(j as u64) as usize;
                let mut b = [0u8; 8];
                b.copy_from_slice(&mem[s..s + 8]);
                let got = u64::from_le_bytes(b);
                if got != *want {
                    return Err(err(format!(
                        "atomic slot {j} holds {got:#018x}, expected {want:#018x} after {iters} {kind:?} by {:?}",
                        o.peer
                    )));
                }
                rep.verified += 1;
            }
            // Nothing else in the target half moved.
            for (i, &b) in mem.iter().enumerate() {
                let in_slot = (i as u64 % l.step()) < 8 && (i as u64 / l.step()) < l.wrap();
                if !in_slot && b != fill_byte(pat, o.size, off + i as u64) {
                    return Err(err(format!("atomic target byte {i} changed")));
                }
            }
        }
        Test::SendLat => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_the_observed_message() {
        // tests/vm/oob-notes.md, test 4, client keys.
        let m = b"0000:0001:000015:6ded1e:000006ac:00005651b4bda000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:";
        let k = Keys::decode(m).unwrap();
        assert_eq!(
            k,
            Keys {
                lid: 0,
                out_reads: 1,
                qpn: 0x15,
                psn: 0x6ded1e,
                rkey: 0x6ac,
                vaddr: 0x5651b4bda000,
                gid: Gid::from_ipv4([10, 77, 0, 3]),
                srqn: 0,
            }
        );
        let e = k.encode();
        assert_eq!(e.len(), KEY_MSG_LEN);
        assert_eq!(&e[..KEY_MSG_LEN - 1], &m[..]);
        assert_eq!(e[KEY_MSG_LEN - 1], 0);
        assert!(Keys::decode(b"0000:0001").is_err());
    }

    #[test]
    fn report_fields_are_big_endian() {
        // The observed client report of test 4.
        let r = BwReport {
            size: 4096,
            iters: 5,
            bw_peak: f64::from_bits(0x3ffce521f048d7f4),
            bw_avg: 1.0,
            msg_rate: 0.5,
        };
        let f = r.fields();
        assert_eq!(f[0], [0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(f[1], [0, 0, 0, 0, 0, 0, 0, 5]);
        assert_eq!(f[2], 0x3ffce521f048d7f4u64.to_be_bytes());
        assert_eq!(BwReport::from_fields(&f), r);
    }

    #[test]
    fn payload_file_round_trips_like_perftest_parses_it() {
        let f = payload_file();
        let mut bytes = Vec::new();
        for tok in f.split(',') {
            assert_eq!(tok.len(), 10);
            // perftest: token[8-i], token[9-i] for i = 0, 2, 4, 6.
            for i in (0..8).step_by(2) {
                bytes.push(u8::from_str_radix(&tok[8 - i..10 - i], 16).unwrap());
            }
        }
        assert_eq!(bytes, pattern());
        assert_ne!(u64::from_le_bytes(pattern()[..8].try_into().unwrap()), 0);
    }

    /// No shift by a multiple of 4 bytes up to the largest path MTU maps the pattern onto
    /// itself, and a fill longer than the pattern never repeats at an MTU boundary: a segment
    /// at the wrong offset cannot compare equal.
    #[test]
    fn pattern_has_no_period_a_segment_could_hide_in() {
        let p = pattern();
        for shift in (4..=8192).step_by(4) {
            assert_ne!(p[..4096], p[shift..shift + 4096], "shift {shift}");
        }
        for mtu in [256u64, 512, 1024, 2048, 4096] {
            let big = 1 << 20;
            assert_ne!(
                (0..mtu).map(|i| fill_byte(&p, big, i)).collect::<Vec<_>>(),
                (0..mtu)
                    .map(|i| fill_byte(&p, big, 64 * mtu + i))
                    .collect::<Vec<_>>(),
                "segment 64 of MTU {mtu} equals segment 0"
            );
        }
    }

    #[test]
    fn layout_follows_perftest() {
        let l = Layout {
            size: 8,
            cycle: 4096,
            cache_line: 64,
        };
        assert_eq!((l.remote_off(), l.total(), l.wrap()), (4096, 8192, 64));
        assert_eq!(l.op_off(65), 64);
        let l = Layout {
            size: 65536,
            cycle: 4096,
            cache_line: 64,
        };
        assert_eq!((l.remote_off(), l.total(), l.wrap()), (65536, 131072, 1));
        let l = Layout {
            size: 100,
            cycle: 4096,
            cache_line: 64,
        };
        assert_eq!((l.step(), l.wrap()), (128, 32));
    }

    #[test]
    fn atomic_plans() {
        let mut p = AtomicPlan::new(AtomicKind::FetchAdd, PeerKind::Tool, vec![10, 20]);
        let ops: Vec<u64> = (0..5).map(|k| p.next(k % 2).orig).collect();
        assert_eq!(ops, [10, 20, 11, 21, 12]);
        assert_eq!(p.current(), &[13, 22]);
        let mut p = AtomicPlan::new(AtomicKind::CmpSwap, PeerKind::Tool, vec![5]);
        assert!((0..3).all(|_| p.next(0).orig == 5));
        let mut p = AtomicPlan::new(AtomicKind::CmpSwap, PeerKind::Ours, vec![5]);
        let o: Vec<AtomicOp> = (0..5).map(|_| p.next(0)).collect();
        assert_eq!(o[0].compare, 5);
        assert_eq!(o[1].orig, 5 + OUR_SWAP_STEP);
        assert_ne!(o[3].compare, o[3].orig);
        assert_eq!(o[4].orig, o[3].orig);
    }

    #[test]
    fn version_parses_like_atof() {
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.24");
        assert_eq!(parse_version(&v), ("6.24".to_string(), 6.24));
        assert!(parse_version(b"5.6\0").1 < MIN_PEER_VERSION);
    }
}
