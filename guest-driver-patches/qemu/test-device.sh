#!/usr/bin/env bash
# Boot the test guest on the patched QEMU with a vhost-user-rdma-pci device served by the
# real daemon, and check what the guest and QEMU see:
#
#   - `-device help` lists vhost-user-rdma-pci;
#   - QEMU started with `-chardev socket,...,reconnect-ms=` before the daemon waits for it
#     (no abort), and connects once the daemon listens;
#   - the guest has a virtio device with ID 0x002a on PCI 1af4:106a with 4 MSI-X vectors;
#   - over the vhost-user socket QEMU read the features, negotiated protocol features
#     (CONFIG among them) and read the config space (VHOST_USER_GET_CONFIG), as QEMU's
#     vhost_user_read/write trace shows; x-query-virtio-status shows the device, its feature
#     bits and three queues of 256;
#   - the daemon is killed and restarted on the same socket while the guest runs: QEMU
#     reconnects (the new daemon logs a frontend) and keeps running; the guest powers off.
#
#   sudo guest-driver-patches/qemu/test-device.sh
#
# Uses the QEMU that guest-driver-patches/qemu/build.sh built (or $VUR_QEMU_RDMA), the guest
# image of images/build.sh (or $VUR_IMAGES) and target/debug/vhost-user-rdma (built here with
# cargo, or $VUR_DAEMON). When one of them is missing it prints one SKIP line and exits 77,
# except under CI=true, where that is a failure. Network: the daemon's UDP socket on
# 127.0.0.1 only. Every wait is bounded; on failure the script says what it waited for and
# prints the logs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
name=qemu-device
boot_timeout=${VUR_BOOT_TIMEOUT:-300}

missing() {
    if [[ ${CI:-} == true ]]; then
        echo "FAIL: $name: $* (CI=true: prerequisites must be installed)"
        exit 1
    fi
    echo "SKIP: $name: $*"
    exit 77
}

[[ $(id -u) -eq 0 ]] || missing "needs root (the QEMU and image caches are root's)"
qemu=${VUR_QEMU_RDMA:-$("$here/build.sh" --print-bin 2>/dev/null || true)}
[[ -n $qemu && -x $qemu ]] ||
    missing "no QEMU with vhost-user-rdma-pci (sudo guest-driver-patches/qemu/build.sh)"
images=${VUR_IMAGES:-$("$repo/images/build.sh" --print-dir 2>/dev/null || true)}
[[ -f $images/vmlinuz && -f $images/initrd.img ]] ||
    missing "no guest image in ${images:-?} (sudo images/build.sh)"
[[ -f /usr/share/seabios/bios-256k.bin && -f /usr/share/qemu/linuxboot_dma.bin ]] ||
    missing "no seabios / qemu-system-data firmware (images/host-setup.sh)"
command -v python3 >/dev/null || missing "python3 not installed (QMP client)"
if [[ -n ${VUR_DAEMON:-} ]]; then
    daemon=$VUR_DAEMON
else
    command -v cargo >/dev/null || missing "cargo not installed (builds the daemon)"
    (cd "$repo" && vur_cargo build -q -p vhost-user-rdma) || {
        echo "FAIL: $name: cargo build -p vhost-user-rdma"
        exit 1
    }
    daemon=$repo/target/debug/vhost-user-rdma
fi
[[ -x $daemon ]] || missing "no daemon at $daemon"

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-qemu-device.XXXXXX")
sock=$work/vur.sock
share=$work/share
mkdir -p "$share"
# A loopback UDP port for the daemon, different per run.
udp_port=$((20000 + $$ % 20000))
qemu_pid='' daemon_pid='' passed=0 failed=0 qemu_must_live=1

say() { echo "[$name $(date +%T)] $*"; }
stop_pid() { # PID: end a process this script started, bounded
    local pid=$1 i
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid" 2>/dev/null || true
    for i in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    stop_pid "$qemu_pid"
    stop_pid "$daemon_pid"
    if ((failed == 0)); then rm -rf "$work"; else echo "logs kept in $work"; fi
}
trap cleanup EXIT
show_logs() {
    local f
    for f in "$work"/console.log "$work"/qemu.stderr "$work"/daemon*.log "$work"/trace.log; do
        [[ -s $f ]] || continue
        echo "---- $(basename "$f") (last 40 lines)"
        tail -40 "$f" | tr -d '\r'
    done
}
ok() {
    passed=$((passed + 1))
    say "ok: $*"
}
fail() {
    failed=$((failed + 1))
    say "FAIL: $*"
    show_logs
    echo "$name: $passed passed, $failed failed"
    exit 1
}
# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s until it succeeds.
wait_for() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@"; do
        ((SECONDS < deadline)) || fail "waited ${secs} s for $what"
        if ((qemu_must_live)) && [[ -n $qemu_pid ]] && ! kill -0 "$qemu_pid" 2>/dev/null; then
            fail "QEMU exited while waiting for $what"
        fi
        sleep 0.2
    done
}
start_daemon() { # LOG
    RUST_LOG=info "$daemon" --socket-path "$sock" --udp-addr "127.0.0.1:$udp_port" >"$1" 2>&1 &
    daemon_pid=$!
}
# qmp CMD [JSON-ARGS]: one QMP command on $work/qmp.sock; prints the "return" value as JSON.
qmp() {
    python3 - "$work/qmp.sock" "$1" "${2:-}" <<'EOF'
import json, socket, sys
path, cmd, args = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(path)
f = s.makefile("rw")
def call(c, a=None):
    msg = {"execute": c}
    if a:
        msg["arguments"] = a
    f.write(json.dumps(msg) + "\n")
    f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            return r
json.loads(f.readline())  # greeting
call("qmp_capabilities")
r = call(cmd, json.loads(args) if args else None)
if "error" in r:
    sys.exit("QMP %s: %s" % (cmd, r["error"]))
print(json.dumps(r["return"]))
EOF
}
jq_py() { # EXPR < JSON: evaluate a Python expression on the JSON value `v`
    python3 -c 'import json, sys; v = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

# ---- 1. the device type exists ---------------------------------------------------------
"$qemu" -device help 2>&1 | grep -q '"vhost-user-rdma-pci"' ||
    fail "$qemu -device help does not list vhost-user-rdma-pci"
props=$("$qemu" -device vhost-user-rdma-pci,help 2>&1)
for p in chardev ctrl-queue-size doorbell-queue-size event-queue-size vectors; do
    grep -q "^  $p=" <<<"$props" || fail "vhost-user-rdma-pci has no property $p"
done
ok "-device help lists vhost-user-rdma-pci (chardev, *-queue-size, vectors)"

# ---- 2. the guest's side: what it prints, then it waits for the host ---------------------
cat >"$share/check.sh" <<'EOF'
# Runs in the guest (images/init, vur.scenario=check.sh).
msix_count() { # PCI device dir -> MSI-X table size from its capability list, or 0
    local cfg ptr id ctrl
    read -r -a cfg <<<"$(od -An -v -tu1 "$1/config" | tr '\n' ' ')"
    ptr=${cfg[0x34]:-0}
    while ((ptr)); do
        id=${cfg[ptr]}
        if ((id == 0x11)); then
            ctrl=$((cfg[ptr + 2] | cfg[ptr + 3] << 8))
            echo $(((ctrl & 0x7ff) + 1))
            return
        fi
        ptr=${cfg[ptr + 1]}
    done
    echo 0
}
for d in /sys/bus/virtio/devices/*; do
    drv=$(readlink "$d/driver" 2>/dev/null || true)
    echo "VIRTIO $(basename "$d") device=$(cat "$d/device") vendor=$(cat "$d/vendor") features=$(cat "$d/features") driver=${drv##*/}"
done
for d in /sys/bus/pci/devices/*; do
    [[ $(cat "$d/vendor") == 0x1af4 ]] || continue
    echo "PCI $(basename "$d") $(cat "$d/vendor"):$(cat "$d/device") class=$(cat "$d/class") msix=$(msix_count "$d") irqs=$(ls "$d/msi_irqs" 2>/dev/null | wc -l)"
done
echo "RDMA-CHECK ready"
for _ in $(seq 900); do
    [[ -e /vur/host-done ]] && break
    sleep 0.2
done
echo "RDMA-CHECK end"
EOF

# ---- 3. QEMU first, with reconnect-ms: it must wait for the daemon -----------------------
args=(
    -L /usr/share/seabios -L /usr/share/qemu
    -accel tcg -machine pc -cpu max -smp 2 -m 512M
    -nodefaults -display none -no-reboot
    -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem
    -chardev "socket,id=rdma0,path=$sock,reconnect-ms=500"
    -device vhost-user-rdma-pci,chardev=rdma0
    -virtfs "local,path=$share,mount_tag=vur,security_model=none,id=vur"
    -kernel "$images/vmlinuz" -initrd "$images/initrd.img"
    -append "console=ttyS0 panic=-1 quiet loglevel=4 vur.name=rdmadev vur.rxe=0 vur.scenario=check.sh"
    -serial "file:$work/console.log"
    -qmp "unix:$work/qmp.sock,server=on,wait=off"
    -trace vhost_user_read -trace vhost_user_write -D "$work/trace.log"
)
say "qemu: $qemu"
say "qemu ${args[*]}" >"$work/qemu.cmdline"
"$qemu" "${args[@]}" 2>"$work/qemu.stderr" &
qemu_pid=$!
sleep 2
kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited at startup (no daemon yet, reconnect-ms=500)"
[[ ! -e $work/console.log || ! -s $work/console.log ]] ||
    fail "the guest started before the vhost-user back-end was there"
ok "QEMU with reconnect-ms=500 waits for the daemon (no abort)"

start_daemon "$work/daemon1.log"
wait_for 30 "the daemon to log 'frontend connected'" grep -q 'frontend connected' "$work/daemon1.log"
ok "QEMU connected once the daemon listened"

# ---- 4. the guest sees the device ---------------------------------------------------------
wait_for "$boot_timeout" "the guest scenario ('RDMA-CHECK ready' on the console)" \
    grep -q 'RDMA-CHECK ready' "$work/console.log"
tr -d '\r' <"$work/console.log" | grep -E '^(VIRTIO|PCI) ' | sed 's/^/  guest: /'
line=$(tr -d '\r' <"$work/console.log" | grep -E '^VIRTIO .* device=0x002a ' | head -1)
[[ -n $line ]] || fail "no virtio device with ID 0x002a in the guest"
ok "guest: virtio device ID 42 (${line#VIRTIO })"
pci=$(tr -d '\r' <"$work/console.log" | grep -E '^PCI .* 0x1af4:0x106a ' | head -1)
[[ -n $pci ]] || fail "no PCI device 1af4:106a in the guest"
[[ $pci == *" msix=4 "* ]] || fail "MSI-X table size is not 4: $pci"
ok "guest: PCI 1af4:106a with 4 MSI-X vectors (${pci#PCI })"

# ---- 5. what QEMU negotiated with the daemon ----------------------------------------------
# vhost-user requests (QEMU's trace): 1 GET_FEATURES, 15 GET_PROTOCOL_FEATURES,
# 16 SET_PROTOCOL_FEATURES, 24 GET_CONFIG.
for r in 1:GET_FEATURES 15:GET_PROTOCOL_FEATURES 16:SET_PROTOCOL_FEATURES 24:GET_CONFIG; do
    grep -q "vhost_user_write req:${r%%:*} " "$work/trace.log" ||
        fail "QEMU never sent ${r#*:} (trace.log)"
done
grep -q 'vhost_user_read req:24 ' "$work/trace.log" || fail "no reply to GET_CONFIG (trace.log)"
ok "vhost-user: GET_FEATURES, GET/SET_PROTOCOL_FEATURES, GET_CONFIG sent and answered"

vpath=$(qmp x-query-virtio | jq_py '[d["path"] for d in v if d["name"] == "virtio-rdma"][0]') ||
    fail "x-query-virtio lists no virtio-rdma device"
status=$(qmp x-query-virtio-status "{\"path\": \"$vpath\"}") || fail "x-query-virtio-status failed"
echo "$status" >"$work/virtio-status.json"
# Feature lists as names only ("VIRTIO_F_VERSION_1: Device compliant..." -> VIRTIO_F_VERSION_1).
summary=$(jq_py '(lambda n: "device-id=%s name=%s status=%s offered=%s negotiated=%s vhost-user-protocol=%s nvqs=%s" % (v["device-id"], v["name"], n(v["status"]["statuses"]), n(v["host-features"]["transports"]), n(v["guest-features"]["transports"]) or "-", n(v["vhost-dev"]["protocol-features"]["protocols"]) if "vhost-dev" in v else "-", v["vhost-dev"]["nvqs"] if "vhost-dev" in v else "-"))(lambda l: ",".join(x.split(":")[0] for x in l))' <<<"$status")
say "  $summary"
[[ $summary == *"device-id=42 name=virtio-rdma "* ]] || fail "unexpected device: $summary"
# vhost-dev is shown once a driver started the device (the image's virtio_rdma module).
if [[ $summary != *"vhost-user-protocol=- "* ]]; then
    [[ $summary == *VHOST_USER_PROTOCOL_F_CONFIG* ]] || fail "CONFIG protocol feature not negotiated"
    [[ $summary == *"nvqs=3"* ]] || fail "vhost-dev does not have 3 queues"
else
    say "  (no guest driver started the device: negotiated features not shown)"
fi
sizes=''
for q in 0 1 2; do
    s=$(qmp x-query-virtio-queue-status "{\"path\": \"$vpath\", \"queue\": $q}" |
        jq_py 'v["vring-num-default"]')
    sizes+="$s "
done
[[ $sizes == "256 256 256 " ]] || fail "queue sizes are $sizes, not 256 256 256"
ok "x-query-virtio-status: ID 42, 3 queues of 256"

# ---- 6. reconnect: kill the daemon, start a new one on the same socket --------------------
# 12 = SET_VRING_KICK: one per queue each time QEMU hands the vrings to a back-end.
kicks() { grep -c 'vhost_user_write req:12 ' "$work/trace.log" || true; }
kicks_ge() { (($(kicks) >= $1)); }
kicks_before=$(kicks)
say "killing the daemon (pid $daemon_pid) and starting a new one"
stop_pid "$daemon_pid"
rm -f "$sock"
sleep 1
kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited when the daemon went away"
start_daemon "$work/daemon2.log"
wait_for 30 "QEMU to reconnect to the new daemon ('frontend connected')" \
    grep -q 'frontend connected' "$work/daemon2.log"
if ((kicks_before >= 3)); then
    # The driver had started the device: the new daemon must get the running vrings.
    wait_for 30 "QEMU to give the new daemon the 3 vrings (SET_VRING_KICK in trace.log)" \
        kicks_ge $((kicks_before + 3))
    say "  the new daemon got the running vrings"
fi
sleep 1
kill -0 "$qemu_pid" 2>/dev/null || fail "QEMU exited after reconnecting"
qmp x-query-virtio-status "{\"path\": \"$vpath\"}" >/dev/null || fail "QMP after reconnect"
ok "QEMU reconnected to a restarted daemon (reconnect-ms) and keeps running"

# ---- 7. the guest ends, QEMU exits by itself -----------------------------------------------
touch "$share/host-done"
wait_for 120 "the guest to power off (VUR-END)" grep -q 'VUR-END' "$work/console.log"
qemu_must_live=0
wait_for 30 "QEMU to exit after the guest powered off" bash -c "! kill -0 $qemu_pid 2>/dev/null"
rc=0
wait "$qemu_pid" || rc=$?
qemu_pid=''
((rc == 0)) || fail "QEMU exit code $rc"
if grep -qiE 'abort|assert|segmentation' "$work/qemu.stderr"; then fail "QEMU stderr reports a crash"; fi
ok "guest powered off, QEMU exited with 0"

echo "$name: $passed passed, $failed failed"
