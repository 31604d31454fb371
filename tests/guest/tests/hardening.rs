//! What the daemon does against a guest or a network it does not trust: object names that
//! cannot be counted, registrations it refuses, budgets checked before the work, sockets only
//! their owner reaches, destinations it will not send to.

mod common;

use common::bin;
use rxe_core::verbs::*;
use vm_memory::ByteValued;
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

/// The first MR's R_Key and the first QPN of each connection: (rkey, qpn).
fn first_names(g: &mut Guest) -> (u32, u32) {
    let pd = g.alloc_pd().unwrap();
    let cq = g.create_cq(15).unwrap();
    let mr = g.reg_mr(pd, 4096, ALL).unwrap();
    let qp = g
        .create_qp(QpType::Rc, pd, &cq, &cq, None, ConnOpts::default().cap)
        .unwrap();
    (mr.rkey, qp.qpn)
}

/// Every connection (every device instance) draws its own key bytes and first QPN: the
/// first MR is not R_Key 0x111 and the first QPN not 0x11 on every guest.
#[test]
fn each_connection_draws_its_own_keys_and_qpns() {
    let (addr, _) = loopback_pair(4791);
    let d = Daemon::spawn(bin(), addr, &[]).unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
        seen.push(first_names(&mut g));
        g.disconnect();
    }
    for &(rkey, qpn) in &seen {
        assert_eq!(rkey >> 8, 1, "the first key index");
        assert!(qpn >= 0x11);
    }
    assert!(
        seen.iter().any(|&n| n != (0x111, 0x11)) && seen.windows(2).any(|w| w[0] != w[1]),
        "names repeat across connections: {seen:x?}"
    );
}

fn reg_dma_mr(g: &mut Guest, pd: u32, access: Access) -> Result<u32> {
    let c = abi::CmdRegDmaMr {
        pdn: pd,
        access: access.0,
    };
    let r = g.cmd(abi::op::REG_DMA_MR, c.as_slice())?;
    Ok(u32::from_le_bytes(r[..4].try_into().unwrap()))
}

fn status<T: std::fmt::Debug>(r: Result<T>) -> Option<abi::Status> {
    match r {
        Err(Error::Status(s)) => Some(s),
        r => panic!("expected an error status, got {r:?}"),
    }
}

/// A DMA MR reaches all of guest memory: remote rights on it (or MW_BIND, FLUSH targets)
/// only with `--allow-remote-dma-mr`, else PERMISSION; remote write or atomic without local
/// write is INVALID either way (IBTA 10.6.3.1).
#[test]
fn a_dma_mr_with_remote_rights_needs_the_operators_consent() {
    use abi::Status::{Invalid, Permission};
    for allow in [false, true] {
        let (addr, _) = loopback_pair(4791);
        let extra: &[&str] = if allow {
            &["--allow-remote-dma-mr"]
        } else {
            &[]
        };
        let mut n = Node::start(bin(), addr, extra).unwrap();
        let g = &mut n.guest;
        let pd = g.alloc_pd().unwrap();
        reg_dma_mr(g, pd, Access::LOCAL_WRITE).expect("local DMA MR");
        assert_eq!(
            status(reg_dma_mr(g, pd, Access::REMOTE_WRITE)),
            Some(Invalid)
        );
        assert_eq!(
            status(reg_dma_mr(g, pd, Access::REMOTE_ATOMIC)),
            Some(Invalid)
        );
        for remote in [
            Access::REMOTE_READ,
            ALL,
            Access::LOCAL_WRITE.union(Access::MW_BIND),
            Access::LOCAL_WRITE.union(Access::FLUSH_GLOBAL),
        ] {
            let r = reg_dma_mr(g, pd, remote);
            if allow {
                r.expect("allowed by the operator");
            } else {
                assert_eq!(status(r), Some(Permission), "{remote:?}");
            }
        }
    }
}
