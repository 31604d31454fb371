#!/usr/bin/env bash
# tests/vm/run-vm.sh boots once more when QEMU dies of a signal before the guest's /init
# started (QEMU's multi-threaded TCG can crash in the firmware; nothing of the test ran yet), and
# only then: a crash after /init started is the run's failure (rc 125), and a second crash
# before /init is too. No QEMU here: a stand-in for the emulator binary plays each case, writing
# to the console file QEMU would have written (`-serial file:PATH`) and killing itself with
# SIGSEGV when the case says so; run-vm.sh's own boot, retry and exit-code logic are what run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
run_vm=$here/../vm/run-vm.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-run-vm-retry.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/images"
: >"$work/images/vmlinuz"
: >"$work/images/initrd.img"
printf '#!/bin/sh\ntrue\n' >"$work/scenario.sh"
cat >"$work/emulator" <<'EOF'
#!/usr/bin/env bash
# $CASE: early (crash before /init on the first boot), late (crash after /init started),
# always (crash before /init on every boot), ok
ulimit -c 0
n=$(($(cat "$STATE/boots" 2>/dev/null || echo 0) + 1))
echo "$n" >"$STATE/boots"
out=''
for a; do [[ $a == file:* ]] && out=${a#file:}; done
[[ -n $out ]] || { echo "no -serial file:PATH among the arguments" >&2; exit 2; }
case $CASE:$n in
early:1 | always:*) kill -SEGV $$ ;;
late:*) echo '[vur-init 0.9] init start' >>"$out"; kill -SEGV $$ ;;
esac
printf '[vur-init 0.9] init start\nVUR-END name=retry rc=0\n' >>"$out"
EOF
chmod +x "$work/emulator" "$work/scenario.sh"

fail=0
# check CASE WANT_RC WANT_BOOTS WANT_RETRY_LINE(0/1)
check() {
    local case=$1 want_rc=$2 want_boots=$3 want_line=$4 rc=0 boots line=0
    mkdir -p "$work/$case"
    CASE=$case STATE=$work/$case "$run_vm" --name retry --qemu "$work/emulator" \
        --images "$work/images" --scenario "$work/scenario.sh" --log "$work/$case/console" \
        --timeout 20 >"$work/$case/out" 2>&1 || rc=$?
    boots=$(cat "$work/$case/boots")
    grep -q 'before the guest.s /init started.*booting once more' "$work/$case/out" && line=1
    if ((rc != want_rc || boots != want_boots || line != want_line)); then
        echo "FAIL $case: rc $rc boots $boots retry line $line, want rc $want_rc boots $want_boots retry line $want_line"
        sed 's/^/    /' "$work/$case/out"
        fail=1
    else
        echo "ok   $case: rc $rc after $boots boot(s)"
    fi
}
check ok 0 1 0
check early 0 2 1
check late 125 1 0
check always 125 2 1
exit "$fail"
