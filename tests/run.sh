#!/usr/bin/env bash
# The project's test command (README "Run the tests"; CI calls it through .ci/run).
#
#   tests/run.sh            everything: Rust tests, the soak, fuzz smoke runs, then the VM tests
#   tests/run.sh --no-vm    Rust tests, the soak and fuzz smoke runs only
#
# VUR_SOAK_SECS sets the soak's duration (default 120 s).
#
# VM tests need root, QEMU and the guest images (scripts/setup-host.sh); without them each
# prints one line saying why it skips (exit 77) — except under CI=true, where a missing
# prerequisite is a failure. Every step runs even when an earlier one failed; the last line is
# "N passed, N failed, N skipped" over the Rust tests, the fuzz targets and the VM tests.
set -uo pipefail
cd "$(dirname "$0")/.."

vm=1
[[ ${1:-} == --no-vm ]] && vm=0

step() { printf '\n== %s\n' "$*"; }
t0=$SECONDS
passed=0 failed=0 skipped=0
failures=()
log=$(mktemp "${TMPDIR:-/tmp}/vur-tests.XXXXXX")
# The last 40 lines of every step that failed, printed again beside the summary at the end.
tails=$(mktemp -d "${TMPDIR:-/tmp}/vur-tests-tails.XXXXXX")
trap 'rm -rf "$log" "$tails"' EXIT

# keep_tail NAME FILE: keeps the last lines of FILE as what step NAME printed last.
keep_tail() {
    printf '%s\n' "--- $1, last lines:" >"$tails/$(printf '%03d' "${#failures[@]}")"
    tail -n 40 "$2" >>"$tails/$(printf '%03d' "${#failures[@]}")"
}

# cargo_step NAME ARGS...: run cargo test, add up its "test result:" lines.
cargo_step() {
    local name=$1 rc=0 p f i
    shift
    step "$name"
    cargo "$@" 2>&1 | tee "$log" || rc=$?
    read -r p f i < <(awk '/^test result:/ { p += $4; f += $6; i += $8 } END { print p + 0, f + 0, i + 0 }' \
        FS='[ ;]+' "$log")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + i))
    if ((rc != 0)); then
        ((f > 0)) || failed=$((failed + 1)) # a build failure has no result line
        keep_tail "$name" "$log"
        failures+=("$name (rc $rc)")
    fi
}

# script_step SCRIPT [ARGS...]: one test; exit 0 passes, 77 skips, anything else fails.
script_step() {
    local t=$1 rc=0 t1=$SECONDS
    step "$*"
    # Through a file, not a pipe: a process the step leaves behind cannot hold the run up.
    # (A background job ignores SIGINT: Ctrl-C and SIGTERM are passed on as SIGTERM, which
    # every step's cleanup handles.)
    : >"$log"
    bash "$@" >>"$log" 2>&1 &
    local pid=$! tail_pid
    tail -n +1 -f --pid="$pid" "$log" &
    tail_pid=$!
    trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; wait "$tail_pid"; exit 130' INT TERM
    wait "$pid" || rc=$?
    wait "$tail_pid"
    trap - INT TERM
    case $rc in
    0) passed=$((passed + 1)) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)); keep_tail "$t" "$log"; failures+=("$t (rc $rc)") ;;
    esac
    echo "$t: rc $rc in $((SECONDS - t1)) s"
}

cargo_step "cargo test --workspace --all-targets" test --workspace --all-targets
# Doc tests too (all-targets skips them).
cargo_step "cargo test --workspace --doc" test --workspace --doc
# The short form of the 16k-QP scale benchmark (ignored by plain cargo test: it wants a
# release build).
cargo_step "16k-QP scale run (release)" test --release -p vur-testguest --test scale -- --ignored
# The soak (tests/guest/tests/soak.rs) is #[ignore]d so that a plain `cargo test` stays fast;
# it runs here, for VUR_SOAK_SECS seconds (120 unless set).
export VUR_SOAK_SECS=${VUR_SOAK_SECS:-120}
cargo_step "soak, $VUR_SOAK_SECS s (cargo test -p vur-testguest --test soak -- --ignored)" \
    test -p vur-testguest --test soak -- --ignored --nocapture
echo "rust tests: $((SECONDS - t0)) s"

if [[ -f tests/fuzz.sh ]]; then
    script_step tests/fuzz.sh
fi

if ((vm)); then
    # The VM tests run the release daemon and the release interop peers.
    step "cargo build --release (daemon and interop peers for the VM tests)"
    if ! cargo build --release -p vhost-user-rdma -p vur-interop --bins 2>&1; then
        failed=$((failed + 1))
        failures+=("cargo build --release")
    fi
    for t in tests/vm/*.test.sh guest-driver-patches/*/test-*.sh; do
        [[ -e $t ]] || continue
        script_step "$t"
    done
fi

echo
if ((${#failures[@]})); then
    echo "== what the failed steps printed last"
    cat "$tails"/* 2>/dev/null
    echo
fi
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "tests: $((SECONDS - t0)) s"
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
