//! Compiles bpf/roce_tap.bpf.c with clang for the BPF target into $OUT_DIR/roce_tap.bpf.o,
//! which src/bpf.rs embeds. The object is always built from source, never committed.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const SRC: &str = "bpf/roce_tap.bpf.c";

fn main() {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let out =
        PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("roce_tap.bpf.o");
    let status = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c", SRC, "-o",
        ])
        .arg(&out)
        .status();
    // A plain message and exit 1, not a panic: cargo shows this stderr as the build error.
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("error: vur-tap: `{clang} -target bpf` failed on {SRC} ({s})");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!(
                "error: vur-tap: cannot run `{clang}` ({e}): the eBPF tap is compiled with clang for \
                 the BPF target; install the Debian package `clang` (images/host-setup.sh does), or \
                 set CLANG to a clang that has the BPF target"
            );
            std::process::exit(1);
        }
    }
}
