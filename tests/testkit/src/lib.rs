//! What every test crate of the workspace shares.
//!
//! **The skip rule.** A test that needs something the machine may lack (root, iproute2, a
//! loopback address it can bind, tshark) calls [`skip`] with its name and the reason, then
//! returns. Rust's test harness has no "skipped" result, so:
//! - under `CI=true`, where every prerequisite is installed, a skip is a failure: [`skip`]
//!   panics with the reason (a test that silently did nothing must not count as passed);
//! - otherwise it prints `SKIP <test>: <why>` and, when `VUR_SKIP_LOG` names a file, appends
//!   that line to it. `tests/run.sh` sets `VUR_SKIP_LOG` and moves each such test from the
//!   harness's "passed" to its own "skipped" count.
//!
//! **The house rules** ([`house`]): each crate's `tests/floors.rs` checks that its imports run
//! one way down its floors and that no file or production function outgrows a reader.

use std::io::Write;

pub mod house;

/// The environment variable that names the file skips are appended to.
pub const SKIP_LOG: &str = "VUR_SKIP_LOG";

/// True when the run is CI's (`CI=true`): a missing prerequisite is then a failure.
pub fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Says that `test` does not run here and why. Panics under CI (see the crate docs); the
/// caller returns right after.
#[track_caller]
pub fn skip(test: &str, why: &str) {
    if under_ci() {
        panic!("{test}: cannot run under CI=true: {why}");
    }
    let line = format!("SKIP {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        // One write of one line in append mode: lines from parallel tests do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            panic!("{test}: skipped, and the skip could not be recorded in {path:?}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A skip outside CI is recorded, one line per call; under CI it is a panic. (Both in one
    /// test: the environment is the process's, and tests run on threads.)
    #[test]
    fn a_skip_is_recorded_and_fails_under_ci() {
        let dir = std::env::temp_dir().join(format!("vur-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips");
        let ci = std::env::var_os("CI");
        // No other test of this crate reads the environment.
        std::env::set_var(SKIP_LOG, &log);
        std::env::set_var("CI", "false");
        skip("t1", "no root");
        skip("t2", "no ip");
        let lines = std::fs::read_to_string(&log).unwrap();
        assert_eq!(lines, "SKIP t1: no root\nSKIP t2: no ip\n");
        std::env::set_var("CI", "true");
        let r = std::panic::catch_unwind(|| skip("t3", "no tshark"));
        match ci {
            Some(v) => std::env::set_var("CI", v),
            None => std::env::remove_var("CI"),
        }
        std::env::remove_var(SKIP_LOG);
        let msg = *r
            .expect_err("a skip under CI must panic")
            .downcast::<String>()
            .unwrap();
        assert_eq!(msg, "t3: cannot run under CI=true: no tshark");
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            lines,
            "t3 not recorded"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
