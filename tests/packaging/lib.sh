# shellcheck shell=bash
# Shared by the packaging tests (source it): their log, fail and skip, their prerequisites,
# and a clean Debian root to install into, made once with debootstrap and cached by its recipe.

# shellcheck source=../../scripts/lib/apt-sources.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/apt-sources.sh"

# pkg_test NAME TOOL...: names the test for log, fail and skip, and skips it (one line, exit
# 77; a failure under CI=true) without root or one of the TOOLs.
pkg_test() {
    pkg_name=$1
    shift
    [[ $(id -u) -eq 0 ]] || skip "needs root (debootstrap, chroot)"
    local t
    for t in "$@"; do
        command -v "$t" >/dev/null || skip "$t missing (images/host-setup.sh installs it)"
    done
}
log() { printf '[%s %s] %s\n' "$pkg_name" "$(date +%T)" "$*"; }
fail() { printf '[%s %s] FAIL: %s\n' "$pkg_name" "$(date +%T)" "$*"; exit 1; }
skip() {
    echo "SKIP: $pkg_name: $*"
    [[ ${CI:-} != true ]] || fail "skipped under CI=true: $*"
    exit 77
}

# pkg_clean_root SUITE: prints the path of a cached minbase root of SUITE with systemd (made
# with debootstrap from the machine's archive the first time, under
# $VUR_CACHE_ROOT/roots or /var/cache/vhost-user-rdma/roots); the caller copies it before
# changing anything. Fails saying why.
pkg_clean_root() {
    local suite=$1 cache base uri t1
    cache=${VUR_CACHE_ROOT:-/var/cache/vhost-user-rdma}/roots
    # ROOT-RECIPE: what the key covers (this function).
    base=$cache/$suite-systemd-$(declare -f pkg_clean_root | sha256sum | cut -c1-12)
    mkdir -p "$cache"
    (
        flock 9
        if [[ ! -x $base/usr/bin/systemctl ]]; then
            uri=$(apt_archive_uri) || { echo "no Debian archive in /etc/apt to debootstrap from" >&2; exit 1; }
            t1=$SECONDS
            rm -rf "$base.tmp"
            debootstrap --variant=minbase --include=systemd "$suite" "$base.tmp" "$uri" \
                >"$cache/debootstrap-$suite.log" 2>&1 ||
                { tail -20 "$cache/debootstrap-$suite.log" >&2; echo "debootstrap $suite failed" >&2; exit 1; }
            rm -rf "$base" && mv "$base.tmp" "$base"
            # Roots of an older recipe go.
            find "$cache" -maxdepth 1 -name "$suite-systemd-*" ! -path "$base" -exec rm -rf {} +
            echo "debootstrap $suite (minbase, systemd) in $((SECONDS - t1)) s" >&2
        fi
    ) 9>"$cache/.lock" || return 1
    printf '%s\n' "$base"
}

# pkg_dkms_root: prints the path of a cached trixie root with dkms and a compiler, and the
# headers of two kernels: trixie's and the newest of trixie-backports (when the archive has
# one; else only trixie's). Their versions are in the root's /kernels file. Made once from
# pkg_clean_root trixie, keyed by this recipe.
pkg_dkms_root() {
    local cache base clean uri t1 k
    cache=${VUR_CACHE_ROOT:-/var/cache/vhost-user-rdma}/roots
    base=$cache/trixie-dkms-$(declare -f pkg_dkms_root | sha256sum | cut -c1-12)
    clean=$(pkg_clean_root trixie) || return 1
    (
        flock 9
        [[ -f $base/kernels ]] && exit 0
        uri=$(apt_archive_uri) || { echo "no Debian archive in /etc/apt" >&2; exit 1; }
        t1=$SECONDS
        rm -rf "$base.tmp"
        cp -a "$clean" "$base.tmp"
        in_root() { chroot "$base.tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }
        printf 'Types: deb\nURIs: %s\nSuites: trixie-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$uri" >"$base.tmp/etc/apt/sources.list.d/trixie-backports.sources"
        printf '#!/bin/sh\nexit 101\n' >"$base.tmp/usr/sbin/policy-rc.d"
        chmod 755 "$base.tmp/usr/sbin/policy-rc.d"
        cp /etc/resolv.conf "$base.tmp/etc/resolv.conf" 2>/dev/null || true
        mount --bind /proc "$base.tmp/proc"
        trap 'umount -l "$base.tmp/proc" 2>/dev/null || true' EXIT
        in_root apt-get update -qq >"$cache/dkms-root.log" 2>&1 &&
            in_root apt-get install -y -qq --no-install-recommends dkms gcc make libc6-dev \
                >>"$cache/dkms-root.log" 2>&1 ||
            { tail -20 "$cache/dkms-root.log" >&2; echo "dkms root: apt-get failed" >&2; exit 1; }
        # The headers of each kernel unpacked by hand as images/build.sh does (the header
        # packages depend on the kernel image, whose postinst has no business here); dkms
        # finds them through /lib/modules/KVER/build.
        : >"$base.tmp/kernels.tmp"
        for suite in trixie trixie-backports; do
            k=$(in_root apt-cache -t "$suite" depends linux-headers-amd64 2>/dev/null |
                awk '/Depends: linux-headers-[0-9]/ {sub(/.*linux-headers-/, ""); print; exit}')
            [[ -n $k ]] || continue
            grep -qx "$k" "$base.tmp/kernels.tmp" && continue
            local kb=${k%-amd64}
            mkdir -p "$base.tmp/tmp/hdeb" && chmod 777 "$base.tmp/tmp/hdeb"
            # linux-kbuild (modpost, objtool and the libraries they need) goes in with apt.
            in_root apt-get install -y -qq --no-install-recommends -t "$suite" "linux-kbuild-$kb" \
                >>"$cache/dkms-root.log" 2>&1 &&
                in_root sh -c "cd /tmp/hdeb && apt-get download -qq -t $suite linux-headers-$k linux-headers-$kb-common" \
                >>"$cache/dkms-root.log" 2>&1 ||
                { tail -5 "$cache/dkms-root.log" >&2; echo "dkms root: no headers for $k" >&2; exit 1; }
            in_root sh -c 'for d in /tmp/hdeb/*.deb; do dpkg-deb -x "$d" /; done; rm -f /tmp/hdeb/*.deb'
            mkdir -p "$base.tmp/lib/modules/$k"
            ln -sfn "/usr/src/linux-headers-$k" "$base.tmp/lib/modules/$k/build"
            echo "$k" >>"$base.tmp/kernels.tmp"
        done
        umount -l "$base.tmp/proc"
        trap - EXIT
        [[ -s $base.tmp/kernels.tmp ]] || { echo "dkms root: no kernel headers found" >&2; exit 1; }
        mv "$base.tmp/kernels.tmp" "$base.tmp/kernels"
        rm -rf "$base" && mv "$base.tmp" "$base"
        find "$cache" -maxdepth 1 -name 'trixie-dkms-*' ! -path "$base" -exec rm -rf {} +
        echo "dkms root (trixie, dkms, headers of $(tr '\n' ' ' <"$base/kernels")) in $((SECONDS - t1)) s" >&2
    ) 9>"$cache/.lock-dkms" || return 1
    printf '%s\n' "$base"
}
