// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
// RoCEv2 tap: a tcx classifier for ingress and egress that copies every RoCEv2 frame (UDP
// destination port 4791, after Ethernet, up to two VLAN tags and IPv4 or IPv6) that passes the
// filters of `tap_config` into the ring buffer `events`, up to the snap length, with a
// timestamp, the interface and the direction. It never changes a packet nor its fate: every
// path returns TC_ACT_UNSPEC, so the next tcx program (or the default action) decides.
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
};

// include/uapi/linux/pkt_cls.h: "use the default action", the tcx way to stay out of the way.
#define TC_ACT_UNSPEC (-1)

// Helper ids from include/uapi/linux/bpf.h (___BPF_FUNC_MAPPER order).
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static __u64 (*bpf_ktime_get_ns)(void) = (void *)5;
static long (*bpf_skb_load_bytes)(const void *skb, __u32 offset, void *to, __u32 len) = (void *)26;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size, __u64 flags) = (void *)130;
static __u64 (*bpf_ringbuf_query)(void *ringbuf, __u64 flags) = (void *)134;

// bpf_ringbuf_output flags and bpf_ringbuf_query's BPF_RB_AVAIL_DATA.
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0

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
#define F_ENABLED (1u << 31) // set by user space once the config is complete

struct tap_config {
	__u32 flags;
	__u32 qpn;
	__u32 snaplen;
	// Wake the reader only once this many bytes wait in the ring (it also polls on a short
	// timer): one wakeup per frame would cost more than the copy.
	__u32 wake_bytes;
	__u32 ip[4]; // IPv6, or IPv4-mapped ::ffff:a.b.c.d, in network byte order
	__u8 opcodes[32]; // bitmap over the 8-bit BTH opcode
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
};

struct scratch {
	struct tap_record hdr;
	__u8 data[MAX_SNAPLEN];
};

// Counters (per CPU, summed by user space).
enum {
	STAT_MATCHED = 0, // RoCEv2 frames that passed the filters
	STAT_RING_FULL = 1, // of those, lost because the ring buffer was full
	STAT_FILTERED = 2, // RoCEv2 frames the filters left out
	STAT_MAX = 4,
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
	if (c)
		__sync_fetch_and_add(c, 1);
}

static __always_inline __u16 be16(const __u8 *p)
{
	return ((__u16)p[0] << 8) | p[1];
}

static __always_inline int ip_eq(const __u32 *a, const __u32 *b)
{
	return !((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]));
}

static __always_inline int tap(struct __sk_buff *skb, __u8 direction)
{
	__u32 zero = 0;
	struct tap_config *cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || !(cfg->flags & F_ENABLED))
		return TC_ACT_UNSPEC;

	__u8 eth[4];
	__u32 off = 12;
	if (bpf_skb_load_bytes(skb, off, eth, 2))
		return TC_ACT_UNSPEC;
	__u16 proto = be16(eth);
	off += 2;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			break;
		if (bpf_skb_load_bytes(skb, off + 2, eth, 2))
			return TC_ACT_UNSPEC;
		proto = be16(eth);
		off += 4;
	}

	// Source and destination as IPv6 (IPv4-mapped for IPv4), for the IP filter.
	__u32 src[4] = {}, dst[4] = {};
	if (proto == ETH_P_IP) {
		__u32 ipw[5];
		__u8 *ip = (__u8 *)ipw;
		if (bpf_skb_load_bytes(skb, off, ipw, sizeof(ipw)))
			return TC_ACT_UNSPEC;
		if ((ip[0] >> 4) != 4 || ip[9] != IPPROTO_UDP)
			return TC_ACT_UNSPEC;
		// A fragment other than the first has no UDP header.
		if (be16(ip + 6) & 0x1fff)
			return TC_ACT_UNSPEC;
		__u32 ihl = (ip[0] & 0xf) * 4;
		if (ihl < 20)
			return TC_ACT_UNSPEC;
		src[2] = dst[2] = __builtin_bswap32(0xffff); // ::ffff:a.b.c.d
		src[3] = ipw[3];
		dst[3] = ipw[4];
		off += ihl;
	} else if (proto == ETH_P_IPV6) {
		__u32 ip6w[10];
		__u8 *ip6 = (__u8 *)ip6w;
		if (bpf_skb_load_bytes(skb, off, ip6w, sizeof(ip6w)))
			return TC_ACT_UNSPEC;
		// RoCEv2 puts UDP right after the fixed header (no extension headers).
		if ((ip6[0] >> 4) != 6 || ip6[6] != IPPROTO_UDP)
			return TC_ACT_UNSPEC;
		__builtin_memcpy(src, &ip6w[2], 16);
		__builtin_memcpy(dst, &ip6w[6], 16);
		off += 40;
	} else {
		return TC_ACT_UNSPEC;
	}

	// UDP header (8) + BTH (12) + the DETH's source QPN word (UD: 8 bytes after the BTH).
	__u8 hdr[28];
	if (bpf_skb_load_bytes(skb, off, hdr, 20))
		return TC_ACT_UNSPEC;
	if (be16(hdr + 2) != ROCE_V2_PORT)
		return TC_ACT_UNSPEC;
	__u8 opcode = hdr[8];
	__u32 dqpn = ((__u32)hdr[13] << 16) | ((__u32)hdr[14] << 8) | hdr[15];

	int keep = 1;
	if (cfg->flags & F_OPCODE)
		keep &= (cfg->opcodes[(opcode >> 3) & 31] >> (opcode & 7)) & 1;
	if (cfg->flags & F_QPN) {
		int q = dqpn == cfg->qpn;
		// UD SEND_ONLY (0x64) and SEND_ONLY_WITH_IMMEDIATE (0x65) carry a DETH.
		if (!q && (opcode == 0x64 || opcode == 0x65) &&
		    !bpf_skb_load_bytes(skb, off + 20, hdr + 20, 8)) {
			__u32 sqpn = ((__u32)hdr[25] << 16) | ((__u32)hdr[26] << 8) | hdr[27];
			q = sqpn == cfg->qpn;
		}
		keep &= q;
	}
	if (cfg->flags & F_IP)
		keep &= ip_eq(src, cfg->ip) | ip_eq(dst, cfg->ip);
	if (!keep) {
		count(STAT_FILTERED);
		return TC_ACT_UNSPEC;
	}
	count(STAT_MATCHED);

	struct scratch *s = bpf_map_lookup_elem(&scratch_buf, &zero);
	if (!s)
		return TC_ACT_UNSPEC;
	__u32 len = skb->len;
	__u32 snap = cfg->snaplen;
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
	__u64 wake = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) + size >= cfg->wake_bytes ?
			     BPF_RB_FORCE_WAKEUP :
			     BPF_RB_NO_WAKEUP;
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
