#!/usr/bin/env bash
# Boot one test guest under QEMU (TCG), run a scenario script in it, return its exit code.
#
#   tests/vm/run-vm.sh --name A --tap vurtapA --mac 52:54:00:77:00:02 \
#       --ip 10.77.0.2/24 --ip6 fd77::2/64 --scenario FILE --shared DIR --timeout 300
#
# Options:
#   --name NAME        guest name (hostname, log name)                    [required]
#   --tap TAP          attach virtio-net eth0 to this tap (tests/vm/net.sh up makes them)
#   --mac MAC          eth0 MAC (default derived from the name)
#   --ip A/N --ip6 A/N --mtu N   eth0 addresses and MTU
#   --scenario FILE    bash script run by the guest's /init; its exit code becomes ours.
#                      It is packed into a small cpio in front of the image's initrd
#                      (guest path /vur-scenario/<basename>)
#   --file FILE        extra file for /vur-scenario/ (repeatable)
#   --shared DIR       host directory mounted in the guest at /vur (9p); the scenario runs there
#   --env KEY=VALUE    environment variable for the scenario (repeatable)
#   --timeout SEC      kill QEMU after SEC seconds (default 300); exit code 124
#   --log FILE         serial console log (default DIR/NAME.console.log, or .cache/vm/)
#   --mem MB --smp N   guest size (default 1024, 1)
#   --no-rxe           do not create rxe0 in the guest
#   --interactive      console on this terminal, no scenario needed, no timeout
#   --images DIR       kernel + initrd directory (default: images/build.sh --print-dir; env VUR_IMAGES)
#   --qemu BIN         QEMU binary (default: $VUR_QEMU, else qemu-system-x86_64)
#   --gpu              add a virtio-gpu-pci (2D, no display): /dev/dri/renderD128 in the guest,
#                      a dma-buf exporter (virtio_gpu's buffers)
#   --rdma-sock PATH   add a vhost-user-rdma-pci device (virtio-rdma, served by the daemon
#                      listening on PATH); guest RAM becomes a shared memfd, as vhost-user needs
#   --rdma-reconnect MS  QEMU reconnects to the daemon's socket MS ms after losing it
#                      (chardev reconnect-ms): a guest that outlives a daemon restart
#   --nic-no-peer      without --tap: an eth0 (virtio-net, --mac) attached to nothing, so a
#                      virtio-rdma port has a netdev to pair with and carry its addresses
#   --allow-reboot     a guest reboot restarts the guest (the scenario runs again at every
#                      boot) instead of ending QEMU
#   --net-sock PATH    eth0 (virtio-net, --mac) is served by the daemon listening on PATH
#                      (vhost-user-rdma --net-socket): with --rdma-sock on the same daemon, the
#                      guest has its RoCE NIC
#   --host-mtu N       with --net-sock: QEMU's host_mtu=N (VIRTIO_NET_F_MTU; QEMU hands N to the
#                      daemon with NET_SET_MTU, which refuses more than its interface carries)
#   --tap2 TAP --mac2 MAC  a second NIC (eth1) on TAP, e.g. next to --nic-no-peer: the guest's
#                      link to other guests while eth0 carries the virtio-rdma addresses
#
# Exit code: the scenario's (from the "VUR-END name=NAME rc=N" line the guest prints),
# 124 on timeout, 125 when QEMU ended without an end marker. On failure the tail of the
# console log is printed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

name='' tap='' mac='' ip='' ip6='' mtu='' scenario='' shared='' timeout=300 logf=''
mem=1024 smp=1 rxe=1 interactive=0 images=${VUR_IMAGES:-} qemu=${VUR_QEMU:-qemu-system-x86_64}
gpu=0 rdma_sock='' net_sock='' host_mtu='' rdma_reconnect='' nic_no_peer=0 tap2='' mac2='' no_reboot=-no-reboot
envs=() files=()
die() { printf '[run-vm] error: %s\n' "$*" >&2; exit 2; }
while (($#)); do
    case $1 in
    --name) name=$2; shift ;;
    --tap) tap=$2; shift ;;
    --mac) mac=$2; shift ;;
    --ip) ip=$2; shift ;;
    --ip6) ip6=$2; shift ;;
    --mtu) mtu=$2; shift ;;
    --scenario) scenario=$2; shift ;;
    --file) files+=("$2"); shift ;;
    --shared) shared=$2; shift ;;
    --env) envs+=("$2"); shift ;;
    --timeout) timeout=$2; shift ;;
    --log) logf=$2; shift ;;
    --mem) mem=$2; shift ;;
    --smp) smp=$2; shift ;;
    --no-rxe) rxe=0 ;;
    --interactive) interactive=1 ;;
    --images) images=$2; shift ;;
    --qemu) qemu=$2; shift ;;
    --rdma-sock) rdma_sock=$2; shift ;;
    --gpu) gpu=1 ;;
    --net-sock) net_sock=$2; shift ;;
    --host-mtu) host_mtu=$2; shift ;;
    --rdma-reconnect) rdma_reconnect=$2; shift ;;
    --nic-no-peer) nic_no_peer=1 ;;
    --allow-reboot) no_reboot='' ;;
    --tap2) tap2=$2; shift ;;
    --mac2) mac2=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done
[[ -n $name ]] || die "--name is required"
[[ -n $scenario || $interactive == 1 ]] || die "--scenario FILE (or --interactive) is required"
[[ -z $scenario || -f $scenario ]] || die "scenario $scenario not found"
log() { printf '[run-vm %s %s] %s\n' "$name" "$(date +%T)" "$*"; }

command -v "$qemu" >/dev/null || die "$qemu not found (images/host-setup.sh installs it)"
[[ -n $images ]] || images=$("$repo/images/build.sh" --print-dir)
[[ -f $images/vmlinuz && -f $images/initrd.img ]] ||
    die "no guest image in $images (run: sudo images/build.sh)"
[[ -z $shared ]] || { mkdir -p "$shared" && shared=$(cd "$shared" && pwd); }
if [[ -z $logf ]]; then
    if [[ -n $shared ]]; then logf=$shared/$name.console.log; else
        mkdir -p "$repo/.cache/vm" && logf=$repo/.cache/vm/$name.console.log
    fi
fi
[[ -n $mac ]] || mac=52:54:00:$(printf '%s' "$name" | sha256sum | sed 's/^\(..\)\(..\)\(..\).*/\1:\2:\3/')

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-vm-$name.XXXXXX")
qpid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then
        kill "$qpid" 2>/dev/null || true
        sleep 1
        kill -9 "$qpid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# initrd = small uncompressed cpio with the scenario, then the image's compressed one
# (the kernel unpacks concatenated archives; the compressed one must come last).
initrd=$images/initrd.img
if [[ -n $scenario || ${#files[@]} -gt 0 ]]; then
    mkdir -p "$work/root/vur-scenario"
    [[ -z $scenario ]] || install -m 755 "$scenario" "$work/root/vur-scenario/"
    for f in "${files[@]}"; do cp "$f" "$work/root/vur-scenario/"; done
    (cd "$work/root" && find . | cpio -o -H newc --quiet) >"$work/initrd.img"
    cat "$images/initrd.img" >>"$work/initrd.img"
    initrd=$work/initrd.img
fi

append="console=ttyS0 panic=-1 oops=panic softlockup_panic=1 quiet loglevel=4 mitigations=off vur.name=$name"
[[ -z $ip ]] || append+=" vur.ip=$ip"
[[ -z $ip6 ]] || append+=" vur.ip6=$ip6"
[[ -z $mtu ]] || append+=" vur.mtu=$mtu"
((rxe)) || append+=" vur.rxe=0"
[[ -z $scenario ]] || append+=" vur.scenario=$(basename "$scenario")"
for e in "${envs[@]}"; do append+=" vur.env.$e"; done
((interactive)) && append+=" vur.shell=1"

args=(
    -L /usr/share/seabios -L /usr/share/qemu
    -accel tcg -machine pc -cpu max -smp "$smp" -m "$mem"
    -nodefaults -no-user-config -display none ${no_reboot:+"$no_reboot"}
    -kernel "$images/vmlinuz" -initrd "$initrd" -append "$append"
)
if [[ -n $tap ]]; then
    [[ -e /sys/class/net/$tap ]] || die "tap $tap does not exist (sudo tests/vm/net.sh up $tap)"
    args+=(-netdev "tap,id=n0,ifname=$tap,script=no,downscript=no"
        -device "virtio-net-pci,netdev=n0,mac=$mac,romfile=")
fi
if [[ -n $net_sock ]]; then
    [[ -z $tap ]] || die "--net-sock and --tap both make eth0"
    [[ -S $net_sock ]] || die "no vhost-user socket at $net_sock (start vhost-user-rdma --net-socket first)"
    args+=(-chardev "socket,id=net0,path=$net_sock"
        -netdev vhost-user,id=n0,chardev=net0
        -device "virtio-net-pci,netdev=n0,mac=$mac,romfile=${host_mtu:+,host_mtu=$host_mtu}")
fi
if [[ -z $tap && -z $net_sock ]] && ((nic_no_peer)); then
    args+=(-device "virtio-net-pci,mac=$mac,romfile=")
fi
if [[ -n $tap2 ]]; then
    [[ -e /sys/class/net/$tap2 ]] || die "tap $tap2 does not exist (sudo tests/vm/net.sh up $tap2)"
    [[ -n $mac2 ]] || die "--tap2 needs --mac2"
    args+=(-netdev "tap,id=n1,ifname=$tap2,script=no,downscript=no"
        -device "virtio-net-pci,netdev=n1,mac=$mac2,romfile=")
fi
if [[ -n $rdma_sock || -n $net_sock ]]; then
    # vhost-user backends map guest memory: a shared memfd
    args+=(-object "memory-backend-memfd,id=mem,size=${mem}M,share=on" -numa node,memdev=mem)
fi
if [[ -n $rdma_sock ]]; then
    [[ -S $rdma_sock ]] || die "no vhost-user socket at $rdma_sock (start vhost-user-rdma first)"
    args+=(-chardev "socket,id=rdma0,path=$rdma_sock${rdma_reconnect:+,reconnect-ms=$rdma_reconnect}"
        -device vhost-user-rdma-pci,chardev=rdma0)
fi
# A 2D virtio-gpu (no display): a DRM render node whose buffers are dma-buf exporters.
((gpu == 0)) || args+=(-device virtio-gpu-pci)
[[ -z $shared ]] || args+=(-virtfs "local,path=$shared,mount_tag=vur,security_model=none,id=vur")

if ((interactive)); then
    log "interactive: $qemu ${args[*]} -serial mon:stdio"
    exec "$qemu" "${args[@]}" -serial mon:stdio
fi

# boot: run QEMU once, the console to $logf; sets $qstatus (QEMU's exit status), $timed_out, $t0
boot() {
    : >"$logf"
    log "boot: tap=${tap:-none}${tap2:+ tap2=$tap2}${rdma_sock:+ rdma=$rdma_sock} mac=$mac ip=${ip:-none} ip6=${ip6:-none} timeout=${timeout}s log=$logf"
    t0=${EPOCHREALTIME/./}
    "$qemu" "${args[@]}" -serial "file:$logf" 2>"$work/qemu.stderr" &
    qpid=$!
    timed_out=0
    while kill -0 "$qpid" 2>/dev/null; do
        if (((${EPOCHREALTIME/./} - t0) / 1000000 >= timeout)); then
            timed_out=1
            log "timeout after ${timeout}s, killing QEMU (pid $qpid)"
            kill "$qpid" 2>/dev/null || true
            sleep 2
            kill -9 "$qpid" 2>/dev/null || true
            break
        fi
        sleep 0.5
    done
    qstatus=0
    wait "$qpid" 2>/dev/null || qstatus=$?
    qpid=''
}
boot
# QEMU 10.0's multi-threaded TCG can die of SIGSEGV in a vCPU thread while the firmware is
# still running (address_space_translate_for_iotlb reading a MemoryRegionSection whose mr is
# 0x20, the console still empty, 2.5 s after start; seen once with -smp 2 in a CI run). The
# guest has run nothing of the test then, and the daemon waits for the next frontend: boot
# once more, saying so. A crash after the guest's /init started is the test's failure.
if ((qstatus > 128 && !timed_out)) && ! grep -aq 'init start' "$logf"; then
    cp "$logf" "$work/console.first-boot"
    log "QEMU died of signal $((qstatus - 128)) before the guest's /init started (stderr: $(tr '\n' ' ' <"$work/qemu.stderr")); booting once more"
    boot
fi
elapsed_ms=$(((${EPOCHREALTIME/./} - t0) / 1000))

tr -d '\r' <"$logf" >"$work/log"
init_at=$(sed -n 's/^\[vur-init \([0-9.]*\)\] init start.*/\1/p' "$work/log" | head -1)
end=$(grep -a "^VUR-END name=$name rc=" "$work/log" | tail -1 || true)
if ((timed_out)); then
    rc=124
elif [[ -n $end ]]; then
    rc=${end##*rc=}
else
    rc=125
fi
log "exit rc=$rc in $((elapsed_ms / 1000)).$(printf '%03d' $((elapsed_ms % 1000))) s (guest /init at ${init_at:-?} s uptime)"
if ((rc != 0)); then
    [[ -s $work/qemu.stderr ]] && { log "qemu stderr:"; cat "$work/qemu.stderr"; }
    log "last lines of $logf:"
    tail -n 40 "$work/log"
fi
exit "$rc"
