//! `rxe-diff`: the differential wire test's host side (see `vur_interop::diff`). Every case goes
//! to each target in turn — the first is the reference (Linux rxe), the others are compared
//! with it — and the transcripts are compared.
//!
//! ```text
//! rxe-diff --local-ip 10.78.0.1 --control 10.78.0.2:18600 \
//!     --target rxe0=10.78.0.2 --target vrdma0=10.77.0.2 [--case TEXT] [--table FILE] [--quiet-ms 250]
//! ```
//! Exits 1 when a case differs and is not a known exception, when a known exception no longer
//! differs, when a target answered with a bad ICRC, or on an error; 2 on bad usage.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use vur_interop::diff::{cases, differences, run_case, Control, Target};
use vur_interop::udp::{UdpTransport, ROCE_PORT};

fn usage() -> ExitCode {
    eprintln!(
        "usage: rxe-diff --local-ip IP --control IP:PORT --target DEV=IP --target DEV=IP [--case TEXT] [--table FILE] [--quiet-ms N] [--transcripts DIR]"
    );
    ExitCode::from(2)
}

/// The command line.
struct Cli {
    local: Option<IpAddr>,
    control: Option<SocketAddr>,
    targets: Vec<Target>,
    only: Option<String>,
    table: Option<String>,
    quiet_ms: u64,
    dir: Option<String>,
}

/// Parses the arguments; the first bad one is `Err`.
fn parse_args(args: &[String]) -> Result<Cli, String> {
    let mut c = Cli {
        local: None,
        control: None,
        targets: Vec::new(),
        only: None,
        table: None,
        quiet_ms: 250,
        dir: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        let ok = match a.as_str() {
            "--local-ip" => val().parse().map(|v| c.local = Some(v)).is_ok(),
            "--control" => val().parse().map(|v| c.control = Some(v)).is_ok(),
            "--target" => {
                let v = val();
                match v
                    .split_once('=')
                    .map(|(d, ip)| (d.to_string(), ip.parse::<IpAddr>()))
                {
                    Some((dev, Ok(addr))) if !dev.is_empty() => {
                        c.targets.push(Target { dev, addr });
                        true
                    }
                    _ => false,
                }
            }
            "--case" => {
                c.only = Some(val());
                true
            }
            "--table" => {
                c.table = Some(val());
                true
            }
            "--transcripts" => {
                c.dir = Some(val());
                true
            }
            "--quiet-ms" => val()
                .parse()
                .map(|v| c.quiet_ms = v)
                .is_ok_and(|_| c.quiet_ms > 0),
            _ => false,
        };
        if !ok {
            return Err(a.clone());
        }
    }
    Ok(c)
}

/// How many cases were the same, known differences, or failing.
#[derive(Default)]
struct Tally {
    same: u32,
    known: u32,
    bad: u32,
}

impl Tally {
    /// The verdict on one target's transcript against the reference, counted.
    fn judge(&mut self, differs: bool, known: Option<&str>, setup_failed: bool) -> String {
        match (!differs, known) {
            _ if setup_failed => {
                self.bad += 1;
                "SETUP FAILED".to_string()
            }
            (true, None) => {
                self.same += 1;
                "same".to_string()
            }
            (false, Some(why)) => {
                self.known += 1;
                format!("differs, known: {why}")
            }
            (true, Some(_)) => {
                self.bad += 1;
                "same, but listed as a known difference: take it off the list".to_string()
            }
            (false, None) => {
                self.bad += 1;
                "DIFFERENT".to_string()
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cli = match parse_args(&args) {
        Ok(c) => c,
        Err(a) => {
            eprintln!("rxe-diff: bad argument {a}");
            return usage();
        }
    };
    let Cli {
        local,
        control,
        targets,
        only,
        table,
        quiet_ms,
        dir,
    } = cli;
    let (Some(local), Some(control)) = (local, control) else {
        return usage();
    };
    if targets.len() < 2 {
        eprintln!("rxe-diff: give a reference target and at least one to compare with it");
        return usage();
    }
    let mut udp = match UdpTransport::bind(local, ROCE_PORT) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("rxe-diff: cannot bind {local}:{ROCE_PORT}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut ctl = match Control::connect(control, Duration::from_secs(120)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rxe-diff: {e}");
            return ExitCode::FAILURE;
        }
    };
    let quiet = Duration::from_millis(quiet_ms);
    let all = cases();
    let mut md = String::from("| # | case | ");
    for t in &targets[1..] {
        let _ = write!(md, "{} vs {} | ", t.dev, targets[0].dev);
    }
    md.push_str("\n|---|---|");
    md.push_str(&"---|".repeat(targets.len() - 1));
    md.push('\n');
    let (mut tally, mut corrupted) = (Tally::default(), 0);
    for (n, case) in all.iter().enumerate() {
        let n = n + 1;
        if only
            .as_ref()
            .is_some_and(|o| !case.name.contains(o.as_str()) && o != &n.to_string())
        {
            continue;
        }
        let my_qpn = 0xd000 + n as u32;
        corrupted += case.corrupted_packets();
        let mut scripts = Vec::new();
        for t in &targets {
            match run_case(&mut ctl, &mut udp, t, case, my_qpn, quiet) {
                Ok(s) => scripts.push(s),
                Err(e) => {
                    eprintln!("rxe-diff: case {n} on {}: {e}", t.dev);
                    return ExitCode::FAILURE;
                }
            }
        }
        if let Some(d) = &dir {
            for (t, s) in targets.iter().zip(&scripts) {
                let _ = std::fs::write(format!("{d}/{n:02}.{}.txt", t.dev), s.join("\n") + "\n");
            }
        }
        let _ = write!(md, "| {n} | {} | ", case.name);
        for (t, s) in targets[1..].iter().zip(&scripts[1..]) {
            let d = differences(&scripts[0], s);
            let setup_failed = scripts
                .iter()
                .any(|s| s.iter().any(|l| l.starts_with("setup:")));
            let verdict = tally.judge(!d.is_empty(), case.known, setup_failed);
            println!("case {n:2} {:<70} {}: {verdict}", case.name, t.dev);
            for l in &d {
                println!("    {} | {}: {l}", targets[0].dev, t.dev);
            }
            if !d.is_empty() || std::env::var_os("RXE_DIFF_VERBOSE").is_some() {
                for l in &scripts[0] {
                    println!("      {}: {l}", targets[0].dev);
                }
            }
            let _ = write!(md, "{} | ", verdict.replace('|', "/"));
        }
        md.push('\n');
    }
    ctl.bye();
    let st = udp.stats();
    println!(
        "rxe-diff: {} same, {} known differences, {} failing; datagrams with a good ICRC {}, bad {}; corrupted packets sent to each target: {corrupted}",
        tally.same, tally.known, tally.bad, st.rx_icrc_ok, st.rx_icrc_bad
    );
    if let Some(f) = table {
        if let Err(e) = std::fs::write(&f, md) {
            eprintln!("rxe-diff: cannot write {f}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if tally.bad > 0 || st.rx_icrc_bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
