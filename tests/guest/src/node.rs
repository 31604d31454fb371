//! Two-node setups: a daemon with its test guest ([`Node`]) and connected QP pairs.

use std::net::SocketAddr;
use std::path::Path;

use rxe_core::verbs::*;
use rxe_core::Gid;

use crate::daemon::Daemon;
use crate::driver::{Guest, GuestOpts};
use crate::error::Result;
use crate::rings::{Cq, Qp};

/// One node: a daemon and the test guest attached to it, with GID 0 set to its address.
pub struct Node {
    pub daemon: Daemon,
    pub guest: Guest,
    pub gid: Gid,
    /// The MAC peers put in their address vectors for this node (what the raw transport
    /// sends frames to; zero for the udp transport, which has no use for it).
    pub mac: [u8; 6],
}

impl Node {
    pub fn start(bin: &Path, addr: SocketAddr, extra: &[&str]) -> Result<Node> {
        Self::start_on(bin, addr, extra, None)
    }

    /// As [`Node::start`], with the daemon restricted to `cpus`.
    pub fn start_on(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> Result<Node> {
        Self::start_with(bin, addr, extra, cpus, GuestOpts::default())
    }

    /// As [`Node::start_on`], with the guest's options (memory size, queues).
    pub fn start_with(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
        opts: GuestOpts,
    ) -> Result<Node> {
        let daemon = Daemon::spawn_on(bin, addr, extra, cpus)?;
        Self::attach(daemon, opts)
    }

    /// A test guest on `daemon`'s socket, with the daemon's address as GID 0.
    fn attach(daemon: Daemon, opts: GuestOpts) -> Result<Node> {
        let mut guest = Guest::connect(&daemon.socket, opts)?;
        let gid = Gid::from_ip(daemon.addr.ip());
        guest.add_gid(0, gid)?;
        Ok(Node {
            daemon,
            guest,
            gid,
            mac: [0; 6],
        })
    }

    /// Two nodes on one daemon process serving two devices ([`Daemon::spawn_two`]).
    pub fn start_two(
        bin: &Path,
        a: SocketAddr,
        b: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> Result<(Node, Node)> {
        let (da, db) = Daemon::spawn_two(bin, a, b, extra, cpus)?;
        Ok((
            Self::attach(da, GuestOpts::default())?,
            Self::attach(db, GuestOpts::default())?,
        ))
    }
}

/// Where a UD send goes: the QP `qpn` with Q_Key `qkey` at `dgid` (source GID index 0, hop
/// limit 64).
pub fn ud_dest(dgid: Gid, qpn: u32, qkey: u32) -> UdDest {
    UdDest {
        av: Av {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            ..Default::default()
        },
        remote_qpn: rxe_core::Qpn(qpn),
        remote_qkey: qkey,
    }
}

/// What [`connect_qps`] builds on one side.
pub struct End {
    pub pd: u32,
    pub cq: Cq,
    pub qp: Qp,
}

/// Connection options.
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub cap: QpCap,
    pub cqe: u32,
    pub access: Access,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            qp_type: QpType::Rc,
            mtu: Mtu::M1024,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            cqe: 1023,
            access: Access::LOCAL_WRITE.union(Access::REMOTE),
            // 268 ms (4.096 µs × 2^16), seven retries: a test fails on RETRY_EXC_ERR only when
            // a daemon made no progress for about 1.9 s, not when a loaded machine kept it
            // off the CPU for 120 ms (with 2^12: one failure in a full run under load). Tests
            // of retry exhaustion set their own.
            timeout: 16,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
        }
    }
}

/// Moves a QP through INIT → RTR → RTS towards `(dgid, dqpn)`, the way ibv_rc_pingpong does.
pub fn bring_up(g: &mut Guest, qp: &Qp, dgid: Gid, dqpn: u32, o: &ConnOpts) -> Result<()> {
    bring_up_l2(g, qp, dgid, [0; 6], dqpn, o)
}

/// As [`bring_up`], with the destination MAC the driver resolved for `dgid` in the address
/// vector (the raw transport puts it on the frames).
pub fn bring_up_l2(
    g: &mut Guest,
    qp: &Qp,
    dgid: Gid,
    dmac: [u8; 6],
    dqpn: u32,
    o: &ConnOpts,
) -> Result<()> {
    let ud = matches!(qp.qp_type, QpType::Ud | QpType::Gsi);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: o.access,
        qkey: 0x1111_1111,
        ..Default::default()
    };
    let m = AttrMask::STATE
        | AttrMask::PKEY_INDEX
        | AttrMask::PORT
        | if ud {
            AttrMask::QKEY
        } else {
            AttrMask::ACCESS_FLAGS
        };
    g.modify_qp(qp, &a, m)?;
    a.qp_state = QpState::Rtr;
    let mut m = AttrMask::STATE;
    if !ud {
        a.path_mtu = o.mtu;
        a.dest_qp_num = dqpn;
        a.rq_psn = 0x100;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = o.min_rnr_timer;
        a.av = Av {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            dmac,
            ..Default::default()
        };
        m |= AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        // An XRC INI QP has no responder, an XRC TGT QP no requester (the kernel's
        // qp_state_table columns).
        if qp.qp_type.is_rc_responder() {
            m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
    }
    g.modify_qp(qp, &a, m)?;
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x100;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = 16;
    let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
    if qp.qp_type.is_rc_requester() {
        m |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    } else if qp.qp_type == QpType::XrcTgt {
        m |= AttrMask::TIMEOUT;
    }
    g.modify_qp(qp, &a, m)
}

/// Creates a PD, a CQ and a QP on each node and connects the QPs (each address vector with
/// the other node's MAC).
pub fn connect_qps(a: &mut Node, b: &mut Node, o: &ConnOpts) -> Result<(End, End)> {
    let mk = |n: &mut Node| -> Result<End> {
        let pd = n.guest.alloc_pd()?;
        let cq = n.guest.create_cq(o.cqe)?;
        let qp = n.guest.create_qp(o.qp_type, pd, &cq, &cq, None, o.cap)?;
        Ok(End { pd, cq, qp })
    };
    let ea = mk(a)?;
    let eb = mk(b)?;
    bring_up_l2(&mut a.guest, &ea.qp, b.gid, b.mac, eb.qp.qpn, o)?;
    bring_up_l2(&mut b.guest, &eb.qp, a.gid, a.mac, ea.qp.qpn, o)?;
    Ok((ea, eb))
}
