#!/usr/bin/env bash
# The daemon killed (SIGKILL) under a running guest with traffic in flight, then started again
# on the same socket: QEMU reconnects (reconnect-ms), the new daemon finds a guest whose device
# state it does not have and raises DEVICE_FATAL, the driver removes and probes the device
# again, the applications that were running end with an error instead of hanging, and new
# ones run on the new vrdma device without a guest reboot. Then the driver is unloaded and
# loaded again with user contexts open. Afterwards the daemon holds only the kernel's QP1 and
# its CQ, the guest's kernel log has no oops, BUG or warning, and once the guest has powered
# off the daemon holds no device state at all.
#
# A kernel ULP rides through the restart too: NVMe over RDMA (nvmet-rdma and nvme-rdma in the
# guest, over the device) has I/O in flight when the daemon dies; the I/O ends with an error
# (nvme-rdma drains its queues on the dead device and deletes the controller) instead of
# hanging, and after the restart a new connection writes and reads back 16 MiB. Last, the guest
# reboots (a reset, with a context open): the daemon drops everything of the old boot, and
# the device works in the new one.
#
#   sudo tests/vm/device-restart.test.sh
#
# Env: VUR_DAEMON, VUR_IMAGES, VUR_QEMU, VUR_DRIVER_KO (a virtio_rdma.ko to load instead of
# the image's), VUR_RESTART_KEEP=1 (keep the logs).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t_start=$SECONDS
log() { printf '[device-restart %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require device-restart
vm_device_prereqs device-restart
vm_netns device-restart "$@"

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-device-restart.XXXXXX")
dpid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $dpid ]]; then kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; fi
    if ((rc == 0)) && [[ -z ${VUR_RESTART_KEEP:-} ]]; then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

addr=10.77.0.2 mac=52:54:00:77:00:02
log "daemon 1: $daemon"
vm_start_daemon "$work" "$addr" "$mac" || exit 1
dpid=$REPLY
[[ -z ${VUR_DRIVER_KO:-} ]] || cp "$VUR_DRIVER_KO" "$work/virtio_rdma.ko"

cat >"$work/guest.sh" <<'EOF'
#!/bin/bash
# Runs inside the guest (tests/vm/device-restart.test.sh). Host and guest meet through files
# in /vur: traffic → (host kills and restarts the daemon) → restarted.
fail=0
say() { echo "DR $*"; }
check() { say "$1 rc=$2${3:+ $3}"; [[ $2 == 0 ]] || fail=1; }
if [[ -f /vur/virtio_rdma.ko ]]; then
    rmmod virtio_rdma && insmod /vur/virtio_rdma.ko || { say "FAIL reloading virtio_rdma"; exit 1; }
fi
wait_file() { # PATH SECONDS WHAT
    local i
    for ((i = 0; i < $2 * 10; i++)); do [[ -e $1 ]] && return 0; sleep 0.1; done
    say "timeout after $2 s waiting for $3"
    return 1
}
# the vrdma device (name may change across a re-probe), its IPv4 GID index; bounded wait
device_up() { # SECONDS
    local i d g
    for ((i = 0; i < $1 * 10; i++)); do
        for d in /sys/class/infiniband/vrdma*; do
            [[ -e $d ]] || continue
            grep -q ACTIVE "$d/ports/1/state" 2>/dev/null || continue
            g=$(vur-gid v4 "${d##*/}" 2>/dev/null) || continue
            dev=${d##*/} gid=$g
            return 0
        done
        sleep 0.1
    done
    return 1
}
# wait_listen, wait_cm_listen
wait_tag=DR
# shellcheck source=tests/vm/guest-wait.sh
. /vur-scenario/guest-wait.sh
# ended_within SECONDS PID...: bounded wait (counted from $t0) until every PID has exited; if
# one still runs then, all are killed and it returns 1
ended_within() {
    local secs=$1 p
    shift
    for p; do
        while kill -0 "$p" 2>/dev/null && ((SECONDS - t0 < secs)); do sleep 0.2; done
    done
    for p; do
        kill -0 "$p" 2>/dev/null && { kill "$@" 2>/dev/null; return 1; }
    done
    return 0
}
# wait_rts N: bounded wait until N QPs of ibv_rc_pingpong on $dev are in RTS (connected: the
# ping-pong is under way; their output, a file, is only flushed at exit)
wait_rts() {
    local n=0
    for _ in $(seq 300); do
        n=$(rdma resource show qp link "$dev/1" 2>/dev/null | grep -w ibv_rc_pingpong | grep -cw RTS)
        ((n >= $1)) && return 0
        sleep 0.1
    done
    say "note: $n of $1 ibv_rc_pingpong QPs in RTS within 30 s"
    return 1
}
pingpong() { # NAME PORT ARGS... : a server and a client on this guest, bounded by 60 s; a
    # --chk (-c) finding ("invalid data in page N", after which the server exits 0) fails it
    local name=$1 port=$2 s=0 c=0
    shift 2
    timeout 60 ibv_rc_pingpong -d "$dev" -g "$gid" -p "$port" "$@" >"/tmp/$name.s" 2>&1 &
    local sp=$!
    wait_listen "$port"
    timeout 60 ibv_rc_pingpong -d "$dev" -g "$gid" -p "$port" "$@" 127.0.0.1 >"/tmp/$name.c" 2>&1 || c=$?
    wait "$sp" || s=$?
    if grep -q 'invalid data' "/tmp/$name.s" "/tmp/$name.c"; then
        say "FAIL $name: 'invalid data' in its output"
        ((s != 0)) || s=97
    fi
    check "$name" $((s | c)) "server=$s client=$c"
}

# NVMe over RDMA on this guest's RoCE address, target and host both here (kernel verbs on both
# ends of the device). nvme_port_on (re)enables the port: a listener does not outlive the
# device it was bound to. nvme_connect sets $ctrl and $blk.
nvme_target() {
    local c=/sys/kernel/config/nvmet s
    modprobe nvmet-rdma && modprobe nvme-rdma || return 1
    mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || return 1
    s=$c/subsystems/vur-nvme
    truncate -s 64M /tmp/nvme.img
    mkdir "$s" && echo 1 >"$s/attr_allow_any_host" && mkdir "$s/namespaces/1" &&
        echo /tmp/nvme.img >"$s/namespaces/1/device_path" &&
        echo 1 >"$s/namespaces/1/buffered_io" && echo 1 >"$s/namespaces/1/enable" &&
        mkdir "$c/ports/1" && echo rdma >"$c/ports/1/addr_trtype" &&
        echo ipv4 >"$c/ports/1/addr_adrfam" && echo "$VUR_ADDR" >"$c/ports/1/addr_traddr" &&
        echo 4420 >"$c/ports/1/addr_trsvcid"
}
nvme_port_on() {
    local c=/sys/kernel/config/nvmet
    rm -f "$c/ports/1/subsystems/vur-nvme"
    ln -s "$c/subsystems/vur-nvme" "$c/ports/1/subsystems/vur-nvme"
}
nvme_connect() { # [OPTIONS]: more nvme-fabrics options, e.g. ctrl_loss_tmo=0
    local i c b
    ctrl='' blk=''
    for ((i = 0; i < 50; i++)); do # the listener may take a moment after the port comes up
        echo "transport=rdma,traddr=$VUR_ADDR,trsvcid=4420,nqn=vur-nvme${1:+,$1}" >/dev/nvme-fabrics 2>/dev/null && break
        sleep 0.2
    done
    ((i < 50)) || { say "nvme connect to $VUR_ADDR:4420 failed for 10 s"; return 1; }
    for ((i = 0; i < 100; i++)); do
        for c in /sys/class/nvme/nvme[0-9]*; do
            [[ $(cat "$c/transport" 2>/dev/null) == rdma ]] && ctrl=${c##*/}
        done
        for b in /sys/block/nvme*; do
            [[ ${b##*/} =~ ^nvme[0-9]+n[0-9]+$ && -b /dev/${b##*/} ]] && blk=/dev/${b##*/}
        done
        [[ -n $ctrl && -n $blk ]] && return 0
        sleep 0.1
    done
    say "no rdma controller with a namespace within 10 s"
    return 1
}
nvme_check() { # NAME: 16 MiB written, read back and compared
    head -c 16M /dev/urandom >/tmp/pattern
    dd if=/tmp/pattern of="$blk" bs=1M oflag=direct status=none &&
        dd if="$blk" of=/tmp/back bs=1M count=16 iflag=direct status=none &&
        cmp -s /tmp/pattern /tmp/back
    check "$1" $? "16 MiB through $blk ($ctrl)"
}

if [[ -f /vur/boot1-fail ]]; then
    . /vur/boot2.sh
fi
device_up 10 || { say "FAIL no active vrdma device"; exit 1; }
say "before: $dev gid-index=$gid"
pingpong before 18515 -n 50 -c
nvme_target && nvme_port_on || { say "FAIL nvmet configuration"; exit 1; }
# ctrl_loss_tmo=0: no reconnect after the error, so the outcome does not depend on whether
# nvme-rdma's error recovery or the device's removal comes first (with reconnects allowed, a
# controller whose recovery came first connects again over the new device)
nvme_connect ctrl_loss_tmo=0 || { say "FAIL nvme connect before the restart"; exit 1; }
nvme_check nvme_before
# I/O in flight when the daemon dies: writes and reads in a loop until one fails
timeout 300 bash -c "while :; do dd if=/tmp/pattern of=$blk bs=1M oflag=direct status=none &&
    dd if=$blk of=/dev/null bs=1M count=16 iflag=direct status=none || exit 1; done" &
nvme_io=$!

# Traffic in flight when the daemon dies: an event-driven pingpong pair (both sleep in
# ibv_get_cq_event, which fails once the device is gone) and one that only polls its CQ ring
# in user memory (it never enters the kernel: the driver writes flush completions into its
# ring); none may outlive the device by more than 30 s.
timeout 600 ibv_rc_pingpong -d "$dev" -g "$gid" -p 18516 -n 100000000 -e >/tmp/long.s 2>&1 &
p1=$!
timeout 600 ibv_rc_pingpong -d "$dev" -g "$gid" -p 18523 -n 100000000 >/tmp/poll.s 2>&1 &
p3=$!
wait_listen 18516
wait_listen 18523
timeout 600 ibv_rc_pingpong -d "$dev" -g "$gid" -p 18516 -n 100000000 -e 127.0.0.1 >/tmp/long.c 2>&1 &
p2=$!
timeout 600 ibv_rc_pingpong -d "$dev" -g "$gid" -p 18523 -n 100000000 127.0.0.1 >/tmp/poll.c 2>&1 &
p4=$!
wait_rts 4
kill -0 $p1 $p2 2>/dev/null || { say "FAIL the long pingpong did not start: $(tail -3 /tmp/long.c)"; exit 1; }
kill -0 $p3 $p4 2>/dev/null || { say "FAIL the polling pingpong did not start: $(tail -3 /tmp/poll.c)"; exit 1; }
touch /vur/traffic
wait_file /vur/restarted 60 "the host to restart the daemon" || exit 1
t0=$SECONDS
ended_within 30 $p1 $p2 ||
    { say "FAIL a pingpong still ran 30 s after the daemon restart (it should have got an error)"; fail=1; }
wait $p1; r1=$?
wait $p2; r2=$?
say "in-flight pingpongs ended: server rc=$r1 ($(tail -1 /tmp/long.s)) client rc=$r2 ($(tail -1 /tmp/long.c)) after $((SECONDS - t0)) s"
((r1 != 0 && r2 != 0 && r1 != 124 && r2 != 124)) || { say "FAIL the in-flight pingpongs should have failed with an error"; fail=1; }
ended_within 30 $p3 $p4 ||
    { say "FAIL a polling pingpong still ran 30 s after the daemon restart (no flush completion in its ring)"; fail=1; }
wait $p3; r3=$?
wait $p4; r4=$?
say "in-flight polling pingpongs ended: server rc=$r3 ($(grep -m1 -i 'fail\|error' /tmp/poll.s)) client rc=$r4 ($(grep -m1 -i 'fail\|error' /tmp/poll.c)) after $((SECONDS - t0)) s"
((r3 != 0 && r4 != 0 && r3 != 124 && r4 != 124)) || { say "FAIL the polling pingpongs should have failed with an error"; fail=1; }
while kill -0 $nvme_io 2>/dev/null && ((SECONDS - t0 < 60)); do sleep 0.2; done
if kill -0 $nvme_io 2>/dev/null; then
    say "FAIL NVMe I/O still ran 60 s after the daemon restart"
    fail=1
else
    wait $nvme_io; r=$?
    say "in-flight NVMe I/O ended with rc=$r after $((SECONDS - t0)) s"
    ((r != 0 && r != 124)) || { say "FAIL the NVMe I/O should have ended with an error"; fail=1; }
fi
dmesg | grep -E 'virtio_rdma|vrdma|nvme' | tail -30 | sed 's/^/DR dmesg: /'

device_up 30 || { say "FAIL no active vrdma device 30 s after the restart"; exit 1; }
say "after restart: $dev gid-index=$gid"
pingpong after_restart 18517 -n 200 -c
# NVMe again, on the new device: the controller of the old one is gone
for c in /sys/class/nvme/nvme[0-9]*; do
    [[ -e $c ]] && { say "FAIL $c outlived the device it ran on"; fail=1; echo 1 >"$c/delete_controller"; }
done
nvme_port_on
if nvme_connect; then
    nvme_check nvme_after_restart
    echo 1 >"/sys/class/nvme/$ctrl/delete_controller"
else
    check nvme_after_restart 1
fi
rm -f /sys/kernel/config/nvmet/ports/1/subsystems/vur-nvme
# rdma_cm again: the kernel's QP1 of the new device
timeout 60 rping -s -a "$VUR_ADDR" -p 7174 -C 10 -v >/tmp/rping.s 2>&1 &
sp=$!
wait_cm_listen 7174
c=0; s=0
timeout 60 rping -c -a "$VUR_ADDR" -p 7174 -C 10 -v -V >/tmp/rping.c 2>&1 || c=$?
wait $sp || s=$?
check rping_after_restart $((s | c)) "pings=$(grep -c 'ping data' /tmp/rping.c)"

# Driver unload with a user context open (a pingpong server waiting for its client).
timeout 60 ibv_rc_pingpong -d "$dev" -g "$gid" -p 18518 -n 10 >/tmp/unload.s 2>&1 &
sp=$!
wait_listen 18518
t0=$SECONDS
rmmod virtio_rdma; rc=$?
check unload_with_open_context $rc "in $((SECONDS - t0)) s"
kill $sp 2>/dev/null
wait $sp
if [[ -f /vur/virtio_rdma.ko ]]; then insmod /vur/virtio_rdma.ko; else modprobe virtio_rdma; fi
device_up 30 || { say "FAIL no active vrdma device after reloading the driver"; exit 1; }
pingpong after_reload 18519 -n 200 -c

# Device reset: unbind the virtio device from its driver and bind it again.
vdev=$(basename "$(readlink -f /sys/class/infiniband/$dev/device)")
echo "$vdev" >/sys/bus/virtio/drivers/virtio_rdma/unbind && echo "$vdev" >/sys/bus/virtio/drivers/virtio_rdma/bind
check rebind $? "$vdev"
device_up 30 || { say "FAIL no active vrdma device after rebinding $vdev"; exit 1; }
pingpong after_rebind 18520 -n 200 -c

if dmesg | grep -E 'BUG:|Oops:|WARNING:|Call Trace:|refcount_t:|general protection' >/tmp/bad; then
    say "FAIL the kernel log has:"; sed 's/^/DR   /' /tmp/bad | head -20; fail=1
fi

# A reset with a context open (a pingpong server waiting for its client): the next boot finds
# a device that knows nothing of this one.
timeout 60 ibv_rc_pingpong -d "$dev" -g "$gid" -p 18521 -n 10 >/tmp/reboot.s 2>&1 &
wait_listen 18521
echo "$fail" >/vur/boot1-fail
say "rebooting (reset) with a context open"
sync
echo b >/proc/sysrq-trigger
sleep 30
say "FAIL the guest did not reboot"
exit 1
EOF
cat >"$work/boot2.sh" <<'EOF'
# Sourced by guest.sh at the second boot (after the reset): the device is there and works,
# nothing of boot 1 is left.
fail=$(cat /vur/boot1-fail)
say "boot 2 (boot 1 ended with fail=$fail)"
device_up 30 || { say "FAIL no active vrdma device after the reboot"; exit 1; }
pingpong after_reboot 18522 -n 200 -c
if dmesg | grep -E 'BUG:|Oops:|WARNING:|Call Trace:|refcount_t:|general protection' >/tmp/bad; then
    say "FAIL the kernel log has:"; sed 's/^/DR   /' /tmp/bad | head -20; fail=1
fi
touch /vur/tools-done
for _ in $(seq 300); do [[ -f /vur/counters-read ]] && break; sleep 0.1; done
exit $fail
EOF

vm_rc=0
"$here/run-vm.sh" --name dr --qemu "$qemu" --images "$images" --rdma-sock "$work/rdma.sock" \
    --rdma-reconnect 500 --allow-reboot --nic-no-peer --mac "$mac" --ip "$addr/24" --no-rxe --shared "$work" \
    --smp 2 --scenario "$work/guest.sh" --file "$here/guest-wait.sh" --timeout 600 >"$work/run-vm.log" 2>&1 &
vm=$!

fail=0
vm_wait_file() { # PATH SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do [[ -e $1 ]] && return 0; sleep 0.1; done
    return 1
}
if vm_wait_file "$work/traffic" 120; then
    log "traffic in flight: SIGKILL to the daemon (pid $dpid)"
    kill -9 "$dpid"
    wait "$dpid" 2>/dev/null || true
    dpid=''
    mv "$work/daemon.log" "$work/daemon1.log"
    rm -f "$work/rdma.sock" "$work/counters.sock"
    sleep 1
    vm_start_daemon "$work" "$addr" "$mac" || exit 1
    dpid=$REPLY
    log "daemon 2 (pid $dpid) on the same socket"
    touch "$work/restarted"
    if vm_wait_file "$work/tools-done" 300; then
        vm_daemon_counters "$work/counters.sock" >"$work/counters.json" 2>&1 || true
    fi
    touch "$work/counters-read"
else
    log "FAIL: the guest did not start its traffic within 120 s"
    fail=1
fi
wait "$vm" || vm_rc=$?
# The guest is gone (powered off): its frontend with it, and every object.
if [[ -n $dpid ]]; then
    for _ in $(seq 50); do
        vm_daemon_counters "$work/counters.sock" >"$work/after.json" 2>/dev/null || true
        python3 -c 'import json,sys; sys.exit(0 if "objects" not in json.load(open(sys.argv[1])) else 1)' "$work/after.json" 2>/dev/null && break
        sleep 0.1
    done
    if python3 -c 'import json,sys; sys.exit(0 if "objects" not in json.load(open(sys.argv[1])) else 1)' "$work/after.json" 2>/dev/null; then
        log "after the guest powered off the daemon holds no device state"
    else
        log "FAIL: the daemon still holds a device after its guest powered off: $(cat "$work/after.json")"
        fail=1
    fi
fi
tr -d '\r' <"$work/dr.console.log" | grep -a -E '^DR|^\[vur-init' || true
if ((vm_rc != 0)); then
    tail -n 30 "$work/run-vm.log"
    fail=1
fi
grep -E 'device state was lost|frontend' "$work/daemon.log" 2>/dev/null | sed 's/^/daemon 2: /' || true
if [[ -s $work/counters.json ]]; then
    msg=$(vm_daemon_leaks device-restart "$work/counters.json") || fail=1
    log "$msg"
else
    log "FAIL: no counters from daemon 2"
    fail=1
fi
if ((fail)); then
    log "FAIL in $((SECONDS - t_start)) s"
    exit 1
fi
log "PASS in $((SECONDS - t_start)) s"
