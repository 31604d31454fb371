#!/usr/bin/env bash
# Builds every fuzz target of rxe-core/fuzz and backend/fuzz on stable Rust and runs each for a
# fixed time; fails when a target does not build, crashes, hangs or leaks past its limits.
#
#   tests/fuzz.sh            20 s per target
#   tests/fuzz.sh 60         60 s per target
#
# The targets are libFuzzer binaries (libfuzzer-sys), built the way `cargo fuzz build
# --sanitizer none` builds them (cargo-fuzz 0.13: SanitizerCoverage flags, --cfg fuzzing, debug
# assertions and overflow checks, release optimisation, an explicit --target so build scripts
# stay uninstrumented), with plain cargo: no cargo-fuzz to install, no nightly. Both fuzz crates
# build into target/fuzz, so rxe-core and libFuzzer are compiled once.
#
# Each run starts from the committed corpus (read only, where there is one) and writes new
# inputs to a scratch directory. A crash or hang leaves its input in
# target/fuzz/artifacts/<target>/; replay it with the binary the failure line names.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-20}
[[ $secs =~ ^[0-9]+$ ]] || { echo "usage: tests/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2; }
t0=$SECONDS
host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=$PWD/target/fuzz
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth \
-Cdebug-assertions -Coverflow-checks"
bin_dir=$CARGO_TARGET_DIR/$host/release
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

passed=0 failed=0
for crate in rxe-core/fuzz backend/fuzz; do
    targets=()
    for f in "$crate"/fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
    echo "== build $crate (${targets[*]})"
    t1=$SECONDS
    locked=()
    [[ -e $crate/Cargo.lock ]] && locked=(--locked)
    if ! cargo build -q --release "${locked[@]}" --target "$host" \
        --manifest-path "$crate/Cargo.toml" --bins; then
        for t in "${targets[@]}"; do
            echo "FAIL $t: $crate does not build"
            failed=$((failed + 1))
        done
        continue
    fi
    echo "built $crate in $((SECONDS - t1)) s"
    # The targets of a crate run side by side (libFuzzer uses one core each).
    pids=()
    for t in "${targets[@]}"; do
        scratch=$work/corpus-$t
        artifacts=$CARGO_TARGET_DIR/artifacts/$t
        mkdir -p "$scratch" "$artifacts"
        corpus=()
        [[ -d $crate/corpus/$t ]] && corpus=("$crate/corpus/$t")
        echo "${corpus[*]:-none}" >"$work/$t.seeds"
        "$bin_dir/$t" "$scratch" "${corpus[@]}" -max_total_time="$secs" -timeout=10 \
            -rss_limit_mb=2048 -artifact_prefix="$artifacts/" >"$work/$t.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!targets[@]}"; do
        t=${targets[$i]} log=$work/${targets[$i]}.log
        if wait "${pids[$i]}"; then
            runs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' || echo '?')
            cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo '?')
            echo "PASS $t: $secs s, $runs runs, $cov edges, seeds: $(cat "$work/$t.seeds")"
            passed=$((passed + 1))
        else
            rc=$?
            echo "FAIL $t: exit $rc; input(s) in $CARGO_TARGET_DIR/artifacts/$t/;" \
                "replay: $bin_dir/$t <input>"
            tail -n 30 "$log" | sed 's/^/    /'
            failed=$((failed + 1))
        fi
    done
done
echo "fuzz: $((SECONDS - t0)) s"
echo "$passed passed, $failed failed"
((failed == 0))
