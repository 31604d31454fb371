#!/usr/bin/env bash
# The daemon's guest memory through host dma-bufs (--guest-memory dmabuf) and the devmem
# receive probe (--devmem-rx), where the kernel has udmabuf: inside the trixie guest (kernel
# 6.12, CONFIG_UDMABUF=y), whose kernel plays the host's.
#   1. tests/guest/tests/guest_memory_dmabuf.rs, built here and run in the guest with its
#      ignored tests included: SEND, WRITE and READ of 64 KiB between two daemons with
#      --guest-memory dmabuf and test guests on them, every byte checked, the daemons' dma-buf
#      mappings as large as the guests' RAM; an unsealed memfd and a region above udmabuf's
#      size_limit_mb refused with their reasons while the daemon goes on serving; the devmem
#      probe's refusal on a veth and on a missing interface.
#   2. The devmem probe on the guest's virtio-net (eth0, a NIC driver without the queue API):
#      the daemon does not start and says what it found.
# On a host whose kernel has udmabuf, `cargo test -p vur-testguest --test guest_memory_dmabuf
# -- --include-ignored` runs the same tests there.
#
#   sudo tests/vm/guest-memory-dmabuf.test.sh
#
# Runs in a network namespace of its own (tests/vm/net.sh exec). Prints "SKIP: <reason>" and
# exits 77 without root, QEMU or the guest image (a failure under CI=true).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
log() { printf '[guest-memory-dmabuf %s] %s\n' "$(date +%T)" "$*"; }
fail() { printf '[guest-memory-dmabuf %s] FAIL: %s\n' "$(date +%T)" "$*"; exit 1; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require guest-memory-dmabuf /usr/bin/python3
if ! vm_in_netns; then
    t=$SECONDS
    log "building vur-daemon and the guest_memory_dmabuf test"
    (cd "$repo" && vur_cargo build -q -p vur-testguest --bin vur-daemon)
    VUR_DMABUF_TEST_EXE=$(cd "$repo" && vur_cargo test -q -p vur-testguest --test guest_memory_dmabuf \
        --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "guest_memory_dmabuf":
        print(m["executable"])')
    export VUR_DMABUF_TEST_EXE
    log "built in $((SECONDS - t)) s"
fi
vm_netns guest-memory-dmabuf "$@"

daemon=$repo/target/debug/vur-daemon
exe=${VUR_DMABUF_TEST_EXE:-}
[[ -x $daemon ]] || fail "$daemon not built"
[[ -n $exe && -x $exe ]] || fail "the guest_memory_dmabuf test binary was not built"
shared=$(mktemp -d "${TMPDIR:-/tmp}/vur-gm-dmabuf.XXXXXX")
cleanup() {
    local rc=$?
    if ((rc == 0)); then rm -rf "$shared"; else log "artifacts kept in $shared"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$daemon" "$shared/vur-daemon"
cp "$exe" "$shared/guest_memory_dmabuf"

cat >"$shared/gm-dmabuf-guest.sh" <<'EOF'
#!/bin/bash
# Runs inside the guest (tests/vm/guest-memory-dmabuf.test.sh).
set -uo pipefail
say() { echo "GMVM $*"; }
bad() { echo "GMVM-FAIL $*"; exit 1; }
say "kernel $(uname -r); size_limit_mb $(cat /sys/module/udmabuf/parameters/size_limit_mb 2>/dev/null)"
[[ -c /dev/udmabuf ]] || bad "no /dev/udmabuf in the guest"
cd /tmp
# --- 1. the Rust tests, ignored ones included, one at a time (one lowers size_limit_mb) ---
VUR_TEST_DAEMON=/vur/vur-daemon RUST_BACKTRACE=1 /vur/guest_memory_dmabuf --include-ignored \
    --test-threads=1 --nocapture >/tmp/tests.out 2>&1
trc=$?
sed 's/^/GMVM test: /' /tmp/tests.out | grep -v '^GMVM test: $'
((trc == 0)) || bad "guest_memory_dmabuf failed (rc=$trc)"
grep -q '^test result: ok. 4 passed; 0 failed; 0 ignored' /tmp/tests.out ||
    bad "guest_memory_dmabuf did not run its 4 tests"
# --- 2. the devmem probe on the guest's virtio-net ----------------------------------------
out=$(/vur/vur-daemon --socket-path /tmp/d.sock --udp-addr 127.0.0.1:47920 --guest-memory dmabuf \
    --devmem-rx eth0 2>&1)
rc=$?
say "eth0 (virtio-net): rc=$rc: $(echo "$out" | grep -- '--devmem-rx')"
((rc == 1)) || bad "the daemon with --devmem-rx eth0 did not refuse to start (rc=$rc)"
[[ $out == *"devmem receive on eth0 is unavailable"* && $out == *"bind-rx"* && $out == *"TCP sockets only"* ]] ||
    bad "the refusal does not say what the probe found: $out"
say "PASS"
EOF
chmod +x "$shared/gm-dmabuf-guest.sh"

"$here/net.sh" up vurtapA
log "booting the guest (image $images)"
rc=0
"$here/run-vm.sh" --name gm --images "$images" --shared "$shared" --no-rxe \
    --tap vurtapA --ip "$guest4/24" \
    --scenario "$shared/gm-dmabuf-guest.sh" --timeout 600 >"$shared/run.log" 2>&1 || rc=$?
tr -d '\r' <"$shared/gm.console.log" | grep -a '^GMVM' || true
((rc == 0)) || { tail -30 "$shared/run.log"; fail "the guest scenario ended with rc=$rc"; }
grep -aq '^GMVM PASS' "$shared/gm.console.log" || fail "no PASS from the guest"
log "PASS"
