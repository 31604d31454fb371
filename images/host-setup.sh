#!/usr/bin/env bash
# Install the host tools the VM test bed needs (idempotent).
#
#   sudo images/host-setup.sh
#
# - debootstrap, zstd, cpio, xz-utils  : images/build.sh (trixie chroot -> initramfs)
# - qemu-system-x86 from bookworm-backports (QEMU 10) : tests/vm/run-vm.sh
# - iproute2, iputils-ping               : tests/vm/net.sh (bridge + taps), smoke.test.sh
# - tshark (dumpcap), python3-scapy      : tests/vm/capture-rxe.sh and ICRC checks of captures
# - nftables                             : tests/vm/soak.test.sh (loss between the daemons)
# - systemd (systemd-analyze, systemd-socket-activate) : tests/packaging/deb.test.sh
# - libvirt-daemon (libvirtd), libvirt-daemon-driver-qemu, libvirt-clients (virsh) :
#   tests/vm/libvirt.test.sh (libvirtd started by the test in a namespace of its own; without
#   libvirt-daemon-system no service is installed or enabled on the host)
#
# bookworm-backports is added in a private apt state directory (sources file and
# package lists under $VUR_APT_DIR, default <repo>/.cache/apt-host), derived at run time
# from the machine's apt sources in either format (deb822 or a classic sources.list:
# scripts/lib/apt-sources.sh, tests/scripts/apt-sources.test.sh), so the host's own
# apt configuration is left untouched and the host stays bookworm.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
state=${VUR_APT_DIR:-$repo/.cache/apt-host}
# VUR_APT_SIMULATE=1: resolve everything and say what would be installed (apt-get -s), install
# nothing (tests/packaging/host-setup.test.sh, in a clean Debian 12 root).
simulate=${VUR_APT_SIMULATE:-}

log() { printf '[host-setup] %s\n' "$*"; }
die() { printf '[host-setup] error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "must run as root (apt-get install)"
# shellcheck source=../scripts/lib/apt-sources.sh
. "$repo/scripts/lib/apt-sources.sh"
apt_archive_uri >/dev/null || die "no Debian archive in /etc/apt (sources.list or sources.list.d/*.sources/*.list) to derive the archive from"

installed() { # pkg -> 0 when dpkg says "install ok installed"
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]]
}

# Packages from the host's own suite (bookworm).
base_pkgs=(debootstrap zstd cpio xz-utils iproute2 iputils-ping tshark python3-scapy procps clang nftables
    systemd libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients)
# Packages taken from bookworm-backports.
bpo_pkgs=(qemu-system-x86 qemu-utils)

need_base=()
for p in "${base_pkgs[@]}"; do installed "$p" || need_base+=("$p"); done
need_bpo=()
for p in "${bpo_pkgs[@]}"; do
    if ! installed "$p"; then
        need_bpo+=("$p")
    elif ! dpkg-query -W -f='${Version}' "$p" | grep -q '~bpo'; then
        need_bpo+=("$p") # installed, but the bookworm QEMU 7.2, not the backport
    fi
done

if ((${#need_base[@]} == 0 && ${#need_bpo[@]} == 0)); then
    log "all prerequisites already installed:"
    dpkg-query -W -f='  ${Package} ${Version}\n' "${base_pkgs[@]}" "${bpo_pkgs[@]}"
    exit 0
fi

uri=$(apt_archive_uri)
mkdir -p "$state/sources.list.d" "$state/lists/partial"
rm -f "$state"/sources.list.d/host-* "$state/sources.list.d/debian.sources"
apt_copy_sources "$state/sources.list.d" || die "no apt source files to copy"
cat >"$state/sources.list.d/bookworm-backports.sources" <<EOF
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_opts=(
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$state/sources.list.d"
    -o "Dir::State::Lists=$state/lists"
)
export DEBIAN_FRONTEND=noninteractive

t0=$SECONDS
log "apt-get update (bookworm + bookworm-backports, private lists in $state)"
apt-get "${apt_opts[@]}" update -qq
log "apt-get update done in $((SECONDS - t0)) s"

# python3-scapy is optional: only install it when the suite has it.
if [[ " ${need_base[*]} " == *" python3-scapy "* ]] &&
    ! apt-cache "${apt_opts[@]}" show python3-scapy >/dev/null 2>&1; then
    log "python3-scapy not available, skipping it"
    need_base=("${need_base[@]/python3-scapy/}")
fi

# tshark asks whether non-root users may capture; answer "no" non-interactively.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections

if ((${#need_base[@]})); then
    t0=$SECONDS
    log "installing from bookworm: ${need_base[*]}"
    # shellcheck disable=SC2068 # empty elements from the scapy removal must vanish
    apt-get "${apt_opts[@]}" install -y -qq ${simulate:+-s} --no-install-recommends ${need_base[@]}
    log "done in $((SECONDS - t0)) s"
fi
if ((${#need_bpo[@]})); then
    t0=$SECONDS
    log "installing from bookworm-backports: ${need_bpo[*]}"
    apt-get "${apt_opts[@]}" install -y -qq ${simulate:+-s} --no-install-recommends \
        -t bookworm-backports "${need_bpo[@]}"
    log "done in $((SECONDS - t0)) s"
fi

if [[ -n $simulate ]]; then
    log "simulated: nothing installed"
    exit 0
fi
log "installed versions:"
dpkg-query -W -f='  ${Package} ${Version}\n' "${base_pkgs[@]}" "${bpo_pkgs[@]}" 2>/dev/null || true
qemu-system-x86_64 --version | head -1
