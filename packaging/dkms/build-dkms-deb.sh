#!/usr/bin/env bash
# Builds virtio-rdma-dkms_VERSION_all.deb: the guest driver's sources
# (guest-driver-patches/linux/virtio_rdma) under /usr/src/virtio-rdma-VERSION with a dkms.conf,
# so that any Debian or Ubuntu guest builds it for its kernels on install and for each kernel
# it installs later (dkms's own hooks). dpkg-deb only.
#
#   packaging/dkms/build-dkms-deb.sh [--out DIR]        (default target/debian)
#
# Prints the package's path. Checked by tests/packaging/dkms.test.sh (two kernel versions).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$repo/target/debian
while (($#)); do
    case $1 in
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
    esac
done
src=$repo/guest-driver-patches/linux/virtio_rdma
version=$(awk -F'"' '/^version = /{print $2; exit}' "$repo/backend/Cargo.toml")
name=virtio-rdma-dkms_${version}_all
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/$name
dest=$root/usr/src/virtio-rdma-$version
install -d "$root/DEBIAN" "$dest" "$root/usr/share/doc/virtio-rdma-dkms"
install -m 0644 "$src"/*.c "$src"/*.h "$src/Kbuild" "$src/Makefile" "$dest/"
sed "s/@VERSION@/$version/" "$here/dkms.conf" >"$dest/dkms.conf"
install -m 0644 "$repo/guest-driver-patches/linux/README.md" "$root/usr/share/doc/virtio-rdma-dkms/"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: virtio-rdma"
    echo
    echo "Files: *"
    echo "License: GPL-2.0 or BSD-2-Clause"
    echo
    sed 's/^$/./; s/^/ /' "$repo/guest-driver-patches/linux/LICENSE"
} >"$root/usr/share/doc/virtio-rdma-dkms/copyright"
cat >"$root/DEBIAN/control" <<CONTROL
Package: virtio-rdma-dkms
Version: $version
Architecture: all
Maintainer: vhost-user-rdma <vhost-user-rdma@localhost>
Depends: dkms (>= 2.1)
Recommends: rdma-core, ibverbs-providers
Section: kernel
Priority: optional
Description: virtio-rdma guest driver (DKMS)
 The Linux driver of the virtio-rdma device (virtio ID 42) that the vhost-user-rdma daemon
 offers a virtual machine. rdma-core's rxe provider (ibverbs-providers) drives it from user
 space. DKMS builds it for the installed kernels and for every kernel installed later.
CONTROL
# dkms's usual maintainer scripts: add and build at install (for each kernel with headers;
# none is not an error), remove every build at removal.
cat >"$root/DEBIAN/postinst" <<POSTINST
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
    dkms add -m virtio-rdma -v $version >/dev/null 2>&1 || true
    for k in /lib/modules/*/build; do
        [ -d "\$k" ] || continue
        kver=\$(basename "\$(dirname "\$k")")
        dkms install -m virtio-rdma -v $version -k "\$kver" || echo "virtio-rdma-dkms: not built for \$kver" >&2
    done
fi
exit 0
POSTINST
cat >"$root/DEBIAN/prerm" <<PRERM
#!/bin/sh
set -e
dkms remove -m virtio-rdma -v $version --all >/dev/null 2>&1 || true
exit 0
PRERM
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm"
mkdir -p "$out"
dpkg-deb --root-owner-group --build "$root" "$out/$name.deb" >/dev/null
echo "$out/$name.deb"
