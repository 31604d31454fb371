#!/usr/bin/env bash
# Build qemu-system-x86_64 with the vhost-user-rdma-pci device (this directory's *.patch)
# from Debian's qemu source package in bookworm-backports (QEMU 10.0).
#
#   guest-driver-patches/qemu/build.sh              build (or reuse) and print the binary path
#   guest-driver-patches/qemu/build.sh --print-bin  print the binary path only (never builds)
#   guest-driver-patches/qemu/build.sh --force      rebuild even when the cache has it
#
# Cache: $VUR_CACHE_ROOT/qemu/<key>/bin/qemu-system-x86_64, where VUR_CACHE_ROOT defaults to
# /var/cache/vhost-user-rdma as root and ${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma
# otherwise (outside the work tree, so a fresh clone reuses it). The key is a hash of the
# patches, this script and the source package version; manifest.txt beside bin/ says what
# went in. A rerun with a warm cache needs no network and takes well under a second.
#
# Needs root the first time (apt-get install of the build dependencies). The archive is
# derived at run time from the URIs line of /etc/apt/sources.list.d/debian.sources; package
# lists for bookworm-backports (deb + deb-src) live in a private apt state directory under
# the cache root, so the host's own apt configuration is left untouched.
#
# Progress and per-step durations go to stderr; stdout carries only the binary's path.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../../scripts/lib/apt-sources.sh
. "$here/../../scripts/lib/apt-sources.sh"
suite=bookworm-backports
if [[ -n ${VUR_CACHE_ROOT:-} ]]; then
    cache_root=$VUR_CACHE_ROOT
elif [[ $(id -u) -eq 0 ]]; then
    cache_root=/var/cache/vhost-user-rdma
else
    cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/vhost-user-rdma
fi
base=$cache_root/qemu
aptdir=$base/apt
apt_opts=(
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$aptdir/sources.list.d"
    -o "Dir::State::Lists=$aptdir/lists"
    -o "Dir::Cache=$aptdir/cache"
)

# A small system emulator: what the VM tests use (pc machine, TCG or KVM, virtio-pci,
# vhost-user, tap networking, virtfs/9p, memfd guest RAM, -trace) and nothing else.
configure_flags=(
    --target-list=x86_64-softmmu --python=/usr/bin/python3
    --without-default-features --disable-download
    --disable-docs --disable-tools --disable-guest-agent --disable-debug-info
    --disable-werror --disable-fdt --disable-install-blobs
    --enable-tcg --enable-kvm --enable-pixman
    --enable-vhost-user --enable-vhost-kernel --enable-vhost-net
    --enable-virtfs --enable-attr
)

log() { printf '[qemu-build %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
    printf '[qemu-build] error: %s\n' "$*" >&2
    exit 1
}
now_ms() {
    local t=${EPOCHREALTIME/./}
    echo $((t / 1000))
}
step() { # step NAME CMD... : run CMD, log its duration
    local name=$1 t0 dt
    shift
    t0=$(now_ms)
    log "step: $name"
    "$@"
    dt=$(($(now_ms) - t0))
    log "step: $name done in $((dt / 1000)).$(printf '%03d' $((dt % 1000))) s"
}

# The newest bookworm-backports qemu source version in the private lists ("" if unknown).
source_version() {
    [[ -d $aptdir/lists ]] || return 0
    apt-cache "${apt_opts[@]}" showsrc qemu 2>/dev/null |
        awk '/^Version:/ && /~bpo12/ {print $2}' | sort -V -r | head -1
}

cache_key() { # VERSION -> key
    {
        (cd "$here" && sha256sum -- *.patch build.sh)
        echo "source qemu $1"
    } | sha256sum | cut -c1-16
}

write_sources() {
    # The machine's own sources in either format (deb822 or a classic sources.list) and the
    # suite, from the archive they name: scripts/lib/apt-sources.sh.
    mkdir -p "$aptdir/lists/partial" "$aptdir/cache/archives/partial"
    rm -rf "$aptdir/sources.list.d"
    apt_write_sources "$aptdir/sources.list.d" "$suite" ||
        die "no Debian archive in /etc/apt (sources.list, sources.list.d/*.sources or *.list) to derive the archive from"
}

apt_update() { apt-get "${apt_opts[@]}" update -qq >&2; }

installed() { [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]; }
version_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]; }

install_deps() {
    local base_pkgs=(build-essential pkg-config ninja-build libglib2.0-dev libpixman-1-dev
        python3-venv xz-utils dpkg-dev)
    local need=() need_bpo=() p mv
    for p in "${base_pkgs[@]}"; do installed "$p" || need+=("$p"); done
    # QEMU 10.0 wants meson >= 1.5 (bookworm has 1.0) and pycotap; the +ds tarball ships
    # neither as a wheel, so both come from bookworm-backports. configure looks for them
    # as modules of /usr/bin/python3 (its venv sees the system's).
    mv=$(/usr/bin/python3 -c 'from mesonbuild import coredata; print(coredata.version)' \
        2>/dev/null || true)
    [[ -n $mv ]] && version_ge "$mv" 1.5.0 || need_bpo+=(meson)
    /usr/bin/python3 -c 'import pycotap' 2>/dev/null || need_bpo+=(python3-pycotap)
    if ((${#need[@]} + ${#need_bpo[@]} == 0)); then
        log "build dependencies present (meson $mv)"
        return 0
    fi
    [[ $(id -u) -eq 0 ]] || die "missing build dependencies (${need[*]} ${need_bpo[*]}); run as root"
    export DEBIAN_FRONTEND=noninteractive
    if ((${#need[@]})); then
        log "installing: ${need[*]}"
        apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${need[@]}" >&2
    fi
    if ((${#need_bpo[@]})); then
        log "installing from $suite: ${need_bpo[*]}"
        apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends -t "$suite" \
            "${need_bpo[@]}" >&2
    fi
}

fetch_source() { # into $work/dl
    # The signed Sources index names each file of the package with its SHA256.
    local uris name sum
    uris=$(apt-get "${apt_opts[@]}" source --print-uris "qemu=$version" 2>/dev/null |
        awk -F"'" '/^'"'"'/ && / SHA256:/ {print $3}')
    [[ -n $uris ]] || die "apt-get source --print-uris gave no files for qemu=$version"
    # apt-get source gives up as a whole when one file is missing from the archive; go on
    # and check each file against the index below.
    (cd "$work/dl" && apt-get "${apt_opts[@]}" source --download-only "qemu=$version" \
        >"$work/download.log" 2>&1) || true
    while read -r name _ sum; do
        [[ -n $name ]] || continue
        if [[ -f $work/dl/$name ]]; then
            echo "${sum#SHA256:}  $work/dl/$name" | sha256sum -c --quiet - >&2 ||
                die "$name: SHA256 does not match the Sources index"
            log "  $name: SHA256 ok"
        else
            log "  $name: not downloadable from the archive"
        fi
    done <<<"$uris"
}

unpack_source() { # $work/dl -> $work/src; sets packaging
    local dsc orig
    dsc=$(compgen -G "$work/dl/qemu_*.dsc" | head -1 || true)
    orig=$(compgen -G "$work/dl/qemu_*.orig.tar.*" | head -1 || true)
    [[ -n $orig ]] || die "the upstream tarball (qemu_*.orig.tar.*) could not be downloaded"
    if [[ -n $dsc ]] && compgen -G "$work/dl/qemu_*.debian.tar.*" >/dev/null; then
        log "unpacking with dpkg-source (Debian's patches applied)"
        # --no-check: every file was checked against the signed Sources index above.
        (cd "$work/dl" && dpkg-source --no-check -x "$(basename "$dsc")" "$work/src") >&2
        packaging="Debian source package, Debian's patches applied"
    else
        log "the archive serves only the upstream tarball: building it without Debian's patches"
        mkdir -p "$work/src"
        tar -xf "$orig" -C "$work/src" --strip-components=1
        packaging="orig tarball of the Debian source package, without Debian's patches"
    fi
}

apply_patches() {
    local p
    for p in "${patches[@]}"; do
        log "  patch -p1 < $(basename "$p")"
        patch -d "$work/src" -p1 --forward --batch --quiet <"$p" >&2 ||
            die "$(basename "$p") does not apply to qemu $version"
    done
    # The +ds tarball has no edk2 firmware blobs: never try to unpack them.
    sed -i 's/^\( *unpack_edk2_blobs = \)bzip2\.found()$/\1false/' "$work/src/meson.build"
    if grep -q 'unpack_edk2_blobs = bzip2' "$work/src/meson.build"; then
        die "could not set unpack_edk2_blobs = false in meson.build"
    fi
}

do_configure() {
    mkdir -p "$work/build"
    (cd "$work/build" && ../src/configure "${configure_flags[@]}") >"$work/configure.log" 2>&1 || {
        tail -30 "$work/configure.log" >&2
        die "configure failed (full log: $work/configure.log)"
    }
}

do_ninja() {
    local jobs rc
    jobs=$(nproc)
    log "ninja -j$jobs qemu-system-x86_64 (a line every 100 steps; log: $work/ninja.log)"
    set +e
    NINJA_STATUS='[%f/%t %es] ' ninja -C "$work/build" -j"$jobs" qemu-system-x86_64 2>&1 |
        tee "$work/ninja.log" |
        awk '/^\[[0-9]+\/[0-9]+ / {
                 split(substr($1, 2), a, "/")
                 if (a[1] % 100 == 0 || a[1] == a[2]) { print "[qemu-build] ninja " $1 " " $2; fflush() }
             }' >&2
    rc=${PIPESTATUS[0]}
    set -e
    if ((rc != 0)); then
        grep -B2 -A20 -m3 'error' "$work/ninja.log" >&2 || tail -40 "$work/ninja.log" >&2
        die "ninja failed (full log: $work/ninja.log)"
    fi
}

install_result() { # $work/build -> $out (atomically)
    local tmp=$base/tmp-$key
    rm -rf "$tmp"
    mkdir -p "$tmp/bin"
    cp "$work/build/qemu-system-x86_64" "$tmp/bin/"
    strip "$tmp/bin/qemu-system-x86_64"
    "$tmp/bin/qemu-system-x86_64" -device help 2>/dev/null | grep -q '"vhost-user-rdma-pci"' ||
        die "the built QEMU does not list vhost-user-rdma-pci"
    {
        echo "qemu source: $version ($packaging)"
        echo "inputs:"
        (cd "$here" && sha256sum -- *.patch build.sh | sed 's/^/  /')
        echo "configure: ${configure_flags[*]}"
        echo "built: $(date -u +%FT%TZ), $(nproc) cores, $((($(now_ms) - t_start) / 1000)) s"
        echo "version: $("$tmp/bin/qemu-system-x86_64" --version | head -1)"
    } >"$tmp/manifest.txt"
    cp "$work/configure.log" "$tmp/"
    rm -rf "$out"
    mv "$tmp" "$out"
    rm -rf "$work"
}

main() {
    local force=0 print_only=0
    case ${1:-} in
    --print-bin) print_only=1 ;;
    --force) force=1 ;;
    "") ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2 && exit 0 ;;
    *) die "unknown argument: $1 (use --print-bin or --force)" ;;
    esac

    shopt -s nullglob
    patches=("$here"/*.patch)
    shopt -u nullglob
    ((${#patches[@]})) || die "no *.patch in $here"

    version=$(source_version)
    if ((print_only)); then
        [[ -n $version ]] || die "no qemu source version known yet (run $0 once to build)"
        echo "$base/$(cache_key "$version")/bin/qemu-system-x86_64"
        return 0
    fi

    mkdir -p "$base"
    exec 9>"$base/.lock"
    if ! flock -n 9; then
        log "another build holds $base/.lock; waiting for it"
        flock 9
    fi

    t_start=$(now_ms)
    # Warm cache: no network at all.
    if [[ -n $version ]] && ((!force)); then
        out=$base/$(cache_key "$version")
        if [[ -x $out/bin/qemu-system-x86_64 ]]; then
            log "cached: $out (qemu $version)"
            echo "$out/bin/qemu-system-x86_64"
            return 0
        fi
    fi

    [[ $(id -u) -eq 0 ]] || die "the first build needs root (apt-get update and install)"
    step "apt sources ($suite deb + deb-src, private lists in $aptdir)" write_sources
    step "apt-get update" apt_update
    version=$(source_version)
    [[ -n $version ]] || die "no qemu source package in $suite"
    key=$(cache_key "$version")
    out=$base/$key
    log "qemu source $version, key $key"
    if [[ -x $out/bin/qemu-system-x86_64 ]] && ((!force)); then
        log "cached: $out"
        echo "$out/bin/qemu-system-x86_64"
        return 0
    fi

    step "build dependencies" install_deps
    work=$base/work-$key
    rm -rf "$work"
    mkdir -p "$work/dl"
    step "apt-get source qemu=$version (download)" fetch_source
    step "unpack" unpack_source
    step "apply patches" apply_patches
    step "configure" do_configure
    step "compile" do_ninja
    step "install into $out" install_result
    log "built in $((($(now_ms) - t_start) / 1000)) s: $out/bin/qemu-system-x86_64"
    echo "$out/bin/qemu-system-x86_64"
}

# Everything runs from main, parsed in full before it starts: editing this file while a
# build runs cannot change what that build does.
main "$@"
exit
