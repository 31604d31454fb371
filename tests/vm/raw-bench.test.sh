#!/usr/bin/env bash
# The udp and raw transports side by side on a veth pair, in one run (docs/benchmarks.md, "udp
# vs raw transport on a veth pair"): `vur-bench --only raw`, which makes two network
# namespaces of its own with the veth pair between them (they vanish with it) and runs, in
# interleaved rounds, two udp daemons, two raw daemons with the TPACKET_V3 ring and two with
# the V2 ring: 64 B RC SEND half RTT and 64 KiB RC WRITE. Prints the table; fails when a pair
# fails (a completion error, a timeout) or no table comes out. The numbers are reported, not
# judged: this machine's noise is larger than the difference (docs/benchmarks.md).
#
#   sudo tests/vm/raw-bench.test.sh
#
# Prints "SKIP: <reason>" and exits 77 without root or iproute2 (a failure under CI=true).
# Env: VUR_RAW_BENCH_ROUNDS (default 3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
t_start=$SECONDS
log() { printf '[raw-bench %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
[[ $(id -u) -eq 0 ]] || vm_missing "raw-bench: needs root (network namespaces, packet sockets)"
command -v ip >/dev/null || vm_missing "raw-bench: ip not installed (iproute2)"
rounds=${VUR_RAW_BENCH_ROUNDS:-3}
[[ $rounds =~ ^[1-9][0-9]?$ ]] || { echo "VUR_RAW_BENCH_ROUNDS=$rounds: want 1..99"; exit 2; }

t=$SECONDS
log "building vhost-user-rdma and vur-bench (release)"
(cd "$repo" && vur_cargo build -q --release -p vhost-user-rdma -p vur-testguest --bin vhost-user-rdma --bin vur-bench)
log "built in $((SECONDS - t)) s"
out=$(mktemp "${TMPDIR:-/tmp}/vur-raw-bench.XXXXXX")
trap 'rm -f "$out"' EXIT
rc=0
"$repo/target/release/vur-bench" --only raw --rounds "$rounds" --iters 2000 \
    --write-bytes 134217728 >"$out" 2>&1 || rc=$?
cat "$out"
((rc == 0)) || { log "FAIL: vur-bench exited with $rc"; exit 1; }
grep -q '^veth, 2 namespaces' "$out" || { log "FAIL: no table (skipped?)"; exit 1; }
log "PASS in $((SECONDS - t_start)) s"
