//! The short form of `vur-bench --only scale`: 16 384 RC QPs in each daemon (all in RTS, all
//! but 16 idle), traffic on the 16 before and after they are created, and all of them
//! destroyed again. It checks that the run completes — every message delivered, every QP
//! created and destroyed, the daemons alive — and prints the numbers; speed is the
//! benchmark's business, not this test's.
//!
//! Ignored by plain `cargo test` (about 30 s in a debug build); tests/run.sh runs it in a
//! release build: `cargo test --release -p vur-testguest --test scale -- --ignored`.

use std::path::Path;

use vur_testguest::scale::{connect_active, round};
use vur_testguest::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vur-daemon"))
}

const QPS: usize = 16_384;
const ACTIVE: usize = 16;

#[test]
#[ignore = "16k QPs: run from tests/run.sh in a release build"]
fn sixteen_thousand_qps_with_traffic_on_sixteen() {
    let (aa, ba) = loopback_pair(4791);
    let max = QPS.to_string();
    let extra = ["--max-qp", &max];
    let opts = GuestOpts {
        mem_size: (64 << 20) + QPS as u64 * 2 * 4096,
        ..Default::default()
    };
    let mut a = Node::start_with(bin(), aa, &extra, None, opts.clone()).expect("node a");
    let mut b = Node::start_with(bin(), ba, &extra, None, opts).expect("node b");
    let pairs = connect_active(&mut a, &mut b, ACTIVE, 16).expect("active pairs");
    let r = round(&mut a, &mut b, &pairs, QPS - ACTIVE, 5_000, 16).expect("scale round");
    println!("{r:#?}");
    for n in [&mut a, &mut b] {
        assert!(n.daemon.is_alive());
        let c = n.daemon.counters().expect("counters");
        assert_eq!(
            json_u64(&c, "objects", "qps"),
            Some(ACTIVE as u64),
            "idle QPs destroyed"
        );
    }
    assert!(r.base.msgs_per_s > 0.0 && r.loaded.msgs_per_s > 0.0);
}
