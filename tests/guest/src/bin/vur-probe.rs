//! A test guest for scripts: connects to a vhost-user-rdma socket as a VMM would (memfd guest
//! memory, the three virtqueues), asks the device what it is and makes a PD, a CQ and a QP,
//! prints one line and exits 0; any failure is said and exits 1.
//!
//!   vur-probe SOCKET

use vur_testguest::*;

fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: vur-probe SOCKET");
        return std::process::ExitCode::from(2);
    };
    let run = || -> Result<String> {
        let mut g = Guest::connect(std::path::Path::new(&path), GuestOpts::default())?;
        let cfg = g.query_device()?;
        let port = g.query_port()?;
        let pd = g.alloc_pd()?;
        let cq = g.create_cq(15)?;
        let qp = g.create_qp(
            rxe_core::verbs::QpType::Rc,
            pd,
            &cq,
            &cq,
            None,
            ConnOpts::default().cap,
        )?;
        Ok(format!(
            "vur-probe: {path}: device version {} caps {:#x} max_qp {}, port state {}, QP {:#x} created",
            cfg.version, cfg.caps, cfg.max_qp, port.state, qp.qpn
        ))
    };
    match run() {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vur-probe: {path}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
