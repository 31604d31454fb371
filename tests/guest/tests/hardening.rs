//! What the daemon does against a guest or a network it does not trust: object names that
//! cannot be counted, registrations it refuses, budgets checked before the work, sockets only
//! their owner reaches, destinations it will not send to.

mod common;

use common::bin;
use rxe_core::verbs::*;
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
