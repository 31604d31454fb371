#!/usr/bin/env bash
# The host set-up's package step on a Debian 12 installed from the netinst image: apt sources
# in a classic /etc/apt/sources.list only (no deb822 file). In a copy of a clean Debian 12 root
# (debootstrap, cached: tests/packaging/lib.sh) whose apt configuration is rewritten so,
# images/host-setup.sh runs with VUR_APT_SIMULATE=1: it must derive the archive and
# bookworm-backports from that file, update its private lists from the archive, and resolve
# every package it needs (apt-get -s: QEMU 10 from bookworm-backports among them), installing
# nothing. No QEMU build. Needs root and the Debian archive; prints "SKIP: <reason>" and exits
# 77 otherwise (a failure under CI=true).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/packaging/lib.sh
. "$here/lib.sh"
pkg_test host-setup debootstrap
t0=$SECONDS
base=$(pkg_clean_root bookworm) || fail "no clean bookworm root"
uri=$(apt_archive_uri) || fail "no Debian archive in this machine's /etc/apt"
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-host-setup.XXXXXX")
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
# The netinst layout: a classic sources.list, no deb822 file.
rm -f "$root"/etc/apt/sources.list.d/*.sources "$root"/etc/apt/sources.list.d/*.list
printf '# deb cdrom:[Debian GNU/Linux 12 _Bookworm_ - Official amd64 NETINST]/ bookworm main\n\ndeb %s bookworm main\ndeb-src %s bookworm main\n' \
    "$uri" "$uri" >"$root/etc/apt/sources.list"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount --bind /proc "$root/proc" && mounts+=("$root/proc")
# The repository's set-up scripts, as a user's clone has them.
mkdir -p "$root/src/vur/images" "$root/src/vur/scripts/lib"
cp "$repo/images/host-setup.sh" "$root/src/vur/images/"
cp "$repo/scripts/lib/apt-sources.sh" "$root/src/vur/scripts/lib/"
out=$(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    VUR_APT_SIMULATE=1 VUR_APT_DIR=/var/tmp/vur-apt bash /src/vur/images/host-setup.sh 2>&1) ||
    { printf '%s\n' "$out" | tail -20; fail "images/host-setup.sh in a root with only a classic sources.list"; }
printf '%s\n' "$out" | grep -E '^\[host-setup\]' || true
grep -q "^Inst qemu-system-x86 ([^ ]*~bpo12" <<<"$out" ||
    { printf '%s\n' "$out" | grep -E '^Inst' | head; fail "QEMU from bookworm-backports not resolved"; }
for p in debootstrap clang tshark libvirt-clients; do
    grep -q "^Inst $p " <<<"$out" || fail "$p not resolved"
done
log "host-setup.sh resolved $(grep -c '^Inst ' <<<"$out") packages from a classic sources.list (QEMU: $(grep -o '^Inst qemu-system-x86 ([^ ]*' <<<"$out" | cut -d'(' -f2)), installed nothing"
log "PASS in $((SECONDS - t0)) s"
