//! The command line of the daemon's binaries (`vhost-user-rdma`, and the test crate's
//! `vur-daemon`): serve the devices the options describe, or run a subcommand —
//! `link ...` makes the host side of a guest's NIC (netkit or veth pair,
//! [`crate::net::netlink`]), `tap ...` runs the eBPF RoCEv2 tap (vur-tap, docs/tap.md).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{configs, Args};

/// The options, or a subcommand with options of its own.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    disable_help_subcommand = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    args: Args,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// Makes the host side of a guest's NIC (`link --help`).
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Link {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Prints a daemon's counters, as JSON or OpenMetrics (`counters --help`).
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Counters {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Prints the man page (roff) written from these options: `man -l <(vhost-user-rdma man)`.
    Man,
    /// Runs the eBPF RoCEv2 tap (`tap --help`).
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Tap {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Prints this help, or a command's (`help tap`).
    #[command(disable_help_flag = true, disable_version_flag = true)]
    Help {
        /// The command whose help to print.
        command: Option<String>,
    },
}

/// What a binary of the daemon offers beside serving.
#[derive(Clone, Copy, Debug)]
pub struct Binary {
    /// The name its messages start with.
    pub name: &'static str,
    /// Whether it runs `tap ...` (the test crate's daemon does not).
    pub tap: bool,
}

/// `--print-capabilities`: the JSON object QEMU's vhost-user backend program conventions
/// describe (docs/interop/vhost-user.rst). QEMU's schema has no `rdma` type yet: the type is
/// this device's proposal (virtio ID 42 is `VIRTIO_ID_RDMA`); the features are the options
/// a manager may rely on.
pub fn capabilities() -> &'static str {
    r#"{"type":"rdma","features":["fd","socket-path","udp-addr","iface","net-socket","counters-socket","socket-group","allow-peer"]}"#
}

/// The man page, vhost-user-rdma(1), from the same definitions as `--help`
/// (docs/vhost-user-rdma.1 is its output, kept equal by a test).
pub fn man_page(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    use clap::CommandFactory;
    let cmd = Cli::command().name("vhost-user-rdma");
    clap_mangen::Man::new(cmd).render(out)
}

/// `help [COMMAND]`: the options, or a command's own help (the commands with parsers of
/// their own are asked for it with `--help`).
fn help<I: Iterator<Item = OsString>>(
    bin: Binary,
    command: Option<&str>,
    sub_args: &dyn Fn(&str, Vec<OsString>) -> I,
) -> ExitCode {
    use clap::CommandFactory;
    let flag = || vec![OsString::from("--help")];
    match command {
        None => {
            let _ = Cli::command().print_long_help();
            ExitCode::SUCCESS
        }
        Some("link") => crate::net::netlink::main_with_args(sub_args("link", flag())),
        Some("counters") => crate::metrics::main_with_args(sub_args("counters", flag())),
        Some("tap") if bin.tap => vur_tap::cli::main_with_args(sub_args("tap", flag())),
        Some(name) => match Cli::command().find_subcommand_mut(name) {
            Some(c) => {
                let _ = c.print_long_help();
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("{}: no command {name} (link, counters, man, tap)", bin.name);
                ExitCode::from(2)
            }
        },
    }
}

/// The daemon's `main`, after the binary installed its allocator: logging, the command
/// line, then the devices or the subcommand.
pub fn main(bin: Binary) -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    main_with_args(bin, std::env::args_os())
}

/// [`main`] over the arguments given (the first is the program's name).
pub fn main_with_args(bin: Binary, argv: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = Cli::parse_from(argv);
    let sub_args = |name: &str, args: Vec<OsString>| {
        std::iter::once(OsString::from(format!("vhost-user-rdma {name}"))).chain(args)
    };
    let configs = match cli.sub {
        Some(Sub::Link { args }) => {
            return crate::net::netlink::main_with_args(sub_args("link", args))
        }
        Some(Sub::Tap { args }) if bin.tap => {
            return vur_tap::cli::main_with_args(sub_args("tap", args))
        }
        Some(Sub::Tap { .. }) => {
            eprintln!("{}: no tap in this binary (vhost-user-rdma tap)", bin.name);
            std::process::exit(2);
        }
        Some(Sub::Counters { args }) => {
            return crate::metrics::main_with_args(sub_args("counters", args))
        }
        Some(Sub::Help { command }) => return help(bin, command.as_deref(), &sub_args),
        Some(Sub::Man) => {
            return match man_page(&mut std::io::stdout().lock()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{}: {e}", bin.name);
                    ExitCode::FAILURE
                }
            }
        }
        None if cli.args.print_capabilities => {
            println!("{}", capabilities());
            return ExitCode::SUCCESS;
        }
        None => configs(cli.args),
    };
    let configs = match configs {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", bin.name);
            std::process::exit(2);
        }
    };
    if let Err(e) = crate::start_backends(configs) {
        eprintln!("{}: {e}", bin.name);
        std::process::exit(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every option says what it does and sits under a heading of `--help` (the man page and
    /// docs/daemon.md's table are written from the same text).
    #[test]
    fn every_option_is_described_under_a_heading() {
        let cmd = Cli::command();
        let mut missing = Vec::new();
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if ["help", "version"].contains(&id) || a.is_positional() {
                continue;
            }
            if a.get_help().is_none() || a.get_help_heading().is_none() {
                missing.push(id.to_string());
            }
        }
        assert!(
            missing.is_empty(),
            "options without a text or a heading: {missing:?}"
        );
    }

    /// docs/daemon.md's options table is the one list of options: a row for each.
    #[test]
    fn every_option_has_a_row_in_daemon_md() {
        let doc = include_str!("../../docs/daemon.md");
        let missing: Vec<String> = Cli::command()
            .get_arguments()
            .filter(|a| !a.is_positional() && !["help", "version"].contains(&a.get_id().as_str()))
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| !doc.contains(&format!("| `{l}")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/daemon.md has no row for {missing:?}"
        );
    }

    /// docs/vhost-user-rdma.1 is what `vhost-user-rdma man` prints: regenerate it with
    /// `cargo run -p vhost-user-rdma -- man > docs/vhost-user-rdma.1` after an option changes.
    #[test]
    fn the_man_page_in_docs_is_current() {
        let mut now = Vec::new();
        man_page(&mut now).unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/vhost-user-rdma.1");
        let kept = std::fs::read(path).unwrap_or_default();
        assert!(
            kept == now,
            "docs/vhost-user-rdma.1 is stale: cargo run -p vhost-user-rdma -- man > docs/vhost-user-rdma.1"
        );
    }
}
