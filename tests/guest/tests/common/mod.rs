//! Code shared by the integration tests; a test file that needs it says `mod common;`.

// Each test binary compiles this module on its own and uses a different part of it.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use vur_testguest::{abi, loopback_pair, Cq, Guest, Node, Wc, PAGE};

/// How long a test waits for a completion.
pub const T: Duration = Duration::from_secs(10);

/// The daemon binary built with these tests.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vur-daemon"))
}

/// Two daemons on loopback UDP, each with a test guest attached.
pub fn pair() -> (Node, Node) {
    let (aa, ba) = loopback_pair(4791);
    (
        Node::start(bin(), aa, &[]).expect("node a"),
        Node::start(bin(), ba, &[]).expect("node b"),
    )
}

/// The next completion of `cq`, within `t`; exactly one.
pub fn one_within(g: &mut Guest, cq: &Cq, t: Duration) -> Wc {
    let w = g.wait_cq(cq, 1, t);
    assert_eq!(w.len(), 1, "expected one completion");
    w[0]
}

/// The next completion of `cq`, within [`T`].
pub fn one(g: &mut Guest, cq: &Cq) -> Wc {
    one_within(g, cq, T)
}

/// A page list of `n` entries that all name `page`, with one level of indirection: a top
/// array of ⌈n/512⌉ pointers, every one to the same list page. Cheap in guest memory
/// whatever `n` is; the device still reads (and holds) `n` entries.
pub fn repeated_list(g: &Guest, page: u64, n: u32) -> abi::PageListDesc {
    let list_page = g.ram.alloc_contig(PAGE, PAGE).unwrap();
    let entries: Vec<u8> = (0..512).flat_map(|_| page.to_le_bytes()).collect();
    g.ram.write(list_page, &entries);
    let tops = vec![list_page; (n as usize).div_ceil(512)];
    abi::PageListDesc {
        gpa: g.page_list(&tops).unwrap(),
        num_pages: n,
        page_shift: 12,
        levels: 1,
        reserved: 0,
    }
}
