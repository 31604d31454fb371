#!/usr/bin/env bash
# The project's test command (README "Run the tests"; CI calls it through .ci/run).
#
#   tests/run.sh            everything: Rust tests, then the VM tests
#   tests/run.sh --no-vm    Rust tests only
#
# VM tests need root, QEMU and the guest images (images/build.sh); without them each prints one
# line saying why it skips — except under CI=true, where a missing prerequisite is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

vm=1
[[ ${1:-} == --no-vm ]] && vm=0

step() { printf '\n== %s\n' "$*"; }
t0=$SECONDS

step "cargo test --workspace"
cargo test --workspace --all-targets 2>&1
# Doc tests too (all-targets skips them).
cargo test --workspace --doc 2>&1
echo "rust tests: $((SECONDS - t0)) s"

if ((vm)); then
    for t in tests/vm/*.test.sh; do
        [[ -e $t ]] || continue
        step "$t"
        t1=$SECONDS
        bash "$t"
        echo "$t: $((SECONDS - t1)) s"
    done
fi
echo "all tests passed in $((SECONDS - t0)) s"
