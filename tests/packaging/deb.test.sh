#!/usr/bin/env bash
# The host package, end to end: packaging/deb/build-deb.sh builds it; it installs with dpkg into
# a clean Debian 12 root (debootstrap minbase with systemd; cached by suite and package list,
# no second QEMU build); its unit files pass `systemd-analyze verify` in that root; and the
# daemon it installed, started with the service's own ExecStart line (%i, the EnvironmentFile
# and the socket unit's path substituted) under systemd-socket-activate, which hands it the
# listening socket as fd 3 as systemd would, is reached by a test guest (vur-probe), and its
# counters socket answers. Needs root (debootstrap, chroot); prints "SKIP: <reason>" and
# exits 77 otherwise (a failure under CI=true).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
# shellcheck source=tests/packaging/lib.sh
. "$here/lib.sh"
pkg_test deb debootstrap dpkg-deb systemd-analyze systemd-socket-activate

# The package, from the release daemon (built when missing) and a test guest.
t0=$SECONDS
(cd "$repo" && vur_cargo build -q --release -p vhost-user-rdma -p vur-testguest \
    --bin vhost-user-rdma --bin vur-probe)
deb=$("$repo/packaging/deb/build-deb.sh")
log "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB) in $((SECONDS - t0)) s"
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/libexec/vhost-user-rdma ./usr/bin/vhost-user-rdma ./usr/share/man/man1/vhost-user-rdma.1.gz \
    ./usr/lib/systemd/system/vhost-user-rdma@.service ./usr/lib/systemd/system/vhost-user-rdma@.socket \
    ./usr/share/qemu/vhost-user/50-vhost-user-rdma.json ./usr/share/doc/vhost-user-rdma/copyright \
    ./usr/share/doc/vhost-user-rdma/examples/vhost-user-rdma-nic-domain.xml; do
    grep -qxF "$f" <<<"$contents" || fail "$f not in the package"
done

# A clean Debian 12 root with systemd, cached (the package is installed into a copy).
suite=bookworm
base=$(pkg_clean_root "$suite") || fail "no clean $suite root"
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-deb.XXXXXX")
root=$work/root
mounts=() pid=''
cleanup() {
    local rc=$? m
    [[ -z $pid ]] || { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
    if ((rc == 0)); then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp -a "$base" "$root"
mount --bind /proc "$root/proc" && mounts+=("$root/proc")
cp "$deb" "$root/tmp/"
chroot "$root" dpkg -i "/tmp/$(basename "$deb")" >"$work/dpkg.log" 2>&1 ||
    { cat "$work/dpkg.log"; fail "dpkg -i into a clean $suite root"; }
log "installed into a clean $suite root: $(chroot "$root" dpkg-query -W -f='${Package} ${Version} ${Status}' vhost-user-rdma)"
chroot "$root" /usr/bin/vhost-user-rdma --version >/dev/null || fail "the installed daemon does not run in the root"

# The units, as systemd reads them, for an instance.
mkdir -p "$root/etc/vhost-user-rdma"
addr=127.$((64 + $$ % 128)).77.1
echo "VUR_ARGS=\"--udp-addr $addr:4791\"" >"$root/etc/vhost-user-rdma/vm1.conf"
out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --root="$root" --man=no \
    vhost-user-rdma@vm1.service vhost-user-rdma@vm1.socket 2>&1) ||
    fail "systemd-analyze verify: $out"
[[ -z $out ]] || fail "systemd-analyze verify said: $out"
log "systemd-analyze verify: vhost-user-rdma@vm1.service and .socket clean"

# The service's own command line, as systemd would run it for vm1.
unit=$root/usr/lib/systemd/system/vhost-user-rdma@.service
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
listen=$(sed -n 's/^ListenStream=//p' "$root/usr/lib/systemd/system/vhost-user-rdma@.socket")
rundir=$(sed -n 's/^RuntimeDirectory=//p' "$unit")
# shellcheck disable=SC1090
. "$root/etc/vhost-user-rdma/vm1.conf"
exec_start=${exec_start//%i/vm1}
exec_start=${exec_start//\$VUR_ARGS/$VUR_ARGS}
listen=${listen//%i/vm1}
mkdir -p "$root$(dirname "$listen")" "$root/run/${rundir//%i/vm1}"
read -ra argv <<<"$exec_start"
log "ExecStart: ${argv[*]} (socket $listen as fd 3)"
systemd-socket-activate -l "$root$listen" chroot "$root" "${argv[@]}" >"$work/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S $root$listen ]] && break; sleep 0.05; done
[[ -S $root$listen ]] || fail "no socket at $listen"
probe=$("$repo/target/release/vur-probe" "$root$listen") || { cat "$work/daemon.log"; fail "vur-probe"; }
log "$probe"
counters=${exec_start#*--counters-socket }
counters=${counters%% *}
for _ in $(seq 100); do [[ -S $root$counters ]] && break; sleep 0.05; done
json=$(chroot "$root" /usr/bin/vhost-user-rdma counters "$counters") || fail "counters at $counters"
[[ $json == '{"connections":1,'* ]] || fail "counters: $json"
grep -q 'frontend connected' "$work/daemon.log" || { cat "$work/daemon.log"; fail "no frontend in the daemon's log"; }
grep -q 'seccomp: Kill' "$work/daemon.log" || { cat "$work/daemon.log"; fail "the daemon runs without its seccomp filter"; }
kill -TERM "$pid"
wait "$pid" || fail "the daemon did not exit 0 on SIGTERM (rc $?)"
pid=''
log "PASS in $((SECONDS - t0)) s"
