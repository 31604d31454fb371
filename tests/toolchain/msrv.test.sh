#!/usr/bin/env bash
# The workspace's rust-version (Cargo.toml) is the oldest Rust it builds with, and that Rust
# is checked: every crate and target type-checks with it (`cargo check --workspace
# --all-targets`), and the engine's and the daemon's unit tests pass built by it. One version
# older must not build (else rust-version claims too much: a lower one works).
#
#   tests/toolchain/msrv.test.sh
#
# Needs rustup with the rust-version's toolchain and the one before it (scripts/setup-host.sh
# installs both when rustup is there: `rustup toolchain install 1.89 1.88 --profile minimal`).
# Without them it skips (exit 77) saying so; under CI=true that is a failure. Builds in
# target/msrv-<version>.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
# shellcheck source=scripts/lib/cargo.sh
. scripts/lib/cargo.sh
log() { printf '[msrv %s] %s\n' "$(date +%T)" "$*"; }
want=$(vur_rust_version)
[[ $want =~ ^1\.([0-9]+)$ ]] || { log "FAIL: rust-version '$want' in Cargo.toml is not 1.N"; exit 1; }
older=1.$((BASH_REMATCH[1] - 1))
have() { rustup run "$1" rustc --version >/dev/null 2>&1; }
if ! command -v rustup >/dev/null || ! have "$want" || ! have "$older"; then
    why="needs rustup with Rust $want and $older (rustup toolchain install $want $older --profile minimal; scripts/setup-host.sh does)"
    [[ ${CI:-} == true ]] && { log "FAIL: $why"; exit 1; }
    echo "SKIP msrv: $why"
    exit 77
fi
fail=0 n=0
t0=$SECONDS
log "cargo +$want check --workspace --all-targets"
if cargo "+$want" check -q --workspace --all-targets --target-dir "target/msrv-$want"; then
    n=$((n + 1)); log "ok: everything builds with Rust $want ($((SECONDS - t0)) s)"
else
    fail=$((fail + 1)); log "FAIL: the workspace does not build with Rust $want, its rust-version"
fi
t0=$SECONDS
if cargo "+$want" test -q -p rxe-core -p vhost-user-rdma --lib --target-dir "target/msrv-$want" >"target/msrv-$want.test.log" 2>&1; then
    n=$((n + 1)); log "ok: the engine's and the daemon's unit tests pass with Rust $want ($((SECONDS - t0)) s)"
else
    fail=$((fail + 1)); tail -30 "target/msrv-$want.test.log"; log "FAIL: unit tests with Rust $want"
fi
# One version older: the lock file's dependencies or the code itself need $want.
t0=$SECONDS
if cargo "+$older" check -q --workspace --all-targets --ignore-rust-version \
    --target-dir "target/msrv-$older" >"target/msrv-$older.log" 2>&1; then
    fail=$((fail + 1)); log "FAIL: the workspace builds with Rust $older too: rust-version $want claims too much"
else
    n=$((n + 1))
    log "ok: Rust $older cannot build it ($(grep -m1 -E '^error' "target/msrv-$older.log" | cut -c1-120)) ($((SECONDS - t0)) s)"
fi
echo "$n passed, $fail failed"
((fail == 0))
