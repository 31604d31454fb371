#!/usr/bin/env bash
# Smoke test of the VM test bed: boot one trixie guest with Linux rxe, check rxe0,
# run ibv_rc_pingpong (server + client in the guest, over rxe0 to its own IPv4 GID),
# and ping the guest from the host bridge.
#
#   sudo tests/vm/smoke.test.sh
#
# Runs in a network namespace of its own (tests/vm/net.sh exec): bridge, tap and QEMU live
# there and vanish with it. Prints "SKIP: <reason>" and exits 77 when not root or QEMU / the
# image is missing, except under CI=true, where a missing prerequisite is a failure.
# Env: VUR_SMOKE_ITERS (default 100), VUR_IMAGES, VUR_BRIDGE/VUR_TAP (default vurbr0/vurtapS).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
iters=${VUR_SMOKE_ITERS:-100}
export VUR_BRIDGE=${VUR_BRIDGE:-vurbr0}
tap=${VUR_TAP:-vurtapS}
guest_ip=10.77.0.2

log() { printf '[smoke %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require smoke
vm_netns smoke "$@"

t_start=$SECONDS
shared=$(mktemp -d "${TMPDIR:-/tmp}/vur-smoke.XXXXXX")
vm_pid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $vm_pid ]] && kill -0 "$vm_pid" 2>/dev/null; then kill "$vm_pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    "$here/net.sh" down "$tap" >/dev/null 2>&1 || true
    if ((rc == 0)); then rm -rf "$shared"; else log "artifacts kept in $shared"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$here/net.sh" up "$tap"

cat >"$shared/smoke-guest.sh" <<EOF
#!/bin/bash
# Runs inside the guest (tests/vm/smoke.test.sh).
set -euo pipefail
iters=$iters
EOF
cat >>"$shared/smoke-guest.sh" <<'EOF'
echo "== rdma link"; rdma link
echo "== ibv_devices"; ibv_devices
ibv_devices | grep -qw rxe0 || { echo "SMOKE-FAIL no rxe0 in ibv_devices"; exit 1; }
gid=$(vur-gid v4) || { echo "SMOKE-FAIL no IPv4 RoCE v2 GID on rxe0"; exit 1; }
echo "SMOKE gid-index-v4=$gid gid=$(cat /sys/class/infiniband/rxe0/ports/1/gids/"$gid")"
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'

timeout 120 ibv_rc_pingpong -d rxe0 -g "$gid" -n "$iters" >/tmp/server.log 2>&1 &
srv=$!
for _ in $(seq 100); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
t0=${EPOCHREALTIME/./}
crc=0
timeout 120 ibv_rc_pingpong -d rxe0 -g "$gid" -n "$iters" "$VUR_ADDR" >/tmp/client.log 2>&1 || crc=$?
src=0
wait "$srv" || src=$?
echo "== server"; cat /tmp/server.log
echo "== client"; cat /tmp/client.log
echo "SMOKE pingpong server=$src client=$crc wall=$(( (${EPOCHREALTIME/./} - t0) / 1000 )) ms"
[[ $src == 0 && $crc == 0 ]] || { echo "SMOKE-FAIL ibv_rc_pingpong"; exit 1; }

# Let the host ping us, then report. Bounded wait for the host's verdict.
touch /vur/guest-ready
for _ in $(seq 600); do [[ -f /vur/host-done ]] && break; sleep 0.1; done
[[ -f /vur/host-done ]] || { echo "SMOKE-FAIL host never answered"; exit 1; }
echo "SMOKE host ping: $(cat /vur/host-done)"
EOF

log "booting guest (image $images)"
"$here/run-vm.sh" --name smoke --tap "$tap" --ip "$guest_ip/24" --ip6 fd77::2/64 \
    --scenario "$shared/smoke-guest.sh" --shared "$shared" --images "$images" --timeout 300 &
vm_pid=$!

ping_rc=1
for _ in $(seq 2400); do # <= 240 s for boot + pingpong
    [[ -f $shared/guest-ready ]] && break
    kill -0 "$vm_pid" 2>/dev/null || break
    sleep 0.1
done
if [[ -f $shared/guest-ready ]]; then
    log "host -> guest: ping -c 3 $guest_ip"
    ping_rc=0
    ping -n -c 3 -i 0.3 -W 2 "$guest_ip" || ping_rc=$?
    echo "ping rc=$ping_rc" >"$shared/host-done"
fi
vm_rc=0
wait "$vm_pid" || vm_rc=$?
vm_pid=''

grep -a '^SMOKE\|usec/iter\|^\[vur-init' "$shared/smoke.console.log" | tr -d '\r' || true
if ((vm_rc == 0 && ping_rc == 0)); then
    log "PASS in $((SECONDS - t_start)) s"
else
    log "FAIL: guest rc=$vm_rc host ping rc=$ping_rc (log: $shared/smoke.console.log)"
    exit 1
fi
