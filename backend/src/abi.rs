//! The virtio-rdma device contract as Rust types: config space, control commands and
//! responses, doorbell and event entries, and the Linux rxe user ABI the rings use.
//!
//! docs/virtio-rdma.md is the normative description; every struct here has a table there with
//! the same offsets. All integers are little-endian (the crate refuses to build on big-endian
//! hosts, see `lib.rs`), every struct is `#[repr(C)]` with explicit padding, and every size is
//! asserted at compile time.

use std::mem::size_of;

use vm_memory::ByteValued;

/// virtio device ID of the RDMA device.
pub const VIRTIO_ID_RDMA: u32 = 42;

/// Virtqueue indices.
pub const VQ_CTRL: u16 = 0;
pub const VQ_DOORBELL: u16 = 1;
pub const VQ_EVENT: u16 = 2;
pub const NUM_QUEUES: usize = 3;

/// Contract version in the config space.
pub const VERSION: u32 = 1;

/// `caps` bits of the config space.
pub mod caps {
    /// CQ arming through the notify word in the CQ ring header (always set in version 1).
    pub const CQ_NOTIFY_WORD: u32 = 1 << 0;
    /// Page lists may be indirect (`levels` 1 and 2).
    pub const MULTI_LEVEL_PAGE_LIST: u32 = 1 << 1;
    /// Fast registration (REG_MR work requests, kernel opcode 0x20) is implemented.
    pub const FAST_REG: u32 = 1 << 2;
    /// Memory windows (type 1 and 2).
    pub const MEM_WINDOW: u32 = 1 << 3;
    /// SRQs.
    pub const SRQ: u32 = 1 << 4;
    /// QUERY_GID_SOURCES lists the GIDs the transport can send from; ADD_GID lists others in
    /// the table, and an address vector naming one is refused with ADDRESS_NOT_AVAILABLE.
    pub const GID_SOURCES: u32 = 1 << 5;
    /// MRs carry the offset of their first byte in the first page apart from the IOVA:
    /// RegUserMr's `page_offset` (the 48-byte command) and the REG_MR work request's
    /// PAGE_OFFSET flag are honoured, so any IOVA can map any buffer.
    pub const MR_PAGE_OFFSET: u32 = 1 << 6;
    /// RESIZE_SRQ hands an SRQ a new ring (`ibv_modify_srq(IBV_SRQ_MAX_WR)`).
    pub const SRQ_RESIZE: u32 = 1 << 7;
    /// QUERY_STATS returns the port's counters, Linux rxe's hw counters by name
    /// ([`super::stat`]): the guest's `rdma statistic`.
    pub const HW_STATS: u32 = 1 << 8;
    /// On-demand paging: REG_USER_MR with `IBV_ACCESS_ON_DEMAND` makes an MR with no page
    /// mapped, UPDATE_ODP maps and unmaps its pages, PAGE_FAULT events ask for them
    /// (docs/virtio-rdma.md §5.10).
    pub const ODP: u32 = 1 << 9;
    /// REREG_MR changes a user MR in place, its keys kept (`ibv_rereg_mr`): PD, access,
    /// translation (docs/virtio-rdma.md §5.8).
    pub const REREG_MR: u32 = 1 << 10;
    /// Implicit on-demand-paging MRs: REG_USER_MR with `IBV_ACCESS_ON_DEMAND`, IOVA 0 and
    /// length `u64::MAX` covers the whole address space (docs/virtio-rdma.md §5.10).
    pub const IMPLICIT_ODP: u32 = 1 << 11;
    /// XRC: ALLOC_XRCD, DEALLOC_XRCD, CREATE_XRC_SRQ, and XRC INI and XRC TGT QPs
    /// (docs/virtio-rdma.md §5.12).
    pub const XRC: u32 = 1 << 12;
    /// Raw packet QPs (CREATE_QP type RAW_PACKET) and flow steering (CREATE_FLOW,
    /// DESTROY_FLOW): whole Ethernet frames (docs/virtio-rdma.md §5.13).
    pub const RAW_PACKET: u32 = 1 << 13;
    /// Receive-side scaling (SET_RSS): a raw packet QP spreads the frames steered to it over
    /// receive-only raw packet QPs by a Toeplitz hash (docs/virtio-rdma.md §5.14).
    pub const RSS: u32 = 1 << 14;
}

macro_rules! byte_valued {
    ($($t:ty = $n:expr),* $(,)?) => {
        $(
            const _: () = assert!(size_of::<$t>() == $n);
            // SAFETY: the type is `#[repr(C)]`, made only of integers and byte arrays with
            // explicit padding fields (the size assertion above proves there is no implicit
            // padding), so every byte pattern is a valid value.
            unsafe impl ByteValued for $t {}
        )*
    };
}

/// The device configuration space (`VHOST_USER_GET_CONFIG`), also returned by QUERY_DEVICE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigSpace {
    pub version: u32,
    pub caps: u32,
    pub mac: [u8; 6],
    /// The device's cap on the page lists it keeps, all objects together: 2^n bytes (0: not
    /// stated, a device before the cap).
    pub log2_max_page_list_bytes: u8,
    /// The cap on REG_MR page lists one QP holds for WQEs not yet executed: 2^n bytes.
    pub log2_max_qp_reg_mr_list_bytes: u8,
    pub netdev_mtu: u32,
    /// `ibv_port_state`: 4 = ACTIVE.
    pub port_state: u8,
    /// `ibv_mtu` (1 = 256 … 5 = 4096).
    pub active_mtu: u8,
    pub max_mtu: u8,
    pub phys_port_cnt: u8,
    pub gid_tbl_len: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub max_ah: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_inline: u32,
    pub max_mw: u32,
    pub max_registered_bytes: u64,
    /// `ib_device_cap_flags` the device implements.
    pub device_cap_flags: u64,
}

/// Control request header (device-readable, first 16 bytes of every control request).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtrlHdr {
    pub opcode: u32,
    /// Must be 0.
    pub flags: u32,
    /// Echoed in the response.
    pub seq: u64,
}

/// Response header (device-writable, first 16 bytes of every response).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespHdr {
    pub status: u32,
    /// Byte length of the response struct that follows (0 on error).
    pub len: u32,
    pub seq: u64,
}

/// Control opcodes.
pub mod op {
    pub const QUERY_DEVICE: u32 = 1;
    pub const QUERY_PORT: u32 = 2;
    pub const CREATE_PD: u32 = 3;
    pub const DESTROY_PD: u32 = 4;
    pub const CREATE_CQ: u32 = 5;
    pub const RESIZE_CQ: u32 = 6;
    pub const DESTROY_CQ: u32 = 7;
    pub const CREATE_QP: u32 = 8;
    pub const MODIFY_QP: u32 = 9;
    pub const QUERY_QP: u32 = 10;
    pub const DESTROY_QP: u32 = 11;
    pub const CREATE_SRQ: u32 = 12;
    pub const MODIFY_SRQ: u32 = 13;
    pub const QUERY_SRQ: u32 = 14;
    pub const DESTROY_SRQ: u32 = 15;
    pub const REG_USER_MR: u32 = 16;
    pub const REG_DMA_MR: u32 = 17;
    pub const ALLOC_MR: u32 = 18;
    pub const DEREG_MR: u32 = 19;
    pub const ALLOC_MW: u32 = 20;
    pub const DEALLOC_MW: u32 = 21;
    pub const CREATE_AH: u32 = 22;
    pub const DESTROY_AH: u32 = 23;
    pub const ADD_GID: u32 = 24;
    pub const DEL_GID: u32 = 25;
    pub const ATTACH_MCAST: u32 = 26;
    pub const DETACH_MCAST: u32 = 27;
    /// Resets the device: every object is destroyed, every ring forgotten.
    pub const RESET: u32 = 28;
    /// Binds a type 1 memory window (`ibv_bind_mw`) outside any send queue.
    pub const BIND_MW: u32 = 29;
    /// The GIDs the transport can send from (caps GID_SOURCES).
    pub const QUERY_GID_SOURCES: u32 = 30;
    /// Moves an SRQ to a new ring with a new max_wr (caps SRQ_RESIZE).
    pub const RESIZE_SRQ: u32 = 31;
    /// The port's counters (caps HW_STATS): [`super::RespQueryStats`].
    pub const QUERY_STATS: u32 = 32;
    /// Maps, unmaps or fails pages of an on-demand-paging MR (caps ODP): [`super::CmdUpdateOdp`].
    pub const UPDATE_ODP: u32 = 33;
    /// Changes a user MR in place, its keys kept (caps REREG_MR): [`super::CmdReregMr`].
    pub const REREG_MR: u32 = 34;
    /// Allocates an XRC domain (caps XRC): [`super::Handle`] answers its number.
    pub const ALLOC_XRCD: u32 = 35;
    /// Frees an XRC domain ([`super::Handle`]); BUSY while an XRC SRQ or TGT QP is in it.
    pub const DEALLOC_XRCD: u32 = 36;
    /// Creates an XRC SRQ (caps XRC): [`super::CmdCreateXrcSrq`].
    pub const CREATE_XRC_SRQ: u32 = 37;
    /// Steers the frames a [`super::FlowMatch`] matches to a raw packet QP (caps RAW_PACKET):
    /// [`super::CmdCreateFlow`], answered with a [`super::Handle`].
    pub const CREATE_FLOW: u32 = 38;
    /// Removes a flow ([`super::Handle`]).
    pub const DESTROY_FLOW: u32 = 39;
    /// Makes a raw packet QP with no ring an RSS QP (caps RSS): [`super::CmdSetRss`].
    pub const SET_RSS: u32 = 40;
}

/// QUERY_STATS' counters, in this order: Linux rxe's hw counters of the same names (what
/// the guest's `rdma statistic` shows). A later device may add more at the end.
pub mod stat {
    /// Packets sent (`sent_pkts`).
    pub const SENT_PKTS: usize = 0;
    /// Packets received (`rcvd_pkts`).
    pub const RCVD_PKTS: usize = 1;
    /// Requests with a PSN before the expected one (`duplicate_request`).
    pub const DUP_REQ: usize = 2;
    /// PSN sequence errors NAKed (`out_of_seq_request`).
    pub const OUT_OF_SEQ_REQ: usize = 3;
    /// RNR NAKs received (`rcvd_rnr_err`).
    pub const RCV_RNR: usize = 4;
    /// RNR NAKs sent (`send_rnr_err`).
    pub const SND_RNR: usize = 5;
    /// PSN sequence error NAKs received (`rcvd_seq_err`).
    pub const RCV_SEQ_ERR: usize = 6;
    /// Work requests failed with RETRY_EXC_ERR (`retry_exceeded_err`).
    pub const RETRY_EXCEEDED: usize = 7;
    /// Work requests failed with RNR_RETRY_EXC_ERR (`retry_rnr_exceeded_err`).
    pub const RNR_RETRY_EXCEEDED: usize = 8;
    /// Retries after a timeout or a sequence NAK (`completer_retry_err`).
    pub const COMP_RETRY: usize = 9;
    /// Times the port went DOWN (`link_downed`).
    pub const LINK_DOWNED: usize = 10;
    /// How many this device fills.
    pub const COUNT: usize = 11;
}

/// Room for counters in QUERY_STATS' response.
pub const MAX_STATS: usize = 16;

/// QUERY_STATS response: `count` counters of [`stat`], the rest zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespQueryStats {
    pub count: u32,
    pub reserved: u32,
    pub values: [u64; MAX_STATS],
}

/// Response status codes.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    /// EINVAL: a field is out of range or inconsistent.
    Invalid = 1,
    /// ENOMEM: a device limit is reached.
    NoMemory = 2,
    /// ENOENT: no such object.
    NotFound = 3,
    /// EBUSY: the object is still in use.
    Busy = 4,
    /// EPERM: not allowed (access flags, PD mismatch).
    Permission = 5,
    /// The object is in a state that forbids the command (QP state machine).
    BadState = 6,
    /// EOPNOTSUPP: unknown opcode or unsupported feature.
    Unsupported = 7,
    /// EFAULT: a guest-physical address or page list lies outside guest memory.
    BadAddress = 8,
    /// The request itself is malformed (too short, non-zero flags, no room for the response).
    BadRequest = 9,
    /// EADDRNOTAVAIL: ADD_GID of a GID the transport cannot send from.
    AddressNotAvailable = 10,
}

impl Status {
    pub fn from_u32(v: u32) -> Option<Status> {
        use Status::*;
        Some(match v {
            0 => Ok,
            1 => Invalid,
            2 => NoMemory,
            3 => NotFound,
            4 => Busy,
            5 => Permission,
            6 => BadState,
            7 => Unsupported,
            8 => BadAddress,
            9 => BadRequest,
            10 => AddressNotAvailable,
            _ => return None,
        })
    }
}

/// A guest-physical page list.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageListDesc {
    /// GPA of the first (top-level) array of little-endian u64 GPAs.
    pub gpa: u64,
    /// Number of data pages.
    pub num_pages: u32,
    /// log2 of the data page size (12..=30).
    pub page_shift: u8,
    /// 0: `gpa` is the array of data-page GPAs (contiguous, `num_pages` entries);
    /// 1: `gpa` is an array of GPAs of 4 KiB list pages of 512 data-page GPAs each;
    /// 2: one more level of 4 KiB list pages.
    pub levels: u8,
    pub reserved: u16,
}

/// Where a ring (an `rxe_queue_buf`) lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDesc {
    pub pages: PageListDesc,
    /// Number of slots, a power of two; capacity is `num_slots - 1`.
    pub num_slots: u32,
    /// log2 of the slot size in bytes.
    pub log2_elem_size: u32,
    pub reserved: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdQueryPort {
    pub port_num: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespQueryPort {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: u32,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub pkey_tbl_len: u16,
    /// `IBV_LINK_LAYER_ETHERNET` = 2.
    pub link_layer: u8,
    /// 5 = LinkUp.
    pub phys_state: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub reserved: u16,
}

/// A bare object handle: DESTROY_PD/CQ/QP/SRQ/AH, DEREG_MR (lkey), DEALLOC_MW (rkey),
/// QUERY_SRQ, DEL_GID (index); and the CREATE_PD response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handle {
    pub handle: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdCreateCq {
    /// Requested capacity (>= 1, <= max_cqe, <= queue.num_slots - 1).
    pub cqe: u32,
    pub flags: u32,
    pub queue: QueueDesc,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespCreateCq {
    pub cqn: u32,
    /// Actual capacity: `queue.num_slots - 1`.
    pub cqe: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdResizeCq {
    pub cqn: u32,
    pub cqe: u32,
    pub queue: QueueDesc,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdResizeSrq {
    pub srqn: u32,
    pub max_wr: u32,
    pub queue: QueueDesc,
}

/// Kernel `ib_qp_type` values.
pub mod qp_type {
    pub const GSI: u32 = 1;
    pub const RC: u32 = 2;
    pub const UC: u32 = 3;
    pub const UD: u32 = 4;
    /// XRC initiator (kernel `IB_QPT_XRC_INI`): a send queue whose WQEs name the remote SRQ.
    pub const XRC_INI: u32 = 9;
    /// XRC target (kernel `IB_QPT_XRC_TGT`): no queue, PD or CQ; in the domain `xrcdn` names.
    pub const XRC_TGT: u32 = 10;
    /// Raw Ethernet frames (kernel `IB_QPT_RAW_PACKET`, caps RAW_PACKET).
    pub const RAW_PACKET: u32 = 8;
}

pub const CREATE_QP_HAS_SRQ: u32 = 1 << 0;
pub const CREATE_QP_SQ_SIG_ALL: u32 = 1 << 1;
/// The QP's rings are written by the guest kernel only (never mapped to user space): only
/// such QPs may post the kernel-only REG_MR work request.
pub const CREATE_QP_KERNEL: u32 = 1 << 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdCreateQp {
    pub qp_type: u32,
    pub pdn: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    pub srqn: u32,
    pub flags: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    /// The XRC domain of an XRC TGT QP; reserved (ignored) for the other types.
    pub xrcdn: u32,
    pub sq: QueueDesc,
    pub rq: QueueDesc,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespCreateQp {
    pub qpn: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub reserved: u64,
}

/// An address vector (the GRH fields RoCEv2 uses plus the next-hop MAC).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub dmac: [u8; 6],
    pub reserved0: u16,
    pub port_num: u8,
    pub static_rate: u8,
    pub reserved1: u16,
    pub reserved2: [u32; 3],
}

/// QP attributes: the MODIFY_QP command, the QUERY_QP response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttrs {
    pub qpn: u32,
    /// `ibv_qp_attr_mask` bits (MODIFY_QP); all valid bits in a QUERY_QP response.
    pub attr_mask: u32,
    /// `ibv_qp_state` (RESET 0 … ERR 6).
    pub qp_state: u32,
    pub cur_qp_state: u32,
    /// `ibv_mtu` (1..=5).
    pub path_mtu: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub reserved0: u8,
    pub reserved1: u32,
    pub ah: AhAttr,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub reserved2: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdCreateSrq {
    pub pdn: u32,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    pub queue: QueueDesc,
}

/// What a flow matches ([`CmdCreateFlow`]): each field compared under its mask (all-zero mask:
/// any value), the layers `layers` names required. Multi-byte fields are in network order,
/// as on the wire; IPv4 addresses are the first 4 bytes of the 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowMatch {
    /// [`flow_layer`] bits: the frame must be IPv4 or IPv6, TCP or UDP.
    pub layers: u32,
    pub dst_mac: [u8; 6],
    pub dst_mac_mask: [u8; 6],
    pub src_mac: [u8; 6],
    pub src_mac_mask: [u8; 6],
    /// The EtherType after any VLAN tag.
    pub ether_type: [u8; 2],
    pub ether_type_mask: [u8; 2],
    /// The VLAN tag's TCI (a frame without a tag has TCI 0).
    pub vlan_tci: [u8; 2],
    pub vlan_tci_mask: [u8; 2],
    pub src_ip: [u8; 16],
    pub src_ip_mask: [u8; 16],
    pub dst_ip: [u8; 16],
    pub dst_ip_mask: [u8; 16],
    /// IPv4 protocol or IPv6 next header.
    pub ip_proto: u8,
    pub ip_proto_mask: u8,
    pub reserved0: [u8; 2],
    pub src_port: [u8; 2],
    pub src_port_mask: [u8; 2],
    pub dst_port: [u8; 2],
    pub dst_port_mask: [u8; 2],
    pub reserved1: [u32; 2],
}

/// [`FlowMatch::layers`] bits.
pub mod flow_layer {
    pub const IPV4: u32 = 1 << 0;
    pub const IPV6: u32 = 1 << 1;
    pub const TCP: u32 = 1 << 2;
    pub const UDP: u32 = 1 << 3;
}

/// CREATE_FLOW: frames matching `m` go to raw packet QP `qpn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdCreateFlow {
    pub qpn: u32,
    /// Must be 0.
    pub flags: u32,
    pub m: FlowMatch,
}

/// [`CmdSetRss::fields`] bits: what the Toeplitz hash reads, in this order (libibverbs'
/// `IBV_RX_HASH_*` values).
pub mod rss_field {
    pub const SRC_IPV4: u32 = 1 << 0;
    pub const DST_IPV4: u32 = 1 << 1;
    pub const SRC_IPV6: u32 = 1 << 2;
    pub const DST_IPV6: u32 = 1 << 3;
    pub const SRC_PORT_TCP: u32 = 1 << 4;
    pub const DST_PORT_TCP: u32 = 1 << 5;
    pub const SRC_PORT_UDP: u32 = 1 << 6;
    pub const DST_PORT_UDP: u32 = 1 << 7;
}

/// The entries of an RSS indirection table at most.
pub const RSS_MAX_TABLE: usize = 256;

/// SET_RSS: frames steered to raw packet QP `qpn` (which has no ring) go to
/// `table[hash & (2^log_table_size - 1)]`, each a raw packet QP with a receive ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdSetRss {
    pub qpn: u32,
    /// [`rss_field`] bits.
    pub fields: u32,
    /// 0 … 8.
    pub log_table_size: u32,
    /// Bytes of `key` in use: 40.
    pub key_len: u32,
    pub key: [u8; 40],
    pub table: [u32; RSS_MAX_TABLE],
}

impl Default for CmdSetRss {
    fn default() -> Self {
        CmdSetRss {
            qpn: 0,
            fields: 0,
            log_table_size: 0,
            key_len: 0,
            key: [0; 40],
            table: [0; RSS_MAX_TABLE],
        }
    }
}

/// CREATE_XRC_SRQ: an SRQ for the XRC TGT QPs of domain `xrcdn`; its receive completions go
/// to CQ `cqn`, and the R_Keys of requests naming it are checked against `srq.pdn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdCreateXrcSrq {
    pub srq: CmdCreateSrq,
    pub xrcdn: u32,
    pub cqn: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespCreateSrq {
    pub srqn: u32,
    pub max_wr: u32,
    pub max_sge: u32,
    pub reserved: u32,
}

/// `ibv_srq_attr_mask`.
pub const SRQ_ATTR_MAX_WR: u32 = 1;
pub const SRQ_ATTR_LIMIT: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdModifySrq {
    pub srqn: u32,
    pub attr_mask: u32,
    pub max_wr: u32,
    pub srq_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespQuerySrq {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdRegUserMr {
    pub pdn: u32,
    /// `ibv_access_flags`.
    pub access: u32,
    pub iova: u64,
    pub length: u64,
    pub pages: PageListDesc,
    /// Where the MR's first byte lies in the first page of `pages` (< the page size); the
    /// IOVA may be anything. Absent from the 40-byte form of the command: then it is
    /// `iova mod page`.
    pub page_offset: u32,
    pub reserved: u32,
}

/// REREG_MR: the user MR `lkey` gets, with flags PD, PD `pdn`; with ACCESS, access `access`;
/// with TRANS, IOVA `iova`, length `length` and the pages `pages` with `page_offset` (as
/// REG_USER_MR's). What no flag names stays; the keys stay. Answers [`RespMr`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdReregMr {
    pub lkey: u32,
    pub flags: u32,
    pub pdn: u32,
    pub access: u32,
    pub iova: u64,
    pub length: u64,
    pub pages: PageListDesc,
    pub page_offset: u32,
    pub reserved: u32,
}

/// [`CmdReregMr`]'s flags (the kernel's `IB_MR_REREG_*`).
pub mod rereg {
    pub const TRANS: u32 = 1 << 0;
    pub const PD: u32 = 1 << 1;
    pub const ACCESS: u32 = 1 << 2;
}

/// `IBV_ACCESS_ON_DEMAND`: REG_USER_MR makes an on-demand-paging MR (caps ODP).
pub const ACCESS_ON_DEMAND: u32 = 1 << 6;

/// UPDATE_ODP: pages `first_page … first_page+count` of the on-demand-paging MR `lkey` (its
/// table has an entry per 4 KiB from the page its first byte lies in) are mapped to the
/// 4 KiB pages of `pages` (read-only, or writable with flags WRITABLE), or with flags UNMAP
/// not mapped, or with flags FAILED failed (the driver could not map them: accesses fail).
/// `pages` is empty (num_pages 0) unless mapping.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdUpdateOdp {
    pub lkey: u32,
    pub flags: u32,
    pub first_page: u64,
    pub count: u64,
    pub pages: PageListDesc,
}

/// [`CmdUpdateOdp`]'s flags.
pub mod odp {
    pub const UNMAP: u32 = 1 << 0;
    pub const FAILED: u32 = 1 << 1;
    /// The pages mapped may be written.
    pub const WRITABLE: u32 = 1 << 2;
    /// PAGE_FAULT events' `event`: the access writes (map the page writable).
    pub const FAULT_WRITE: u32 = 1 << 0;
    /// PAGE_FAULT events' `event` bits 8..31: bits 32..55 of the page (an implicit MR's
    /// pages run to 2^52; `reserved` holds the low 32 bits).
    pub const FAULT_PAGE_HI_SHIFT: u32 = 8;
}

/// Size of RegUserMr before `page_offset` (drivers written before it send this many bytes).
pub const REG_USER_MR_SHORT: usize = 40;

impl CmdRegUserMr {
    /// Reads the command in its 48-byte form, or its 40-byte form (then `None` for the page
    /// offset: the device takes `iova mod page`). Shorter: `None`.
    pub fn read(bytes: &[u8]) -> Option<(CmdRegUserMr, Option<u32>)> {
        if let Some(c) = read_struct::<CmdRegUserMr>(bytes) {
            return Some((c, Some(c.page_offset)));
        }
        let head = bytes.get(..REG_USER_MR_SHORT)?;
        let mut c = CmdRegUserMr::default();
        c.as_mut_slice()[..REG_USER_MR_SHORT].copy_from_slice(head);
        Some((c, None))
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespMr {
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdRegDmaMr {
    pub pdn: u32,
    pub access: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdAllocMr {
    pub pdn: u32,
    pub max_num_sg: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdAllocMw {
    pub pdn: u32,
    /// 1 or 2.
    pub mw_type: u32,
}

/// BIND_MW (type 1 windows): the QP names the PD the bind is checked against.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdBindMw {
    pub qpn: u32,
    /// The window's current rkey (from ALLOC_MW or the previous bind).
    pub mw_rkey: u32,
    pub mr_lkey: u32,
    /// `ibv_access_flags` of the window.
    pub access: u32,
    pub addr: u64,
    pub length: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdCreateAh {
    pub pdn: u32,
    pub reserved: u32,
    pub attr: AhAttr,
}

/// Access bits the device ignores wherever it takes `ibv_access_flags` (as rxe does):
/// `IB_ACCESS_HUGETLB` (1 << 7) and the optional range, bits 20..=28
/// (`IB_UVERBS_ACCESS_OPTIONAL_RANGE`, e.g. `IBV_ACCESS_RELAXED_ORDERING`, which perftest sets),
/// which ib_uverbs passes through to the driver. They are hints for hardware.
pub const ACCESS_IGNORED: u32 = (1 << 7) | (((1 << 29) - 1) & !((1 << 20) - 1));

/// `ib_device_cap_flags` bits of the config space's `device_cap_flags` (§3).
pub mod dev_cap {
    pub const RC_RNR_NAK_GEN: u64 = 1 << 12;
    pub const MEM_WINDOW: u64 = 1 << 17;
    pub const MEM_MGT_EXTENSIONS: u64 = 1 << 21;
    pub const MEM_WINDOW_TYPE_2B: u64 = 1 << 24;
    /// RDMA FLUSH of placement type global, and MRs with `IBV_ACCESS_FLUSH_GLOBAL`
    /// (`IB_UVERBS_DEVICE_FLUSH_GLOBAL`).
    pub const FLUSH_GLOBAL: u64 = 1 << 38;
    /// FLUSH of placement type persistent (`IB_UVERBS_DEVICE_FLUSH_PERSISTENT`), as rxe
    /// states it: with no persistent memory an MR cannot get `IBV_ACCESS_FLUSH_PERSISTENT`
    /// (INVALID, rxe's EINVAL) and such a FLUSH fails with a remote access error.
    pub const FLUSH_PERSISTENT: u64 = 1 << 39;
}

/// Kernel `ib_gid_type`: only RoCEv2 is supported.
pub const GID_TYPE_ROCE_UDP_ENCAP: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdAddGid {
    pub index: u32,
    pub gid_type: u32,
    pub gid: [u8; 16],
}

/// Most GIDs QUERY_GID_SOURCES returns.
pub const MAX_GID_SOURCES: usize = 4;

/// QUERY_GID_SOURCES response: the GIDs (IPv4-mapped for IPv4) the transport sends from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespGidSources {
    pub count: u32,
    pub reserved: u32,
    pub gids: [[u8; 16]; MAX_GID_SOURCES],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdMcast {
    pub qpn: u32,
    pub reserved: u32,
    pub gid: [u8; 16],
}

/// A doorbell (vq 1): one or more of these fill the device-readable buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Doorbell {
    pub kind: u32,
    /// QPN (SQ, RQ), SRQN (SRQ) or CQN (CQ).
    pub object: u32,
    /// The producer index the driver just published (a hint; the device reads the ring).
    pub index: u32,
    pub reserved: u32,
}

pub mod doorbell {
    pub const SQ: u32 = 1;
    pub const RQ: u32 = 2;
    pub const SRQ: u32 = 3;
    /// The driver consumed CQEs after an overflow-free stall, or armed the CQ: re-check.
    pub const CQ: u32 = 4;
}

/// An event (vq 2): the device writes one into each device-writable buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub kind: u32,
    /// `ibv_event_type` for ASYNC events, 0 for COMPLETION.
    pub event: u32,
    /// CQN, QPN, SRQN or port number.
    pub object: u32,
    pub reserved: u32,
}

pub mod event {
    pub const KIND_COMPLETION: u32 = 1;
    pub const KIND_ASYNC: u32 = 2;
    /// Events were dropped (the device's pending queue was full): the driver treats every
    /// armed CQ as fired and every QP, CQ and SRQ as possibly in error (re-query).
    pub const KIND_EVENTS_LOST: u32 = 3;
    /// A page of an on-demand-paging MR is needed (caps ODP): `event` bit 0 a write,
    /// `object` the MR's lkey, `reserved` the page's index in its table.
    pub const KIND_PAGE_FAULT: u32 = 4;
    // `ibv_event_type` values.
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const QP_REQ_ERR: u32 = 2;
    pub const QP_ACCESS_ERR: u32 = 3;
    pub const COMM_EST: u32 = 4;
    pub const SQ_DRAINED: u32 = 5;
    pub const DEVICE_FATAL: u32 = 8;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
}

// ------------------------------------------------------------------------------------------
// The Linux rxe user ABI (include/uapi/rdma/rdma_user_rxe.h, ib_user_verbs.h).

/// `struct rxe_queue_buf` header offsets.
pub mod ring {
    pub const LOG2_ELEM_SIZE: u64 = 0;
    pub const INDEX_MASK: u64 = 4;
    /// CQ rings only: the arm word (inside rxe's `pad_1`, never touched by librxe).
    pub const CQ_NOTIFY: u64 = 64;
    pub const PRODUCER_INDEX: u64 = 128;
    pub const CONSUMER_INDEX: u64 = 256;
    pub const DATA: u64 = 384;
    pub const NOTIFY_NEXT_COMP: u32 = 1;
    pub const NOTIFY_SOLICITED: u32 = 2;
}

/// `struct rxe_send_wqe` offsets (sizeof = 208; SGEs or inline data follow at 208).
pub mod swqe {
    pub const WR_ID: usize = 0;
    /// `reserved` in rxe's `struct rxe_send_wr`: the remote XRC SRQ on an XRC INI QP (the
    /// XRCETH's SRQN; ignored on other QPs).
    pub const XRC_SRQN: usize = 8;
    pub const OPCODE: usize = 12;
    pub const SEND_FLAGS: usize = 16;
    /// `ex.imm_data` (big-endian bytes) or `ex.invalidate_rkey`.
    pub const EX: usize = 20;
    pub const RDMA_REMOTE_ADDR: usize = 24;
    pub const RDMA_RKEY: usize = 32;
    pub const ATOMIC_REMOTE_ADDR: usize = 24;
    pub const ATOMIC_COMPARE_ADD: usize = 32;
    pub const ATOMIC_SWAP: usize = 40;
    pub const ATOMIC_RKEY: usize = 48;
    pub const UD_REMOTE_QPN: usize = 24;
    pub const UD_REMOTE_QKEY: usize = 28;
    pub const UD_PKEY_INDEX: usize = 32;
    pub const UD_AH_NUM: usize = 36;
    /// `struct rxe_av` (88 bytes).
    pub const UD_AV: usize = 56;
    pub const MW_ADDR: usize = 24;
    pub const MW_LENGTH: usize = 32;
    pub const MW_MR_LKEY: usize = 40;
    pub const MW_MW_RKEY: usize = 44;
    pub const MW_RKEY: usize = 48;
    pub const MW_ACCESS: usize = 52;
    /// RDMA FLUSH (`wr.flush`): `u64 remote_addr`, `u32 length`, `u32 rkey`, `u8 type`
    /// (placement type bits), `u8 level` (selectivity). librxe leaves `length` 0 and puts the
    /// length in `dma.length` (and `dma.resid`), which is what rxe sends: the device reads
    /// that one.
    pub const FLUSH_REMOTE_ADDR: usize = 24;
    pub const FLUSH_LENGTH: usize = 32;
    pub const FLUSH_RKEY: usize = 36;
    pub const FLUSH_TYPE: usize = 40;
    pub const FLUSH_LEVEL: usize = 41;
    /// Fast registration (our kernel-only `wr.reg` layout, see the doc).
    pub const REG_IOVA: usize = 24;
    pub const REG_LENGTH: usize = 32;
    pub const REG_MR_LKEY: usize = 40;
    pub const REG_KEY: usize = 44;
    pub const REG_ACCESS: usize = 48;
    pub const REG_PAGE_SHIFT: usize = 52;
    pub const REG_LEVELS: usize = 53;
    /// `u8`: [`super::reg_flags`]; byte 55 is reserved.
    pub const REG_FLAGS: usize = 54;
    pub const REG_PAGE_LIST: usize = 56;
    pub const REG_NUM_PAGES: usize = 64;
    /// `u32`: where the MR's first byte lies in the first page, with
    /// [`super::reg_flags::PAGE_OFFSET`].
    pub const REG_PAGE_OFFSET: usize = 68;
    pub const STATUS: usize = 144;
    pub const STATE: usize = 148;
    pub const IOVA: usize = 152;
    pub const DMA_LENGTH: usize = 184;
    pub const DMA_RESID: usize = 188;
    pub const DMA_CUR_SGE: usize = 192;
    pub const DMA_NUM_SGE: usize = 196;
    pub const DMA_SGE_OFFSET: usize = 200;
    pub const DMA_DATA: usize = 208;
    pub const SIZE: usize = 208;
}

/// `struct rxe_av` offsets.
pub mod av {
    pub const PORT_NUM: usize = 0;
    pub const NETWORK_TYPE: usize = 1;
    pub const DMAC: usize = 2;
    pub const DGID: usize = 8;
    pub const FLOW_LABEL: usize = 24;
    pub const SGID_INDEX: usize = 28;
    pub const HOP_LIMIT: usize = 29;
    pub const TRAFFIC_CLASS: usize = 30;
    pub const SIZE: usize = 88;
}

/// `struct rxe_recv_wqe` offsets (sizeof = 40; SGEs follow at 40).
pub mod rwqe {
    pub const WR_ID: usize = 0;
    pub const DMA_LENGTH: usize = 16;
    pub const DMA_NUM_SGE: usize = 28;
    pub const DMA_SGE: usize = 40;
    pub const SIZE: usize = 40;
}

/// `struct rxe_sge` / `ib_sge` (16 bytes): addr u64, length u32, lkey u32.
pub const SGE_SIZE: usize = 16;

/// Flags of the REG_MR work request (byte `swqe::REG_FLAGS`).
pub mod reg_flags {
    /// `swqe::REG_PAGE_OFFSET` holds the offset of the MR's first byte in the first page;
    /// without it the offset is `iova mod page`.
    pub const PAGE_OFFSET: u8 = 1 << 0;
}

/// `ibv_wr_opcode` values (plus the kernel-only REG_MR).
pub mod wr_op {
    pub const RDMA_WRITE: u32 = 0;
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    pub const SEND: u32 = 2;
    pub const SEND_WITH_IMM: u32 = 3;
    pub const RDMA_READ: u32 = 4;
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    pub const LOCAL_INV: u32 = 7;
    pub const BIND_MW: u32 = 8;
    pub const SEND_WITH_INV: u32 = 9;
    pub const FLUSH: u32 = 14;
    pub const ATOMIC_WRITE: u32 = 15;
    /// Kernel `IB_WR_REG_MR`.
    pub const REG_MR: u32 = 0x20;
}

/// `struct ib_uverbs_wc` (48 bytes), the CQ ring entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UverbsWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (big-endian bytes, as on the wire) or `invalidate_rkey`.
    pub ex: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    pub port_num: u8,
    pub reserved: u8,
}

/// Minimum slot sizes.
pub const CQE_SIZE: usize = 48;

byte_valued! {
    RespQueryStats = 136,
    RespGidSources = 72,
    ConfigSpace = 128,
    CtrlHdr = 16,
    RespHdr = 16,
    PageListDesc = 16,
    QueueDesc = 32,
    CmdQueryPort = 8,
    RespQueryPort = 32,
    Handle = 8,
    CmdCreateCq = 40,
    RespCreateCq = 8,
    CmdResizeCq = 40,
    CmdResizeSrq = 40,
    CmdCreateQp = 112,
    RespCreateQp = 32,
    AhAttr = 48,
    QpAttrs = 128,
    CmdCreateSrq = 48,
    CmdCreateXrcSrq = 56,
    FlowMatch = 120,
    CmdCreateFlow = 128,
    CmdSetRss = 1080,
    RespCreateSrq = 16,
    CmdModifySrq = 16,
    RespQuerySrq = 16,
    CmdRegUserMr = 48,
    CmdUpdateOdp = 40,
    CmdReregMr = 56,
    RespMr = 8,
    CmdRegDmaMr = 8,
    CmdAllocMr = 8,
    CmdAllocMw = 8,
    CmdBindMw = 32,
    CmdCreateAh = 56,
    CmdAddGid = 24,
    CmdMcast = 24,
    Doorbell = 16,
    Event = 16,
    UverbsWc = 48,
}

/// Reads a `ByteValued` struct from the front of `bytes`; `None` if too short.
pub fn read_struct<T: ByteValued + Default>(bytes: &[u8]) -> Option<T> {
    let mut v = T::default();
    let n = size_of::<T>();
    v.as_mut_slice().copy_from_slice(bytes.get(..n)?);
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// Offsets the doc tables name, checked here so the doc and the code cannot drift.
    #[test]
    fn offsets_match_the_doc() {
        assert_eq!(offset_of!(ConfigSpace, log2_max_page_list_bytes), 14);
        assert_eq!(offset_of!(ConfigSpace, log2_max_qp_reg_mr_list_bytes), 15);
        assert_eq!(offset_of!(ConfigSpace, netdev_mtu), 16);
        assert_eq!(offset_of!(ConfigSpace, gid_tbl_len), 24);
        assert_eq!(offset_of!(ConfigSpace, max_mr_size), 56);
        assert_eq!(offset_of!(ConfigSpace, max_qp_rd_atom), 72);
        assert_eq!(offset_of!(ConfigSpace, max_registered_bytes), 112);
        assert_eq!(offset_of!(ConfigSpace, device_cap_flags), 120);
        assert_eq!(offset_of!(CmdCreateQp, sq), 48);
        assert_eq!(offset_of!(CmdCreateQp, rq), 80);
        assert_eq!(offset_of!(QpAttrs, pkey_index), 40);
        assert_eq!(offset_of!(QpAttrs, rnr_retry), 50);
        assert_eq!(offset_of!(QpAttrs, ah), 56);
        assert_eq!(offset_of!(QpAttrs, max_send_wr), 104);
        assert_eq!(offset_of!(AhAttr, dmac), 24);
        assert_eq!(offset_of!(UverbsWc, ex), 24);
        assert_eq!(offset_of!(UverbsWc, port_num), 46);
        assert_eq!(offset_of!(CmdRegUserMr, pages), 24);
        assert_eq!(offset_of!(CmdRegUserMr, page_offset), REG_USER_MR_SHORT);
        assert_eq!(offset_of!(CmdCreateCq, queue), 8);
    }
}
