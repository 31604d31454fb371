#!/usr/bin/env bash
# The guest driver as a DKMS package: packaging/dkms/build-dkms-deb.sh builds
# virtio-rdma-dkms; installed with dpkg into a trixie root with dkms and the headers of two
# kernels (trixie's and the newest of trixie-backports; tests/packaging/lib.sh, cached), its
# postinst has dkms build and install virtio_rdma.ko for each, and each module's vermagic is
# its kernel's; dpkg --purge removes every build. Needs root and the Debian archive; prints
# "SKIP: <reason>" and exits 77 otherwise (a failure under CI=true).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/packaging/lib.sh
. "$here/lib.sh"
pkg_test dkms debootstrap dpkg-deb
t0=$SECONDS
deb=$("$repo/packaging/dkms/build-dkms-deb.sh")
log "built $(basename "$deb")"
base=$(pkg_dkms_root) || fail "no trixie root with dkms and kernel headers"
mapfile -t kernels <"$base/kernels"
log "kernels with headers: ${kernels[*]}"
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-dkms.XXXXXX")
root=$work/root
mounts=()
cleanup() {
    local rc=$? i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
    if ((rc == 0)); then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp -a "$base" "$root"
mount --bind /proc "$root/proc" && mounts+=("$root/proc")
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
cp "$deb" "$root/tmp/"
t1=$SECONDS
in_root dpkg -i "/tmp/$(basename "$deb")" >"$work/dpkg.log" 2>&1 || { tail -30 "$work/dpkg.log"; fail "dpkg -i"; }
log "dpkg -i (dkms builds for every kernel) in $((SECONDS - t1)) s"
status=$(in_root dkms status -m virtio-rdma)
printf '%s\n' "$status"
for k in "${kernels[@]}"; do
    grep -q "virtio-rdma/.*, $k, .*: installed" <<<"$status" ||
        { tail -30 "$work/dpkg.log"; cat "$root"/var/lib/dkms/virtio-rdma/*/build/make.log 2>/dev/null | tail -20; fail "not built and installed for $k"; }
    ko=$(find "$root/lib/modules/$k" -name 'virtio_rdma.ko*' | head -1)
    [[ -n $ko ]] || fail "no virtio_rdma.ko under /lib/modules/$k"
    magic=$(in_root modinfo -F vermagic "${ko#"$root"}")
    [[ $magic == "$k "* ]] || fail "$ko: vermagic '$magic', not $k"
    log "$k: ${ko#"$root"} (vermagic $magic)"
done
((${#kernels[@]} >= 2)) || log "note: the archive has no newer kernel in trixie-backports: one kernel only"
in_root dpkg --purge virtio-rdma-dkms >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg --purge"; }
[[ -z $(in_root dkms status -m virtio-rdma) ]] || fail "dkms still lists virtio-rdma after the purge"
[[ -z $(find "$root/lib/modules" -name 'virtio_rdma.ko*') ]] || fail "modules left after the purge"
log "PASS (${#kernels[@]} kernels) in $((SECONDS - t0)) s"
