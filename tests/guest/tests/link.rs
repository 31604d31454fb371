//! `vhost-user-rdma link`: the host side of a guest's NIC made through rtnetlink, inside a
//! network namespace each test creates. Skipped (one line saying why) when not root or
//! without iproute2.

use std::process::Command;

use common::{bin, run};
use vur_testguest::netns;

mod common;

/// `vur-daemon link ARGS…` (the daemon binary's `link` command); exit code and stderr.
fn link(args: &[&str], drop_net_admin: bool) -> (Option<i32>, String) {
    let mut cmd = Command::new(bin());
    cmd.arg("link").args(args);
    if drop_net_admin {
        // SAFETY: the closure runs in the child between fork and exec and only calls prctl.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                const CAP_NET_ADMIN: libc::c_ulong = 12;
                if libc::prctl(libc::PR_CAPBSET_DROP, CAP_NET_ADMIN, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = cmd.output().expect("run link");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ip_out(args: &[&str]) -> String {
    let o = Command::new("ip").args(args).output().expect("ip");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_veth_pair_on_a_bridge_and_gone_again() {
    run("a_veth_pair_on_a_bridge_and_gone_again", || {
        netns::ip(&["link", "add", "vbr0", "type", "bridge"]).unwrap();
        let (code, err) = link(
            &[
                "add", "vh0", "--peer", "vh0p", "--kind", "veth", "--bridge", "vbr0", "--mtu",
                "4000",
            ],
            false,
        );
        assert_eq!(code, Some(0), "{err}");
        let daemon_end = ip_out(&["-d", "link", "show", "vh0"]);
        assert!(daemon_end.contains("veth"), "{daemon_end}");
        assert!(daemon_end.contains("mtu 4000"), "{daemon_end}");
        assert!(daemon_end.contains(",UP"), "{daemon_end}");
        let peer = ip_out(&["-d", "link", "show", "vh0p"]);
        assert!(peer.contains("master vbr0"), "{peer}");
        assert!(peer.contains(",UP"), "{peer}");
        // the same name again: said, and nothing changed
        let (code, err) = link(&["add", "vh0", "--peer", "vh1p", "--kind", "veth"], false);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("vh0: an interface of that name exists already"),
            "{err}"
        );
        assert!(ip_out(&["link", "show", "vh1p"]).is_empty());
        let (code, err) = link(&["del", "vh0"], false);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            ip_out(&["link", "show", "vh0p"]).is_empty(),
            "the pair went"
        );
        let (code, err) = link(&["del", "vh0"], false);
        assert_eq!(code, Some(1));
        assert!(err.contains("vh0: no such interface"), "{err}");
    });
}

#[test]
fn the_peer_in_another_namespace() {
    run("the_peer_in_another_namespace", || {
        let ns = format!("vur-link-{}", std::process::id());
        netns::ip(&["netns", "add", &ns]).unwrap();
        let (code, err) = link(
            &[
                "add",
                "vh0",
                "--peer",
                "eth9",
                "--kind",
                "veth",
                "--peer-netns",
                &ns,
            ],
            false,
        );
        let there = ip_out(&["-n", &ns, "link", "show", "eth9"]);
        let _ = netns::ip(&["netns", "del", &ns]);
        assert_eq!(code, Some(0), "{err}");
        assert!(there.contains("eth9"), "{there}");
        assert!(ip_out(&["link", "show", "eth9"]).is_empty(), "not here");
        let (code, err) = link(
            &[
                "add",
                "vh1",
                "--peer",
                "x",
                "--kind",
                "veth",
                "--peer-netns",
                "vur-no-such-ns",
            ],
            false,
        );
        assert_eq!(code, Some(1));
        assert!(err.contains("--peer-netns vur-no-such-ns"), "{err}");
    });
}

#[test]
fn netkit_in_l2_mode_or_a_clear_no() {
    run("netkit_in_l2_mode_or_a_clear_no", || {
        let (code, err) = link(&["add", "nk0", "--peer", "nk0p", "--kind", "netkit"], false);
        if code == Some(0) {
            let d = ip_out(&["-d", "link", "show", "nk0"]);
            assert!(d.contains("netkit") && d.contains("mode l2"), "{d}");
            assert!(d.contains("link/ether"), "L2: an Ethernet device: {d}");
        } else {
            // This kernel has no netkit (CONFIG_NETKIT off, or before 6.7).
            assert_eq!(code, Some(1), "{err}");
            assert!(err.contains("this kernel has no netkit support"), "{err}");
            assert!(ip_out(&["link", "show", "nk0"]).is_empty());
        }
    });
}

#[test]
fn errors_say_what_is_wrong() {
    run("errors_say_what_is_wrong", || {
        let (code, err) = link(&["add", "vh0", "--peer", "vh0p", "--kind", "veth"], true);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("needs CAP_NET_ADMIN"), "{err}");
        let (code, err) = link(&["add", "a/b", "--peer", "p"], false);
        assert_eq!(code, Some(1));
        assert!(err.contains("not a valid interface name"), "{err}");
        let (code, err) = link(
            &[
                "add", "vh0", "--peer", "vh0p", "--kind", "veth", "--bridge", "nosuchbr",
            ],
            false,
        );
        assert_eq!(code, Some(1));
        assert!(err.contains("nosuchbr: no such interface"), "{err}");
        // An interface that is not a bridge: said so, and no pair is left behind (it used to
        // fail late with "this kernel has no veth support").
        netns::ip(&["link", "add", "nb0", "type", "veth", "peer", "name", "nb1"]).unwrap();
        let (code, err) = link(
            &[
                "add", "vh0", "--peer", "vh0p", "--kind", "veth", "--bridge", "nb0",
            ],
            false,
        );
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("--bridge nb0: not a bridge"), "{err}");
        assert!(
            !ip_out(&["link", "show"]).contains("vh0"),
            "a pair was left"
        );
        let (code, _) = link(&["add", "vh0"], false);
        assert_eq!(code, Some(2), "usage error: no --peer");
    });
}
