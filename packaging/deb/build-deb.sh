#!/usr/bin/env bash
# Builds the host package, vhost-user-rdma_VERSION_ARCH.deb, from a built daemon with
# dpkg-deb (nothing but dpkg): the daemon (/usr/libexec/vhost-user-rdma, as QEMU's vhost-user
# backend programs, and /usr/bin/vhost-user-rdma for its commands: counters, link, tap), its
# man page, the systemd units (vhost-user-rdma@.socket holds a VM's socket and starts
# vhost-user-rdma@.service on the first connection, which serves it with --fd 3), QEMU's
# vhost-user description file, the docs and the licences.
#
#   packaging/deb/build-deb.sh [--bin PATH] [--out DIR]
#
# --bin: the daemon to package (default target/release/vhost-user-rdma, built first with
# `cargo build --release -p vhost-user-rdma` when missing); --out: where the .deb goes
# (default target/debian). Prints the package's path. Checked by tests/packaging/deb.test.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
bin=$repo/target/release/vhost-user-rdma
out=$repo/target/debian
while (($#)); do
    case $1 in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--bin PATH] [--out DIR]" >&2; exit 2 ;;
    esac
done
if [[ ! -x $bin ]]; then
    echo "build-deb: $bin missing; building it" >&2
    (cd "$repo" && vur_cargo build --release -p vhost-user-rdma) >&2
fi
version=$(awk -F'"' '/^version = /{print $2; exit}' "$repo/backend/Cargo.toml")
arch=$(dpkg --print-architecture)
name=vhost-user-rdma_${version}_$arch
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/$name
doc=$root/usr/share/doc/vhost-user-rdma
install -d "$root/DEBIAN" "$root/etc/vhost-user-rdma" "$root/usr/libexec" "$root/usr/bin" "$root/usr/share/man/man1" \
    "$root/usr/lib/systemd/system" "$root/usr/share/qemu/vhost-user" "$doc"
install -m 0755 "$bin" "$root/usr/libexec/vhost-user-rdma"
# Without the debug info a release build carries (a third of the size).
if command -v strip >/dev/null; then strip --strip-debug "$root/usr/libexec/vhost-user-rdma"; fi
ln -s ../libexec/vhost-user-rdma "$root/usr/bin/vhost-user-rdma"
gzip -9n <"$repo/docs/vhost-user-rdma.1" >"$root/usr/share/man/man1/vhost-user-rdma.1.gz"
install -m 0644 "$repo/packaging/systemd/vhost-user-rdma@.service" \
    "$repo/packaging/systemd/vhost-user-rdma@.socket" "$root/usr/lib/systemd/system/"
install -m 0644 "$repo/packaging/qemu/50-vhost-user-rdma.json" "$root/usr/share/qemu/vhost-user/"
install -m 0644 "$repo/packaging/systemd/example.conf" "$repo/README.md" "$repo/docs/daemon.md" \
    "$repo/docs/virtio-rdma.md" "$repo/docs/kvm-host.md" "$doc/"
# The libvirt domains (docs/kvm-host.md), as examples.
install -d "$doc/examples"
install -m 0644 "$repo"/packaging/libvirt/*.xml "$doc/examples/"
# Debian's copyright file: the licences of the daemon (Apache-2.0 or BSD-2-Clause, as the
# workspace says).
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: vhost-user-rdma"
    echo
    echo "Files: *"
    echo "License: Apache-2.0 or BSD-2-Clause"
    echo
    echo "License: Apache-2.0"
    sed 's/^$/./; s/^/ /' "$repo/LICENSE-APACHE"
    echo
    echo "License: BSD-2-Clause"
    sed 's/^$/./; s/^/ /' "$repo/LICENSE-BSD"
} >"$doc/copyright"
# The shared libraries the binary links against, as dpkg knows their packages.
depends=$(ldd "$bin" | awk '/=> \//{print $3}' | while read -r lib; do
    dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
libc=$(dpkg-query -W -f='${Version}' libc6 2>/dev/null | cut -d- -f1)
depends=${depends/libc6/libc6 (>= ${libc:-2.36})}
size=$(du -sk "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: vhost-user-rdma
Version: $version
Architecture: $arch
Maintainer: vhost-user-rdma <vhost-user-rdma@localhost>
Installed-Size: $size
Depends: ${depends:-libc6}
Recommends: systemd
Section: net
Priority: optional
Homepage: https://github.com/vhost-user-rdma/vhost-user-rdma
Description: vhost-user backend for a paravirtual RDMA (RoCEv2) device
 Gives a virtual machine an RDMA device (virtio ID 42) whose soft-RoCE transport, the one
 Linux's rdma_rxe runs in the kernel, runs in this vhost-user process. Guests run stock
 rdma-core. Started from QEMU, libvirt or cloud-hypervisor, or per VM by the systemd units
 vhost-user-rdma@.socket and vhost-user-rdma@.service.
CONTROL
mkdir -p "$out"
dpkg-deb --root-owner-group --build "$root" "$out/$name.deb" >/dev/null
echo "$out/$name.deb"
