//! Queue pairs: the per-QP state the requester, responder and completer share, and the IBTA
//! state machine with per-transition attribute validation (IBTA 10.3, table 91; the same table
//! as the kernel's `ib_modify_qp_is_ok`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::shared::{Cq, Srq};

use crate::types::{Instant, Psn, Qpn};
use crate::verbs::*;
// Also named `rxe_core::qp::VerbError`, where the verbs on a QP return it.
pub use crate::verbs::VerbError;
use crate::wire::Opcode;

/// The most unacknowledged PSNs a requester keeps in flight (rxe's `RXE_MAX_UNACKED_PSNS`).
pub const MAX_UNACKED_PSNS: i32 = 128;
/// The requester sets AckReq at least this often (rxe's `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Device-wide cap on max_rd_atomic / max_dest_rd_atomic.
pub const MAX_RD_ATOMIC: u8 = 128;
/// The largest message (`max_msg_sz`, IBTA C9-94's 2^31): a longer DMA length in a request
/// is an invalid request; it also keeps a READ's PSN span (at most 2^23 packets at MTU 256)
/// inside the 2^24 PSN space.
pub const MAX_MSG_SZ: u32 = 1 << 31;
/// The most responses a responder keeps waiting to go out. Each responder resource holds at
/// most one (its answer or its latest replay) and ACKs coalesce, so a requester that keeps to
/// the protocol stays far below it; beyond it a response is dropped (counted in
/// `responses_dropped`) and the requester's retry asks again.
pub const MAX_RESP_OUT: usize = 2 * MAX_RD_ATOMIC as usize + 16;
/// The Q_Key of the GSI QP.
pub const GSI_QKEY: u32 = 0x8001_0000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum WqeState {
    /// Not yet started by the requester.
    Posted,
    /// Some or all packets sent, waiting for the response/ACK.
    Pending,
    /// Finished; waits for the completer to reach it in order.
    Done(WcStatus),
}

#[derive(Clone, Debug)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    pub state: WqeState,
    pub first_psn: Psn,
    pub last_psn: Psn,
    pub len: u32,
    pub signaled: bool,
    /// For READ: bytes of response data placed so far.
    pub read_done: u32,
    /// The opcode its completion reports.
    pub wc_opcode: WcOpcode,
}

impl SendWqe {
    /// A work request finished as it was posted (it sends no packet): its completion waits
    /// only for the WQEs before it.
    pub(crate) fn done(
        wr_id: u64,
        opcode: WcOpcode,
        status: WcStatus,
        len: u32,
        signaled: bool,
    ) -> Self {
        SendWqe {
            wr: SendWr::new(wr_id, SendOp::Send, Vec::new()),
            state: WqeState::Done(status),
            first_psn: Psn::default(),
            last_psn: Psn::default(),
            len,
            signaled,
            read_done: 0,
            wc_opcode: opcode,
        }
    }
}

/// What the responder has queued for transmission.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RespOut {
    Ack {
        psn: Psn,
        syndrome: u8,
    },
    /// READ response packets for `[va, va+len)`, starting at PSN `psn`, `offset` bytes in.
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        /// The PD the R_Key is checked in (an XRC TGT's changes with each request).
        pd: u32,
        len: u32,
        offset: u32,
        first: bool,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
    },
    /// Zero-length READ_RESPONSE_ONLY acknowledging FLUSH and ATOMIC_WRITE.
    EmptyReadResp {
        psn: Psn,
    },
}

/// A responder resource (IBTA 9.7.5.1.2): what a duplicate READ or atomic is answered from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Resource {
    Read {
        first_psn: Psn,
        last_psn: Psn,
        va: u64,
        rkey: u32,
        pd: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
    /// FLUSH / ATOMIC_WRITE: a replay is the same empty READ response.
    Empty {
        psn: Psn,
    },
}

/// Requester progress through the send queue.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReqState {
    /// Sequence number (not index) of the next WQE the requester works on.
    pub cur: u64,
    /// Bytes of that WQE already sent.
    pub offset: u32,
    /// PSN of the next packet to send (behind `max_psn` while resending).
    pub psn: Psn,
    /// The PSN the next new message starts at: one past everything ever sent.
    pub max_psn: Psn,
    pub noack_pkts: u32,
    /// Outstanding READ/atomic requests.
    pub rd_atomic: u32,
    /// Waiting for the RNR timer.
    pub rnr_until: Option<Instant>,
    /// Stopped at a page of an on-demand-paging MR not mapped: sends nothing until
    /// [`crate::Device::odp_wake`].
    pub odp_wait: bool,
    /// What stopped it was a READ response or atomic ACK that could not be placed: on
    /// waking, the requester asks again from the oldest PSN not acknowledged.
    pub odp_retry: bool,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub psn: Psn,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub retrans_at: Option<Instant>,
    /// A READ response out of sequence already sent the requester back: later ones of the
    /// same burst must not restart it again (rxe's `started_retry`). Cleared on progress.
    pub started_retry: bool,
    /// The PSN the responder last refused with an RNR NAK, until something is acknowledged:
    /// a sequence NAK for the same PSN is that responder reporting the same gap.
    pub rnr_psn: Option<Psn>,
}

/// A multi-packet message being received.
#[derive(Clone, Debug)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        va: u64,
        rkey: u32,
        resid: u64,
        total: u64,
    },
}

#[derive(Clone, Debug, Default)]
pub(crate) struct RespState {
    pub psn: Psn,
    pub msn: u32,
    pub sent_psn_nak: bool,
    pub in_msg: Option<InMsg>,
    /// Last opcode of a message in progress, for the opcode-sequence check.
    pub last_op: Option<Opcode>,
    /// UC: drop packets until the next first/only.
    pub drop_msg: bool,
    pub resources: VecDeque<Resource>,
    /// Responses waiting to go out, each with the MSN it carries (the MSN as of the request
    /// it answers, as rxe sends it).
    pub out: VecDeque<(RespOut, u32)>,
    pub comm_est: bool,
    /// A NAK that moves the QP to ERR once sent is queued.
    pub goto_error: bool,
    /// XRC TGT: the request being handled names no XRC SRQ of the QP's domain (or another
    /// than its message's); the walk refuses it as an invalid request.
    pub xrc_bad: bool,
    /// The READ response at the head of `out` needs a page of an on-demand-paging MR not
    /// mapped: nothing goes out until [`crate::Device::odp_wake`].
    pub odp_wait: bool,
}

/// Per-QP counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCounters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub retransmits: u64,
    pub timeouts: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub duplicates: u64,
    pub dropped: u64,
    pub errors: u64,
    /// Responses (ACK, NAK, READ response, atomic ACK) dropped because their PSN is not
    /// before the next PSN the requester would send: they answer something never sent.
    pub ghost_responses: u64,
    /// Responses the responder dropped because [`MAX_RESP_OUT`] were already waiting.
    pub responses_dropped: u64,
    // What Linux rxe counts per device (its hw counters), counted here per QP as rxe does.
    /// Requests with a PSN before the expected one (rxe `duplicate_request`).
    pub duplicate_requests: u64,
    /// PSN sequence errors the responder NAKed, once per gap (rxe `out_of_seq_request`).
    pub out_of_seq_requests: u64,
    /// PSN sequence error NAKs received (rxe `rcvd_seq_err`).
    pub seq_naks_received: u64,
    /// Retries the requester started after a timeout or a sequence NAK (rxe
    /// `completer_retry_err`).
    pub completer_retries: u64,
    /// WQEs failed with RETRY_EXC_ERR (rxe `retry_exceeded_err`).
    pub retry_exceeded: u64,
    /// WQEs failed with RNR_RETRY_EXC_ERR (rxe `retry_rnr_exceeded_err`).
    pub rnr_retry_exceeded: u64,
}

impl QpCounters {
    /// Adds `o` in (the counters of QPs gone, kept for the device's totals).
    pub fn add(&mut self, o: &QpCounters) {
        let QpCounters {
            tx_packets,
            tx_bytes,
            rx_packets,
            rx_bytes,
            retransmits,
            timeouts,
            naks_sent,
            naks_received,
            rnr_naks_sent,
            rnr_naks_received,
            duplicates,
            dropped,
            errors,
            ghost_responses,
            responses_dropped,
            duplicate_requests,
            out_of_seq_requests,
            seq_naks_received,
            completer_retries,
            retry_exceeded,
            rnr_retry_exceeded,
        } = o;
        self.tx_packets += tx_packets;
        self.tx_bytes += tx_bytes;
        self.rx_packets += rx_packets;
        self.rx_bytes += rx_bytes;
        self.retransmits += retransmits;
        self.timeouts += timeouts;
        self.naks_sent += naks_sent;
        self.naks_received += naks_received;
        self.rnr_naks_sent += rnr_naks_sent;
        self.rnr_naks_received += rnr_naks_received;
        self.duplicates += duplicates;
        self.dropped += dropped;
        self.errors += errors;
        self.ghost_responses += ghost_responses;
        self.responses_dropped += responses_dropped;
        self.duplicate_requests += duplicate_requests;
        self.out_of_seq_requests += out_of_seq_requests;
        self.seq_naks_received += seq_naks_received;
        self.completer_retries += completer_retries;
        self.retry_exceeded += retry_exceeded;
        self.rnr_retry_exceeded += rnr_retry_exceeded;
    }
}

#[derive(Debug)]
pub struct Qp {
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    /// The XRC domain of an XRC TGT QP. Such a QP has no PD, CQ or SRQ of its own: `pd`,
    /// `recv_cq`, `srq` and the receive CQ are those of the XRC SRQ its request names
    /// (`xrc.rs`), 0 (no object) before the first.
    pub xrcd: Option<u32>,
    /// The send and the receive CQ themselves (they outlive the QP: a CQ in use cannot be
    /// destroyed), so a completion takes only the CQ's own lock.
    pub(crate) cq_objs: [Arc<Mutex<Cq>>; 2],
    pub(crate) srq_obj: Option<Arc<Mutex<Srq>>>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    pub attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    /// Sequence number of `sq[0]`.
    pub(crate) sq_head: u64,
    /// Bytes of REG_MR page lists held by WQEs in `sq` (not yet moved into their MR).
    pub(crate) reg_mr_list_bytes: u64,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) req: ReqState,
    pub(crate) comp: CompState,
    pub(crate) resp: RespState,
    pub(crate) scheduled: bool,
    /// Time of this QP's live entry in the device's timer queue (`timers.rs`).
    pub(crate) timer_queued: Option<Instant>,
    pub(crate) drained_notified: bool,
    pub counters: QpCounters,
    pub mcast: Vec<crate::types::Gid>,
}

use AttrMask as M;

/// Required and optional attributes for a transition, by QP type (`[rc, uc, ud, xrc_ini,
/// xrc_tgt]`, the columns of the kernel's `qp_state_table`: XRC INI is RC without the
/// responder's attributes, XRC TGT RC without the requester's).
fn transition(cur: QpState, next: QpState, t: QpType) -> Option<(u32, u32)> {
    use QpState::*;
    let ti = match t {
        QpType::Rc => 0,
        QpType::Uc => 1,
        QpType::Ud | QpType::Gsi => 2,
        QpType::XrcIni => 3,
        QpType::XrcTgt => 4,
        // The kernel's RAW_PACKET column: RESET to INIT needs the port, nothing else is
        // required or taken.
        QpType::RawPacket => return raw_transition(cur, next),
    };
    let pick = |v: [u32; 5]| v[ti];
    let init = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    let ud_init = M::PKEY_INDEX | M::PORT | M::QKEY;
    let rtr_uc = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rtr_rc = rtr_uc | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    let rtr_opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
    let rts_rc = M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    let rts_opt_uc = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
    let rts_opt_rc = rts_opt_uc | M::MIN_RNR_TIMER;
    let sqd_uc = M::PKEY_INDEX | M::AV | M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS;
    let sqd_uc = sqd_uc | M::PORT | M::PATH_MIG_STATE;
    let sqd_ini = sqd_uc | M::MAX_QP_RD_ATOMIC | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY;
    let sqd_tgt = sqd_uc | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER | M::TIMEOUT;
    let r = match (cur, next) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) => (pick([init, init, ud_init, init, init]), 0),
        (Init, Init) => (0, pick([init, init, ud_init, init, init])),
        (Init, Rtr) => (
            pick([rtr_rc, rtr_uc, 0, rtr_uc, rtr_rc]),
            pick([rtr_opt, rtr_opt, M::PKEY_INDEX | M::QKEY, rtr_opt, rtr_opt]),
        ),
        (Rtr, Rts) => (
            pick([rts_rc, M::SQ_PSN, M::SQ_PSN, rts_rc, M::SQ_PSN | M::TIMEOUT]),
            pick([
                rts_opt_rc,
                rts_opt_uc,
                M::CUR_STATE | M::QKEY,
                rts_opt_uc,
                rts_opt_rc,
            ]),
        ),
        (Rts, Rts) | (Sqd, Rts) => (
            0,
            pick([
                rts_opt_rc,
                rts_opt_uc,
                M::CUR_STATE | M::QKEY,
                rts_opt_uc,
                rts_opt_rc,
            ]),
        ),
        (Rts, Sqd) => (0, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => (
            0,
            pick([
                sqd_ini | sqd_tgt,
                sqd_uc,
                M::PKEY_INDEX | M::QKEY,
                sqd_ini,
                sqd_tgt,
            ]),
        ),
        (Sqe, Rts) if !t.is_reliable() => {
            (0, M::CUR_STATE | pick([0, M::ACCESS_FLAGS, M::QKEY, 0, 0]))
        }
        _ => return None,
    };
    Some(r)
}

/// [`transition`] for raw packet QPs.
fn raw_transition(cur: QpState, next: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    match (cur, next) {
        (_, Reset) | (_, Err) => Some((0, 0)),
        (Reset, Init) => Some((M::PORT, 0)),
        (Init, Init) => Some((0, M::PORT)),
        (Init, Rtr) | (Rtr, Rts) | (Rts, Rts) => Some((0, 0)),
        _ => None,
    }
}

impl Qp {
    pub(crate) fn new(
        qpn: Qpn,
        init: &crate::shared::QpInit,
        cq_objs: [Arc<Mutex<Cq>>; 2],
        srq_obj: Option<Arc<Mutex<Srq>>>,
    ) -> Self {
        let cap = init.cap;
        let (pd, send_cq, recv_cq) = match init.qp_type {
            QpType::XrcTgt => (0, 0, 0),
            QpType::XrcIni => (init.pd, init.send_cq, init.send_cq),
            _ => (init.pd, init.send_cq, init.recv_cq),
        };
        Qp {
            qpn,
            qp_type: init.qp_type,
            pd,
            send_cq,
            recv_cq,
            srq: init.srq,
            xrcd: init.xrcd,
            cq_objs,
            srq_obj,
            cap,
            sq_sig_all: init.sq_sig_all,
            attr: QpAttr::default(),
            // Grown as WQEs are posted (an idle QP holds none): QP create/destroy churn keeps
            // the daemon's live heap flat (tests/guest/tests/soak.rs); its resident set moves
            // with the allocator's reuse of freed pages (docs/daemon.md, "Memory").
            sq: VecDeque::new(),
            sq_head: 0,
            reg_mr_list_bytes: 0,
            rq: VecDeque::new(),
            req: ReqState::default(),
            comp: CompState::default(),
            resp: RespState::default(),
            scheduled: false,
            timer_queued: None,
            drained_notified: false,
            counters: QpCounters::default(),
            mcast: Vec::new(),
        }
    }

    pub fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    pub(crate) fn is_connected(&self) -> bool {
        matches!(
            self.qp_type,
            QpType::Rc | QpType::Uc | QpType::XrcIni | QpType::XrcTgt
        )
    }

    /// Checks a modify request against the transition table and value limits. `gid_ok` says
    /// whether an sgid index names a GID; `port_mtu` bounds path MTU.
    pub(crate) fn check_modify(
        &self,
        attr: &QpAttr,
        mask: AttrMask,
        port_mtu: Mtu,
        gid_ok: &dyn Fn(u8) -> bool,
    ) -> Result<QpState, VerbError> {
        let cur = self.attr.qp_state;
        if mask.has(M::CUR_STATE) && attr.cur_qp_state != cur {
            return Err(VerbError::Invalid);
        }
        let next = if mask.has(M::STATE) {
            attr.qp_state
        } else {
            cur
        };
        let (req, opt) = transition(cur, next, self.qp_type).ok_or(VerbError::Invalid)?;
        let given = mask.0 & !(M::STATE | M::CUR_STATE);
        let allowed = req | opt | M::CUR_STATE | M::RATE_LIMIT;
        if given & req != req || given & !allowed != 0 {
            return Err(VerbError::Invalid);
        }
        if mask.has(M::PATH_MTU) && attr.path_mtu > port_mtu {
            return Err(VerbError::Invalid);
        }
        if mask.has(M::PORT) && attr.port_num != 1 {
            return Err(VerbError::Invalid);
        }
        if mask.has(M::PKEY_INDEX) && attr.pkey_index != 0 {
            return Err(VerbError::Invalid);
        }
        if (mask.has(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > MAX_RD_ATOMIC)
            || (mask.has(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > MAX_RD_ATOMIC)
            || (mask.has(M::TIMEOUT) && attr.timeout > 31)
            || (mask.has(M::RETRY_CNT) && attr.retry_cnt > 7)
            || (mask.has(M::RNR_RETRY) && attr.rnr_retry > 7)
            || (mask.has(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31)
            || (mask.has(M::DEST_QPN) && attr.dest_qp_num > 0xff_ffff)
            || (mask.has(M::ACCESS_FLAGS) && attr.qp_access_flags.0 & !Access::ALL.0 != 0)
        {
            return Err(VerbError::Invalid);
        }
        if mask.has(M::AV) && !gid_ok(attr.av.sgid_index) {
            return Err(VerbError::Invalid);
        }
        Ok(next)
    }

    /// Applies checked attributes. State side effects (flush, reset) are the device's job.
    pub(crate) fn apply_attrs(&mut self, attr: &QpAttr, mask: AttrMask) {
        let a = &mut self.attr;
        if mask.has(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.has(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.has(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.has(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.has(M::AV) {
            a.av = attr.av;
        }
        if mask.has(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.has(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.has(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.comp.retry_cnt = attr.retry_cnt;
        }
        if mask.has(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.comp.rnr_retry = attr.rnr_retry;
        }
        if mask.has(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0xff_ffff;
            self.resp.psn = Psn::new(attr.rq_psn);
        }
        if mask.has(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0xff_ffff;
            self.req.psn = Psn::new(attr.sq_psn);
            self.req.max_psn = Psn::new(attr.sq_psn);
            self.comp.psn = Psn::new(attr.sq_psn);
        }
        if mask.has(M::MAX_QP_RD_ATOMIC) {
            // rxe rounds up to a power of two.
            a.max_rd_atomic = (attr.max_rd_atomic as u32)
                .next_power_of_two()
                .min(MAX_RD_ATOMIC as u32) as u8;
            if attr.max_rd_atomic == 0 {
                a.max_rd_atomic = 0;
            }
        }
        if mask.has(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = (attr.max_dest_rd_atomic as u32)
                .next_power_of_two()
                .min(MAX_RD_ATOMIC as u32) as u8;
            if attr.max_dest_rd_atomic == 0 {
                a.max_dest_rd_atomic = 0;
            }
        }
        if mask.has(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.has(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.has(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if self.qp_type == QpType::Gsi {
            a.qkey = GSI_QKEY;
        }
    }

    /// Back to a fresh QP (the transition to RESET): queues emptied without completions.
    pub(crate) fn reset(&mut self) {
        self.sq.clear();
        self.sq_head = 0;
        self.reg_mr_list_bytes = 0;
        self.rq.clear();
        self.req = ReqState::default();
        self.comp = CompState::default();
        self.resp = RespState::default();
        let keep = (self.attr.port_num, self.attr.qkey);
        self.attr = QpAttr {
            port_num: keep.0,
            ..QpAttr::default()
        };
        if self.qp_type == QpType::Gsi {
            self.attr.qkey = GSI_QKEY;
        }
    }

    pub(crate) fn wqe(&self, seq: u64) -> Option<&SendWqe> {
        self.sq.get(seq.checked_sub(self.sq_head)? as usize)
    }
    pub(crate) fn wqe_mut(&mut self, seq: u64) -> Option<&mut SendWqe> {
        self.sq.get_mut(seq.checked_sub(self.sq_head)? as usize)
    }
    pub(crate) fn sq_tail(&self) -> u64 {
        self.sq_head + self.sq.len() as u64
    }

    /// Rewinds the requester to resend from `psn` (go-back-N): the oldest WQE in flight whose PSN
    /// range reaches `psn` is resent from the packet carrying it.
    pub(crate) fn retry_from(&mut self, psn: Psn) {
        let mtu = self.mtu();
        let mut seq = self.sq_head;
        let found = loop {
            if seq > self.req.cur {
                break None;
            }
            match self.wqe(seq) {
                None => break None,
                Some(w) if w.state == WqeState::Pending && !w.last_psn.before(psn) => {
                    break Some(seq)
                }
                Some(_) => seq += 1,
            }
        };
        let Some(seq) = found else { return };
        let w = self.wqe(seq).expect("found above");
        let skip = psn.diff(w.first_psn).max(0) as u32;
        let offset = match w.wr.op {
            SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInv(_)
            | SendOp::Write { .. }
            | SendOp::WriteWithImm { .. } => (skip * mtu).min(w.len.saturating_sub(1) / mtu * mtu),
            _ => 0,
        };
        let at = w.first_psn.add(offset / mtu);
        self.req.cur = seq;
        self.req.offset = offset;
        self.req.psn = at;
        self.req.noack_pkts = 0;
        self.req.rd_atomic = 0;
        self.counters.retransmits += 1;
    }
}

/// IBTA table 45: the RNR NAK timer field in nanoseconds.
pub fn rnr_timer_ns(t: u8) -> u64 {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760,
        327680, 491520,
    ];
    US[(t & 31) as usize] * 1000
}

/// Local ACK timeout: 4.096 µs × 2^t; 0 means no timer.
pub fn ack_timeout_ns(t: u8) -> Option<u64> {
    (t != 0).then(|| 4096u64 << t.min(31))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qp(t: QpType) -> Qp {
        let init = crate::shared::QpInit {
            qp_type: t,
            pd: 1,
            send_cq: 1,
            recv_cq: 1,
            srq: None,
            xrcd: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        let cq = Arc::new(Mutex::new(crate::shared::Cq::default()));
        Qp::new(Qpn(0x11), &init, [cq.clone(), cq], None)
    }

    #[test]
    fn transitions_require_the_right_attributes() {
        let q = qp(QpType::Rc);
        let ok = |_| true;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            ..Default::default()
        };
        // RESET -> INIT needs pkey index, port and access flags on RC.
        assert_eq!(
            q.check_modify(
                &a,
                AttrMask(M::STATE | M::PKEY_INDEX | M::PORT),
                Mtu::M1024,
                &ok
            ),
            Err(VerbError::Invalid)
        );
        assert_eq!(
            q.check_modify(
                &a,
                AttrMask(M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
                Mtu::M1024,
                &ok
            ),
            Ok(QpState::Init)
        );
        // QKEY is not an RC attribute.
        assert!(q
            .check_modify(
                &a,
                AttrMask(M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS | M::QKEY),
                Mtu::M1024,
                &ok
            )
            .is_err());
        // RESET -> RTR skips a state.
        a.qp_state = QpState::Rtr;
        assert!(q
            .check_modify(&a, AttrMask(M::STATE), Mtu::M1024, &ok)
            .is_err());
        // Anything -> ERR and -> RESET.
        a.qp_state = QpState::Err;
        assert_eq!(
            q.check_modify(&a, AttrMask(M::STATE), Mtu::M1024, &ok),
            Ok(QpState::Err)
        );
        let u = qp(QpType::Ud);
        a.qp_state = QpState::Init;
        assert!(u
            .check_modify(
                &a,
                AttrMask(M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY),
                Mtu::M1024,
                &ok
            )
            .is_ok());
        // Values out of range.
        let mut q = qp(QpType::Rc);
        q.attr.qp_state = QpState::Init;
        let mut a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::M4096,
            ..Default::default()
        };
        let rtr = AttrMask(
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        );
        assert!(q.check_modify(&a, rtr, Mtu::M1024, &ok).is_err());
        a.path_mtu = Mtu::M1024;
        assert!(q.check_modify(&a, rtr, Mtu::M1024, &ok).is_ok());
        assert!(q.check_modify(&a, rtr, Mtu::M1024, &|_| false).is_err());
        a.max_dest_rd_atomic = 129;
        assert!(q.check_modify(&a, rtr, Mtu::M1024, &ok).is_err());
    }

    #[test]
    fn timers() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(4096 << 14));
    }
}
