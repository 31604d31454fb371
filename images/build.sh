#!/usr/bin/env bash
# Build the trixie test guest: kernel + initramfs (rdma-core, perftest, rxe modules,
# and the virtio_rdma driver from guest-driver-patches/linux built against that kernel).
#
#   sudo images/build.sh              build (or reuse) and print the output directory
#   images/build.sh --print-dir       print the output directory only (no build)
#   sudo images/build.sh --force      rebuild even when the cache is warm
#
# Outputs in $VUR_CACHE_DIR/<key>/, where VUR_CACHE_DIR defaults to $VUR_CACHE_ROOT/images
# and VUR_CACHE_ROOT to /var/cache/vhost-user-rdma (root) or
# ${XDG_CACHE_HOME:-~/.cache}/vhost-user-rdma (other users), so every clone shares it:
#   vmlinuz, initrd.img (zstd cpio), virtio_rdma.ko, manifest.txt (kernel + package versions)
# The key is a hash of this script, packages.txt, init, vur-gid, the driver sources and its DKMS
# packaging (packaging/dkms: the driver is built by dkms from its package). The
# trixie chroot (debootstrap + packages + kernel, before pruning) is cached separately in
# rootfs-<key1>/, keyed by this script and packages.txt only, so editing init is cheap.
# The driver is built in a second chroot, kbuild-<kernel>/ (gcc, make, dkms and the headers of
# the image's kernel), so the compiler never enters the guest's initramfs.
#
# Needs root (debootstrap, chroot, mknod) and images/host-setup.sh's packages.
# The archive is derived from the machine's apt sources, deb822 or a classic sources.list
# (scripts/lib/apt-sources.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=../scripts/lib/apt-sources.sh
. "$repo/scripts/lib/apt-sources.sh"
if [[ -z ${VUR_CACHE_ROOT:-} ]]; then
    if [[ $(id -u) -eq 0 ]]; then VUR_CACHE_ROOT=/var/cache/vhost-user-rdma; else
        VUR_CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma
    fi
fi
cache=${VUR_CACHE_DIR:-$VUR_CACHE_ROOT/images}
# Out-of-tree kernel module sources (guest-driver-patches/linux/virtio_rdma), and the
# kernel-verbs self test that goes with it (guest-driver-patches/linux/selftest).
driver_src=$repo/guest-driver-patches/linux/virtio_rdma
selftest_src=$repo/guest-driver-patches/linux/selftest
# Packages of the module build chroot (the kernel headers are added by version).
kbuild_pkgs=(gcc-14 make libc6-dev dkms xz-utils
    cmake ninja-build pkg-config libnl-3-dev libnl-route-3-dev libudev-dev python3 dpkg-dev
    cython3 python3-dev)
# The rxe provider (librxe) of the image's rdma-core, rebuilt from Debian's source with
# guest-driver-patches/rdma-core/*.patch (verbs that stock librxe leaves out, e.g.
# ibv_reg_dmabuf_mr) in the build chroot, replaces Debian's in the image.
provider_src=$repo/guest-driver-patches/rdma-core
suite=trixie
# Kernel package: the newest linux-image-6.12.*-amd64-unsigned in the suite.
kernel_re='^linux-image-6\.12\.[0-9a-z.+~]*-amd64-unsigned$'
# Kernel module trees (relative to lib/modules/<ver>/kernel) kept in the initramfs.
keep_modules=(
    net crypto lib arch/x86/crypto fs/configfs
    drivers/infiniband/core drivers/infiniband/sw drivers/infiniband/ulp
    drivers/net/virtio_net.ko.xz drivers/net/net_failover.ko.xz
    drivers/net/veth.ko.xz drivers/net/ifb.ko.xz drivers/net/tun.ko.xz drivers/net/dummy.ko.xz
    drivers/virtio fs/9p fs/netfs drivers/gpu/drm/virtio
    drivers/nvme/host/nvme-rdma.ko.xz drivers/nvme/target/nvmet-rdma.ko.xz
)
# Subtrees of net/ that a wired RoCE test never loads.
drop_modules=(net/bluetooth net/mac80211 net/wireless net/nfc net/ieee802154 net/mac802154
    net/6lowpan net/rxrpc net/ceph net/sunrpc net/can net/atm net/appletalk net/rose net/ax25
    net/netrom net/x25 net/lapb net/phonet net/caif net/hsr net/batman-adv net/dsa net/qrtr
    net/rfkill net/9p/9pnet_rdma.ko.xz net/9p/9pnet_xen.ko.xz)

log() { printf '[build %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }
now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
step() { # step NAME CMD... : run CMD, print its duration
    local name=$1 t0
    shift
    t0=$(now_ms)
    log "step: $name"
    "$@"
    local dt=$(($(now_ms) - t0))
    log "step: $name done in $((dt / 1000)).$(printf '%03d' $((dt % 1000))) s"
}

# Contents only: the key must not depend on where the checkout lives (CI clones elsewhere).
hash_files() { (cd "$here" && sha256sum -- "${@##*/}") | sha256sum | cut -c1-16; }
key1=$(hash_files "$here/build.sh" "$here/packages.txt")
driver_hash() { # contents and names of the driver (and self test) sources
    [[ -d $driver_src ]] || { echo none && return; }
    local dirs=("${driver_src##*/}")
    [[ ! -d $selftest_src ]] || dirs+=("${selftest_src##*/}")
    (cd "$driver_src/.." && find "${dirs[@]}" -type f ! -name '*.o' ! -name '*.ko' ! -name '*.cmd' \
        ! -name '*.mod*' ! -name 'Module.symvers' ! -name 'modules.order' -print0 |
        LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}
provider_hash() { # the provider patches' names and contents
    compgen -G "$provider_src/*.patch" >/dev/null || { echo none && return; }
    (cd "$provider_src" && sha256sum -- *.patch) | sha256sum | cut -c1-16
}
key=$( { echo "$key1"; cat "$here/init" "$here/vur-gid" "$repo/packaging/dkms/dkms.conf" \
    "$repo/packaging/dkms/build-dkms-deb.sh"; driver_hash; provider_hash; } | sha256sum | cut -c1-16)
rootfs=$cache/rootfs-$key1
out=$cache/$key

force=0
case ${1:-} in
--print-dir) echo "$out" && exit 0 ;;
--force) force=1 ;;
"") ;;
*) die "usage: $0 [--print-dir|--force]" ;;
esac

t_start=$(now_ms)
if ((!force)) && [[ -f $out/manifest.txt && -f $out/vmlinuz && -f $out/initrd.img ]]; then
    log "cache hit: $out ($(($(now_ms) - t_start)) ms)"
    echo "$out"
    exit 0
fi
[[ $(id -u) -eq 0 ]] || die "building the image needs root (debootstrap/chroot); run images/host-setup.sh first"
for t in debootstrap zstd cpio; do command -v "$t" >/dev/null || die "$t missing; run images/host-setup.sh"; done

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

mounts=()
cleanup() {
    local m
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m=${mounts[i]}
        umount -l "$m" 2>/dev/null || true
    done
}
trap cleanup EXIT

chroot_mounts() { # mount proc/sys/dev into $1 for apt/dpkg postinsts
    local r=$1
    mount -t proc proc "$r/proc" && mounts+=("$r/proc")
    mount -t sysfs sysfs "$r/sys" && mounts+=("$r/sys")
    mount --bind /dev "$r/dev" && mounts+=("$r/dev")
}
chroot_umounts() { cleanup; mounts=(); }

in_chroot() { chroot "$rootfs.tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }

# --- stage 1: trixie chroot with packages and the extracted kernel -------------------
do_debootstrap() {
    local uri
    uri=$(apt_archive_uri) ||
        die "no Debian archive in /etc/apt (sources.list, sources.list.d/*.sources or *.list)"
    rm -rf "$rootfs.tmp"
    debootstrap --variant=minbase "$suite" "$rootfs.tmp" "$uri" >"$cache/debootstrap.log" 2>&1 ||
        { tail -20 "$cache/debootstrap.log"; die "debootstrap failed (log: $cache/debootstrap.log)"; }
}

do_packages() {
    local pkgs
    mapfile -t pkgs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$here/packages.txt")
    log "packages: ${pkgs[*]}"
    # No service starts inside the chroot.
    printf '#!/bin/sh\nexit 101\n' >"$rootfs.tmp/usr/sbin/policy-rc.d"
    chmod 755 "$rootfs.tmp/usr/sbin/policy-rc.d"
    chroot_mounts "$rootfs.tmp"
    in_chroot apt-get update -qq
    in_chroot apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >"$cache/apt.log" 2>&1 ||
        { tail -30 "$cache/apt.log"; die "apt-get install failed (log: $cache/apt.log)"; }
    chroot_umounts
}

do_kernel() {
    local kpkg
    kpkg=$(in_chroot apt-cache search --names-only "$kernel_re" | awk '{print $1}' | sort -V | tail -1)
    [[ -n $kpkg ]] || die "no package matching $kernel_re in $suite"
    log "kernel package: $kpkg"
    mkdir -p "$rootfs.tmp/tmp/kdeb"
    chmod 777 "$rootfs.tmp/tmp/kdeb" # apt downloads as user _apt
    in_chroot sh -c "cd /tmp/kdeb && apt-get download -qq $kpkg"
    rm -rf "$rootfs.tmp/kernel"
    in_chroot sh -c 'dpkg-deb -x /tmp/kdeb/*.deb /kernel && dpkg-deb -f /tmp/kdeb/*.deb Package Version >/kernel/package.txt'
    rm -rf "$rootfs.tmp/tmp/kdeb"
}

if [[ ! -f $rootfs/.complete ]]; then
    step "debootstrap --variant=minbase $suite" do_debootstrap
    step "install packages.txt in the chroot" do_packages
    step "download + extract the kernel" do_kernel
    touch "$rootfs.tmp/.complete"
    rm -rf "$rootfs"
    mv "$rootfs.tmp" "$rootfs"
    # Chroots of other versions of this script/packages.txt are ~600 MB each: drop them.
    for d in "$cache"/rootfs-*; do
        [[ $d == "$rootfs" ]] || { log "removing stale $d" && rm -rf "$d"; }
    done
else
    log "reusing chroot $rootfs"
fi

kmods=''
for d in "$rootfs"/kernel/usr/lib/modules/* "$rootfs"/kernel/lib/modules/*; do
    [[ -d $d ]] && kmods=$d && break
done
[[ -n $kmods ]] || die "no modules directory in the extracted kernel"
kver=${kmods##*/}

# --- stage 1b: module build chroot (gcc + the headers of $kver), keyed by kernel ------
kbuild=$cache/kbuild-$kver-$(echo "${kbuild_pkgs[*]}" | sha256sum | cut -c1-8)
kbuild_in() { chroot "$kbuild.tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }
do_kbuild_chroot() {
    local uri kbuild_ver
    uri=$(apt_archive_uri) ||
        die "no Debian archive in /etc/apt (sources.list, sources.list.d/*.sources or *.list)"
    rm -rf "$kbuild.tmp"
    debootstrap --variant=minbase "$suite" "$kbuild.tmp" "$uri" >"$cache/debootstrap-kbuild.log" 2>&1 ||
        { tail -20 "$cache/debootstrap-kbuild.log"; die "debootstrap failed (log: $cache/debootstrap-kbuild.log)"; }
    printf '#!/bin/sh\nexit 101\n' >"$kbuild.tmp/usr/sbin/policy-rc.d"
    chmod 755 "$kbuild.tmp/usr/sbin/policy-rc.d"
    # linux-kbuild-<upstream version> (modpost, objtool, scripts) goes in with apt; the two
    # header packages are unpacked by hand: they depend on the kernel image package, whose
    # postinst (initramfs, bootloader) has no business in a build chroot.
    kbuild_ver=${kver%-amd64}
    chroot_mounts "$kbuild.tmp"
    kbuild_in apt-get update -qq
    kbuild_in apt-get install -y -qq --no-install-recommends "${kbuild_pkgs[@]}" \
        "linux-kbuild-$kbuild_ver" >"$cache/apt-kbuild.log" 2>&1 ||
        { tail -30 "$cache/apt-kbuild.log"; die "apt-get install failed (log: $cache/apt-kbuild.log)"; }
    mkdir -p "$kbuild.tmp/tmp/hdeb"
    chmod 777 "$kbuild.tmp/tmp/hdeb"
    kbuild_in sh -c "cd /tmp/hdeb && apt-get download -qq linux-headers-$kver linux-headers-$kbuild_ver-common" ||
        die "could not download linux-headers-$kver"
    kbuild_in sh -c 'for d in /tmp/hdeb/*.deb; do dpkg-deb -x "$d" /; done'
    rm -rf "$kbuild.tmp/tmp/hdeb" "$kbuild.tmp/var/cache/apt/archives/"*.deb
    chroot_umounts
    [[ -f $kbuild.tmp/usr/src/linux-headers-$kver/Makefile ]] || die "no headers for $kver in the build chroot"
}
if [[ -d $driver_src ]]; then
    if [[ ! -f $kbuild/.complete ]]; then
        step "module build chroot for $kver (debootstrap, gcc, headers)" do_kbuild_chroot
        touch "$kbuild.tmp/.complete"
        rm -rf "$kbuild"
        mv "$kbuild.tmp" "$kbuild"
        for d in "$cache"/kbuild-*; do
            [[ $d == "$kbuild" ]] || { log "removing stale $d" && rm -rf "$d"; }
        done
    else
        log "reusing build chroot $kbuild"
    fi
fi

# Builds the driver as a guest installs it: the DKMS package (packaging/dkms) installed in the
# build chroot, dkms building it for the image's kernel; the module it made goes to
# $kbuild/src/virtio_rdma/virtio_rdma.ko. The self test module is built with make.
do_driver() {
    local deb ko run=(chroot "$kbuild" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
    rm -rf "$kbuild/src" "$kbuild/tmp/vur-dkms"
    mkdir -p "$kbuild/src/virtio_rdma" "$kbuild/lib/modules/$kver"
    deb=$("$repo/packaging/dkms/build-dkms-deb.sh" --out "$kbuild/tmp/vur-dkms")
    ln -sfn "/usr/src/linux-headers-$kver" "$kbuild/lib/modules/$kver/build"
    chroot_mounts "$kbuild"
    "${run[@]}" dpkg --purge virtio-rdma-dkms >/dev/null 2>&1 || true
    "${run[@]}" dpkg -i "/tmp/vur-dkms/${deb##*/}" >"$cache/driver-build.log" 2>&1 ||
        { tail -40 "$cache/driver-build.log"; die "dpkg -i ${deb##*/} failed (log: $cache/driver-build.log)"; }
    cat "$kbuild"/var/lib/dkms/virtio-rdma/*/build/make.log >>"$cache/driver-build.log" 2>/dev/null || true
    ko=$(find "$kbuild/lib/modules/$kver/updates/dkms" -name 'virtio_rdma.ko*' 2>/dev/null | head -1)
    [[ -n $ko ]] || { tail -40 "$cache/driver-build.log"; die "dkms built no virtio_rdma.ko for $kver (log: $cache/driver-build.log)"; }
    case $ko in
    *.xz) xz -dc "$ko" >"$kbuild/src/virtio_rdma/virtio_rdma.ko" ;;
    *.zst) zstd -dc "$ko" >"$kbuild/src/virtio_rdma/virtio_rdma.ko" ;;
    *) cp "$ko" "$kbuild/src/virtio_rdma/virtio_rdma.ko" ;;
    esac
    log "dkms: $("${run[@]}" dkms status -m virtio-rdma | tr '\n' ' ')"
    "${run[@]}" dpkg --purge virtio-rdma-dkms >>"$cache/driver-build.log" 2>&1 || true
    chroot_umounts
    grep -E 'warning|error' "$cache/driver-build.log" | grep -v 'openssl\|sign' || true
    if [[ -d $selftest_src ]]; then
        cp -r "$selftest_src" "$kbuild/src/selftest"
        chroot "$kbuild" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
            make -C "/usr/src/linux-headers-$kver" M=/src/selftest modules >>"$cache/driver-build.log" 2>&1 ||
            { tail -40 "$cache/driver-build.log"; die "vrdma_selftest build failed (log: $cache/driver-build.log)"; }
    fi
}
if [[ -d $driver_src ]]; then
    step "build virtio_rdma.ko for $kver" do_driver
fi

# The rxe provider with the patches: the orig tarball of Debian's rdma-core source of the
# version in the image (checked against the SHA256 of the archive's signed Sources index),
# the patches, and cmake/ninja in the build chroot, for lib/librxe-rdmav<ABI>.so only. The
# tarball is kept in the build chroot, the provider in provider-<version>-<patches>/.
provider_ver='' provider_out=''
do_provider() {
    local run=(chroot "$kbuild" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
        DEBIAN_FRONTEND=noninteractive) upstream uris orig sum so p
    upstream=${provider_ver%-*}
    upstream=${upstream#*:}
    orig=rdma-core_$upstream.orig.tar.gz
    mkdir -p "$kbuild/var/cache/vur-src"
    chroot_mounts "$kbuild"
    if [[ ! -f $kbuild/var/cache/vur-src/$orig.ok ]]; then
        # deb-src of the chroot's own archive
        sed -n 's/^deb /deb-src /p' "$kbuild/etc/apt/sources.list" >"$kbuild/etc/apt/sources.list.d/vur-src.list"
        "${run[@]}" apt-get update -qq >"$cache/provider-build.log" 2>&1 ||
            { tail -20 "$cache/provider-build.log"; die "apt-get update (deb-src) failed"; }
        uris=$("${run[@]}" apt-get source --print-uris "rdma-core=$provider_ver" 2>/dev/null)
        sum=$(awk -v f="$orig" '$2 == f && $4 ~ /^SHA256:/ {sub(/^SHA256:/, "", $4); print $4}' <<<"$uris")
        [[ -n $sum ]] || die "the archive's Sources index names no $orig for rdma-core=$provider_ver"
        # apt-get source gives up as a whole when one file (here the .dsc) is not served: go
        # on and check the tarball against the index.
        "${run[@]}" sh -c "cd /var/cache/vur-src && apt-get source --download-only -qq rdma-core=$provider_ver" \
            >>"$cache/provider-build.log" 2>&1 || true
        [[ -f $kbuild/var/cache/vur-src/$orig ]] || { tail -20 "$cache/provider-build.log"; die "$orig could not be downloaded"; }
        echo "$sum  $kbuild/var/cache/vur-src/$orig" | sha256sum -c --quiet - ||
            die "$orig: SHA256 does not match the Sources index"
        touch "$kbuild/var/cache/vur-src/$orig.ok"
    fi
    rm -rf "$kbuild/src/rdma-core"
    mkdir -p "$kbuild/src/rdma-core"
    tar -xzf "$kbuild/var/cache/vur-src/$orig" -C "$kbuild/src/rdma-core" --strip-components=1
    for p in "$provider_src"/*.patch; do
        log "  patch -p1 < ${p##*/}"
        patch -d "$kbuild/src/rdma-core" -p1 --forward --batch --quiet <"$p" ||
            die "${p##*/} does not apply to rdma-core $upstream"
    done
    # The provider, and pyverbs' dma-buf allocator module (patch 0006: virtio-gpu's buffers).
    "${run[@]}" CC=gcc-14 sh -c 'cd /src/rdma-core && mkdir build && cd build &&
        cmake -GNinja -DCMAKE_BUILD_TYPE=Release -DNO_MAN_PAGES=1 .. &&
        dmabuf=$(ninja -t targets all | grep -o "^python/pyverbs/dmabuf\.cpython[^:]*\.so" | head -1) &&
        [ -n "$dmabuf" ] && ninja lib/librxe-rdmav34.so "$dmabuf" && cp "$dmabuf" /src/rdma-core/build/' \
        >>"$cache/provider-build.log" 2>&1 ||
        { tail -30 "$cache/provider-build.log"; die "the rxe provider did not build (log: $cache/provider-build.log)"; }
    chroot_umounts
    so=$kbuild/src/rdma-core/build/lib/librxe-rdmav34.so
    grep ': warning:' "$cache/provider-build.log" | head -5 || true
    rm -rf "$provider_out.tmp"
    mkdir -p "$provider_out.tmp"
    install -m 644 "$so" "$provider_out.tmp/librxe-rdmav34.so"
    strip --strip-unneeded "$provider_out.tmp/librxe-rdmav34.so"
    install -m 644 "$kbuild"/src/rdma-core/build/dmabuf.cpython-*.so "$provider_out.tmp/"
    strip --strip-unneeded "$provider_out.tmp"/dmabuf.cpython-*.so
    (cd "$provider_src" && sha256sum -- *.patch) >"$provider_out.tmp/patches.sha256"
    rm -rf "$provider_out" "$kbuild/src/rdma-core"
    mv "$provider_out.tmp" "$provider_out"
}
if [[ $(provider_hash) != none ]]; then
    provider_ver=$(chroot "$rootfs" dpkg-query -W -f='${source:Version}' libibverbs1)
    provider_out=$cache/provider-${provider_ver//[:~]/_}-$(provider_hash)
    if [[ -f $provider_out/librxe-rdmav34.so ]] && compgen -G "$provider_out/dmabuf.cpython-*.so" >/dev/null; then
        log "reusing the rxe provider $provider_out"
    else
        step "rxe provider of rdma-core $provider_ver with guest-driver-patches/rdma-core" do_provider
    fi
fi

# --- stage 2: prune a copy into the initramfs tree ------------------------------------
stage=$cache/stage-$key

do_stage() {
    rm -rf "$stage"
    mkdir -p "$stage"
    # Copy the userland without the kernel extraction, apt state, docs, man pages, locales.
    tar -C "$rootfs" -c --exclude=./kernel --exclude=./.complete \
        --exclude=./var/lib/apt/lists --exclude=./var/cache/apt --exclude=./var/cache/debconf \
        --exclude=./usr/share/doc --exclude=./usr/share/man --exclude=./usr/share/info \
        --exclude=./usr/share/locale --exclude=./usr/share/i18n --exclude=./usr/share/lintian \
        --exclude=./usr/share/bug --exclude=./usr/share/zoneinfo --exclude=./usr/share/common-licenses \
        --exclude=./var/log --exclude=./usr/sbin/policy-rc.d \
        --exclude=./usr/lib/udev/hwdb.bin --exclude=./usr/lib/udev/hwdb.d \
        --exclude=./usr/lib/x86_64-linux-gnu/gconv --exclude=./usr/lib/systemd \
        --exclude=./usr/lib/x86_64-linux-gnu/systemd --exclude='./usr/bin/systemd*' \
        --exclude=./usr/bin/systemctl --exclude=./usr/bin/journalctl --exclude=./usr/bin/sqv \
        --exclude='*/__pycache__' . | tar -C "$stage" -x
    # rdma-core's own test suite (pyverbs; run_tests.py) ships under usr/share/doc: keep it.
    if [[ -d $rootfs/usr/share/doc/rdma-core/tests ]]; then
        mkdir -p "$stage/usr/share/doc/rdma-core"
        cp -a "$rootfs/usr/share/doc/rdma-core/tests" "$stage/usr/share/doc/rdma-core/"
        find "$stage/usr/share/doc/rdma-core/tests" -name __pycache__ -prune -exec rm -rf {} +
        # Debian compresses the larger modules; Python imports only plain .py files.
        find "$stage/usr/share/doc/rdma-core/tests" -name '*.py.gz' -exec gunzip -f {} +
    fi
    mkdir -p "$stage/var/log" "$stage/vur" "$stage/vur-scenario"
    # Kernel modules: the trees a RoCE/netkit/netem test needs plus everything they depend
    # on (closure over the full tree's modules.dep), the rest is deleted.
    local m=$stage/usr/lib/modules/$kver
    mkdir -p "${m%/*}"
    cp -a "$kmods" "$m"
    chroot "$stage" depmod -a "$kver"
    local keep_list=$stage/tmp/keep-modules
    awk -v keep="${keep_modules[*]}" -v drop="${drop_modules[*]}" '
        function under(path, list,   n, a, i) {
            n = split(list, a, " ")
            for (i = 1; i <= n; i++)
                if (path == "kernel/" a[i] || index(path, "kernel/" a[i] "/") == 1) return 1
            return 0
        }
        {
            mod = $1; sub(/:$/, "", mod)
            if (under(mod, keep) && !under(mod, drop)) {
                wanted[mod] = 1
                for (i = 2; i <= NF; i++) wanted[$i] = 1
            }
        }
        END { for (w in wanted) print w }' "$m/modules.dep" | sort >"$keep_list"
    local all kept
    all=$(find "$m/kernel" -name '*.ko*' | wc -l)
    (cd "$m" && find kernel -name '*.ko*' | sort | comm -23 - "$keep_list" | xargs -r rm -f)
    find "$m/kernel" -type d -empty -delete
    rm -f "$keep_list"
    if [[ -d $driver_src ]]; then
        install -D -m 644 "$kbuild/src/virtio_rdma/virtio_rdma.ko" "$m/updates/virtio_rdma.ko"
        [[ ! -f $kbuild/src/selftest/vrdma_selftest.ko ]] ||
            install -m 644 "$kbuild/src/selftest/vrdma_selftest.ko" "$m/updates/vrdma_selftest.ko"
    fi
    chroot "$stage" depmod -a "$kver"
    if [[ -n $provider_out ]]; then
        [[ -f $stage/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ]] ||
            die "the image's rdma-core has no librxe-rdmav34.so to replace"
        install -m 644 "$provider_out/librxe-rdmav34.so" "$stage/usr/lib/x86_64-linux-gnu/libibverbs/"
        local pydmabuf
        pydmabuf=$(cd "$provider_out" && echo dmabuf.cpython-*.so)
        [[ -f $stage/usr/lib/python3/dist-packages/pyverbs/$pydmabuf ]] ||
            die "the image's pyverbs has no $pydmabuf to replace"
        install -m 644 "$provider_out/$pydmabuf" "$stage/usr/lib/python3/dist-packages/pyverbs/"
    fi
    kept=$(find "$m/kernel" -name '*.ko*' | wc -l)
    log "modules: kept $kept of $all ($(du -sh "$m" | cut -f1))"
    # The kernel opens /dev/console before /init runs and mounts devtmpfs only later.
    mknod -m 600 "$stage/dev/console" c 5 1 2>/dev/null || true
    mknod -m 666 "$stage/dev/null" c 1 3 2>/dev/null || true
    install -m 755 "$here/init" "$stage/init"
    install -D -m 755 "$here/vur-gid" "$stage/usr/local/bin/vur-gid"
}

# shellcheck disable=SC2016 # ${...} are dpkg-query format fields
do_manifest() {
    local f=$out.tmp/manifest.txt
    {
        echo "# vhost-user-rdma test guest image (images/build.sh)"
        echo "key: $key"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "suite: $suite"
        echo "kernel: $kver"
        echo "kernel-package: $(awk '{print $2}' "$rootfs/kernel/package.txt" | paste -sd' ')"
        echo "rdma-core: $(chroot "$stage" dpkg-query -W -f='${source:Version}' libibverbs1)"
        echo "perftest: $(chroot "$stage" dpkg-query -W -f='${Version}' perftest)"
        echo "iproute2: $(chroot "$stage" dpkg-query -W -f='${Version}' iproute2)"
        [[ ! -d $driver_src ]] || echo "virtio_rdma: $(driver_hash) (guest-driver-patches/linux)"
        [[ -z $provider_out ]] || echo "librxe and pyverbs' dmabuf module: rdma-core ${provider_ver%-*} (orig tarball) with $(cd "$provider_src" && echo *.patch) ($(provider_hash), guest-driver-patches/rdma-core)"
        echo "initrd.img: $(du -k "$out.tmp/initrd.img" | cut -f1) KiB, $(find "$stage" | wc -l) files"
        echo
        echo "## kernel config (selected)"
        grep -E '^CONFIG_(RDMA_RXE|INFINIBAND|NETKIT|NET_SCH_NETEM|IFB|NET_ACT_MIRRED|VIRTIO_NET|NET_9P|NET_9P_VIRTIO|9P_FS|DEVTMPFS|RD_ZSTD)=' \
            "$rootfs/kernel/boot/config-$kver" || true
        echo
        echo "## packages (dpkg-query -W)"
        chroot "$stage" dpkg-query -W -f='${Package} ${Version}\n'
    } >"$f"
}

do_cpio() {
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    cp "$rootfs/kernel/boot/vmlinuz-$kver" "$out.tmp/vmlinuz"
    [[ ! -d $driver_src ]] || cp "$kbuild/src/virtio_rdma/virtio_rdma.ko" "$out.tmp/"
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z |
        cpio --null -o -H newc --reproducible --quiet) | zstd -q -T0 -12 >"$out.tmp/initrd.img"
}

step "stage the initramfs tree (prune docs, keep needed modules, depmod)" do_stage
step "pack initrd.img (cpio | zstd)" do_cpio
step "write manifest.txt" do_manifest
rm -rf "$out" "$stage"
mv "$out.tmp" "$out"
# Images of other keys (~45 MB each) pile up while the driver or init is being worked on:
# drop those nobody has built for two days.
find "$cache" -maxdepth 1 -type d -regex '.*/[0-9a-f]\{16\}' -mtime +2 ! -path "$out" \
    -exec rm -rf {} + 2>/dev/null || true
dt=$(($(now_ms) - t_start))
log "kernel $kver, initrd.img $(du -h "$out/initrd.img" | cut -f1), total $((dt / 1000)) s"
echo "$out"
