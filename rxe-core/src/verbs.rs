//! The verbs-level types the engine takes and returns: work requests, completions, QP
//! attributes. Numeric values follow libibverbs / the kernel uverbs ABI where one exists, so the
//! backend can pass them through.

use crate::types::{Gid, Qpn};

/// Access flags (`ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct Access(pub u32);

impl Access {
    pub const LOCAL_WRITE: Access = Access(1);
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    pub const REMOTE_READ: Access = Access(1 << 2);
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    pub const MW_BIND: Access = Access(1 << 4);
    pub const ZERO_BASED: Access = Access(1 << 5);
    pub const ON_DEMAND: Access = Access(1 << 6);
    /// The target of FLUSHes of placement type [`flush::GLOBAL`] (IBTA 1.5).
    pub const FLUSH_GLOBAL: Access = Access(1 << 8);
    /// The target of FLUSHes of placement type [`flush::PERSISTENT`]. No memory behind an MR
    /// is persistent memory to the engine, so `reg_mr` refuses it (rxe refuses it for pages
    /// that are not pmem).
    pub const FLUSH_PERSISTENT: Access = Access(1 << 9);
    pub const REMOTE: Access =
        Access(Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0);
    pub const ALL: Access = Access(0x37f);

    #[inline]
    pub const fn contains(self, o: Access) -> bool {
        self.0 & o.0 == o.0
    }
    #[inline]
    pub const fn union(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
    /// The rights a FLUSH of placement type `placement` (FETH bits 3:0) needs, on the QP and
    /// on the memory: as rxe reads the field, bits other than GLOBAL and PERSISTENT ask for
    /// nothing.
    pub const fn for_flush(placement: u8) -> Access {
        let mut a = 0;
        if placement & flush::GLOBAL != 0 {
            a |= Self::FLUSH_GLOBAL.0;
        }
        if placement & flush::PERSISTENT != 0 {
            a |= Self::FLUSH_PERSISTENT.0;
        }
        Access(a)
    }
}

/// The two fields of a FLUSH's FETH (IBTA 1.5 Memory Placement Extensions; the values of
/// `ibv_placement_type` and `ibv_selectivity_level`).
pub mod flush {
    /// Placement type: make the data visible to every later reader.
    pub const GLOBAL: u8 = 1 << 0;
    /// Placement type: make the data persistent.
    pub const PERSISTENT: u8 = 1 << 1;
    /// Selectivity level: the RETH's range.
    pub const RANGE: u8 = 0;
    /// Selectivity level: the whole memory region the R_Key names (the RETH's address and
    /// length are not looked at).
    pub const MR: u8 = 1;
}

/// A scatter/gather element.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A scatter/gather list. Up to [`SgList::INLINE`] elements live in place, so a work request
/// with one or two SGEs (nearly all of them) costs no allocation on the data path; longer
/// lists go to the heap. Reads as a slice.
#[derive(Clone)]
pub struct SgList(SgRepr);

#[derive(Clone)]
enum SgRepr {
    Inline(u8, [Sge; SgList::INLINE]),
    Heap(Vec<Sge>),
}

impl SgList {
    /// Elements kept in place.
    pub const INLINE: usize = 2;

    pub const fn new() -> Self {
        SgList(SgRepr::Inline(
            0,
            [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; SgList::INLINE],
        ))
    }

    pub fn push(&mut self, sge: Sge) {
        match &mut self.0 {
            SgRepr::Inline(n, a) if (*n as usize) < SgList::INLINE => {
                a[*n as usize] = sge;
                *n += 1;
            }
            SgRepr::Inline(n, a) => {
                let mut v = Vec::with_capacity(*n as usize + 1);
                v.extend_from_slice(&a[..*n as usize]);
                v.push(sge);
                self.0 = SgRepr::Heap(v);
            }
            SgRepr::Heap(v) => v.push(sge),
        }
    }
}

impl Default for SgList {
    fn default() -> Self {
        SgList::new()
    }
}

impl std::ops::Deref for SgList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        match &self.0 {
            SgRepr::Inline(n, a) => &a[..*n as usize],
            SgRepr::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for SgList {
    fn deref_mut(&mut self) -> &mut [Sge] {
        match &mut self.0 {
            SgRepr::Inline(n, a) => &mut a[..*n as usize],
            SgRepr::Heap(v) => v,
        }
    }
}

impl PartialEq for SgList {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SgList {}

impl std::fmt::Debug for SgList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<Sge> for SgList {
    fn from_iter<I: IntoIterator<Item = Sge>>(it: I) -> Self {
        let mut l = SgList::new();
        for s in it {
            l.push(s);
        }
        l
    }
}

impl From<Vec<Sge>> for SgList {
    fn from(v: Vec<Sge>) -> Self {
        if v.len() <= SgList::INLINE {
            v.into_iter().collect()
        } else {
            SgList(SgRepr::Heap(v))
        }
    }
}

impl From<&[Sge]> for SgList {
    fn from(v: &[Sge]) -> Self {
        v.iter().copied().collect()
    }
}

impl<const N: usize> From<[Sge; N]> for SgList {
    fn from(v: [Sge; N]) -> Self {
        v.into_iter().collect()
    }
}

/// Work completion status (`ibv_wc_status`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

/// Work completion opcode (`ib_uverbs_wc_opcode`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    Tso = 7,
    Flush = 8,
    AtomicWrite = 9,
    RegMr = 10,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// Completion flags (`ibv_wc_flags`).
pub const WC_GRH: u32 = 1;
pub const WC_WITH_IMM: u32 = 2;
pub const WC_WITH_INV: u32 = 1 << 3;

/// A completion queue entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Cqe {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Immediate data (host order) or the invalidated rkey, per `wc_flags`.
    pub imm_or_inv: u32,
    pub qp_num: Qpn,
    pub src_qp: Qpn,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
    /// For UD receives over RoCEv2: 2 = IPv4, 3 = IPv6 network header (`rdma_network_type`).
    pub network_hdr_type: u8,
    /// A receive completion of a message sent with the solicited-event bit (for
    /// solicited-only CQ notification done outside the engine).
    pub solicited: bool,
}

impl Cqe {
    /// A completion with every optional field zero.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: Qpn) -> Self {
        Cqe {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_or_inv: 0,
            qp_num,
            src_qp: Qpn(0),
            wc_flags: 0,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            network_hdr_type: 0,
            solicited: false,
        }
    }
}

/// Send work request flags (`ibv_send_flags`).
pub const SEND_FENCE: u32 = 1;
pub const SEND_SIGNALED: u32 = 1 << 1;
pub const SEND_SOLICITED: u32 = 1 << 2;
pub const SEND_INLINE: u32 = 1 << 3;

/// An address vector: where a packet goes (RoCEv2: GIDs and the next-hop MAC).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Av {
    pub dgid: Gid,
    pub sgid_index: u8,
    pub flow_label: u32,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub dmac: [u8; 6],
}

/// The operation of a send work request, with its operands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SendOp {
    Send,
    SendWithImm(u32),
    SendWithInv(u32),
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    Read {
        remote_addr: u64,
        rkey: u32,
    },
    CompSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    /// 8 bytes from the first SGE (or inline) written atomically at the responder.
    AtomicWrite {
        remote_addr: u64,
        rkey: u32,
    },
    /// RDMA FLUSH (RC only): `selectivity` is a [`flush`] level, `placement` the type bits.
    /// Carries no data; the completion's `byte_len` is `len`, as rxe reports it.
    Flush {
        remote_addr: u64,
        rkey: u32,
        len: u32,
        selectivity: u8,
        placement: u8,
    },
    LocalInv {
        rkey: u32,
    },
    /// Fast registration of an MR allocated with `alloc_mr`: `iova … iova+length` mapped
    /// through `pages`, the first byte `page_offset` bytes into the first page (see
    /// [`crate::mem::Backing::Pages`]).
    RegMr {
        lkey: u32,
        key: u32,
        access: Access,
        iova: u64,
        length: u64,
        page_shift: u8,
        page_offset: u64,
        pages: Vec<u64>,
    },
    /// Bind a memory window to an MR range.
    BindMw {
        mw_rkey: u32,
        new_rkey: u32,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
    },
}

impl SendOp {
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::Flush { .. } => WcOpcode::Flush,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::RegMr { .. } => WcOpcode::RegMr,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
        }
    }
    /// Operations that wait for a response of their own (READ, the atomics, ATOMIC_WRITE and
    /// FLUSH): they take a slot of the `max_rd_atomic` window, and an ACK that skips one means
    /// its response was lost, so it is sent again (rxe exempts FLUSH from both; here it is
    /// treated as the READ it is acknowledged like).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. }
                | SendOp::CompSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
                | SendOp::Flush { .. }
        )
    }
    /// Bytes of page list the operation carries (a REG_MR's list, 8 bytes a page).
    pub fn page_list_bytes(&self) -> u64 {
        match self {
            SendOp::RegMr { pages, .. } => pages.len() as u64 * 8,
            _ => 0,
        }
    }
    pub fn is_local(&self) -> bool {
        matches!(
            self,
            SendOp::LocalInv { .. } | SendOp::RegMr { .. } | SendOp::BindMw { .. }
        )
    }
}

/// The UD destination of a send.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UdDest {
    pub av: Av,
    pub remote_qpn: Qpn,
    pub remote_qkey: u32,
}

/// A send work request.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: u32,
    pub sg_list: SgList,
    /// Inline payload (when `SEND_INLINE` is set the SGEs are not used).
    pub inline_data: Vec<u8>,
    pub ud: Option<UdDest>,
    /// XRC: the remote XRC SRQ the message goes to (its XRCETH). Required on an XRC INI QP,
    /// refused on every other.
    pub xrc_remote_srqn: Option<u32>,
}

impl SendWr {
    pub fn new(wr_id: u64, op: SendOp, sg_list: impl Into<SgList>) -> Self {
        SendWr {
            wr_id,
            op,
            flags: SEND_SIGNALED,
            sg_list: sg_list.into(),
            inline_data: Vec::new(),
            ud: None,
            xrc_remote_srqn: None,
        }
    }
}

/// A receive work request.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: SgList,
}

/// QP transport type.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
    /// The general services QP (QPN 1), a UD QP with Q_Key 0x80010000.
    Gsi,
    /// XRC initiator (IBTA annex A14): an RC requester alone (send queue and send CQ, no
    /// receive side); each message names the remote XRC SRQ it goes to.
    XrcIni,
    /// XRC target: an RC responder alone, created in an XRC domain; each request names the
    /// XRC SRQ (of that domain) whose receive WQEs, CQ and PD it uses.
    XrcTgt,
    /// Raw Ethernet frames (`IBV_QPT_RAW_PACKET`): no RoCE transport. The engine keeps the
    /// QP's state, PD, CQs and receive queue; each send is a whole frame the caller moves
    /// ([`crate::Device::raw_send`]), each frame the caller steers to the QP fills one receive
    /// ([`crate::Device::raw_receive`]).
    RawPacket,
}

impl QpType {
    /// Sends requests with RC's reliability: ACKs, NAKs, retries, READ and atomics (RC and
    /// XRC INI).
    pub const fn is_rc_requester(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcIni)
    }
    /// Takes requests with RC's reliability (RC and XRC TGT).
    pub const fn is_rc_responder(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcTgt)
    }
    /// RC or either side of XRC.
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcIni | QpType::XrcTgt)
    }
    /// XRC INI or XRC TGT.
    pub const fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcIni | QpType::XrcTgt)
    }
}

/// QP state (IBTA 10.3.1).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Err = 6,
}

/// Path MTU (`ibv_mtu`, 1 = 256 … 5 = 4096).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, PartialOrd, Ord)]
pub enum Mtu {
    M256 = 1,
    M512 = 2,
    M1024 = 3,
    M2048 = 4,
    M4096 = 5,
}

impl Mtu {
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    pub fn from_enum(v: u8) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }
    /// The largest IB MTU that fits a netdev MTU, as rxe picks it (netdev MTU − 80 for headers).
    pub fn for_netdev_mtu(mtu: u32) -> Mtu {
        let room = mtu.saturating_sub(80);
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
            .into_iter()
            .find(|m| m.bytes() <= room)
            .unwrap_or(Mtu::M256)
    }
}

/// Modify-QP attribute mask bits (`ibv_qp_attr_mask`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AttrMask(pub u32);

impl AttrMask {
    pub const STATE: u32 = 1;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const CAP: u32 = 1 << 19;
    pub const DEST_QPN: u32 = 1 << 20;
    pub const RATE_LIMIT: u32 = 1 << 25;

    pub const fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }
}

/// Attributes for `modify_qp` / returned by `query_qp`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: Access,
    pub av: Av,
    pub pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// Read-only: true while an SQD transition is still draining.
    pub sq_draining: bool,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::M256,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: Access(0),
            av: Av::default(),
            pkey_index: 0,
            en_sqd_async_notify: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            sq_draining: false,
        }
    }
}

/// Capacities of a QP's work queues.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// Asynchronous events (`ibv_event_type` subset).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AsyncEvent {
    /// A CQ that was armed received a completion.
    Completion {
        cqn: u32,
    },
    CqErr {
        cqn: u32,
    },
    QpFatal {
        qpn: Qpn,
    },
    QpReqErr {
        qpn: Qpn,
    },
    QpAccessErr {
        qpn: Qpn,
    },
    CommEst {
        qpn: Qpn,
    },
    SqDrained {
        qpn: Qpn,
    },
    QpLastWqeReached {
        qpn: Qpn,
    },
    SrqLimitReached {
        srqn: u32,
    },
}

/// A posted receive, as the responder takes it from the RQ or SRQ.
#[derive(Clone, Debug)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: SgList,
    pub len: u64,
}

/// Why a verb was refused (the backend maps these to status codes; `errno` names what rxe
/// returns).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum VerbError {
    /// EINVAL
    Invalid,
    /// ENOMEM / resource limit reached
    NoResources,
    /// ENOENT: no such object
    NotFound,
    /// EBUSY: object in use
    Busy,
    /// A QP in a state that forbids the operation.
    BadState,
}

impl core::fmt::Display for VerbError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            VerbError::Invalid => "invalid argument",
            VerbError::NoResources => "out of resources",
            VerbError::NotFound => "no such object",
            VerbError::Busy => "object in use",
            VerbError::BadState => "operation not allowed in this state",
        })
    }
}

impl std::error::Error for VerbError {}
