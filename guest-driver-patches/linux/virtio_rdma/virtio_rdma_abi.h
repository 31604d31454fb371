/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The virtio-rdma device contract (virtio ID 42), version 1: config space, control
 * commands, doorbells and events. docs/virtio-rdma.md is the normative description; every
 * structure here has a table there with the same offsets. All fields are little-endian.
 * The rings themselves use the Linux rxe user ABI (<rdma/rdma_user_rxe.h>).
 */
#ifndef VIRTIO_RDMA_ABI_H
#define VIRTIO_RDMA_ABI_H

#include <linux/types.h>
#include <linux/build_bug.h>

#define VIRTIO_ID_RDMA_DEV 42

enum {
	VRDMA_VQ_CTRL = 0,
	VRDMA_VQ_DOORBELL = 1,
	VRDMA_VQ_EVENT = 2,
	VRDMA_NUM_VQS = 3,
};

#define VRDMA_VERSION 1

/* uverbs ABI version of rxe (rxe_param.h), which librxe checks */
#define VRDMA_UVERBS_ABI_VERSION 2

/* config space caps */
#define VRDMA_CAP_CQ_NOTIFY_WORD	(1U << 0)
#define VRDMA_CAP_MULTI_LEVEL_PAGE_LIST	(1U << 1)
#define VRDMA_CAP_FAST_REG		(1U << 2)
#define VRDMA_CAP_MEM_WINDOW		(1U << 3)
#define VRDMA_CAP_SRQ			(1U << 4)
#define VRDMA_CAP_GID_SOURCES		(1U << 5)
#define VRDMA_CAP_MR_PAGE_OFFSET	(1U << 6)
#define VRDMA_CAP_SRQ_RESIZE		(1U << 7)
#define VRDMA_CAP_HW_STATS		(1U << 8)
#define VRDMA_CAP_ODP			(1U << 9)
/* REREG_MR: a user MR changed in place, its keys kept (ibv_rereg_mr), §5.8 */
#define VRDMA_CAP_REREG_MR		(1U << 10)
/* implicit ODP MRs: REG_USER_MR ON_DEMAND with iova 0, length U64_MAX (§5.10) */
#define VRDMA_CAP_IMPLICIT_ODP		(1U << 11)
/* XRC domains, XRC SRQs, XRC INI and TGT QPs (§5.12) */
#define VRDMA_CAP_XRC			(1U << 12)
/* raw packet QPs and flow steering (§5.13) */
#define VRDMA_CAP_RAW_PACKET		(1U << 13)
/* receive-side scaling: SET_RSS (§5.14) */
#define VRDMA_CAP_RSS			(1U << 14)

struct vrdma_config {
	__le32 version;
	__le32 caps;
	u8 mac[6];
	/* the device's caps on the page lists it keeps (2^n bytes; 0: not stated) */
	u8 log2_max_page_list_bytes;
	u8 log2_max_qp_reg_mr_list_bytes;
	__le32 netdev_mtu;
	u8 port_state;
	u8 active_mtu;
	u8 max_mtu;
	u8 phys_port_cnt;
	__le32 gid_tbl_len;
	__le32 max_qp;
	__le32 max_qp_wr;
	__le32 max_sge;
	__le32 max_cq;
	__le32 max_cqe;
	__le32 max_mr;
	__le32 max_pd;
	__le64 max_mr_size;
	__le64 page_size_cap;
	__le32 max_qp_rd_atom;
	__le32 max_qp_init_rd_atom;
	__le32 max_srq;
	__le32 max_srq_wr;
	__le32 max_srq_sge;
	__le32 max_ah;
	__le32 max_mcast_grp;
	__le32 max_mcast_qp_attach;
	__le32 max_inline;
	__le32 max_mw;
	__le64 max_registered_bytes;
	__le64 device_cap_flags;
};

struct vrdma_ctrl_hdr {
	__le32 opcode;
	__le32 flags;
	__le64 seq;
};

struct vrdma_resp_hdr {
	__le32 status;
	__le32 len;
	__le64 seq;
};

enum vrdma_opcode {
	VRDMA_CMD_QUERY_DEVICE = 1,
	VRDMA_CMD_QUERY_PORT = 2,
	VRDMA_CMD_CREATE_PD = 3,
	VRDMA_CMD_DESTROY_PD = 4,
	VRDMA_CMD_CREATE_CQ = 5,
	VRDMA_CMD_RESIZE_CQ = 6,
	VRDMA_CMD_DESTROY_CQ = 7,
	VRDMA_CMD_CREATE_QP = 8,
	VRDMA_CMD_MODIFY_QP = 9,
	VRDMA_CMD_QUERY_QP = 10,
	VRDMA_CMD_DESTROY_QP = 11,
	VRDMA_CMD_CREATE_SRQ = 12,
	VRDMA_CMD_MODIFY_SRQ = 13,
	VRDMA_CMD_QUERY_SRQ = 14,
	VRDMA_CMD_DESTROY_SRQ = 15,
	VRDMA_CMD_REG_USER_MR = 16,
	VRDMA_CMD_REG_DMA_MR = 17,
	VRDMA_CMD_ALLOC_MR = 18,
	VRDMA_CMD_DEREG_MR = 19,
	VRDMA_CMD_ALLOC_MW = 20,
	VRDMA_CMD_DEALLOC_MW = 21,
	VRDMA_CMD_CREATE_AH = 22,
	VRDMA_CMD_DESTROY_AH = 23,
	VRDMA_CMD_ADD_GID = 24,
	VRDMA_CMD_DEL_GID = 25,
	VRDMA_CMD_ATTACH_MCAST = 26,
	VRDMA_CMD_DETACH_MCAST = 27,
	VRDMA_CMD_RESET = 28,
	VRDMA_CMD_BIND_MW = 29,
	VRDMA_CMD_QUERY_GID_SOURCES = 30,
	VRDMA_CMD_RESIZE_SRQ = 31,
	VRDMA_CMD_QUERY_STATS = 32,
	VRDMA_CMD_UPDATE_ODP = 33,
	VRDMA_CMD_REREG_MR = 34,
	VRDMA_CMD_ALLOC_XRCD = 35,
	VRDMA_CMD_DEALLOC_XRCD = 36,
	VRDMA_CMD_CREATE_XRC_SRQ = 37,
	VRDMA_CMD_CREATE_FLOW = 38,
	VRDMA_CMD_DESTROY_FLOW = 39,
	VRDMA_CMD_SET_RSS = 40,
};

enum vrdma_status {
	VRDMA_OK = 0,
	VRDMA_INVALID = 1,
	VRDMA_NO_MEMORY = 2,
	VRDMA_NOT_FOUND = 3,
	VRDMA_BUSY = 4,
	VRDMA_PERMISSION = 5,
	VRDMA_BAD_STATE = 6,
	VRDMA_UNSUPPORTED = 7,
	VRDMA_BAD_ADDRESS = 8,
	VRDMA_BAD_REQUEST = 9,
	VRDMA_ADDRESS_NOT_AVAILABLE = 10,
};

struct vrdma_handle {
	__le32 handle;
	__le32 reserved;
};

struct vrdma_page_list {
	__le64 gpa;
	__le32 num_pages;
	u8 page_shift;
	u8 levels;
	__le16 reserved;
};

struct vrdma_queue_desc {
	struct vrdma_page_list pages;
	__le32 num_slots;
	__le32 log2_elem_size;
	__le64 reserved;
};

struct vrdma_cmd_query_port {
	__le32 port_num;
	__le32 reserved;
};

struct vrdma_resp_query_port {
	__le32 state;
	__le32 max_mtu;
	__le32 active_mtu;
	__le32 gid_tbl_len;
	__le32 port_cap_flags;
	__le32 max_msg_sz;
	__le16 pkey_tbl_len;
	u8 link_layer;
	u8 phys_state;
	u8 active_width;
	u8 active_speed;
	__le16 reserved;
};

struct vrdma_cmd_create_cq {
	__le32 cqe;
	__le32 flags;
	struct vrdma_queue_desc queue;
};

struct vrdma_resp_create_cq {
	__le32 cqn;
	__le32 cqe;
};

struct vrdma_cmd_resize_cq {
	__le32 cqn;
	__le32 cqe;
	struct vrdma_queue_desc queue;
};

/* RESIZE_SRQ (caps SRQ_RESIZE): response vrdma_resp_query_srq */
struct vrdma_cmd_resize_srq {
	__le32 srqn;
	__le32 max_wr;
	struct vrdma_queue_desc queue;
};

#define VRDMA_CREATE_QP_HAS_SRQ		(1U << 0)
#define VRDMA_CREATE_QP_SQ_SIG_ALL	(1U << 1)
#define VRDMA_CREATE_QP_KERNEL		(1U << 2)	/* rings never mapped to user space */

struct vrdma_cmd_create_qp {
	__le32 qp_type;
	__le32 pdn;
	__le32 send_cqn;
	__le32 recv_cqn;
	__le32 srqn;
	__le32 flags;
	__le32 max_send_wr;
	__le32 max_recv_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 xrcdn;		/* XRC TGT QPs: their domain */
	struct vrdma_queue_desc sq;
	struct vrdma_queue_desc rq;
};

struct vrdma_resp_create_qp {
	__le32 qpn;
	__le32 max_send_wr;
	__le32 max_recv_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le64 reserved;
};

struct vrdma_ah_attr {
	u8 dgid[16];
	__le32 flow_label;
	u8 sgid_index;
	u8 hop_limit;
	u8 traffic_class;
	u8 sl;
	u8 dmac[6];
	__le16 reserved0;
	u8 port_num;
	u8 static_rate;
	__le16 reserved1;
	__le32 reserved2[3];
};

struct vrdma_qp_attrs {
	__le32 qpn;
	__le32 attr_mask;
	__le32 qp_state;
	__le32 cur_qp_state;
	__le32 path_mtu;
	__le32 qkey;
	__le32 rq_psn;
	__le32 sq_psn;
	__le32 dest_qp_num;
	__le32 qp_access_flags;
	__le16 pkey_index;
	u8 en_sqd_async_notify;
	u8 sq_draining;
	u8 max_rd_atomic;
	u8 max_dest_rd_atomic;
	u8 min_rnr_timer;
	u8 port_num;
	u8 timeout;
	u8 retry_cnt;
	u8 rnr_retry;
	u8 reserved0;
	__le32 reserved1;
	struct vrdma_ah_attr ah;
	__le32 max_send_wr;
	__le32 max_recv_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 reserved2;
};

struct vrdma_cmd_create_srq {
	__le32 pdn;
	__le32 max_wr;
	__le32 max_sge;
	__le32 srq_limit;
	struct vrdma_queue_desc queue;
};

/* CREATE_FLOW: what a flow matches, each field under its mask, network order (§5.13) */
#define VRDMA_FLOW_IPV4		(1U << 0)
#define VRDMA_FLOW_IPV6		(1U << 1)
#define VRDMA_FLOW_TCP		(1U << 2)
#define VRDMA_FLOW_UDP		(1U << 3)

struct vrdma_flow_match {
	__le32 layers;
	u8 dst_mac[6];
	u8 dst_mac_mask[6];
	u8 src_mac[6];
	u8 src_mac_mask[6];
	__be16 ether_type;
	__be16 ether_type_mask;
	__be16 vlan_tci;
	__be16 vlan_tci_mask;
	u8 src_ip[16];
	u8 src_ip_mask[16];
	u8 dst_ip[16];
	u8 dst_ip_mask[16];
	u8 ip_proto;
	u8 ip_proto_mask;
	u8 reserved0[2];
	__be16 src_port;
	__be16 src_port_mask;
	__be16 dst_port;
	__be16 dst_port_mask;
	__le32 reserved1[2];
};

struct vrdma_cmd_create_flow {
	__le32 qpn;
	__le32 flags;
	struct vrdma_flow_match m;
};

/* SET_RSS: a ringless raw packet QP spreads its frames over a table of QPs (§5.14) */
#define VRDMA_RSS_MAX_LOG_TABLE	8
#define VRDMA_RSS_FIELDS	0xffU	/* IBV_RX_HASH_{SRC,DST}_{IPV4,IPV6,PORT_TCP,PORT_UDP} */

struct vrdma_cmd_set_rss {
	__le32 qpn;
	__le32 fields;
	__le32 log_table_size;
	__le32 key_len;
	u8 key[40];
	__le32 table[1 << VRDMA_RSS_MAX_LOG_TABLE];
};

/* CREATE_XRC_SRQ: an SRQ of domain xrcdn completing into CQ cqn */
struct vrdma_cmd_create_xrc_srq {
	struct vrdma_cmd_create_srq srq;
	__le32 xrcdn;
	__le32 cqn;
};

struct vrdma_resp_create_srq {
	__le32 srqn;
	__le32 max_wr;
	__le32 max_sge;
	__le32 reserved;
};

#define VRDMA_SRQ_ATTR_MAX_WR	1
#define VRDMA_SRQ_ATTR_LIMIT	2

struct vrdma_cmd_modify_srq {
	__le32 srqn;
	__le32 attr_mask;
	__le32 max_wr;
	__le32 srq_limit;
};

struct vrdma_resp_query_srq {
	__le32 max_wr;
	__le32 max_sge;
	__le32 srq_limit;
	__le32 reserved;
};

struct vrdma_cmd_reg_user_mr {
	__le32 pdn;
	__le32 access;
	__le64 iova;
	__le64 length;
	struct vrdma_page_list pages;
	/* where the MR's first byte lies in the first page (VRDMA_CAP_MR_PAGE_OFFSET) */
	__le32 page_offset;
	__le32 reserved;
};

/*
 * REREG_MR (caps REREG_MR): with flags PD the MR gets PD pdn, with ACCESS access, with TRANS
 * iova, length and the pages (as REG_USER_MR's); the rest and the keys stay. The flags are
 * the kernel's IB_MR_REREG_*. Answered with vrdma_resp_mr.
 */
struct vrdma_cmd_rereg_mr {
	__le32 lkey;
	__le32 flags;
	__le32 pdn;
	__le32 access;
	__le64 iova;
	__le64 length;
	struct vrdma_page_list pages;
	__le32 page_offset;
	__le32 reserved;
};

#define VRDMA_REREG_TRANS	(1U << 0)
#define VRDMA_REREG_PD		(1U << 1)
#define VRDMA_REREG_ACCESS	(1U << 2)

/*
 * UPDATE_ODP (caps ODP, docs/virtio-rdma.md §5.10): entries first_page .. +count of an
 * on-demand MR's table mapped to the pages of `pages` (read-only, or WRITABLE), or not mapped
 * (UNMAP, no list), or failed (FAILED, no list).
 */
struct vrdma_cmd_update_odp {
	__le32 lkey;
	__le32 flags;
	__le64 first_page;
	__le64 count;
	struct vrdma_page_list pages;
};

#define VRDMA_ODP_UNMAP			(1U << 0)
#define VRDMA_ODP_FAILED		(1U << 1)
#define VRDMA_ODP_WRITABLE		(1U << 2)

/*
 * The REG_MR work request (kernel-only fast registration) inside the rxe_send_wr union:
 * byte offsets in the rxe_send_wqe (docs/virtio-rdma.md §6.2).
 */
#define VRDMA_REG_MR_IOVA		24
#define VRDMA_REG_MR_LENGTH		32
#define VRDMA_REG_MR_MR_LKEY		40
#define VRDMA_REG_MR_KEY		44
#define VRDMA_REG_MR_ACCESS		48
#define VRDMA_REG_MR_PAGE_SHIFT		52
#define VRDMA_REG_MR_LEVELS		53
#define VRDMA_REG_MR_FLAGS		54
#define VRDMA_REG_MR_PAGE_LIST		56
#define VRDMA_REG_MR_NUM_PAGES		64
#define VRDMA_REG_MR_PAGE_OFFSET	68
/* VRDMA_REG_MR_FLAGS: the u32 at VRDMA_REG_MR_PAGE_OFFSET is the first page's offset */
#define VRDMA_REG_MR_F_PAGE_OFFSET	(1U << 0)

struct vrdma_resp_mr {
	__le32 lkey;
	__le32 rkey;
};

struct vrdma_cmd_reg_dma_mr {
	__le32 pdn;
	__le32 access;
};

struct vrdma_cmd_alloc_mr {
	__le32 pdn;
	__le32 max_num_sg;
};

struct vrdma_cmd_alloc_mw {
	__le32 pdn;
	__le32 mw_type;
};

struct vrdma_cmd_create_ah {
	__le32 pdn;
	__le32 reserved;
	struct vrdma_ah_attr attr;
};

#define VRDMA_GID_TYPE_ROCE_UDP_ENCAP 2

struct vrdma_cmd_add_gid {
	__le32 index;
	__le32 gid_type;
	u8 gid[16];
};

/*
 * QUERY_STATS (caps HW_STATS): the port's counters, rxe's hw counters by name in this
 * order; `count` says how many the device fills (a later device may add at the end).
 */
enum vrdma_stat {
	VRDMA_STAT_SENT_PKTS,
	VRDMA_STAT_RCVD_PKTS,
	VRDMA_STAT_DUP_REQ,
	VRDMA_STAT_OUT_OF_SEQ_REQ,
	VRDMA_STAT_RCV_RNR,
	VRDMA_STAT_SND_RNR,
	VRDMA_STAT_RCV_SEQ_ERR,
	VRDMA_STAT_RETRY_EXCEEDED,
	VRDMA_STAT_RNR_RETRY_EXCEEDED,
	VRDMA_STAT_COMP_RETRY,
	VRDMA_STAT_LINK_DOWNED,
	VRDMA_STAT_NUM,
};

#define VRDMA_MAX_STATS 16

struct vrdma_resp_query_stats {
	__le32 count;
	__le32 reserved;
	__le64 values[VRDMA_MAX_STATS];
};

#define VRDMA_MAX_GID_SOURCES 4

struct vrdma_resp_gid_sources {
	__le32 count;
	__le32 reserved;
	u8 gids[VRDMA_MAX_GID_SOURCES][16];
};

struct vrdma_cmd_mcast {
	__le32 qpn;
	__le32 reserved;
	u8 gid[16];
};

enum {
	VRDMA_DB_SQ = 1,
	VRDMA_DB_RQ = 2,
	VRDMA_DB_SRQ = 3,
	VRDMA_DB_CQ = 4,
};

struct vrdma_doorbell {
	__le32 kind;
	__le32 object;
	__le32 index;
	__le32 reserved;
};

enum {
	VRDMA_EV_COMPLETION = 1,
	VRDMA_EV_ASYNC = 2,
	VRDMA_EV_EVENTS_LOST = 3,	/* the device dropped events: every armed CQ fired */
	VRDMA_EV_PAGE_FAULT = 4,	/* event bit 0 a write, object the lkey, reserved the page's low 32 bits */
};

#define VRDMA_PAGE_FAULT_WRITE		(1U << 0)
/* PAGE_FAULT event bits 8..31: bits 32..55 of the page (implicit MRs' pages run to 2^52) */
#define VRDMA_PAGE_FAULT_PAGE_HI_SHIFT	8

/* ASYNC event codes are ibv_event_type values */
enum {
	VRDMA_AE_CQ_ERR = 0,
	VRDMA_AE_QP_FATAL = 1,
	VRDMA_AE_QP_REQ_ERR = 2,
	VRDMA_AE_QP_ACCESS_ERR = 3,
	VRDMA_AE_COMM_EST = 4,
	VRDMA_AE_SQ_DRAINED = 5,
	VRDMA_AE_DEVICE_FATAL = 8,
	VRDMA_AE_PORT_ACTIVE = 9,
	VRDMA_AE_PORT_ERR = 10,
	VRDMA_AE_SRQ_LIMIT_REACHED = 15,
	VRDMA_AE_QP_LAST_WQE_REACHED = 16,
};

struct vrdma_event {
	__le32 kind;
	__le32 event;
	__le32 object;
	__le32 reserved;
};

/* rxe_queue_buf header: the CQ notify word lives in pad_1 */
#define VRDMA_RING_CQ_NOTIFY	64
#define VRDMA_RING_HDR		384
#define VRDMA_CQ_NOTIFY_NEXT_COMP	1
#define VRDMA_CQ_NOTIFY_SOLICITED	2

/* the CQE the device writes: struct ib_uverbs_wc */
#define VRDMA_CQE_SIZE 48
#define VRDMA_CQ_LOG2_ELEM 6

static inline void vrdma_abi_check(void)
{
	BUILD_BUG_ON(sizeof(struct vrdma_config) != 128);
	BUILD_BUG_ON(sizeof(struct vrdma_ctrl_hdr) != 16);
	BUILD_BUG_ON(sizeof(struct vrdma_resp_hdr) != 16);
	BUILD_BUG_ON(sizeof(struct vrdma_page_list) != 16);
	BUILD_BUG_ON(sizeof(struct vrdma_queue_desc) != 32);
	BUILD_BUG_ON(sizeof(struct vrdma_resp_query_port) != 32);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_create_cq) != 40);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_resize_cq) != 40);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_resize_srq) != 40);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_create_qp) != 112);
	BUILD_BUG_ON(sizeof(struct vrdma_resp_create_qp) != 32);
	BUILD_BUG_ON(sizeof(struct vrdma_ah_attr) != 48);
	BUILD_BUG_ON(sizeof(struct vrdma_qp_attrs) != 128);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_create_srq) != 48);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_create_xrc_srq) != 56);
	BUILD_BUG_ON(sizeof(struct vrdma_flow_match) != 120);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_create_flow) != 128);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_set_rss) != 1080);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_reg_user_mr) != 48);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_create_ah) != 56);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_add_gid) != 24);
	BUILD_BUG_ON(sizeof(struct vrdma_doorbell) != 16);
	BUILD_BUG_ON(sizeof(struct vrdma_event) != 16);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_update_odp) != 40);
	BUILD_BUG_ON(sizeof(struct vrdma_cmd_rereg_mr) != 56);
	BUILD_BUG_ON(sizeof(struct vrdma_resp_gid_sources) != 72);
}

#endif
