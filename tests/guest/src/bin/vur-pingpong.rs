//! `vur-pingpong`: `ibv_rc_pingpong`'s other end on a vhost-user-rdma daemon. A test guest
//! attached to the daemon's vhost-user socket makes the QP, and the out-of-band exchange and
//! the ping-pong loop are the tool's, so the unmodified tool (on Linux rxe, or on the device in
//! a VM) or another `vur-pingpong` is the other end. Every buffer that comes back is compared
//! byte for byte with what must be in it, which the tool does not do: every message carries a
//! payload of its own and the receive buffer is scrubbed after each check (as `rxe-peer` does:
//! [`vur_interop::pingpong::payload`], [`expected`], [`scrub_of`]), so a dropped or stale
//! segment shows in any iteration.
//!
//! ```text
//! vur-pingpong --socket /run/vur/rdma.sock --ip 10.80.0.2 --dmac 02:..:.. [--server 10.80.0.1]
//!     [-p 18515] [-s 4096] [-n 100] [-m 1024] [-r 100] [--timeout 60] [--stall 10] [--peer-is-ours]
//!     [--unsealed-ram]
//! ```
//! With `--server` we are the client of a tool listening there; without, we listen (port
//! `-p`) and the tool connects. `--dmac` is the peer's MAC for a daemon on a raw transport
//! (`--iface`), where the driver resolves neighbours (here: the caller); a udp daemon ignores
//! it. Prints the tool's style of result line; exits 1 on any error, completion error, data
//! mismatch, stall (`--stall` seconds without a completion) or timeout, 2 on bad usage.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rxe_core::verbs::*;
use rxe_core::Gid;
use vur_interop::oob::{self, Dest};
use vur_interop::pingpong::{expected, payload, scrub_of};
use vur_testguest::{Cq, Guest, GuestOpts, Mr, Qp};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

#[derive(Parser, Debug)]
#[command(about = "ibv_rc_pingpong's other end on a vhost-user-rdma daemon")]
struct Args {
    /// The daemon's vhost-user socket.
    #[arg(long)]
    socket: PathBuf,
    /// Our address: the device's GID 0.
    #[arg(long)]
    ip: IpAddr,
    /// The peer's MAC (raw transport), aa:bb:cc:dd:ee:ff.
    #[arg(long, value_parser = parse_mac)]
    dmac: Option<[u8; 6]>,
    /// The tool listens at this address: we are its client.
    #[arg(long)]
    server: Option<IpAddr>,
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    #[arg(short = 's', long, default_value_t = 4096)]
    size: u32,
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (the tool's -m).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    #[arg(short = 'r', long, default_value_t = 500)]
    rx_depth: u32,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Fail when nothing completes for this many seconds, saying what we wait for.
    #[arg(long, default_value_t = 10)]
    stall: u64,
    /// The other end is another vur-pingpong (it sends the same payloads from its first SEND;
    /// the tool echoes ours).
    #[arg(long)]
    peer_is_ours: bool,
    /// Guest RAM as a memfd without seals (a VMM that does not seal its memory, which a
    /// daemon with `--guest-memory dmabuf` must refuse).
    #[arg(long)]
    unsealed_ram: bool,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{s}: {e}"))?;
    v.try_into().map_err(|_| format!("{s}: want six bytes"))
}

fn mtu_of(m: u32) -> Option<Mtu> {
    Some(match m {
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        4096 => Mtu::M4096,
        _ => return None,
    })
}

fn main() -> ExitCode {
    let a = Args::parse();
    let Some(mtu) = mtu_of(a.mtu) else {
        eprintln!(
            "vur-pingpong: -m {}: want 256, 512, 1024, 2048 or 4096",
            a.mtu
        );
        return ExitCode::from(2);
    };
    if a.size == 0 || a.size > 1 << 24 || a.rx_depth == 0 || a.iters == 0 {
        eprintln!("vur-pingpong: -s 1..16 MiB, -r and -n at least 1");
        return ExitCode::from(2);
    }
    match run(&a, mtu) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vur-pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a failed command says: the step, then the device's answer.
fn e(what: &'static str) -> impl Fn(vur_testguest::Error) -> String {
    move |err| format!("{what}: {err}")
}

/// One side of the ping-pong: the QP, its CQ and one MR whose first half receives and whose
/// second half (from `half`) sends.
struct Side {
    g: Guest,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    recv: RecvWr,
    size: usize,
    half: usize,
}

fn run(a: &Args, mtu: Mtu) -> Result<(), String> {
    let mut side = open(a)?;
    let gid = Gid::from_ip(a.ip);
    let psn = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        ^ (side.qp.qpn << 8))
        & 0xff_ffff;
    let mine = Dest {
        lid: 0,
        qpn: side.qp.qpn,
        psn,
        gid,
    };
    let timeout = Duration::from_secs(a.timeout);
    let remote = match a.server {
        Some(ip) => {
            let r = oob::client_exchange(SocketAddr::new(ip, a.port), &mine, timeout)
                .map_err(|err| format!("exchange with {ip}:{}: {err}", a.port))?;
            connect(&mut side, a, mtu, psn, &r)?;
            r
        }
        None => {
            let listen = SocketAddr::new(IpAddr::from([0u8; 4]), a.port);
            let mut failed = None;
            let r = oob::server_exchange(listen, |r| {
                connect(&mut side, a, mtu, psn, r).map_err(|m| {
                    failed = Some(m.clone());
                    std::io::Error::other(m)
                })?;
                Ok(mine)
            })
            .map_err(|err| failed.unwrap_or_else(|| format!("exchange on {listen}: {err}")))?;
            r
        }
    };
    println!(
        "  local address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{psn:06x}, GID {}",
        side.qp.qpn, a.ip
    );
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}",
        remote.lid, remote.qpn, remote.psn
    );
    let start = Instant::now();
    let verified = ping_pong(a, &mut side, start + timeout)?;
    let secs = start.elapsed().as_secs_f64();
    let bytes = a.size as u64 * a.iters as u64 * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / secs / 1e6
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        a.iters,
        secs * 1e6 / a.iters as f64
    );
    println!("verified {verified} buffers byte for byte");
    Ok(())
}

/// Attaches to the device, makes the PD, CQ, MR and an RC QP in INIT, and posts the receives.
fn open(a: &Args) -> Result<Side, String> {
    let mut g = Guest::connect(
        &a.socket,
        GuestOpts {
            sealed_ram: !a.unsealed_ram,
            ..GuestOpts::default()
        },
    )
    .map_err(e("attach"))?;
    let gid = Gid::from_ip(a.ip);
    g.add_gid(0, gid).map_err(e("ADD_GID"))?;
    let pd = g.alloc_pd().map_err(e("ALLOC_PD"))?;
    let cq = g.create_cq(a.rx_depth + 1).map_err(e("CREATE_CQ"))?;
    let size = a.size as usize;
    // Receive and send buffers apart, so that what comes back can be checked.
    let half = size.next_multiple_of(4096);
    let mr = g
        .reg_mr(pd, 2 * half, Access::LOCAL_WRITE)
        .map_err(e("REG_MR"))?;
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: a.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = g
        .create_qp(QpType::Rc, pd, &cq, &cq, None, cap)
        .map_err(e("CREATE_QP"))?;
    let init = QpAttr {
        qp_state: QpState::Init,
        ..Default::default()
    };
    g.modify_qp(
        &qp,
        &init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .map_err(e("modify INIT"))?;
    let recv = RecvWr {
        wr_id: RECV_WRID,
        sg_list: vec![mr.sge(0, a.size)].into(),
    };
    // The receive buffer holds the complement of the first message before the receives are
    // posted: once they are, the daemon may place the peer's first SEND at any moment (a
    // scrub written after the exchange erased a first message that came early).
    let first = expected(1, size, a.server.is_some(), !a.peer_is_ours);
    mr.buf.write(0, &scrub_of(&first));
    for _ in 0..a.rx_depth {
        g.post_recv(&qp, &recv).map_err(e("post_recv"))?;
    }
    Ok(Side {
        g,
        cq,
        qp,
        mr,
        recv,
        size,
        half,
    })
}

/// Moves the QP to RTR and RTS towards the peer `r`, our first PSN `psn`.
fn connect(side: &mut Side, a: &Args, mtu: Mtu, psn: u32, r: &Dest) -> Result<(), String> {
    let mut at = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: r.qpn,
        rq_psn: r.psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        av: Av {
            dgid: r.gid,
            sgid_index: 0,
            hop_limit: 1,
            dmac: a.dmac.unwrap_or_default(),
            ..Default::default()
        },
        ..Default::default()
    };
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    side.g
        .modify_qp(&side.qp, &at, m)
        .map_err(e("modify RTR"))?;
    at.qp_state = QpState::Rts;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.sq_psn = psn;
    at.max_rd_atomic = 1;
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    side.g.modify_qp(&side.qp, &at, m).map_err(e("modify RTS"))
}

/// The exchange itself: `a.iters` SENDs each way, every received buffer checked; returns how
/// many were verified.
fn ping_pong(a: &Args, side: &mut Side, deadline: Instant) -> Result<u32, String> {
    let Side {
        g,
        cq,
        qp,
        mr,
        recv,
        size,
        half,
    } = side;
    let (size, half) = (*size, *half);
    let client = a.server.is_some();
    // Our n-th SEND carries payload(n); our n-th receive must hold expected(n), and the
    // receive buffer holds its complement before.
    let expect_at = |n: u32| expected(n, size, client, !a.peer_is_ours);
    mr.buf.write(half, &payload(1, size));
    let send = SendWr::new(SEND_WRID, SendOp::Send, vec![mr.sge(half, a.size)]);
    let (mut scnt, mut rcnt, mut verified) = (0u32, 0u32, 0u32);
    let mut pending = RECV_WRID;
    if client {
        g.post_send(qp, &send).map_err(e("post_send"))?;
        pending |= SEND_WRID;
    }
    let mut progress = Instant::now();
    while scnt < a.iters || rcnt < a.iters {
        let waiting = || {
            let mut w = Vec::new();
            if pending & SEND_WRID != 0 {
                w.push(format!("the completion (ACK) of our SEND #{}", scnt + 1));
            }
            if pending & RECV_WRID != 0 {
                w.push(format!("the peer's SEND #{}", rcnt + 1));
            }
            w.join(" and ")
        };
        if Instant::now() > deadline {
            return Err(format!(
                "timed out after {} s, {scnt} sends and {rcnt} receives; waiting for {}",
                a.timeout,
                waiting()
            ));
        }
        if progress.elapsed() > Duration::from_secs(a.stall) {
            return Err(format!(
                "stalled: nothing completed for {} s after {scnt} sends and {rcnt} receives; waiting for {}",
                a.stall,
                waiting()
            ));
        }
        let wcs = g.poll_cq(cq, 16);
        if wcs.is_empty() {
            std::thread::yield_now();
            continue;
        }
        progress = Instant::now();
        for c in wcs {
            if c.status != 0 {
                return Err(format!(
                    "completion error, status {} (ibv_wc_status) for wr_id {} after {scnt} sends and {rcnt} receives",
                    c.status, c.wr_id
                ));
            }
            match c.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    rcnt += 1;
                    if c.byte_len != a.size {
                        return Err(format!(
                            "iteration {rcnt}: received {} bytes, expected {}",
                            c.byte_len, a.size
                        ));
                    }
                    let expect = expect_at(rcnt);
                    let got = mr.buf.to_vec(0, size);
                    if got != expect {
                        let at = got.iter().zip(&expect).position(|(x, y)| x != y);
                        let at = at.unwrap_or(0);
                        return Err(format!(
                            "iteration {rcnt}: received data differs at byte {at} ({:#04x}, expected {:#04x}{})",
                            got[at],
                            expect[at],
                            if got[at] == !expect[at] { ": never placed" } else { "" }
                        ));
                    }
                    verified += 1;
                    // Before our next SEND, which the peer's next message answers.
                    mr.buf.write(0, &scrub_of(&expect_at(rcnt + 1)));
                    g.post_recv(qp, recv).map_err(e("post_recv"))?;
                }
                other => return Err(format!("completion for unknown wr_id {other}")),
            }
            pending &= !c.wr_id;
            if scnt < a.iters && pending == 0 {
                // The last SEND has completed: its buffer is ours again.
                mr.buf.write(half, &payload(scnt + 1, size));
                g.post_send(qp, &send).map_err(e("post_send"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(verified)
}
