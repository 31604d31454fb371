// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
// RoCEv2 tap: a tcx classifier for ingress and egress that copies every RoCEv2 frame (UDP
// destination port 4791, after Ethernet, up to two VLAN tags and IPv4 or IPv6) that passes the
// filters of `tap_config` into the ring buffer `events`, up to the snap length, with a
// timestamp, the interface, the direction and the transport headers parsed here: the BTH and the
// extension headers its opcode implies (RDETH, DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH,
// ImmDt, IETH; IBTA 9.2-9.5, Table 38; FLUSH and ATOMIC_WRITE from IBTA 1.5). It never changes a
// packet nor its fate: every path returns TC_ACT_UNSPEC, so the next tcx program (or the
// default action) decides.
//
// Built by build.rs with `clang -target bpf`. The few kernel definitions needed are written
// here (UAPI values from include/uapi/linux/bpf.h, pkt_cls.h) so no kernel or libbpf headers
// are needed. The record layout and the config layout are mirrored in src/bpf.rs.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;
typedef long long __s64;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

// BTF-defined maps (the libbpf convention that aya reads).
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

// include/uapi/linux/bpf.h
enum {
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_RINGBUF = 27,
};

// The leading fields of struct __sk_buff (the verifier checks accesses by offset).
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
};

// include/uapi/linux/pkt_cls.h: "use the default action", the tcx way to stay out of the way.
#define TC_ACT_UNSPEC (-1)

// Helper ids from include/uapi/linux/bpf.h (___BPF_FUNC_MAPPER order).
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static long (*bpf_skb_load_bytes)(const void *skb, __u32 offset, void *to, __u32 len) = (void *)26;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size, __u64 flags) = (void *)130;

// bpf_ringbuf_output flags.
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IPPROTO_UDP 17
#define ROCE_V2_PORT 4791

// Largest frame prefix a record can carry. Keep in step with MAX_SNAPLEN in src/bpf.rs.
#define MAX_SNAPLEN 9216

// tap_config.flags
#define F_QPN (1u << 0)    // only BTH destination QPN == qpn (or UD DETH source QPN == qpn)
#define F_OPCODE (1u << 1) // only opcodes whose bit is set in opcodes[]
#define F_IP (1u << 2)     // only frames with ip[] as source or destination
#define F_AETH (1u << 3)   // only frames with an AETH whose syndrome >> 5 has its bit in aeth_kinds
#define F_HEADERS (1u << 4) // copy the frame only up to the end of its transport headers
#define F_ENABLED (1u << 31) // set by user space once the config is complete

struct tap_config {
	__u32 flags;
	__u32 qpn;
	__u32 snaplen;
	// A CPU wakes the reader only once it has put this many bytes into the ring since its
	// last wakeup (the reader also polls on a short timer): one wakeup per frame would cost
	// more than the copy.
	__u32 wake_bytes;
	__u32 ip[4]; // IPv6, or IPv4-mapped ::ffff:a.b.c.d, in network byte order
	__u8 opcodes[32]; // bitmap over the 8-bit BTH opcode
	__u8 aeth_kinds; // bitmap over the AETH syndrome's top three bits (0 ACK, 1 RNR NAK, 3 NAK)
	__u8 cfg_pad[7];
};

// Extension headers, in the order they follow the BTH (roce_hdrs.present).
#define X_RDETH (1u << 0)
#define X_DETH (1u << 1)
#define X_FETH (1u << 2)
#define X_RETH (1u << 3)
#define X_ATOMICETH (1u << 4)
#define X_AETH (1u << 5)
#define X_ATOMICACKETH (1u << 6)
#define X_IMMDT (1u << 7)
#define X_IETH (1u << 8)
#define X_TRUNCATED (1u << 15) // the frame ends inside a header the opcode implies

// Which of the 32 operations (the low five opcode bits, the same for RC, UC and RD) carry each
// header: bit N set = operation N has it. IBTA Table 38; 0x1c FLUSH, 0x1d ATOMIC_WRITE.
#define OPS_RETH ((1u << 0x06) | (1u << 0x0a) | (1u << 0x0b) | (1u << 0x0c) | (1u << 0x1c) | (1u << 0x1d))
#define OPS_AETH ((1u << 0x0d) | (1u << 0x0f) | (1u << 0x10) | (1u << 0x11) | (1u << 0x12))
#define OPS_ATOMICETH ((1u << 0x13) | (1u << 0x14))
#define OPS_ATOMICACKETH (1u << 0x12)
#define OPS_IMMDT ((1u << 0x03) | (1u << 0x05) | (1u << 0x09) | (1u << 0x0b))
#define OPS_IETH ((1u << 0x16) | (1u << 0x17))
#define OPS_FETH (1u << 0x1c)
// UD has only SEND_ONLY and SEND_ONLY_WITH_IMMEDIATE.
#define OPS_UD ((1u << 0x04) | (1u << 0x05))

// The transport headers as parsed here, in host byte order; zero where absent.
struct roce_hdrs {
	__u64 va; // RETH or AtomicETH
	__u64 swap_add; // AtomicETH
	__u64 compare; // AtomicETH
	__u64 orig; // AtomicAckETH
	__u32 rkey; // RETH or AtomicETH
	__u32 dma_len; // RETH
	__u32 src[4]; // IP source, IPv6 or IPv4-mapped, network byte order
	__u32 dst[4]; // IP destination, likewise
	__u32 dqpn; // BTH
	__u32 psn; // BTH
	__u32 aeth; // syndrome << 24 | MSN
	__u32 qkey; // DETH
	__u32 src_qp; // DETH
	__u32 imm; // ImmDt
	__u32 ieth_rkey; // IETH
	__u32 feth; // FETH
	__u32 ee_ctx; // RDETH
	__u16 pkey; // BTH
	__u16 present; // X_*
	__u16 hdr_len; // bytes from the start of the frame to the payload
	__u8 opcode; // BTH
	__u8 se_m_pad_tver; // BTH byte 1
	__u8 ackreq; // BTH A bit
	__u8 hdrs_pad[11];
};

// Ring buffer record header; the frame's first cap_len bytes follow.
struct tap_record {
	__u64 ts_ns; // CLOCK_MONOTONIC (bpf_ktime_get_ns)
	__u32 ifindex;
	__u32 orig_len; // skb->len
	__u32 cap_len;
	__u8 direction; // 0 ingress, 1 egress
	// A VLAN tag the device keeps out of band (VLAN offload): it is not in the frame bytes,
	// user space puts it back.
	__u8 vlan_present;
	__u16 vlan_tci;
	__u16 vlan_proto; // network byte order
	__u8 pad[6];
	struct roce_hdrs roce;
};

// The layouts src/bpf.rs reads.
_Static_assert(sizeof(struct tap_config) == 72, "tap_config");
_Static_assert(sizeof(struct roce_hdrs) == 128, "roce_hdrs");
_Static_assert(sizeof(struct tap_record) == 160, "tap_record");

struct scratch {
	struct tap_record hdr;
	__u8 data[MAX_SNAPLEN];
	// Bytes this CPU put into the ring since it last woke the reader. Counted here rather
	// than asked of the ring (bpf_ringbuf_query) because the ring's consumer position is a
	// cache line the reader's CPU writes: reading it per packet costs a cross-CPU miss.
	__u64 unwoken;
};

// Counters (per CPU, summed by user space).
enum {
	STAT_MATCHED = 0, // RoCEv2 frames that passed the filters
	STAT_RING_FULL = 1, // of those, lost because the ring buffer was full
	STAT_FILTERED = 2, // RoCEv2 frames the filters left out
	STAT_NAK = 3, // of the matched: AETH with a NAK syndrome (011xxxxx)
	STAT_RNR_NAK = 4, // of the matched: AETH with an RNR NAK syndrome (001xxxxx)
	STAT_CNP = 5, // of the matched: opcode 0x81
	STAT_TRUNCATED = 6, // of the matched: frame ends inside a header its opcode implies
	STAT_MAX = 8,
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20); // user space sets the size (--ring-kib)
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct tap_config);
	__uint(max_entries, 1);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, STAT_MAX);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct scratch);
	__uint(max_entries, 1);
} scratch_buf SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&stats, &which);
	// Per CPU, and a tcx program is not preempted by another on the same CPU: no atomic
	// needed (a lock prefix per packet is measurable, see docs/benchmarks.md).
	if (c)
		*c += 1;
}

static __always_inline __u16 be16(const __u8 *p)
{
	return ((__u16)p[0] << 8) | p[1];
}

static __always_inline __u32 be24(const __u8 *p)
{
	return ((__u32)p[0] << 16) | ((__u32)p[1] << 8) | p[2];
}

static __always_inline __u32 be32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | be24(p + 1);
}

static __always_inline __u64 be64(const __u8 *p)
{
	return ((__u64)be32(p) << 32) | be32(p + 4);
}

static __always_inline int ip_eq(const __u32 *a, const __u32 *b)
{
	return !((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]));
}

// The extension headers (X_*) that follow the BTH of `opcode`.
static __always_inline __u32 ext_headers(__u8 opcode)
{
	__u32 op = 1u << (opcode & 0x1f);
	__u32 x = 0;
	switch (opcode >> 5) {
	case 3: // UD
		return op & OPS_UD ? X_DETH | (op & OPS_IMMDT ? X_IMMDT : 0) : 0;
	case 2: // RD: every packet has an RDETH, requests a DETH too
		x = X_RDETH | (op & OPS_AETH ? 0 : X_DETH);
		break;
	case 0: // RC
	case 1: // UC
		break;
	default: // CNP and the manufacturer-specific opcodes: BTH only
		return 0;
	}
	if (op & OPS_FETH)
		x |= X_FETH;
	if (op & OPS_RETH)
		x |= X_RETH;
	if (op & OPS_ATOMICETH)
		x |= X_ATOMICETH;
	if (op & OPS_AETH)
		x |= X_AETH;
	if (op & OPS_ATOMICACKETH)
		x |= X_ATOMICACKETH;
	if (op & OPS_IMMDT)
		x |= X_IMMDT;
	if (op & OPS_IETH)
		x |= X_IETH;
	return x;
}

// Parses the extension headers `x` found at `off` (right after the BTH) into `h`; sets
// h->present and h->hdr_len. A header cut short by the end of the frame stops the walk and
// sets X_TRUNCATED.
static __always_inline void parse_ext(struct __sk_buff *skb, __u32 off, __u32 x,
				      struct roce_hdrs *h)
{
	__u8 b[28];
	__u16 present = 0;
	if (x & X_RDETH) {
		if (bpf_skb_load_bytes(skb, off, b, 4))
			goto truncated;
		h->ee_ctx = be24(b + 1);
		present |= X_RDETH;
		off += 4;
	}
	if (x & X_DETH) {
		if (bpf_skb_load_bytes(skb, off, b, 8))
			goto truncated;
		h->qkey = be32(b);
		h->src_qp = be24(b + 5);
		present |= X_DETH;
		off += 8;
	}
	if (x & X_FETH) {
		if (bpf_skb_load_bytes(skb, off, b, 4))
			goto truncated;
		h->feth = be32(b);
		present |= X_FETH;
		off += 4;
	}
	if (x & X_RETH) {
		if (bpf_skb_load_bytes(skb, off, b, 16))
			goto truncated;
		h->va = be64(b);
		h->rkey = be32(b + 8);
		h->dma_len = be32(b + 12);
		present |= X_RETH;
		off += 16;
	}
	if (x & X_ATOMICETH) {
		if (bpf_skb_load_bytes(skb, off, b, 28))
			goto truncated;
		h->va = be64(b);
		h->rkey = be32(b + 8);
		h->swap_add = be64(b + 12);
		h->compare = be64(b + 20);
		present |= X_ATOMICETH;
		off += 28;
	}
	if (x & X_AETH) {
		if (bpf_skb_load_bytes(skb, off, b, 4))
			goto truncated;
		h->aeth = be32(b);
		present |= X_AETH;
		off += 4;
	}
	if (x & X_ATOMICACKETH) {
		if (bpf_skb_load_bytes(skb, off, b, 8))
			goto truncated;
		h->orig = be64(b);
		present |= X_ATOMICACKETH;
		off += 8;
	}
	if (x & X_IMMDT) {
		if (bpf_skb_load_bytes(skb, off, b, 4))
			goto truncated;
		h->imm = be32(b);
		present |= X_IMMDT;
		off += 4;
	}
	if (x & X_IETH) {
		if (bpf_skb_load_bytes(skb, off, b, 4))
			goto truncated;
		h->ieth_rkey = be32(b);
		present |= X_IETH;
		off += 4;
	}
	h->present = present;
	h->hdr_len = off;
	return;
truncated:
	h->present = present | X_TRUNCATED;
	h->hdr_len = off;
}

// Finds the UDP header of a RoCEv2 frame with helper calls (VLAN tags, IPv4 options, IPv6, or
// headers outside the linear part of the skb): sets *off to its offset, the addresses (IPv6,
// or IPv4-mapped) and hdr to the UDP header + BTH. Non-zero when the frame is not RoCEv2.
static __always_inline int locate(struct __sk_buff *skb, __u32 *off_out, __u32 *src, __u32 *dst,
				  __u8 *hdr)
{
	__u8 eth[4];
	__u32 off = 12;
	if (bpf_skb_load_bytes(skb, off, eth, 2))
		return -1;
	__u16 proto = be16(eth);
	off += 2;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			break;
		if (bpf_skb_load_bytes(skb, off + 2, eth, 2))
			return -1;
		proto = be16(eth);
		off += 4;
	}

	if (proto == ETH_P_IP) {
		__u32 ipw[5];
		__u8 *ip = (__u8 *)ipw;
		if (bpf_skb_load_bytes(skb, off, ipw, sizeof(ipw)))
			return -1;
		if ((ip[0] >> 4) != 4 || ip[9] != IPPROTO_UDP)
			return -1;
		// A fragment other than the first has no UDP header.
		if (be16(ip + 6) & 0x1fff)
			return -1;
		__u32 ihl = (ip[0] & 0xf) * 4;
		if (ihl < 20)
			return -1;
		src[2] = dst[2] = __builtin_bswap32(0xffff); // ::ffff:a.b.c.d
		src[3] = ipw[3];
		dst[3] = ipw[4];
		off += ihl;
	} else if (proto == ETH_P_IPV6) {
		__u32 ip6w[10];
		__u8 *ip6 = (__u8 *)ip6w;
		if (bpf_skb_load_bytes(skb, off, ip6w, sizeof(ip6w)))
			return -1;
		// RoCEv2 puts UDP right after the fixed header (no extension headers).
		if ((ip6[0] >> 4) != 6 || ip6[6] != IPPROTO_UDP)
			return -1;
		__builtin_memcpy(src, &ip6w[2], 16);
		__builtin_memcpy(dst, &ip6w[6], 16);
		off += 40;
	} else {
		return -1;
	}
	if (bpf_skb_load_bytes(skb, off, hdr, 20))
		return -1;
	if (be16(hdr + 2) != ROCE_V2_PORT)
		return -1;
	*off_out = off;
	return 0;
}

static __always_inline int tap(struct __sk_buff *skb, __u8 direction)
{
	__u32 zero = 0;
	struct tap_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || !(cfg->flags & F_ENABLED))
		return TC_ACT_UNSPEC;

	// Source and destination as IPv6 (IPv4-mapped for IPv4), for the IP filter; the UDP
	// header (8) + BTH (12); where the UDP header starts.
	__u32 src[4] = {}, dst[4] = {};
	__u8 hdr[20];
	__u32 off;
	__u8 *p = (__u8 *)(long)skb->data;
	__u8 *end = (__u8 *)(long)skb->data_end;
	if (p + 54 <= end && p[12] == 0x08 && p[13] == 0x00 && p[14] == 0x45) {
		// The common case read in place, without a helper call: untagged IPv4 without
		// options, headers in the linear part of the skb.
		if (p[23] != IPPROTO_UDP || (be16(p + 20) & 0x1fff) || be16(p + 36) != ROCE_V2_PORT)
			return TC_ACT_UNSPEC;
		src[2] = dst[2] = __builtin_bswap32(0xffff); // ::ffff:a.b.c.d
		__builtin_memcpy(&src[3], p + 26, 4);
		__builtin_memcpy(&dst[3], p + 30, 4);
		__builtin_memcpy(hdr, p + 34, 20);
		off = 34;
	} else if (locate(skb, &off, src, dst, hdr)) {
		return TC_ACT_UNSPEC;
	}
	__u8 b[4]; // for the few bytes the filters read beyond the BTH
	__u8 opcode = hdr[8];
	__u32 dqpn = be24(hdr + 13);
	__u32 bth_end = off + 20;
	__u32 x = ext_headers(opcode);

	int keep = 1;
	if (cfg->flags & F_OPCODE)
		keep &= (cfg->opcodes[(opcode >> 3) & 31] >> (opcode & 7)) & 1;
	if (keep && (cfg->flags & F_QPN)) {
		int q = dqpn == cfg->qpn;
		// UD: the DETH's source QPN too (its low three bytes, 5 bytes into the DETH).
		if (!q && (x & X_DETH) && !(x & X_RDETH) &&
		    !bpf_skb_load_bytes(skb, bth_end + 4, b, 4))
			q = be24(b + 1) == cfg->qpn;
		keep &= q;
	}
	if (keep && (cfg->flags & F_IP))
		keep &= ip_eq(src, cfg->ip) | ip_eq(dst, cfg->ip);
	if (keep && (cfg->flags & F_AETH)) {
		// The AETH comes right after the BTH, or after the RDETH on RD.
		__u32 at = bth_end + (x & X_RDETH ? 4 : 0);
		keep &= (x & X_AETH) && !bpf_skb_load_bytes(skb, at, b, 1) &&
			((cfg->aeth_kinds >> (b[0] >> 5)) & 1);
	}
	if (!keep) {
		count(STAT_FILTERED);
		return TC_ACT_UNSPEC;
	}
	count(STAT_MATCHED);

	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s)
		return TC_ACT_UNSPEC;
	struct roce_hdrs *h = &s->hdr.roce;
	__builtin_memset(h, 0, sizeof(*h));
	__builtin_memcpy(h->src, src, 16);
	__builtin_memcpy(h->dst, dst, 16);
	h->opcode = opcode;
	h->se_m_pad_tver = hdr[9];
	h->pkey = be16(hdr + 10);
	h->dqpn = dqpn;
	h->ackreq = hdr[16] >> 7;
	h->psn = be24(hdr + 17);
	parse_ext(skb, bth_end, x, h);
	if (h->present & X_TRUNCATED)
		count(STAT_TRUNCATED);
	if (h->present & X_AETH) {
		__u8 kind = h->aeth >> 29;
		if (kind == 3)
			count(STAT_NAK);
		else if (kind == 1)
			count(STAT_RNR_NAK);
	}
	if (opcode == 0x81)
		count(STAT_CNP);

	// 64-bit, so that no 32-bit zero extension hides the bounds from the verifier.
	__u64 len = skb->len;
	__u64 snap = cfg->snaplen;
	if (cfg->flags & F_HEADERS)
		snap = h->hdr_len;
	if (len > snap)
		len = snap;
	if (len > MAX_SNAPLEN)
		len = MAX_SNAPLEN;
	if (len < 1)
		return TC_ACT_UNSPEC;
	s->hdr.ts_ns = bpf_ktime_get_ns();
	s->hdr.ifindex = skb->ifindex;
	s->hdr.orig_len = skb->len;
	s->hdr.cap_len = len;
	s->hdr.direction = direction;
	s->hdr.vlan_present = skb->vlan_present != 0;
	s->hdr.vlan_tci = skb->vlan_tci;
	s->hdr.vlan_proto = skb->vlan_proto;
	if (bpf_skb_load_bytes(skb, 0, s->data, len))
		return TC_ACT_UNSPEC;
	__u64 size = sizeof(s->hdr) + len;
	__u64 wake = BPF_RB_NO_WAKEUP;
	s->unwoken += size;
	if (s->unwoken >= cfg->wake_bytes) {
		wake = BPF_RB_FORCE_WAKEUP;
		s->unwoken = 0;
	}
	if (bpf_ringbuf_output(&events, s, size, wake))
		count(STAT_RING_FULL);
	return TC_ACT_UNSPEC;
}

SEC("classifier")
int tap_ingress(struct __sk_buff *skb)
{
	return tap(skb, 0);
}

SEC("classifier")
int tap_egress(struct __sk_buff *skb)
{
	return tap(skb, 1);
}

// No GPL-only helper is used.
char _license[] SEC("license") = "BSD";
