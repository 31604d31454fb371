//! `vhost-user-rdma tap`: the command line, its validation, and the capture loop.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use thiserror::Error;

use crate::bpf::{
    Filter, KernelConfig, Record, Snap, Tap, DEFAULT_RING_BYTES, MAX_SNAPLEN, POLL_INTERVAL,
};
use crate::pcap::{Format, Frame, Writer};
use crate::roce::{describe, parse_aeth_kinds, parse_number, parse_opcode_classes, Summary};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Pcap,
    Pcapng,
}

/// Capture RoCEv2 frames with an eBPF program on tc ingress and egress (tcx, or clsact before Linux 6.6) of network interfaces.
///
/// Writes pcap or pcapng (--write FILE, or - for stdout: `| tshark -r -`) and prints a one-line
/// summary per second on stderr. Needs root (CAP_BPF and CAP_NET_ADMIN).
#[derive(Parser, Debug, Clone)]
#[command(name = "vhost-user-rdma tap", version)]
pub struct TapArgs {
    /// Interface to tap (repeat for several).
    #[arg(long = "iface", required = true)]
    pub ifaces: Vec<String>,
    /// Capture file (.pcapng → pcapng, else pcap), or - for stdout (pcapng unless --format).
    #[arg(long)]
    pub write: Option<PathBuf>,
    /// File format, overriding the one chosen from the file name.
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Only frames whose BTH destination QPN (or UD DETH source QPN) is N (decimal or 0x..).
    #[arg(long)]
    pub qpn: Option<String>,
    /// Only these opcodes: comma-separated rc, uc, rd, ud, send, write, read, ack, atomic,
    /// flush, cnp, or opcode numbers (the union of all).
    #[arg(long)]
    pub opcode: Option<String>,
    /// Only frames from or to this IPv4 or IPv6 address.
    #[arg(long)]
    pub ip: Option<IpAddr>,
    /// Only acknowledgements and read responses whose AETH syndrome is of these kinds:
    /// comma-separated ack, rnr (RNR NAK), nak.
    #[arg(long)]
    pub aeth: Option<String>,
    /// Bytes of each frame to keep, from the Ethernet header (at most 9216), or `headers`: up
    /// to the end of the BTH and its extension headers, without payload.
    #[arg(long, default_value_t = MAX_SNAPLEN.to_string())]
    pub snaplen: String,
    /// Also write one line per frame with its transport headers as the kernel parsed them
    /// (- for stdout).
    #[arg(long)]
    pub decode: Option<PathBuf>,
    /// Ring buffer size in KiB (a power of two, 4..=1048576); larger rides out longer stalls
    /// of the reader.
    #[arg(long, default_value_t = DEFAULT_RING_BYTES / 1024)]
    pub ring_kib: u32,
    /// Stop after N frames.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after SECS seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// No per-second summary lines (the final one is still printed).
    #[arg(long)]
    pub quiet: bool,
    /// How the programs attach: tcx (Linux 6.6 and later), netlink (a filter on the
    /// interface's tc clsact qdisc, added if missing: every kernel since 4.5), or auto (tcx
    /// where the kernel has it, else netlink).
    #[arg(long, value_enum, default_value_t = AttachArg::Auto)]
    pub attach: AttachArg,
}

/// `--attach`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachArg {
    Auto,
    Tcx,
    Netlink,
}

impl AttachArg {
    fn resolve(self) -> crate::bpf::Attach {
        match self {
            AttachArg::Auto => crate::bpf::Attach::for_this_kernel(),
            AttachArg::Tcx => crate::bpf::Attach::Tcx,
            AttachArg::Netlink => crate::bpf::Attach::Netlink,
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum TapConfigError {
    #[error("no network interface {0:?}")]
    Iface(String),
    #[error("--iface {0:?} given twice")]
    DuplicateIface(String),
    #[error("--qpn {0:?}: want a QPN 0..=0xffffff (decimal or 0x..)")]
    Qpn(String),
    #[error("--opcode: {0}")]
    Opcode(String),
    #[error("--aeth: {0}")]
    Aeth(String),
    #[error("--snaplen {0:?}: want 1..={MAX_SNAPLEN} or headers")]
    Snaplen(String),
    #[error("--decode - and --write - both want stdout")]
    BothStdout,
    #[error("--duration {0}: want a positive number of seconds")]
    Duration(f64),
    #[error("--ring-kib {0}: want a power of two from 4 to 1048576")]
    RingKib(u32),
    #[error("--count 0: want at least 1")]
    Count,
}

/// Where the frames go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    None,
    Stdout(Format),
    File(PathBuf, Format),
}

/// The validated tap configuration.
#[derive(Clone, Debug)]
pub struct TapConfig {
    pub ifaces: Vec<(String, u32)>,
    pub output: Output,
    pub filter: Filter,
    pub snap: Snap,
    /// Where the `--decode` lines go (`-` = stdout).
    pub decode: Option<PathBuf>,
    pub ring_bytes: u32,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    pub quiet: bool,
    pub attach: crate::bpf::Attach,
}

fn ifindex(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

impl TryFrom<TapArgs> for TapConfig {
    type Error = TapConfigError;

    fn try_from(a: TapArgs) -> Result<Self, Self::Error> {
        let ifaces = a
            .ifaces
            .iter()
            .map(|n| {
                ifindex(n)
                    .map(|i| (n.clone(), i))
                    .ok_or_else(|| TapConfigError::Iface(n.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (i, (name, index)) in ifaces.iter().enumerate() {
            if ifaces[..i].iter().any(|(_, j)| j == index) {
                return Err(TapConfigError::DuplicateIface(name.clone()));
            }
        }
        let qpn = a
            .qpn
            .as_deref()
            .map(|q| {
                parse_number(q)
                    .filter(|&n| n <= 0xff_ffff)
                    .ok_or_else(|| TapConfigError::Qpn(q.into()))
            })
            .transpose()?;
        let opcodes = a
            .opcode
            .as_deref()
            .map(parse_opcode_classes)
            .transpose()
            .map_err(TapConfigError::Opcode)?;
        let ip = a.ip.map(|ip| match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        });
        let aeth_kinds = a
            .aeth
            .as_deref()
            .map(parse_aeth_kinds)
            .transpose()
            .map_err(TapConfigError::Aeth)?;
        let snap = if a.snaplen == "headers" {
            Snap::Headers
        } else {
            match a.snaplen.parse() {
                Ok(n) if (1..=MAX_SNAPLEN).contains(&n) => Snap::Bytes(n),
                _ => return Err(TapConfigError::Snaplen(a.snaplen)),
            }
        };
        let duration = a
            .duration
            .map(|d| {
                Duration::try_from_secs_f64(d)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or(TapConfigError::Duration(d))
            })
            .transpose()?;
        if !a.ring_kib.is_power_of_two() || !(4..=1 << 20).contains(&a.ring_kib) {
            return Err(TapConfigError::RingKib(a.ring_kib));
        }
        if a.count == Some(0) {
            return Err(TapConfigError::Count);
        }
        let output = match (&a.write, a.format) {
            (None, _) => Output::None,
            (Some(p), f) => {
                let by_name =
                    if p.extension().is_some_and(|e| e == "pcapng") || p.as_os_str() == "-" {
                        Format::Pcapng
                    } else {
                        Format::Pcap
                    };
                let f = match f {
                    Some(FormatArg::Pcap) => Format::Pcap,
                    Some(FormatArg::Pcapng) => Format::Pcapng,
                    None => by_name,
                };
                if p.as_os_str() == "-" {
                    Output::Stdout(f)
                } else {
                    Output::File(p.clone(), f)
                }
            }
        };
        if matches!(output, Output::Stdout(_)) && a.decode.as_deref() == Some("-".as_ref()) {
            return Err(TapConfigError::BothStdout);
        }
        Ok(TapConfig {
            ifaces,
            output,
            filter: Filter {
                qpn,
                opcodes,
                ip,
                aeth_kinds,
            },
            snap,
            decode: a.decode,
            ring_bytes: a.ring_kib * 1024,
            count: a.count,
            duration,
            quiet: a.quiet,
            attach: a.attach.resolve(),
        })
    }
}

static STOP: AtomicBool = AtomicBool::new(false);
/// SIGUSR1: print the progress line now (what the kernel matched, what was written).
static PROGRESS: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

extern "C" fn on_progress(_: libc::c_int) {
    PROGRESS.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic, which is
        // async-signal-safe; SA_RESETHAND makes a second signal end the process the default way.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    // SAFETY: as above; SIGUSR1 stays handled (no SA_RESETHAND): each one asks for a line.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_progress as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC in nanoseconds: turns bpf_ktime_get_ns() into wall time.
fn realtime_offset_ns() -> i128 {
    let now = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-pointer for the duration of the call.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    let m0 = now(libc::CLOCK_MONOTONIC);
    let r = now(libc::CLOCK_REALTIME);
    let m1 = now(libc::CLOCK_MONOTONIC);
    r - (m0 + m1) / 2
}

/// The frame with an 802.1Q/802.1ad tag after the MAC addresses, where the wire has it.
fn with_vlan_tag(frame: &[u8], tpid: u16, tci: u16) -> Vec<u8> {
    let mut v = Vec::with_capacity(frame.len() + 4);
    v.extend_from_slice(&frame[..12]);
    v.extend_from_slice(&tpid.to_be_bytes());
    v.extend_from_slice(&tci.to_be_bytes());
    v.extend_from_slice(&frame[12..]);
    v
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn is_broken_pipe(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// Entry point of `vhost-user-rdma tap ARGS...` (`args` starts with the program name):
/// 0 done, 1 runtime failure, 2 bad input.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = match TapArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let cfg = match TapConfig::try_from(a) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vhost-user-rdma tap: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&cfg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vhost-user-rdma tap: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Error)]
pub enum RunError {
    #[error("{0}{hint}", hint = if is_root() { "" } else { " (the tap needs root: CAP_BPF and CAP_NET_ADMIN)" })]
    Bpf(Box<crate::bpf::BpfError>),
    #[error("{0}: {1}")]
    Io(String, io::Error),
}

impl From<crate::bpf::BpfError> for RunError {
    fn from(e: crate::bpf::BpfError) -> Self {
        RunError::Bpf(Box::new(e))
    }
}

/// An output and the name its errors give.
type Named = (String, Box<dyn Write>);

/// The decoded-line output (`--decode`), or none.
fn open_decode(cfg: &TapConfig) -> Result<Option<Named>, RunError> {
    Ok(match cfg.decode.as_deref() {
        None => None,
        Some(p) if p.as_os_str() == "-" => Some((
            "stdout".into(),
            Box::new(BufWriter::new(io::stdout().lock())) as Box<dyn Write>,
        )),
        Some(p) => Some((
            p.display().to_string(),
            Box::new(BufWriter::with_capacity(
                1 << 20,
                File::create(p).map_err(|e| RunError::Io(p.display().to_string(), e))?,
            )) as Box<dyn Write>,
        )),
    })
}

/// The capture file's writer (`--write`), or none.
fn open_writer(
    cfg: &TapConfig,
    names: &[String],
    file_snaplen: u32,
) -> Result<Option<Writer<Box<dyn Write>>>, RunError> {
    Ok(match &cfg.output {
        Output::None => None,
        Output::Stdout(f) => Some(
            Writer::with_hook(
                Box::new(BufWriter::with_capacity(1 << 16, io::stdout().lock())) as Box<dyn Write>,
                *f,
                names,
                file_snaplen,
                cfg.attach.hook(),
            )
            .map_err(|e| RunError::Io("stdout".into(), e))?,
        ),
        Output::File(p, f) => {
            let file = File::create(p).map_err(|e| RunError::Io(p.display().to_string(), e))?;
            Some(
                Writer::with_hook(
                    Box::new(BufWriter::with_capacity(1 << 20, file)) as Box<dyn Write>,
                    *f,
                    names,
                    file_snaplen,
                    cfg.attach.hook(),
                )
                .map_err(|e| RunError::Io(p.display().to_string(), e))?,
            )
        }
    })
}

/// Flushes what a reader watches live (the capture on stdout, decoded lines on stdout);
/// the first error goes to `write_err`.
fn flush_live(
    live: bool,
    writer: &mut Option<Writer<Box<dyn Write>>>,
    decode: &mut Option<Named>,
    out_name: &str,
    write_err: &mut Option<RunError>,
) {
    if live {
        if let Some(Err(e)) = writer.as_mut().map(|w| w.flush()) {
            write_err.get_or_insert(RunError::Io(out_name.to_string(), e));
        }
    }
    if let Some((name, w)) = decode.as_mut().filter(|(n, _)| n == "stdout") {
        if let Err(e) = w.flush() {
            write_err.get_or_insert(RunError::Io(name.clone(), e));
        }
    }
}

/// The outputs' last flush; a reader that went away is a normal end.
fn flush_at_end(
    writer: Option<&mut Writer<Box<dyn Write>>>,
    decode: Option<&mut Named>,
    out_name: String,
) -> Result<(), RunError> {
    if let Some(w) = writer {
        if let Err(e) = w.flush() {
            if !is_broken_pipe(&e) {
                return Err(RunError::Io(out_name, e));
            }
        }
    }
    if let Some((name, w)) = decode {
        if let Err(e) = w.flush() {
            if !is_broken_pipe(&e) {
                return Err(RunError::Io(name.clone(), e));
            }
        }
    }
    Ok(())
}

/// The last summary line and the totals.
fn print_done(
    stats: &crate::bpf::KernelStats,
    summary: &mut Summary,
    last_line: Instant,
    drops_reported: u64,
    start: Instant,
    total: u64,
) {
    eprintln!(
        "{}",
        summary.line(
            last_line.elapsed().as_secs_f64(),
            stats.ring_full.saturating_sub(drops_reported)
        )
    );
    eprintln!(
        "tap: done after {:.1}s: {total} frames written; in kernel: {} matched, {} filtered out, {} lost to a full ring buffer; of the matched {} NAKs, {} RNR NAKs, {} CNPs, {} truncated",
        start.elapsed().as_secs_f64(),
        stats.matched,
        stats.filtered,
        stats.ring_full,
        stats.naks,
        stats.rnr_naks,
        stats.cnps,
        stats.truncated
    );
}

/// Loads the programs with the filters and attaches them to every interface.
fn attach(cfg: &TapConfig, names: &[String]) -> Result<Tap, RunError> {
    Ok(Tap::attach(
        names,
        // Each CPU wakes the reader after adding its share of an eighth of the ring; small
        // bursts wait at most POLL_INTERVAL.
        &KernelConfig::new(
            &cfg.filter,
            cfg.snap,
            (cfg.ring_bytes / 8 / aya::util::nr_cpus().unwrap_or(1).max(1) as u32).max(4096),
        ),
        cfg.ring_bytes,
        cfg.attach,
    )?)
}

/// Attaches, captures until --count, --duration, SIGINT/SIGTERM or a closed stdout, detaches.
pub fn run(cfg: &TapConfig) -> Result<(), RunError> {
    let names: Vec<String> = cfg.ifaces.iter().map(|(n, _)| n.clone()).collect();
    let file_snaplen = match cfg.snap {
        Snap::Bytes(n) => n,
        Snap::Headers => MAX_SNAPLEN,
    };
    let mut decode = open_decode(cfg)?;
    let mut writer = open_writer(cfg, &names, file_snaplen)?;
    let live = matches!(cfg.output, Output::Stdout(_));
    let out_name = match &cfg.output {
        Output::None => "nothing (summary only)".to_string(),
        Output::Stdout(_) => "stdout".to_string(),
        Output::File(p, _) => p.display().to_string(),
    };

    install_signal_handlers();
    let mut tap = attach(cfg, &names)?;
    let offset = realtime_offset_ns();
    eprintln!(
        "tap: attached to {} ({} ingress and egress), writing {out_name}",
        names.join(", "),
        cfg.attach.hook()
    );

    let start = Instant::now();
    let mut last_line = start;
    let mut summary = Summary::default();
    let mut total: u64 = 0;
    let mut drops_reported = 0u64;
    let mut write_err: Option<RunError> = None;
    let mut done = false;
    let fd = tap.ring_fd();
    while !done {
        let now = Instant::now();
        let mut wait = Duration::from_secs(1)
            .saturating_sub(now - last_line)
            .min(POLL_INTERVAL);
        if let Some(d) = cfg.duration {
            wait = wait.min(d.saturating_sub(now - start));
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, wait.as_millis().clamp(1, 1000) as libc::c_int) };
        done = STOP.load(Ordering::Relaxed) || cfg.duration.is_some_and(|d| start.elapsed() >= d);
        tap.drain(|b| {
            if cfg.count.is_some_and(|c| total >= c) || write_err.is_some() {
                return;
            }
            let Some(r) = Record::parse(b) else { return };
            total += 1;
            let tagged;
            let (data, orig_len) = match r.vlan {
                Some((tpid, tci)) if r.data.len() >= 12 => {
                    tagged = with_vlan_tag(r.data, tpid, tci);
                    (&tagged[..], r.orig_len + 4)
                }
                _ => (r.data, r.orig_len),
            };
            summary.observe(r.ifindex, r.direction, &r.roce);
            let iface = cfg
                .ifaces
                .iter()
                .position(|&(_, i)| i == r.ifindex)
                .unwrap_or(0);
            if let Some((name, w)) = decode.as_mut() {
                if let Err(e) = writeln!(
                    w,
                    "{} {} {}",
                    names[iface],
                    r.direction.name(),
                    describe(&r.roce)
                ) {
                    write_err = Some(RunError::Io(name.clone(), e));
                }
            }
            if let Some(w) = writer.as_mut() {
                let frame = Frame {
                    ts_ns: (r.ts_ns as i128 + offset).max(0) as u64,
                    iface,
                    direction: r.direction,
                    orig_len,
                    data,
                };
                if let Err(e) = w.write(&frame) {
                    write_err = Some(RunError::Io(out_name.clone(), e));
                }
            }
        });
        flush_live(live, &mut writer, &mut decode, &out_name, &mut write_err);
        if cfg.count.is_some_and(|c| total >= c) {
            done = true;
        }
        if PROGRESS.swap(false, Ordering::Relaxed) {
            // After a drain: every frame the kernel matched before the signal is counted in
            // `written` unless the ring was full (a test waits on this line for the frames
            // it sent, instead of sleeping).
            let s = tap.stats()?;
            eprintln!(
                "tap: progress: {total} frames written; in kernel: {} matched, {} lost to a full ring buffer",
                s.matched, s.ring_full
            );
        }
        if let Some(e) = write_err.take() {
            if let RunError::Io(_, ioe) = &e {
                if is_broken_pipe(ioe) {
                    break; // the reader went away: a normal end for a live capture
                }
            }
            return Err(e);
        }
        if !cfg.quiet && last_line.elapsed() >= Duration::from_secs(1) {
            let drops = tap.stats().map(|s| s.ring_full).unwrap_or(0);
            eprintln!(
                "{}",
                summary.line(
                    last_line.elapsed().as_secs_f64(),
                    drops.saturating_sub(drops_reported)
                )
            );
            drops_reported = drops;
            last_line = Instant::now();
        }
    }
    flush_at_end(writer.as_mut(), decode.as_mut(), out_name)?;
    let stats = tap.stats()?;
    print_done(
        &stats,
        &mut summary,
        last_line,
        drops_reported,
        start,
        total,
    );
    drop(tap);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &[&str]) -> Result<TapConfig, TapConfigError> {
        let mut v = vec!["tap", "--iface", "lo"];
        v.extend_from_slice(extra);
        TapConfig::try_from(TapArgs::try_parse_from(v).unwrap())
    }

    #[test]
    fn validation() {
        let c = cfg(&["--write", "-", "--qpn", "0x11"]).unwrap();
        assert_eq!(c.output, Output::Stdout(Format::Pcapng));
        assert_eq!(c.filter.qpn, Some(0x11));
        assert_eq!(c.ifaces[0].0, "lo");
        assert_eq!(
            cfg(&["--write", "x.pcap"]).unwrap().output,
            Output::File("x.pcap".into(), Format::Pcap)
        );
        assert_eq!(
            cfg(&["--write", "x.pcapng"]).unwrap().output,
            Output::File("x.pcapng".into(), Format::Pcapng)
        );
        assert_eq!(
            cfg(&["--write", "-", "--format", "pcap"]).unwrap().output,
            Output::Stdout(Format::Pcap)
        );
        assert_eq!(
            cfg(&["--qpn", "0x1000000"]).unwrap_err(),
            TapConfigError::Qpn("0x1000000".into())
        );
        assert!(matches!(
            cfg(&["--opcode", "rc,nope"]),
            Err(TapConfigError::Opcode(_))
        ));
        assert_eq!(
            cfg(&["--snaplen", "0"]).unwrap_err(),
            TapConfigError::Snaplen("0".into())
        );
        assert_eq!(
            cfg(&["--snaplen", "head"]).unwrap_err(),
            TapConfigError::Snaplen("head".into())
        );
        assert_eq!(cfg(&["--snaplen", "headers"]).unwrap().snap, Snap::Headers);
        assert_eq!(cfg(&["--snaplen", "128"]).unwrap().snap, Snap::Bytes(128));
        assert_eq!(
            cfg(&["--aeth", "nak,rnr"]).unwrap().filter.aeth_kinds,
            Some(0b1010)
        );
        assert!(matches!(
            cfg(&["--aeth", "nack"]),
            Err(TapConfigError::Aeth(_))
        ));
        assert_eq!(
            cfg(&["--write", "-", "--decode", "-"]).unwrap_err(),
            TapConfigError::BothStdout
        );
        assert_eq!(
            cfg(&["--duration=-1"]).unwrap_err(),
            TapConfigError::Duration(-1.0)
        );
        assert_eq!(cfg(&["--count", "0"]).unwrap_err(), TapConfigError::Count);
        assert_eq!(
            cfg(&["--iface", "lo"]).unwrap_err(),
            TapConfigError::DuplicateIface("lo".into())
        );
        assert_eq!(
            cfg(&["--ring-kib", "100"]).unwrap_err(),
            TapConfigError::RingKib(100)
        );
        assert_eq!(
            cfg(&["--ring-kib", "2"]).unwrap_err(),
            TapConfigError::RingKib(2)
        );
        assert_eq!(cfg(&["--ring-kib", "64"]).unwrap().ring_bytes, 64 << 10);
        let c = cfg(&["--ip", "10.77.9.1"]).unwrap();
        assert_eq!(c.filter.ip.unwrap()[10..], [0xff, 0xff, 10, 77, 9, 1]);
        let bad = TapConfig::try_from(
            TapArgs::try_parse_from(["tap", "--iface", "no-such-if0"]).unwrap(),
        );
        assert_eq!(
            bad.unwrap_err(),
            TapConfigError::Iface("no-such-if0".into())
        );
    }
}
