#!/usr/bin/env bash
# The libvirt domains of packaging/libvirt/ with the real libvirt: libvirtd started by this
# test in a mount namespace of its own (its /run, /var/lib, /var/log and /etc/libvirt are tmpfs
# here, the users it wants exist only here: the host's libvirt, if any, is not touched), each
# domain defined and started with virsh (TCG; the patched QEMU as emulator; guest memory a
# shared memfd; the device through <qemu:commandline>), then virsh destroy and undefine:
#   vhost-user-rdma-domain.xml      the daemon's udp transport on an address of this
#                                   namespace's loopback; stock rdma-core in the guest over the
#                                   device (ibv_devinfo, ibv_rc_pingpong against itself)
#   vhost-user-rdma-nic-domain.xml  the daemon as the guest's whole NIC: its virtio-net an
#                                   <interface type='vhostuser'> on the daemon's net socket,
#                                   both on a veth whose other end (10.77.5.1) is this
#                                   namespace's; the guest pings it over eth0 and runs
#                                   ibv_rc_pingpong (server, every byte checked with -c)
#                                   against rxe-peer there, which checks every byte too; the
#                                   daemon got the MTU the domain gives the NIC (host_mtu)
#
#   sudo tests/vm/libvirt.test.sh
#
# Prints "SKIP: <reason>" and exits 77 without root, libvirt (libvirtd, virsh), the patched
# QEMU or the image; under CI=true that is a failure.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
log() { printf '[libvirt %s] %s\n' "$(date +%T)" "$*"; }
fail() { printf '[libvirt %s] FAIL: %s\n' "$(date +%T)" "$*"; exit 1; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require libvirt
for t in libvirtd virsh unshare; do
    command -v "$t" >/dev/null || vm_missing "libvirt: no $t (apt-get install libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients)"
done
vm_device_prereqs libvirt

if ! vm_in_netns; then
    log "building rxe-peer"
    # shellcheck source=scripts/lib/cargo.sh
    . "$repo/scripts/lib/cargo.sh"
    (cd "$repo" && vur_cargo build -q -p vur-interop --bin rxe-peer)
fi
peer=$repo/target/debug/rxe-peer

# Inside the namespace: a mount namespace of our own for libvirt's directories.
if [[ ${1:-} != --inner ]]; then
    vm_netns libvirt "$@"
    exec unshare --mount --propagation private "$BASH" "$0" --inner
fi

addr=10.77.0.2
mac=52:54:00:77:00:02
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-libvirt.XXXXXX")
dpids=() lpid='' domains=()
virsh_() { virsh -q -c qemu:///system "$@"; }
cleanup() {
    local rc=$? d
    if [[ -n $lpid ]]; then
        for d in "${domains[@]}"; do
            virsh_ destroy "$d" >/dev/null 2>&1 || true
            virsh_ undefine "$d" >/dev/null 2>&1 || true
        done
        kill "$lpid" 2>/dev/null || true
        wait "$lpid" 2>/dev/null || true
    fi
    for d in "${dpids[@]}"; do kill "$d" 2>/dev/null || true; wait "$d" 2>/dev/null || true; done
    if ((rc == 0)); then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# libvirt's own directories, this test's alone (a tmpfs each in this mount namespace).
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt; do
    mkdir -p "$d" && mount -t tmpfs tmpfs "$d"
done
# The users libvirt's QEMU driver looks up at start (made by libvirt-daemon-system's postinst
# on a real host), here only.
cp /etc/passwd "$work/passwd" && cp /etc/group "$work/group"
grep -q '^libvirt-qemu:' "$work/passwd" || echo 'libvirt-qemu:x:64055:64055::/var/lib/libvirt:/usr/sbin/nologin' >>"$work/passwd"
grep -q '^libvirt-qemu:' "$work/group" || echo 'libvirt-qemu:x:64055:' >>"$work/group"
grep -q '^kvm:' "$work/group" || echo 'kvm:x:64056:' >>"$work/group"
mount --bind "$work/passwd" /etc/passwd
mount --bind "$work/group" /etc/group
mkdir -p /etc/libvirt/qemu /var/lib/libvirt/qemu /var/log/libvirt/qemu
cat >/etc/libvirt/libvirtd.conf <<'X'
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
X
# QEMU as root without libvirt's sandboxing: this bed has no AppArmor profile or cgroup
# delegation for it (a KVM host keeps the defaults: docs/kvm-host.md).
cat >/etc/libvirt/qemu.conf <<'X'
user = "root"
group = "root"
security_driver = "none"
namespaces = [ ]
cgroup_controllers = [ ]
remember_owner = 0
stdio_handler = "file"
swtpm_user = "root"
swtpm_group = "root"
X
libvirtd -p /run/libvirt/libvirtd.pid >"$work/libvirtd.log" 2>&1 &
lpid=$!
for _ in $(seq 100); do [[ -S /run/libvirt/libvirt-sock ]] && break; sleep 0.1; done
[[ -S /run/libvirt/libvirt-sock ]] || { tail -20 "$work/libvirtd.log"; fail "libvirtd did not come up"; }
log "libvirtd $(virsh_ version | awk '/library/ {print $NF; exit}') up (pid $lpid)"

[[ -x $peer ]] || fail "$peer not built"

# The guests: the image's kernel, its initrd with these scenarios in front (as run-vm.sh does).
mkdir -p "$work/share" "$work/root/vur-scenario"
cat >"$work/root/vur-scenario/lv-guest.sh" <<'G'
#!/bin/bash
dev=vrdma0
for _ in $(seq 100); do gid=$(vur-gid v4 "$dev" 2>/dev/null) && break; sleep 0.1; done
[[ -n ${gid:-} ]] || { echo "LV-FAIL no IPv4 GID on $dev"; exit 1; }
ibv_devinfo -d "$dev" | grep -q 'state:.*PORT_ACTIVE' || { echo "LV-FAIL $dev not PORT_ACTIVE"; exit 1; }
echo "LV devinfo ok gid=$gid"
timeout 60 ibv_rc_pingpong -d "$dev" -g "$gid" -n 200 -c >/tmp/s.log 2>&1 &
spid=$!
for _ in $(seq 100); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
timeout 60 ibv_rc_pingpong -d "$dev" -g "$gid" -n 200 -c 127.0.0.1 >/tmp/c.log 2>&1
c=$?
wait "$spid"; s=$?
tail -2 /tmp/c.log
echo "LV rc server=$s client=$c"
((s == 0 && c == 0))
G
# NIC mode: eth0 is the daemon's virtio-net; the peer is on the host's end of its veth.
cat >"$work/root/vur-scenario/lvnic-guest.sh" <<'G'
#!/bin/bash
dev=vrdma0
for _ in $(seq 100); do gid=$(vur-gid v4 "$dev" 2>/dev/null) && break; sleep 0.1; done
[[ -n ${gid:-} ]] || { echo "LV-FAIL no IPv4 GID on $dev"; exit 1; }
ibv_devinfo -d "$dev" | grep -q 'state:.*PORT_ACTIVE' || { echo "LV-FAIL $dev not PORT_ACTIVE"; exit 1; }
ping -c 3 -W 5 10.77.5.1 >/tmp/ping.log 2>&1 || { tail -3 /tmp/ping.log; echo "LV-FAIL ping 10.77.5.1 over eth0"; exit 1; }
echo "LV ping ok gid=$gid mtu=$(cat /sys/class/net/eth0/mtu)"
timeout 90 ibv_rc_pingpong -d "$dev" -g "$gid" -n 200 -s 4096 -c >/tmp/s.log 2>&1 &
spid=$!
for _ in $(seq 100); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
echo "LV listening"
wait "$spid"; s=$?
tail -2 /tmp/s.log
echo "LV rc server=$s"
((s == 0))
G
chmod 755 "$work/root/vur-scenario/"*.sh
(cd "$work/root" && find . | cpio -o -H newc --quiet) >"$work/initrd.img"
cat "$images/initrd.img" >>"$work/initrd.img"

# domain_start NAME XML SCENARIO IP [SED-ARG...]: fill in the domain XML, define and start it.
domain_start() {
    local name=$1 xml=$2 scen=$3 ip=$4
    shift 4
    sed -e "s|@NAME@|$name|" -e "s|@DOMAIN_TYPE@|qemu|" -e "s|@MEMORY_MIB@|1024|g" \
        -e "s|@KERNEL@|$images/vmlinuz|" -e "s|@INITRD@|$work/initrd.img|" \
        -e "s|@CMDLINE@|console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off vur.name=lv vur.ip=$ip/24 vur.rxe=0 vur.scenario=$scen|" \
        -e "s|@EMULATOR@|$qemu|" -e "s|@CONSOLE_LOG@|$work/$name.console.log|" -e "s|@SHARED_DIR@|$work/share|" \
        "$@" "$repo/packaging/libvirt/$xml" >"$work/$name.xml"
    grep -q '@[A-Z_]*@' "$work/$name.xml" &&
        fail "$name: unfilled fields in the domain: $(grep -o '@[A-Z_]*@' "$work/$name.xml" | sort -u | tr '\n' ' ')"
    virsh_ define "$work/$name.xml" >/dev/null || fail "$name: virsh define"
    domains+=("$name")
    t0=$SECONDS
    virsh_ start "$name" >/dev/null || { tail -20 "/var/log/libvirt/qemu/$name.log" 2>/dev/null; fail "$name: virsh start"; }
    log "$name: virsh start: running ($(virsh_ domstate "$name"))"
}

# domain_wait NAME PATTERN: wait (3 min at most) for a console line matching PATTERN, the
# scenario's end, or the domain's; 0 when PATTERN was seen.
domain_wait() {
    for _ in $(seq 1800); do
        grep -qa "$2" "$work/$1.console.log" 2>/dev/null && return 0
        grep -qa '^LV-FAIL\|scenario finished' "$work/$1.console.log" 2>/dev/null && return 1
        [[ $(virsh_ domstate "$1" 2>/dev/null) == running ]] || return 1
        sleep 0.1
    done
    return 1
}

# domain_end NAME: the scenario's lines on the console (in $out), then destroy and undefine.
domain_end() {
    domain_wait "$1" '^LV rc' || true
    out=$(tr -d '\r' <"$work/$1.console.log" | grep -a '^LV\|^\[vur-init' || true)
    printf '%s\n' "$out"
    virsh_ destroy "$1" >/dev/null 2>&1 || true
    virsh_ undefine "$1" >/dev/null || fail "$1: virsh undefine"
    log "$1: virsh destroy + undefine after $((SECONDS - t0)) s"
}

# 1. The udp transport.
log "daemon: $daemon --udp-addr $addr:4791 --mac $mac"
vm_start_daemon "$work/udp" "$addr" "$mac" || exit 1
dpids+=("$REPLY")
domain_start vur-libvirt vhost-user-rdma-domain.xml lv-guest.sh "$addr" \
    -e "s|@MAC@|$mac|" -e "s|@RDMA_SOCKET@|$work/udp/rdma.sock|"
domain_end vur-libvirt
grep -q '^LV rc server=0 client=0' <<<"$out" || fail "stock rdma-core over the device in the libvirt domain (console: $work/vur-libvirt.console.log, libvirt: /var/log/libvirt/qemu/vur-libvirt.log)"
grep -q 'frontend connected' "$work/udp/daemon.log" || fail "the daemon never saw the domain's QEMU"
kill -0 "${dpids[0]}" || fail "the daemon died"
log "udp domain: PASS"

# 2. The daemon as the guest's NIC, on a veth whose other end is here.
nmac=52:54:00:77:05:02
ip link add vlv0 type veth peer name vlv0p
sysctl -q -w net.ipv6.conf.vlv0.disable_ipv6=1 || true
ip addr add 10.77.5.1/24 dev vlv0p
ip link set vlv0 up && ip link set vlv0p up
mkdir -p "$work/nic"
# --udp-addr is not used with --iface; a loopback address keeps the guest's off the host
vm_start_daemon "$work/nic" 127.0.0.5 "$nmac" --iface vlv0 --net-socket "$work/nic/net.sock" || exit 1
dpids+=("$REPLY")
domain_start vur-libvirt-nic vhost-user-rdma-nic-domain.xml lvnic-guest.sh 10.77.5.2 \
    -e "s|@MAC@|$nmac|" -e "s|@RDMA_SOCKET@|$work/nic/rdma.sock|" -e "s|@NET_SOCKET@|$work/nic/net.sock|"
# What crosses the veth, kept with the artifacts when the test fails.
tshark -i vlv0p -s 128 -w "$work/veth.pcapng" >"$work/tshark.log" 2>&1 &
cpid=$!
dpids+=("$cpid")
prc=99
if domain_wait vur-libvirt-nic '^LV listening'; then
    "$peer" --local-ip 10.77.5.1 rc --server 10.77.5.2 -s 4096 -n 200 -m 1024 --timeout 90 \
        >"$work/rxe-peer.log" 2>&1 && prc=0 || prc=$?
    tail -3 "$work/rxe-peer.log"
fi
vm_daemon_counters "$work/nic/counters.sock" >"$work/nic/counters.json" 2>&1 || true
mtu=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["mtu"])' <"$work/nic/counters.json" 2>/dev/null) || mtu='?'
kill -INT "$cpid" 2>/dev/null || true
domain_end vur-libvirt-nic
grep -q '^LV ping ok' <<<"$out" || fail "the NIC domain's guest could not ping 10.77.5.1 over eth0 (the vhostuser interface)"
grep -q '^LV rc server=0' <<<"$out" && ((prc == 0)) ||
    fail "ibv_rc_pingpong in the NIC domain against rxe-peer (guest: $(grep -a '^LV rc' <<<"$out"), rxe-peer rc $prc; $work/rxe-peer.log)"
[[ $mtu == 1500 ]] || fail "the NIC daemon's net.mtu is $mtu, not the domain's host_mtu 1500"
kill -0 "${dpids[1]}" || fail "the NIC daemon died"
log "NIC domain: PASS (ping over the vhostuser interface; rxe-peer: $(grep -v '^$' "$work/rxe-peer.log" | tail -1))"
log "PASS"
