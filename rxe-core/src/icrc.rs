//! The RoCEv2 invariant CRC, computed exactly as Linux `rxe_icrc.c` does.
//!
//! CRC-32 (reflected, polynomial 0xEDB88320) seeded with eight 0xFF bytes standing for the
//! masked LRH, over the IP header, UDP header, BTH and everything after it up to the ICRC, with
//! the variant fields masked to ones: IPv4 TOS, TTL and header checksum; IPv6 traffic class,
//! flow label and hop limit; the UDP checksum; and the BTH byte holding FECN/BECN/resv6. The
//! result is inverted and carried little-endian.
//!
//! One exception, rxe's own: for RC_FLUSH the CRC then goes on over the packet from the BTH to
//! the ICRC a second time, unmasked. rxe 6.12 covers a packet's "payload" from its opcode's
//! payload offset, and its opcode table gives RC_FLUSH none (0, the BTH), so its FLUSH
//! requests carry, and its responder expects, that ICRC ([`covers_twice`]). A FLUSH with the
//! IBTA ICRC is dropped by rxe, and rxe's FLUSHes fail the IBTA check (seen on the wire between
//! the device and rxe on kernel 6.12.117).

use crate::wire::opcode::{Opcode, BTH_LEN};
use crate::wire::WireError;

/// Whether the ICRC of the RoCE packet `roce` (from the BTH on) covers it twice, as rxe
/// computes it for RC_FLUSH (see the module documentation).
pub fn covers_twice(roce: &[u8]) -> bool {
    roce.first() == Some(&Opcode::RC_FLUSH.0)
}

/// Bytes of the RoCE packet (BTH through ICRC, `roce_len` bytes) the CRC runs over, from the
/// BTH on: everything but the ICRC, twice for RC_FLUSH.
fn covered_len(roce_len: usize, twice: bool) -> usize {
    let n = roce_len.saturating_sub(4);
    if twice {
        2 * n
    } else {
        n
    }
}

/// CRC state after the eight 0xFF bytes of the masked LRH, in crc32fast's (finalised) form:
/// `!0xdebb20e3`.
const SEED: u32 = 0x2144_df1c;

const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;

/// Computes the ICRC of a packet given its IP + UDP headers (`l3l4`: an option-less IPv4 header
/// or an IPv6 header without extension headers, followed by the UDP header) and the RoCE packet
/// from the BTH up to, not including, the ICRC.
pub fn compute(l3l4: &[u8], roce: &[u8]) -> Result<u32, WireError> {
    let ip_len = match l3l4.first().map(|b| b >> 4) {
        Some(4) => IPV4_LEN,
        Some(6) => IPV6_LEN,
        _ => return Err(WireError::BadField),
    };
    if l3l4.len() != ip_len + UDP_LEN || roce.len() < BTH_LEN {
        return Err(WireError::Truncated);
    }
    if ip_len == IPV4_LEN && l3l4[0] != 0x45 {
        // IPv4 options are not used by RoCEv2 and rxe never emits them.
        return Err(WireError::BadField);
    }
    let mut ph = [0u8; IPV6_LEN + UDP_LEN + BTH_LEN];
    let n = ip_len + UDP_LEN;
    ph[..n].copy_from_slice(l3l4);
    if ip_len == IPV4_LEN {
        ph[1] = 0xff; // TOS
        ph[8] = 0xff; // TTL
        ph[10] = 0xff; // header checksum
        ph[11] = 0xff;
    } else {
        ph[0] |= 0x0f; // traffic class (high nibble)
        ph[1] = 0xff; // traffic class (low nibble) + flow label
        ph[2] = 0xff;
        ph[3] = 0xff;
        ph[7] = 0xff; // hop limit
    }
    ph[ip_len + 6] = 0xff; // UDP checksum
    ph[ip_len + 7] = 0xff;
    ph[n..n + BTH_LEN].copy_from_slice(&roce[..BTH_LEN]);
    ph[n + 4] = 0xff; // FECN, BECN, resv6
    let mut h = crc32fast::Hasher::new_with_initial(SEED);
    h.update(&ph[..n + BTH_LEN]);
    h.update(&roce[BTH_LEN..]);
    if covers_twice(roce) {
        h.update(roce);
    }
    Ok(h.finalize())
}

/// Checks the ICRC at the end of `roce_with_icrc` against the headers in `l3l4`.
pub fn verify(l3l4: &[u8], roce_with_icrc: &[u8]) -> Result<(), WireError> {
    let n = roce_with_icrc.len();
    if n < BTH_LEN + 4 {
        return Err(WireError::Truncated);
    }
    let got = u32::from_le_bytes(roce_with_icrc[n - 4..].try_into().expect("4 bytes"));
    if compute(l3l4, &roce_with_icrc[..n - 4])? == got {
        Ok(())
    } else {
        Err(WireError::BadChecksum)
    }
}

/// Writes the ICRC into the last four bytes of `roce_with_icrc`.
pub fn fill(l3l4: &[u8], roce_with_icrc: &mut [u8]) -> Result<(), WireError> {
    let n = roce_with_icrc.len();
    if n < BTH_LEN + 4 {
        return Err(WireError::Truncated);
    }
    let c = compute(l3l4, &roce_with_icrc[..n - 4])?;
    roce_with_icrc[n - 4..].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// The reflected CRC-32 polynomial.
const POLY: u32 = 0xedb8_8320;

/// Offset of the IPv4 identification in the IP header (and in `l3l4`).
const IPV4_ID_AT: usize = 4;

/// `a · b` modulo the CRC polynomial, both in the reflected representation of the CRC
/// register (bit 31 the coefficient of x^0), as zlib's `multmodp` computes it.
const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        if m == 0 {
            return p;
        }
        b = (b >> 1) ^ (POLY & (b & 1).wrapping_neg());
    }
}

/// The linear part of feeding one byte to the reflected CRC register.
fn feed_byte(mut r: u32, b: u8) -> u32 {
    r ^= b as u32;
    for _ in 0..8 {
        r = (r >> 1) ^ (POLY & (r & 1).wrapping_neg());
    }
    r
}

/// `X2N[k]` is x^(2^k) modulo the CRC polynomial.
const X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    t[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < 32 {
        t[k] = mul_mod_p(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// x^(8·n) modulo the CRC polynomial: multiplying a register state by it runs `n` zero bytes
/// through the register (its linear part), in at most 64 products instead of `n` byte steps.
fn zero_bytes(n: usize) -> u32 {
    let (mut p, mut n, mut k) = (1u32 << 31, n as u64, 3usize);
    while n != 0 {
        if n & 1 != 0 {
            p = mul_mod_p(X2N[k & 31], p);
        }
        n >>= 1;
        k += 1;
    }
    p
}

/// What the 16 bits of the IPv4 identification contribute to the ICRC of a packet of one
/// length, reduced for solving: the ICRC is affine over GF(2) in the bits it covers, so
///
/// `icrc(header with ID x) = icrc(header with ID 0) ^ M·x`
///
/// for a 32×16 matrix `M` that depends only on how many bytes follow the ID, i.e. on the
/// packet length (and, for RC_FLUSH, on its ICRC covering the packet twice). A receiver that cannot see the ID (a UDP socket) can still check the ICRC:
/// the received ICRC XOR the one computed with ID 0 must lie in the column span of `M`. The 16
/// columns are independent (any error burst of 32 bits or fewer changes a CRC-32), so the ID is
/// unique when it exists, and a random corruption is accepted with probability 2⁻¹⁶.
///
/// `rows` is `M` in echelon form: `rows[b]`, when its vector is non-zero, has highest set bit
/// `b`, with the ID bits whose columns XOR to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4IdBasis {
    roce_len: usize,
    twice: bool,
    cols: [u32; 16],
    rows: [(u32, u16); 32],
}

impl Ipv4IdBasis {
    /// The basis for RoCE packets (BTH through ICRC) of `roce_len` bytes behind an option-less
    /// IPv4 header and a UDP header.
    pub fn new(roce_len: usize) -> Self {
        Self::with_coverage(roce_len, false)
    }

    /// The basis for RoCE packets of `roce_len` bytes whose ICRC covers them twice (RC_FLUSH,
    /// [`covers_twice`]) when `twice`, once otherwise.
    pub fn with_coverage(roce_len: usize, twice: bool) -> Self {
        // After the ID: the rest of the IPv4 header, the UDP header and the RoCE bytes the CRC
        // runs over.
        let after = (IPV4_LEN - IPV4_ID_AT - 2) + UDP_LEN + covered_len(roce_len, twice);
        let shift = zero_bytes(after);
        let mut cols = [0u32; 16];
        for (k, c) in cols.iter_mut().enumerate() {
            let id = 1u16 << k;
            let [hi, lo] = id.to_be_bytes();
            *c = mul_mod_p(shift, feed_byte(feed_byte(0, hi), lo));
        }
        let mut rows = [(0u32, 0u16); 32];
        for (k, &c) in cols.iter().enumerate() {
            let (mut v, mut m) = (c, 1u16 << k);
            while v != 0 {
                let b = 31 - v.leading_zeros() as usize;
                if rows[b].0 == 0 {
                    rows[b] = (v, m);
                    break;
                }
                v ^= rows[b].0;
                m ^= rows[b].1;
            }
        }
        Ipv4IdBasis {
            roce_len,
            twice,
            cols,
            rows,
        }
    }

    /// The RoCE packet length this basis is for.
    pub fn roce_len(&self) -> usize {
        self.roce_len
    }

    /// Number of independent columns (16: every ID gives a different ICRC).
    pub fn rank(&self) -> u32 {
        self.rows.iter().filter(|r| r.0 != 0).count() as u32
    }

    /// What ID `id` adds to the ICRC computed with ID 0.
    pub fn contribution(&self, id: u16) -> u32 {
        (0..16)
            .filter(|k| id & (1 << k) != 0)
            .fold(0, |a, k| a ^ self.cols[k])
    }

    /// The ID whose contribution is `delta`, if there is one.
    pub fn solve(&self, delta: u32) -> Option<u16> {
        let (mut v, mut m) = (delta, 0u16);
        while v != 0 {
            let b = 31 - v.leading_zeros() as usize;
            let (rv, rm) = self.rows[b];
            if rv == 0 {
                return None;
            }
            v ^= rv;
            m ^= rm;
        }
        Some(m)
    }
}

/// Checks the ICRC of an IPv4 RoCE packet whose identification the receiver cannot see: the
/// ID field of `l3l4` is ignored. Returns the ID that makes the ICRC match (unique), or
/// [`WireError::BadChecksum`] when none does. `basis` must be for `roce_with_icrc.len()` and
/// its opcode's coverage ([`WireError::BadLength`] otherwise).
pub fn verify_any_ipv4_id(
    basis: &Ipv4IdBasis,
    l3l4: &[u8],
    roce_with_icrc: &[u8],
) -> Result<u16, WireError> {
    let n = roce_with_icrc.len();
    if n < BTH_LEN + 4 {
        return Err(WireError::Truncated);
    }
    if basis.roce_len != n || basis.twice != covers_twice(roce_with_icrc) {
        return Err(WireError::BadLength);
    }
    if l3l4.len() != IPV4_LEN + UDP_LEN || l3l4[0] != 0x45 {
        return Err(WireError::BadField);
    }
    let mut h = [0u8; IPV4_LEN + UDP_LEN];
    h.copy_from_slice(l3l4);
    h[IPV4_ID_AT] = 0;
    h[IPV4_ID_AT + 1] = 0;
    let got = u32::from_le_bytes(roce_with_icrc[n - 4..].try_into().expect("4 bytes"));
    let want = compute(&h, &roce_with_icrc[..n - 4])?;
    basis.solve(got ^ want).ok_or(WireError::BadChecksum)
}

/// [`verify_any_ipv4_id`] with the bases cached per packet length (a bounded cache: the
/// lengths one connection uses are few — ACKs, requests, full- and last-packet sizes). A
/// basis costs a few dozen carry-less products modulo the polynomial
/// ([`Ipv4IdBasis::with_coverage`]), so a packet whose length is not cached costs about a
/// microsecond more, never more.
#[derive(Clone, Debug, Default)]
pub struct Ipv4IdSolver {
    cache: Vec<Ipv4IdBasis>,
    next: usize,
    built: u64,
    solves: u64,
}

impl Ipv4IdSolver {
    /// Packet lengths kept; beyond that the oldest entry is replaced.
    pub const CAPACITY: usize = 64;

    pub fn new() -> Self {
        Self::default()
    }

    /// The basis for `roce_len` and the coverage `twice`
    /// ([`Ipv4IdBasis::with_coverage`]), computed on first use.
    pub fn basis(&mut self, roce_len: usize, twice: bool) -> &Ipv4IdBasis {
        let i = match self
            .cache
            .iter()
            .position(|b| b.roce_len == roce_len && b.twice == twice)
        {
            Some(i) => i,
            None if self.cache.len() < Self::CAPACITY => {
                self.built += 1;
                self.cache.push(Ipv4IdBasis::with_coverage(roce_len, twice));
                self.cache.len() - 1
            }
            None => {
                self.built += 1;
                let i = self.next;
                self.next = (self.next + 1) % Self::CAPACITY;
                self.cache[i] = Ipv4IdBasis::with_coverage(roce_len, twice);
                i
            }
        };
        &self.cache[i]
    }

    /// See [`verify_any_ipv4_id`].
    pub fn verify(&mut self, l3l4: &[u8], roce_with_icrc: &[u8]) -> Result<u16, WireError> {
        if roce_with_icrc.len() < BTH_LEN + 4 {
            return Err(WireError::Truncated);
        }
        self.solves += 1;
        let b = self.basis(roce_with_icrc.len(), covers_twice(roce_with_icrc));
        verify_any_ipv4_id(b, l3l4, roce_with_icrc)
    }

    /// Bases computed so far (cache misses).
    pub fn bases_built(&self) -> u64 {
        self.built
    }

    /// Solves run so far ([`Self::verify`] calls past the length check).
    pub fn solves(&self) -> u64 {
        self.solves
    }
}

/// Whether a RoCE packet (BTH … ICRC) is worth an IPv4 ID solve: a BTH with an opcode this
/// engine implements and room for its headers and the ICRC, transport version 0 and a
/// full-member default P_Key — what the engine checks first anyway
/// (`Device::handle_packet`). The cheap filter that keeps junk from costing a solve.
pub fn worth_solving(roce_with_icrc: &[u8]) -> bool {
    let Ok(p) = crate::wire::Packet::new_checked(roce_with_icrc) else {
        return false;
    };
    let bth = p.bth();
    bth.tver() == 0 && bth.pkey() & 0x7fff == 0x7fff
}

/// Segments one GSO run of the udp transport holds at most ...
pub const RUN_MAX_SEGS: usize = 64;
/// ... and RoCE bytes (the sum of its packets' lengths).
pub const RUN_MAX_BYTES: usize = 65_000;

/// Whether `id` can be the index of a packet of `roce_len` bytes in a GSO run as the udp
/// transport sends them ([`RUN_MAX_SEGS`], [`RUN_MAX_BYTES`]; the segments before it are
/// full ones, no shorter than it): the IPv4 ID the kernel gives each segment it cuts, which
/// a receiving socket without GRO cannot see. At most 63 IDs besides 0 (15 at 4112 bytes).
pub fn may_be_run_index(id: u16, roce_len: usize) -> bool {
    let k = id as usize;
    k < RUN_MAX_SEGS && k * roce_len < RUN_MAX_BYTES
}

/// Which IPv4 IDs a receiver that cannot see them (a UDP socket) accepts, per source address,
/// when a packet's ICRC does not hold for ID 0 (or its index in a coalesced run).
///
/// The ICRC fixes the ID a packet was sent with (the solve is unique: [`Ipv4IdBasis`]); what
/// weakens the check is accepting *any* ID, for then every corruption whose CRC syndrome is
/// the contribution of some ID change passes: 2^16 − 1 of the 2^32 syndromes. So the ID found
/// must also be one the source plausibly sent next. Senders number IDs in sequences: Linux
/// (rxe, and any DF packet the kernel numbers with `__ip_select_ident`) keeps one counter per
/// (source, destination, protocol) bucket and adds, per packet, one plus a random number below
/// the jiffies since the bucket's previous packet; NICs count per flow or per port. A source
/// gets up to [`Self::HEADS`] heads — IDs it sent last — and a packet is accepted when its ID
/// lies at most [`Self::BEHIND`] behind a head (reordering, duplicates) or at most
/// [`Self::AHEAD`] plus one per millisecond since the head's packet ahead of it (packets
/// lost or sent elsewhere meanwhile, and Linux's time-based jumps for HZ ≤ 1000). A head
/// unused for [`Self::MAX_AGE_MS`] expires.
///
/// A packet whose ID is outside every window is **not** accepted — that is exactly the weak
/// case — but its ID becomes a head ([`IdVerdict::Learned`]): the next packets of that
/// sequence pass, and reliable transports resend the dropped one. The one exception is left
/// to the caller: a packet nobody would resend (UD, UC) whose source has no live window at
/// all (its first, or its first after an idle time, when Linux's next ID can be anywhere)
/// may open one ([`IdVerdict::Opened`]) with the 16-bit check of the full solve. Bound: a packet is
/// accepted with at most [`Self::MAX_CANDIDATES`] IDs besides the exact one, so a random
/// corruption passes with probability at most `MAX_CANDIDATES / 2^32` (about 2^-19); a
/// source in steady traffic has one head of `BEHIND + 1 + AHEAD` = 97 IDs (about 2^-25.4).
#[derive(Clone, Debug, Default)]
pub struct Ipv4IdWindows {
    peers: Vec<IdPeer>,
    clock: u64,
}

#[derive(Clone, Copy, Debug)]
struct IdPeer {
    addr: u32,
    heads: [IdHead; Ipv4IdWindows::HEADS],
    used: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct IdHead {
    id: u16,
    at_ms: u64,
    live: bool,
    /// A packet was accepted through this head (not only learned): learning replaces the
    /// heads that are not first.
    confirmed: bool,
}

/// What [`Ipv4IdWindows::admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdVerdict {
    /// The ID lies in a window of its source: accept the packet.
    InWindow,
    /// The source has no live window and the caller let the packet open one: accept it (its
    /// check was the 16-bit one) and learn its ID.
    Opened,
    /// It does not: drop the packet; the ID is now a head of its source.
    Learned,
}

impl Ipv4IdWindows {
    /// Heads (ID sequences) kept per source address.
    pub const HEADS: usize = 4;
    /// IDs accepted behind a head.
    pub const BEHIND: u16 = 32;
    /// IDs accepted ahead of a fresh head; one more per millisecond of its age.
    pub const AHEAD: u16 = 64;
    /// A head older than this (milliseconds) expires.
    pub const MAX_AGE_MS: u64 = 2048;
    /// Source addresses kept; beyond that the least recently used one is forgotten.
    pub const PEERS: usize = 256;
    /// The most IDs other than the exact one a packet can be accepted with: every head of
    /// its source at its widest.
    pub const MAX_CANDIDATES: u32 = Self::HEADS as u32
        * (Self::BEHIND as u32 + 1 + Self::AHEAD as u32 + Self::MAX_AGE_MS as u32);

    pub fn new() -> Self {
        Self::default()
    }

    /// How far ahead of a head `age_ms` old an ID may lie; `None` once it expired.
    pub fn ahead(age_ms: u64) -> Option<u16> {
        (age_ms <= Self::MAX_AGE_MS).then(|| Self::AHEAD + age_ms as u16)
    }

    /// How many IDs a packet from `src` would be accepted with at `now_ms` (the union of its
    /// live windows, counted with overlaps; at most [`Self::MAX_CANDIDATES`]).
    pub fn candidates(&self, src: u32, now_ms: u64) -> u32 {
        self.peers.iter().find(|p| p.addr == src).map_or(0, |p| {
            p.heads
                .iter()
                .filter(|h| h.live)
                .filter_map(|h| Self::ahead(now_ms.saturating_sub(h.at_ms)))
                .map(|a| Self::BEHIND as u32 + 1 + a as u32)
                .sum()
        })
    }

    /// Whether a packet from `src` with ID `id` would be accepted at `now_ms` (what
    /// [`Self::admit`] decides, without learning anything).
    pub fn accepts(&self, src: u32, id: u16, now_ms: u64) -> bool {
        self.peers.iter().find(|p| p.addr == src).is_some_and(|p| {
            p.heads.iter().filter(|h| h.live).any(|h| {
                Self::ahead(now_ms.saturating_sub(h.at_ms)).is_some_and(|ahead| {
                    id.wrapping_sub(h.id) <= ahead || h.id.wrapping_sub(id) <= Self::BEHIND
                })
            })
        })
    }

    /// Decides on a packet from `src` whose ICRC holds for ID `id` (and not for the ID
    /// tried first), at `now_ms` (a monotonic clock). `may_open`: a packet whose source has
    /// no live window may open one and be accepted ([`IdVerdict::Opened`]), for a packet
    /// nobody resends (UD, UC): after an idle time Linux's next ID is anywhere.
    pub fn admit(&mut self, src: u32, id: u16, now_ms: u64, may_open: bool) -> IdVerdict {
        self.clock += 1;
        let clock = self.clock;
        let i = match self.peers.iter().position(|p| p.addr == src) {
            Some(i) => i,
            None => {
                let fresh = IdPeer {
                    addr: src,
                    heads: [IdHead::default(); Self::HEADS],
                    used: clock,
                };
                if self.peers.len() < Self::PEERS {
                    self.peers.push(fresh);
                    self.peers.len() - 1
                } else {
                    let lru = (0..self.peers.len())
                        .min_by_key(|&i| self.peers[i].used)
                        .expect("PEERS > 0");
                    self.peers[lru] = fresh;
                    lru
                }
            }
        };
        let peer = &mut self.peers[i];
        peer.used = clock;
        // The nearest head whose window holds `id`: (head, distance, ahead of it).
        let mut best: Option<(usize, u16, bool)> = None;
        for (k, h) in peer.heads.iter_mut().enumerate() {
            if !h.live {
                continue;
            }
            let Some(ahead) = Self::ahead(now_ms.saturating_sub(h.at_ms)) else {
                h.live = false;
                continue;
            };
            let fwd = id.wrapping_sub(h.id);
            let back = h.id.wrapping_sub(id);
            let hit = if fwd <= ahead {
                Some((fwd, fwd != 0))
            } else if back <= Self::BEHIND {
                Some((back, false))
            } else {
                None
            };
            if let Some((d, fwd)) = hit {
                if best.is_none_or(|b| d < b.1) {
                    best = Some((k, d, fwd));
                }
            }
        }
        if let Some((k, _, fwd)) = best {
            peer.heads[k].confirmed = true;
            if fwd {
                peer.heads[k] = IdHead {
                    id,
                    at_ms: now_ms,
                    live: true,
                    confirmed: true,
                };
                // A head that this one caught up with is the same sequence: keep one.
                for j in 0..Self::HEADS {
                    let h = peer.heads[j];
                    if j != k && h.live && id.wrapping_sub(h.id) <= Self::BEHIND {
                        peer.heads[j].live = false;
                    }
                }
            }
            return IdVerdict::InWindow;
        }
        let open = may_open && peer.heads.iter().all(|h| !h.live);
        // A new sequence, or one that jumped (or a corrupted packet): its ID takes a free
        // head, else the oldest one no packet was accepted through, else the oldest.
        let k = (0..Self::HEADS)
            .min_by_key(|&k| {
                let h = peer.heads[k];
                (h.live, h.confirmed, h.at_ms)
            })
            .expect("HEADS > 0");
        peer.heads[k] = IdHead {
            id,
            at_ms: now_ms,
            live: true,
            confirmed: false,
        };
        if open {
            IdVerdict::Opened
        } else {
            IdVerdict::Learned
        }
    }
}

/// UDP source port for an RC/UC QP pair, as `rdma_get_udp_sport()` computes it: a 20-bit flow
/// label (the given one, or one folded from `lqpn * rqpn`), folded again into 14 bits, with the
/// top two bits set. It is the same in both directions.
pub fn rc_udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let mut fl = flow_label & 0xf_ffff;
    if fl == 0 {
        let v = lqpn as u64 * rqpn as u64;
        fl = ((v ^ (v >> 20) ^ (v >> 40)) & 0xf_ffff) as u32;
    }
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
}

/// UDP source port rxe uses for UD (and any QP without a GRH flow label): `0xc000 +
/// (hash_32(qpn, 14) & 0x3fff)`.
pub fn ud_udp_sport(qpn: u32) -> u16 {
    // hash_32(val, bits) = (val * GOLDEN_RATIO_32) >> (32 - bits)
    let h = qpn.wrapping_mul(0x61C8_8647) >> (32 - 14);
    0xc000 + (h & 0x3fff) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Rng;

    /// A random option-less IPv4 + UDP header with identification `id` and a random RoCE
    /// packet of `roce_len` bytes whose ICRC is filled for that header.
    fn packet(rng: &mut Rng, roce_len: usize, id: u16) -> ([u8; 28], Vec<u8>) {
        let mut h = [0u8; 28];
        for b in h.iter_mut() {
            *b = rng.next_u64() as u8;
        }
        h[0] = 0x45;
        h[4..6].copy_from_slice(&id.to_be_bytes());
        let mut r: Vec<u8> = (0..roce_len).map(|_| rng.next_u64() as u8).collect();
        fill(&h, &mut r).unwrap();
        (h, r)
    }

    /// Bytes of the IPv4 + UDP header the ICRC masks: TOS, TTL, header checksum, UDP checksum.
    const MASKED_L3L4: [usize; 6] = [1, 8, 10, 11, 26, 27];

    #[test]
    fn ipv4_id_contributions_match_the_icrc() {
        let mut rng = Rng::new(1);
        let mut lens = vec![16, 17, 20, 21, 24, 28, 1044, 4140, 9000];
        lens.extend((0..20).map(|_| 16 + rng.below(2000) as usize));
        for (i, len) in lens.into_iter().enumerate() {
            // Every other length as an RC_FLUSH, whose ICRC covers the packet twice.
            let twice = i % 2 == 1;
            let b = Ipv4IdBasis::with_coverage(len, twice);
            assert_eq!(b.rank(), 16, "len {len}");
            for _ in 0..8 {
                let id = rng.next_u64() as u16;
                let (mut h, mut r) = packet(&mut rng, len, id);
                r[0] = if twice { Opcode::RC_FLUSH.0 } else { 0x04 };
                let with = compute(&h, &r[..len - 4]).unwrap();
                h[4..6].fill(0);
                let without = compute(&h, &r[..len - 4]).unwrap();
                assert_eq!(with ^ without, b.contribution(id), "len {len} id {id:#x}");
                assert_eq!(b.solve(b.contribution(id)), Some(id));
            }
        }
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RC_FLUSH requests as Linux rxe 6.12.117 sent them to the device (IPv4 + UDP header, then
    /// BTH … ICRC; the IPv4 ID is rxe's hash, and its two resends carry address 0, as rxe's
    /// retry rewinds a FLUSH), and one of the device's that rxe answered (ID 0): their ICRC
    /// covers the packet twice; the IBTA ICRC (once) is not what rxe sends or takes.
    const RXE_FLUSH: [(&str, &str); 4] = [
        (
            "45000040b664400040116fa90a4d00040a4d0002c14412b7002c0000",
            "1c00ffff000000128059196300000001000000002994d0000000022200001000cb8ae48e",
        ),
        (
            "45000040b66e400040116f9f0a4d00040a4d0002c14412b7002c0000",
            "1c00ffff000000128059196300000001000000000000000000000222000010000de839cc",
        ),
        (
            "45000040b677400040116f960a4d00040a4d0002c14412b7002c0000",
            "1c00ffff00000012805919630000000100000000000000000000022200001000d0c407d1",
        ),
        (
            "45000040000040004011260e0a4d00020a4d000412b712b7002c0000",
            "1c00ffff0000001180bbdf1000000001000000002766d0000000022100001000b1542458",
        ),
    ];

    /// rxe's answer to the device's FLUSH above (the last of `RXE_FLUSH`): RDMA READ response
    /// ONLY, same PSN, ACK, no payload; its ICRC is the IBTA one.
    const RXE_FLUSH_RESPONSE: (&str, &str) = (
        "450000304f8f40004011d68e0a4d00040a4d0002c12112b7001c0000",
        "1000ffff0000001100bbdf101f000002f2824d20",
    );

    #[test]
    fn rxe_flush_icrc_covers_the_packet_twice() {
        let mut solver = Ipv4IdSolver::new();
        for (l3l4, roce) in RXE_FLUSH {
            let (h, r) = (unhex(l3l4), unhex(roce));
            assert!(covers_twice(&r));
            assert_eq!(verify(&h, &r), Ok(()), "{roce}");
            let id = u16::from_be_bytes([h[4], h[5]]);
            assert_eq!(solver.verify(&h, &r), Ok(id), "rxe's ID solved");
            let n = r.len();
            let mut once = crc32fast::Hasher::new_with_initial(SEED);
            let mut hm = h.clone();
            for b in [1, 8, 10, 11, 26, 27] {
                hm[b] = 0xff;
            }
            let mut bth = r[..BTH_LEN].to_vec();
            bth[4] = 0xff;
            once.update(&hm);
            once.update(&bth);
            once.update(&r[BTH_LEN..n - 4]);
            assert_ne!(
                once.finalize().to_le_bytes(),
                r[n - 4..],
                "not the IBTA ICRC"
            );
            // The same bytes under another opcode are covered once.
            let mut other = r.clone();
            other[0] = 0x0a;
            assert!(!covers_twice(&other));
            assert_eq!(verify(&h, &other), Err(WireError::BadChecksum));
        }
        let (h, r) = (unhex(RXE_FLUSH_RESPONSE.0), unhex(RXE_FLUSH_RESPONSE.1));
        assert!(!covers_twice(&r));
        assert_eq!(solver.verify(&h, &r), Ok(0x4f8f));
        // A basis of the other coverage is refused, not misapplied.
        let (h, r) = (unhex(RXE_FLUSH[0].0), unhex(RXE_FLUSH[0].1));
        assert_eq!(
            verify_any_ipv4_id(&Ipv4IdBasis::new(r.len()), &h, &r),
            Err(WireError::BadLength)
        );
    }

    #[test]
    fn the_solver_recovers_the_id_of_random_packets() {
        let mut rng = Rng::new(2);
        let mut solver = Ipv4IdSolver::new();
        for i in 0..300 {
            let len = 16 + rng.below(1200) as usize;
            let id = if i < 3 {
                [0, 1, 0xffff][i]
            } else {
                rng.next_u64() as u16
            };
            let (h, r) = packet(&mut rng, len, id);
            assert_eq!(solver.verify(&h, &r), Ok(id), "len {len}");
            // What the header says the ID is does not matter: the receiver cannot see it.
            let mut h0 = h;
            h0[4..6].copy_from_slice(&(rng.next_u64() as u16).to_be_bytes());
            assert_eq!(solver.verify(&h0, &r), Ok(id));
        }
        assert!(solver.cache.len() <= Ipv4IdSolver::CAPACITY);
        // Wrong basis length, truncation and a non-IPv4 header are errors, not panics.
        let (h, r) = packet(&mut rng, 40, 7);
        assert_eq!(
            verify_any_ipv4_id(&Ipv4IdBasis::new(44), &h, &r),
            Err(WireError::BadLength)
        );
        assert_eq!(solver.verify(&h, &r[..10]), Err(WireError::Truncated));
        assert_eq!(solver.verify(&h[..20], &r), Err(WireError::BadField));
        let mut h6 = h;
        h6[0] = 0x46;
        assert_eq!(solver.verify(&h6, &r), Err(WireError::BadField));
    }

    #[test]
    fn flipping_a_covered_bit_is_rejected_a_masked_one_accepted() {
        let mut rng = Rng::new(3);
        let mut solver = Ipv4IdSolver::new();
        let (mut flips, mut accepted) = (0u64, 0u64);
        for len in [20, 24, 60, 300, 1044] {
            let id = rng.next_u64() as u16;
            let (h, r) = packet(&mut rng, len, id);
            for byte in 0..h.len() {
                if byte == 4 || byte == 5 {
                    continue; // the ID: unknown to the receiver, not a flip target
                }
                for bit in 0..8 {
                    let mut f = h;
                    f[byte] ^= 1 << bit;
                    let v = solver.verify(&f, &r);
                    if byte == 0 {
                        // Not an option-less IPv4 header any more: refused as such.
                        assert_eq!(v, Err(WireError::BadField));
                    } else if MASKED_L3L4.contains(&byte) {
                        assert_eq!(v, Ok(id), "masked byte {byte}");
                    } else {
                        // Header fields: always rejected for these lengths (the length,
                        // flags and fragment fields sit within 32 bits of the ID, where
                        // rejection is certain).
                        assert_eq!(v, Err(WireError::BadChecksum), "l3l4 byte {byte} bit {bit}");
                    }
                }
            }
            for byte in 0..r.len() {
                for bit in 0..8 {
                    let mut f = r.clone();
                    f[byte] ^= 1 << bit;
                    let v = solver.verify(&h, &f);
                    if byte == 4 {
                        assert_eq!(v, Ok(id), "FECN/BECN/resv6 are masked");
                        continue;
                    }
                    flips += 1;
                    if v.is_ok() {
                        accepted += 1;
                    }
                }
            }
        }
        // Each flip of a bit far from the ID is accepted with probability about 2^-16.
        assert!(flips > 10_000);
        assert!(
            accepted * 4096 <= flips,
            "{accepted} of {flips} flips accepted"
        );
    }

    #[test]
    fn random_corruption_is_accepted_with_probability_2_pow_minus_16() {
        let mut rng = Rng::new(4);
        let b = Ipv4IdBasis::new(1044);
        let n = 1u64 << 18;
        let hits = (0..n)
            .filter(|_| b.solve(rng.next_u64() as u32).is_some())
            .count();
        // Expected n / 2^16 = 4.
        assert!(hits <= 24, "{hits} of {n}");
    }

    /// Linux's IPv4 ID generator for DF packets it numbers itself (`__ip_select_ident`, as
    /// rxe sends): one counter per (source, destination, protocol) bucket, advanced per packet
    /// by one plus a random number below the jiffies since the bucket's previous packet.
    struct LinuxIds {
        id: u16,
        hz: u64,
        last_jiffy: u64,
    }

    impl LinuxIds {
        fn next(&mut self, rng: &mut Rng, t_ms: u64) -> u16 {
            let j = t_ms * self.hz / 1000;
            let delta = if j > self.last_jiffy {
                rng.below(j - self.last_jiffy)
            } else {
                0
            };
            self.last_jiffy = j;
            self.id = self.id.wrapping_add(1 + delta as u16);
            self.id
        }
    }

    /// A Linux (rxe) sender, at HZ 100, 250 and 1000, in bursts with gaps from nothing to
    /// 1.5 s, each packet received up to 3 ms late: its first packet teaches the sequence,
    /// every other one is accepted, and no packet is accepted with more IDs than the bound.
    #[test]
    fn a_linux_sender_is_learned_once_then_accepted() {
        for hz in [100u64, 250, 1000] {
            let mut rng = Rng::new(hz);
            let mut w = Ipv4IdWindows::new();
            let src = 0x0a4d_0004;
            let mut gen = LinuxIds {
                id: rng.next_u64() as u16,
                hz,
                last_jiffy: 0,
            };
            let (mut t_ms, mut rx_ms) = (1000u64, 0u64);
            let mut verdicts = Vec::new();
            for _ in 0..3000 {
                t_ms += match rng.below(10) {
                    0 => rng.below(1500),
                    1..=3 => rng.below(50),
                    _ => rng.below(2),
                };
                for _ in 0..1 + rng.below(40) {
                    let id = gen.next(&mut rng, t_ms);
                    rx_ms = rx_ms.max(t_ms + rng.below(4));
                    assert!(w.candidates(src, rx_ms) <= Ipv4IdWindows::MAX_CANDIDATES);
                    verdicts.push(w.admit(src, id, rx_ms, false));
                }
            }
            let learned = verdicts
                .iter()
                .filter(|v| **v == IdVerdict::Learned)
                .count();
            assert_eq!(learned, 1, "HZ {hz}: {} packets", verdicts.len());
            assert_eq!(verdicts[0], IdVerdict::Learned);
        }
    }

    /// A NIC numbering per flow: HEADS flows of one address, interleaved at random, each
    /// losing packets now and then (IDs skipped) and some pairs swapped: one packet per flow
    /// teaches, the rest pass. With a head to spare, a corrupted packet now and then (a random
    /// ID) is dropped and does not disturb the sequences; with none, it costs a flow one
    /// packet more.
    #[test]
    fn per_flow_sequences_and_corruption() {
        for flows in [Ipv4IdWindows::HEADS - 1, Ipv4IdWindows::HEADS] {
            let (learned, corrupt, dropped) = flows_with_corruption(flows, false);
            assert_eq!((learned, corrupt, dropped), (flows, 0, 0));
            let (learned, corrupt, dropped) = flows_with_corruption(flows, true);
            assert!(
                dropped + 2 >= corrupt,
                "{dropped} of {corrupt} corrupted packets dropped"
            );
            if flows < Ipv4IdWindows::HEADS {
                assert_eq!(learned, flows, "one per flow");
            } else {
                assert!(learned <= flows + 2 * corrupt, "{learned} for {corrupt}");
            }
        }
    }

    /// `flows` interleaved sequences (with corrupted packets: `corruption`): packets learned,
    /// corrupted packets, corrupted packets dropped.
    fn flows_with_corruption(flows: usize, corruption: bool) -> (usize, usize, usize) {
        let mut rng = Rng::new(7);
        let mut w = Ipv4IdWindows::new();
        let src = 0xc0a8_0001;
        let mut ids: Vec<u16> = (0..flows).map(|_| rng.next_u64() as u16).collect();
        let (mut learned, mut corrupt, mut dropped_corrupt) = (0, 0, 0);
        let mut now = 0u64;
        let mut held: Option<u16> = None;
        for i in 0..20_000 {
            now += rng.below(2);
            if corruption && i % 97 == 50 {
                corrupt += 1;
                if w.admit(src, rng.next_u64() as u16, now, false) == IdVerdict::Learned {
                    dropped_corrupt += 1;
                }
                continue;
            }
            let f = rng.below(flows as u64) as usize;
            ids[f] = ids[f].wrapping_add(1 + if rng.below(20) == 0 { 5 } else { 0 });
            let id = ids[f];
            // Now and then a packet is held back and arrives after the next one.
            if held.is_none() && rng.below(50) == 0 {
                held = Some(id);
                continue;
            }
            if w.admit(src, id, now, false) == IdVerdict::Learned {
                learned += 1;
            }
            if let Some(h) = held.take() {
                if w.admit(src, h, now, false) == IdVerdict::Learned {
                    learned += 1;
                }
            }
        }
        (learned, corrupt, dropped_corrupt)
    }

    /// A head expires after MAX_AGE_MS: the next packet (after a long idle time, Linux's ID
    /// may have jumped anywhere) teaches, and the resend one retransmission timeout later is
    /// accepted. Sources beyond PEERS evict the least recently used.
    #[test]
    fn expiry_resend_and_bounded_state() {
        let mut w = Ipv4IdWindows::new();
        assert_eq!(w.admit(1, 100, 0, false), IdVerdict::Learned);
        assert_eq!(w.admit(1, 101, 1, false), IdVerdict::InWindow);
        assert!(w.accepts(1, 101 + 64 + 2000, 2001));
        assert!(!w.accepts(1, 101 + 64 + 2000, 2050 + 1));
        assert_eq!(w.candidates(1, 2001), 33 + 64 + 2000);
        assert_eq!(w.candidates(1, 3000), 0, "expired");
        assert_eq!(w.admit(1, 40_000, 5000, false), IdVerdict::Learned);
        // rxe resends after its timeout (here 1 s: rdma_cm's default) with an ID up to one
        // per jiffy further on.
        assert_eq!(w.admit(1, 40_000 + 900, 6000, false), IdVerdict::InWindow);
        // Behind a head, within BEHIND: reordering.
        assert_eq!(
            w.admit(1, 40_000 + 900 - 32, 6000, false),
            IdVerdict::InWindow
        );
        assert_eq!(
            w.admit(1, 40_000 + 900 - 33, 6000, false),
            IdVerdict::Learned
        );
        // A packet nobody resends may open a sequence when its source has no live window,
        // and only then.
        assert_eq!(w.admit(2, 7000, 0, true), IdVerdict::Opened);
        assert_eq!(w.admit(2, 9000, 1, true), IdVerdict::Learned);
        assert_eq!(w.admit(2, 9001, 2, true), IdVerdict::InWindow);
        assert_eq!(
            w.admit(2, 30_000, 5000, true),
            IdVerdict::Opened,
            "after expiry"
        );
        for a in 0..1000u32 {
            w.admit(1000 + a, 5, 7000, false);
        }
        assert_eq!(w.peers.len(), Ipv4IdWindows::PEERS);
        assert!(w.peers.iter().all(|p| p.addr != 1), "the oldest went");
        for h in 0..40u16 {
            w.admit(7, h * 1000, 8000, false);
        }
        let p = w.peers.iter().find(|p| p.addr == 7).unwrap();
        assert_eq!(
            p.heads.iter().filter(|h| h.live).count(),
            Ipv4IdWindows::HEADS
        );
        assert!(w.candidates(7, 8000) <= Ipv4IdWindows::MAX_CANDIDATES);
    }

    #[test]
    fn run_indexes() {
        assert!(!may_be_run_index(64, 16));
        assert!(may_be_run_index(62, 1040) && !may_be_run_index(63, 1040));
        assert!(may_be_run_index(15, 4112) && !may_be_run_index(16, 4112));
    }

    #[test]
    fn sport_formulas() {
        // Symmetric in the two QPNs.
        assert_eq!(rc_udp_sport(0, 0x11, 0x12), rc_udp_sport(0, 0x12, 0x11));
        // lqpn*rqpn = 0x11*0x12 = 0x132 -> fl 0x132 -> sport 0xc132
        assert_eq!(rc_udp_sport(0, 0x11, 0x12), 0xc132);
        // A flow label above 14 bits folds its top 6 bits in.
        assert_eq!(rc_udp_sport(0xfc001, 0, 0), 0xc000 | (1 ^ 0x3f));
        for q in [1u32, 0x11, 0xffffff] {
            assert!(ud_udp_sport(q) >= 0xc000);
        }
        assert_eq!(ud_udp_sport(0), 0xc000);
    }
}
