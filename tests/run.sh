#!/usr/bin/env bash
# The project's test command (README "Run the tests"; CI calls it through .ci/run).
#
#   tests/run.sh            everything: lints, Rust tests, the soak, fuzz smoke runs, the demo,
#                           the host package, then the VM tests
#   tests/run.sh --no-vm    lints, Rust tests, the soak, fuzz smoke runs, the demo and the host
#                           package only
#
# Env:
#   VUR_SOAK_SECS       the soak's duration (default 120 s)
#   VUR_TEST_DEADLINE   a time (seconds since the epoch) by which the run must have ended:
#                       every step's time limit is cut to what is left, and a step that would
#                       start after it is counted as failed, not run (.ci/run sets it so that
#                       a run ends with its summary inside CI's time limit)
#
# VM tests need root, QEMU and the guest images (scripts/setup-host.sh); without them each
# prints one line saying why it skips (exit 77) — except under CI=true, where a missing
# prerequisite is a failure. The Rust tests follow the same rule (vur_testkit::skip): a test
# that cannot run here says so in one line and is counted as skipped, not passed; under
# CI=true it fails.
#
# Every step runs even when an earlier one failed, each under a time limit (a hang ends the
# step, says so and leaves the summary). The last line is "N passed, N failed, N skipped" over
# the lints, the Rust tests (ignored ones run in their own steps below and are not counted
# twice), each fuzz target, the demos and each VM test.
set -uo pipefail
cd "$(dirname "$0")/.."

vm=1
[[ ${1:-} == --no-vm ]] && vm=0

step() { printf '\n== %s\n' "$*"; }
t0=$SECONDS
passed=0 failed=0 skipped=0
failures=()
times=()
scratch=$(mktemp -d "${TMPDIR:-/tmp}/vur-tests.XXXXXX")
log=$scratch/log
# The last 40 lines of every step that failed, printed again beside the summary at the end.
tails=$scratch/tails
mkdir -p "$tails"
trap 'rm -rf "$scratch"' EXIT
# Rust tests that skip append "SKIP name: why" here (vur_testkit::skip).
export VUR_SKIP_LOG=$scratch/skips
deadline=${VUR_TEST_DEADLINE:-}

# keep_tail NAME FILE: keeps the last lines of FILE as what step NAME printed last.
keep_tail() {
    printf '%s\n' "--- $1, last lines:" >"$tails/$(printf '%03d' "${#failures[@]}")"
    tail -n 40 "$2" >>"$tails/$(printf '%03d' "${#failures[@]}")"
}

# limit SECONDS: prints the time limit for a step that may take SECONDS, cut to what is left
# before the deadline; prints nothing (and returns 1) when nothing is left.
limit() {
    local l=$1 left
    if [[ -n $deadline ]]; then
        left=$((deadline - $(date +%s)))
        ((left >= 30)) || return 1
        ((l <= left)) || l=$left
    fi
    echo "$l"
}

# fail_step NAME WHY: counts a step that failed before or without running.
fail_step() {
    failed=$((failed + 1))
    failures+=("$1 ($2)")
    echo "$1: $2"
}

# finish_step NAME RC LIMIT T1: the step's time, and what a timeout means.
finish_step() {
    local name=$1 rc=$2 lim=$3 t1=$4
    times+=("$(printf '%6d s  %s' $((SECONDS - t1)) "$name")")
    if ((rc == 124 || rc == 137)); then
        echo "$name: TIMED OUT after $lim s (its time limit; the step was stopped)"
    fi
}

# cargo_step NAME LIMIT ARGS...: run cargo test (under LIMIT seconds), add up its "test
# result:" lines; the tests that skipped move from passed to skipped.
cargo_step() {
    local name=$1 lim rc=0 p f s t1=$SECONDS
    step "$name"
    lim=$(limit "$2") || { fail_step "$name" "not run: the run's deadline has passed"; return; }
    shift 2
    : >"$VUR_SKIP_LOG"
    timeout -k 30 "$lim" cargo "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    read -r p f < <(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' \
        FS='[ ;]+' "$log")
    s=$(grep -c '^SKIP ' "$VUR_SKIP_LOG")
    if ((s)); then
        echo "$name: $s test(s) skipped here:"
        sed 's/^/    /' "$VUR_SKIP_LOG"
    fi
    passed=$((passed + p - s)) failed=$((failed + f)) skipped=$((skipped + s))
    if ((rc != 0)); then
        ((f > 0)) || failed=$((failed + 1)) # a build failure or a timeout has no result line
        keep_tail "$name" "$log"
        failures+=("$name (rc $rc)")
    fi
    finish_step "$name" "$rc" "$lim" "$t1"
}

# check_step NAME LIMIT COMMAND...: one test that passes when COMMAND exits 0 (lints, demos).
check_step() {
    local name=$1 lim rc=0 t1=$SECONDS
    step "$name"
    lim=$(limit "$2") || { fail_step "$name" "not run: the run's deadline has passed"; return; }
    shift 2
    timeout -k 30 "$lim" "$@" >"$log" 2>&1 || rc=$?
    cat "$log"
    if ((rc == 0)); then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        keep_tail "$name" "$log"
        failures+=("$name (rc $rc)")
    fi
    echo "$name: rc $rc in $((SECONDS - t1)) s"
    finish_step "$name" "$rc" "$lim" "$t1"
}

# script_step LIMIT SCRIPT [ARGS...]: one test; exit 0 passes, 77 skips, anything else fails.
# A script that ends with "N passed, N failed" (tests/fuzz.sh) counts as N + N tests.
script_step() {
    local lim rc=0 t1=$SECONDS t=$2 p f
    step "${*:2}"
    lim=$(limit "$1") || { fail_step "$t" "not run: the run's deadline has passed"; return; }
    shift
    # Through a file, not a pipe: a process the step leaves behind cannot hold the run up.
    # (A background job ignores SIGINT: Ctrl-C and SIGTERM are passed on as SIGTERM, which
    # every step's cleanup handles; so does the time limit's SIGTERM.)
    : >"$log"
    timeout -k 60 "$lim" bash "$@" >>"$log" 2>&1 &
    local pid=$! tail_pid
    tail -n +1 -f --pid="$pid" "$log" &
    tail_pid=$!
    trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; wait "$tail_pid"; exit 130' INT TERM
    wait "$pid" || rc=$?
    wait "$tail_pid"
    trap - INT TERM
    read -r p f < <(awk '/^[0-9]+ passed, [0-9]+ failed$/ { p = $1; f = $3 } END { print p + 0, f + 0 }' "$log")
    case $rc in
    0) passed=$((passed + (p + f > 0 ? p : 1))) ;;
    77) skipped=$((skipped + 1)) ;;
    *)
        failed=$((failed + (f > 0 ? f : 1)))
        passed=$((passed + p))
        keep_tail "$t" "$log"
        failures+=("$t (rc $rc)")
        ;;
    esac
    echo "$t: rc $rc in $((SECONDS - t1)) s"
    finish_step "$t" "$rc" "$lim" "$t1"
}

# Lints first: they are quick, and the workspace's lints (undocumented_unsafe_blocks) hold
# only if clippy runs. The fuzz crates are workspaces of their own: checked in their target dir.
check_step "cargo fmt --check" 300 cargo fmt --all --check
check_step "cargo clippy (workspace)" 1800 cargo clippy -q --workspace --all-targets -- -D warnings
for c in rxe-core/fuzz backend/fuzz; do
    check_step "cargo clippy ($c)" 900 env CARGO_TARGET_DIR="$PWD/target/fuzz-clippy" \
        cargo clippy -q --manifest-path "$c/Cargo.toml" --all-targets -- -D warnings
done

cargo_step "cargo test --workspace --all-targets" 2700 test --workspace --all-targets --no-fail-fast
# The short form of the 16k-QP scale benchmark (ignored by plain cargo test: it wants a
# release build).
cargo_step "16k-QP scale run (release)" 1200 test --release -p vur-testguest --test scale -- --ignored
# The soak (tests/guest/tests/soak.rs) is #[ignore]d so that a plain `cargo test` stays fast;
# it runs here, for VUR_SOAK_SECS seconds (120 unless set).
export VUR_SOAK_SECS=${VUR_SOAK_SECS:-120}
cargo_step "soak, $VUR_SOAK_SECS s (cargo test -p vur-testguest --test soak -- --ignored)" \
    $((VUR_SOAK_SECS + 900)) test -p vur-testguest --test soak -- --ignored --nocapture
echo "rust tests: $((SECONDS - t0)) s"

# Each fuzz target counts as one test (tests/fuzz.sh ends with "N passed, N failed").
script_step 1500 tests/fuzz.sh

# The set-up scripts' own checks (no network, no root).
for t in tests/scripts/*.test.sh; do
    script_step 120 "$t"
done

# The oldest Rust the workspace claims builds it and runs its unit tests; the one before does not.
script_step 900 tests/toolchain/msrv.test.sh

# The README's main job, as a newcomer runs it.
check_step "scripts/demo.sh (the README's main job)" 900 scripts/demo.sh

# The host package: built, installed into a clean Debian 12 root, its units verified, the
# daemon started from the unit's command line and reached by a test guest (root).
script_step 900 tests/packaging/deb.test.sh
# The host set-up's package step on a Debian 12 with a classic sources.list (a clean root).
script_step 600 tests/packaging/host-setup.test.sh
# The guest driver as a DKMS package, built for two kernels in a clean trixie root.
script_step 900 tests/packaging/dkms.test.sh

if ((vm)); then
    # The benchmarks among the VM tests keep their checks (filters, counts, completions) with
    # one short round; their measurements are commands of their own (docs/benchmarks.md).
    export VUR_RAW_BENCH_ROUNDS=${VUR_RAW_BENCH_ROUNDS:-1} VUR_TAP_BENCH_ROUNDS=${VUR_TAP_BENCH_ROUNDS:-1}
    export VUR_NETKIT_BENCH_ROUNDS=${VUR_NETKIT_BENCH_ROUNDS:-1}
    # The VM tests run the release daemon and the release interop peers.
    step "cargo build --release (daemon and interop peers for the VM tests)"
    if lim=$(limit 1200); then
        timeout -k 30 "$lim" cargo build --release -p vhost-user-rdma -p vur-interop --bins 2>&1 ||
            fail_step "cargo build --release" "rc $?"
    else
        fail_step "cargo build --release" "not run: the run's deadline has passed"
    fi
    # The VM main job: a guest with the device, stock rdma-core on it.
    if [[ $(id -u) -eq 0 || ${CI:-} == true ]]; then
        script_step 900 scripts/vm-demo.sh
    else
        step "scripts/vm-demo.sh"
        echo "SKIP scripts/vm-demo.sh: needs root (network namespace, QEMU with shared memory)"
        skipped=$((skipped + 1))
    fi
    for t in tests/vm/*.test.sh guest-driver-patches/*/test-*.sh; do
        [[ -e $t ]] || continue
        # guest-pair runs two guests per mode through many modes; the rest boot one or two
        # guests for a few minutes at most.
        case $t in
        */guest-pair.test.sh) script_step 2400 "$t" ;;
        */pyverbs.test.sh | */soak.test.sh) script_step 1500 "$t" ;;
        *) script_step 900 "$t" ;;
        esac
    done
fi

echo
if ((${#failures[@]})); then
    echo "== what the failed steps printed last"
    cat "$tails"/* 2>/dev/null
    echo
fi
echo "== time per step"
printf '%s\n' "${times[@]}"
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "tests: $((SECONDS - t0)) s"
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
