#!/usr/bin/env bash
# The libvirt domain of packaging/libvirt/vhost-user-rdma-domain.xml with the real libvirt:
# libvirtd started by this test in a mount namespace of its own (its /run, /var/lib, /var/log
# and /etc/libvirt are tmpfs here, the users it wants exist only here: the host's libvirt, if
# any, is not touched), the domain defined and started with virsh (TCG; the patched QEMU as
# emulator; guest memory a shared memfd; the device through <qemu:commandline>), stock
# rdma-core in the guest over the device (ibv_devinfo, ibv_rc_pingpong), then virsh destroy
# and undefine. The daemon's udp transport on an address of this namespace's loopback.
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
    command -v "$t" >/dev/null || vm_missing "libvirt: no $t (apt-get install libvirt-daemon-driver-qemu libvirt-clients)"
done
vm_device_prereqs libvirt

# Inside the namespace: a mount namespace of our own for libvirt's directories.
if [[ ${1:-} != --inner ]]; then
    vm_netns libvirt "$@"
    exec unshare --mount --propagation private "$BASH" "$0" --inner
fi

addr=10.77.0.2
mac=52:54:00:77:00:02
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-libvirt.XXXXXX")
dpid='' lpid=''
virsh_() { virsh -q -c qemu:///system "$@"; }
cleanup() {
    local rc=$?
    if [[ -n $lpid ]]; then
        virsh_ destroy vur-libvirt >/dev/null 2>&1 || true
        virsh_ undefine vur-libvirt >/dev/null 2>&1 || true
        kill "$lpid" 2>/dev/null || true
        wait "$lpid" 2>/dev/null || true
    fi
    [[ -z $dpid ]] || { kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; }
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

log "daemon: $daemon --udp-addr $addr:4791 --mac $mac"
vm_start_daemon "$work" "$addr" "$mac" || exit 1
dpid=$REPLY

# The guest: the image's kernel, its initrd with this scenario in front (as run-vm.sh does).
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
chmod 755 "$work/root/vur-scenario/lv-guest.sh"
(cd "$work/root" && find . | cpio -o -H newc --quiet) >"$work/initrd.img"
cat "$images/initrd.img" >>"$work/initrd.img"
sed -e "s|@NAME@|vur-libvirt|" -e "s|@DOMAIN_TYPE@|qemu|" -e "s|@MEMORY_MIB@|1024|g" \
    -e "s|@KERNEL@|$images/vmlinuz|" -e "s|@INITRD@|$work/initrd.img|" \
    -e "s|@CMDLINE@|console=ttyS0 panic=-1 quiet loglevel=4 mitigations=off vur.name=lv vur.ip=$addr/24 vur.rxe=0 vur.scenario=lv-guest.sh|" \
    -e "s|@EMULATOR@|$qemu|" -e "s|@CONSOLE_LOG@|$work/console.log|" -e "s|@SHARED_DIR@|$work/share|" \
    -e "s|@MAC@|$mac|" -e "s|@RDMA_SOCKET@|$work/rdma.sock|" \
    "$repo/packaging/libvirt/vhost-user-rdma-domain.xml" >"$work/domain.xml"
grep -q '@[A-Z_]*@' "$work/domain.xml" && fail "unfilled fields in the domain: $(grep -o '@[A-Z_]*@' "$work/domain.xml" | sort -u | tr '\n' ' ')"
virsh_ define "$work/domain.xml" >/dev/null || fail "virsh define"
t0=$SECONDS
virsh_ start vur-libvirt >/dev/null || { tail -20 "/var/log/libvirt/qemu/vur-libvirt.log" 2>/dev/null; fail "virsh start"; }
log "virsh start: running ($(virsh_ domstate vur-libvirt))"
# The guest powers off when its scenario ends (panic=-1, init's poweroff): wait for that.
for _ in $(seq 1800); do
    [[ $(virsh_ domstate vur-libvirt 2>/dev/null) == running ]] || break
    grep -qa '^LV rc\|^LV-FAIL\|scenario finished' "$work/console.log" 2>/dev/null && break
    sleep 0.1
done
out=$(tr -d '\r' <"$work/console.log" | grep -a '^LV\|^\[vur-init' || true)
printf '%s\n' "$out"
virsh_ destroy vur-libvirt >/dev/null 2>&1 || true
virsh_ undefine vur-libvirt >/dev/null || fail "virsh undefine"
log "virsh destroy + undefine after $((SECONDS - t0)) s"
grep -q '^LV rc server=0 client=0' <<<"$out" || fail "stock rdma-core over the device in the libvirt domain (console: $work/console.log, libvirt: /var/log/libvirt/qemu/vur-libvirt.log)"
grep -q 'frontend connected' "$work/daemon.log" || fail "the daemon never saw the domain's QEMU"
kill -0 "$dpid" || fail "the daemon died"
log "PASS"
