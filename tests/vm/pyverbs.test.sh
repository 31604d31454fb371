#!/usr/bin/env bash
# rdma-core's own test suite (pyverbs, tests/ of the rdma-core version in the guest image)
# against the virtio-rdma device (vrdma0, paired with eth0) and, in the same guest, against
# Linux rxe (rxe0 on a second NIC, eth1, so that its tests' traffic stays apart from the
# device's GID): test by test, side by side.
#
#   sudo tests/vm/pyverbs.test.sh [MODULE...]     default: the modules below
#
# Fails when a test passes on rxe0 and not on vrdma0 (unless listed in known_gaps below with
# its reason), when a test errors on vrdma0 (ditto), or when the daemon keeps objects after the
# suite. Writes the table to $VUR_PYVERBS_TABLE when set (docs/interop.md has one).
# Env: VUR_DAEMON, VUR_IMAGES, VUR_QEMU, VUR_PYVERBS_TABLE, VUR_PYVERBS_KEEP=1 (keep the logs).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t_start=$SECONDS
log() { printf '[pyverbs %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require pyverbs
vm_device_prereqs pyverbs
vm_netns pyverbs "$@"

modules=("$@")
((${#modules[@]})) || modules=(test_device test_pd test_mr test_cq test_cq_events test_cqex test_qp
    test_qpex test_srq test_addr test_atomic test_relaxed_ordering test_shared_pd
    test_parent_domain test_fork test_rdmacm test_odp test_flow test_rss_traffic test_tag_matching)

# Tests that pass on rxe0 and may not on vrdma0, or error on vrdma0, each with the reason.
# Nothing else may. (None left: test_rss_traffic, the last, passes since the device has work
# queues, indirection tables and RSS QPs, docs/virtio-rdma.md 5.14.)
declare -A known_gaps=()

# A floor for the default module list: vrdma0 passes at least this many tests (the run of
# 2026-11-29 with rereg, prefetch, implicit ODP and device import through
# guest-driver-patches/rdma-core's librxe, the 10 dma-buf tests over virtio-gpu buffers
# through its pyverbs patches, XRC, raw packet QPs and RSS: vrdma0 153 ok, rxe0 106 ok), and no
# fewer than rxe0
# less the known gaps. A run where the
# per-test lines stop matching, or a module stops importing, passes nothing and so fails here.
# Raise it when the device passes more.
min_ok=153
(($#)) && min_ok=0 # an explicit module list: no floor

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-pyverbs.XXXXXX")
dpid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $dpid ]]; then kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; fi
    if ((rc == 0)) && [[ -z ${VUR_PYVERBS_KEEP:-} ]]; then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

addr=10.77.0.2 mac=52:54:00:77:00:02 rxe_mac=52:54:00:79:00:02
"$here/net.sh" up vurtapA
vm_start_daemon "$work" "$addr" "$mac" || exit 1
dpid=$REPLY

cat >"$work/guest.sh" <<EOF
#!/bin/bash
modules=(${modules[*]})
rxe_mac=$rxe_mac
EOF
cat >>"$work/guest.sh" <<'EOF'
# Runs inside the guest (tests/vm/pyverbs.test.sh): every module against vrdma0, then rxe0.
t=/usr/share/doc/rdma-core/tests
[[ -f $t/run_tests.py ]] || { echo "PYV-FAIL the image has no rdma-core tests"; exit 1; }
# rxe0 on the second NIC (found by its MAC), with an address of its own
nic=''
for n in /sys/class/net/*; do [[ $(cat "$n/address") == "$rxe_mac" ]] && nic=${n##*/}; done
[[ -n $nic ]] || { echo "PYV-FAIL no NIC with MAC $rxe_mac"; exit 1; }
ip link set "$nic" up && ip addr add 10.79.0.2/24 dev "$nic"
modprobe rdma_rxe && rdma link add rxe0 type rxe netdev "$nic" ||
    { echo "PYV-FAIL could not create rxe0 on $nic"; exit 1; }
# The dma-buf tests' exporter: virtio-gpu (run-vm.sh --gpu), its render node renderD128;
# pyverbs allocates from it with guest-driver-patches/rdma-core 0006
modprobe virtio-gpu
for _ in $(seq 50); do [[ -c /dev/dri/renderD128 ]] && break; sleep 0.1; done
echo "PYV-GPU $(cat /sys/class/drm/renderD128/device/driver/module/drivers/*/uevent 2>/dev/null | head -1) $(ls /dev/dri 2>/dev/null | tr '\n' ' ')"
# 2 MiB huge pages for the tests that register them (test_odp's huge-page tests)
echo 8 >/proc/sys/vm/nr_hugepages
echo "PYV-HUGEPAGES $(cat /proc/sys/vm/nr_hugepages)"
for dev in vrdma0 rxe0; do
    gid=''
    for _ in $(seq 100); do gid=$(vur-gid v4 "$dev") && break; sleep 0.1; done
    [[ -n $gid ]] || { echo "PYV-FAIL no IPv4 RoCE v2 GID on $dev"; exit 1; }
    for m in "${modules[@]}"; do
        timeout 900 python3 -u "$t/run_tests.py" --dev "$dev" --port 1 --gid "$gid" -v \
            "tests.$m" >"/tmp/$dev.$m.log" 2>&1
        rc=$?
        echo "PYV-MODULE $dev $m rc=$rc $(grep -E '^(Ran|OK|FAILED)' "/tmp/$dev.$m.log" | tr '\n' ' ')"
        # one line per test: PYV dev test-id status [reason]
        python3 - "$dev" "/tmp/$dev.$m.log" <<'PY'
import re, sys
dev, path = sys.argv[1:3]
seen, status, last = [], {}, None
for line in open(path, errors="replace"):
    line = line.rstrip("\n")
    m = re.match(r"^(test\w*) \((tests\.[\w.]+)\)", line)
    if m:
        last = m.group(2)
        seen.append(last)
    # "... ok" ends the test's line, or stands alone after output the test printed
    r = re.search(r"(?: \.\.\. |^)(ok|FAIL|ERROR|skipped '(.*)'|expected failure|unexpected success)$", line)
    if r and last:
        status[last] = (r.group(1).split(" ")[0], (r.group(2) or "").replace("|", "/")[:100])
        last = None
    # the summary at the end names every error and failure, also those whose "... ERROR"
    # was lost among the test's own output
    m = re.match(r"^(ERROR|FAIL): test\w* \((tests\.[\w.]+)\)", line)
    if m:
        status[m.group(2)] = (m.group(1), "")
for t in dict.fromkeys(seen):
    st, why = status.get(t, ("unknown", ""))
    print(f"PYV {dev} {t} {st} {why}".rstrip())
PY
        cp "/tmp/$dev.$m.log" "/vur/$dev.$m.log" 2>/dev/null
    done
done
touch /vur/tools-done
for _ in $(seq 300); do [[ -f /vur/counters-read ]] && break; sleep 0.1; done
exit 0
EOF

(
    for _ in $(seq 36000); do [[ -f $work/tools-done ]] && break; sleep 0.1; done
    [[ -f $work/tools-done ]] && vm_daemon_counters "$work/counters.sock" >"$work/counters.json" 2>&1
    touch "$work/counters-read"
) &
watcher=$!
log "booting the guest: ${#modules[@]} modules on vrdma0, then on rxe0"
vm_rc=0
"$here/run-vm.sh" --name pyv --qemu "$qemu" --images "$images" --rdma-sock "$work/rdma.sock" \
    --nic-no-peer --mac "$mac" --ip "$addr/24" --no-rxe --tap2 vurtapA --mac2 "$rxe_mac" \
    --shared "$work" --smp 2 --gpu \
    --scenario "$work/guest.sh" --timeout 3600 >"$work/run-vm.log" 2>&1 || vm_rc=$?
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
tr -d '\r' <"$work/pyv.console.log" >"$work/console.txt"
grep -a -E '^PYV-(MODULE|FAIL)' "$work/console.txt" || true
if ((vm_rc != 0)); then
    tail -n 40 "$work/run-vm.log"
    log "FAIL: the guest ended with rc=$vm_rc"
    exit 1
fi

# The table and the verdict: every test that passes on rxe0 passes on vrdma0, and none errors
# or fails on vrdma0, unless it is a known gap (with its reason, printed).
fail=0
table=$work/table.md
for id in "${!known_gaps[@]}"; do printf '%s\t%s\n' "$id" "${known_gaps[$id]}"; done >"$work/known-gaps.tsv"
python3 - "$work/console.txt" "$table" "$work/known-gaps.tsv" "$min_ok" <<'PY' || fail=1
import sys
res, gaps = {}, dict(l.rstrip("\n").split("\t", 1) for l in open(sys.argv[3]) if "\t" in l)
for line in open(sys.argv[1], errors="replace"):
    p = line.rstrip("\n").split(" ", 4)
    if len(p) >= 4 and p[0] == "PYV":
        res.setdefault(p[2], {})[p[1]] = (p[3], p[4] if len(p) > 4 else "")
get = lambda t, dev: res[t].get(dev, ("missing", ""))
kinds = ("ok", "skipped", "FAIL", "ERROR", "unknown", "missing")
bad = 0
with open(sys.argv[2], "w") as f:
    f.write("| test | vrdma0 | rxe0 |\n|---|---|---|\n")
    for t in sorted(res):
        cell = lambda s: s[0] + (f" ({s[1]})" if s[1] and s[0] != "ok" else "")
        f.write(f"| {t.removeprefix('tests.')} | {cell(get(t, 'vrdma0'))} | {cell(get(t, 'rxe0'))} |\n")
    f.write("\n")
    for dev in ("vrdma0", "rxe0"):
        n = {k: sum(1 for t in res if get(t, dev)[0] == k) for k in kinds}
        line = f"{dev}: " + ", ".join(f"{v} {k}" for k, v in n.items() if v or k in ("ok", "skipped"))
        print("PYV-COUNT " + line)
        f.write(line + "  \n")
for t in sorted(res):
    v, r = get(t, "vrdma0")[0], get(t, "rxe0")[0]
    if v == "ok" or (r != "ok" and v == "skipped"):
        continue
    if t in gaps:
        print(f"known gap: {t}: vrdma0 {v}, rxe0 {r} — {gaps[t]}")
    else:
        print(f"FAIL: {t}: vrdma0 {v}, rxe0 {r}")
        bad = 1
for t in sorted(gaps):
    if t in res and get(t, "vrdma0")[0] == "ok":
        print(f"FAIL: {t} is listed as a known gap but passes on vrdma0: take it off the list")
        bad = 1
ok = {dev: sum(1 for t in res if get(t, dev)[0] == "ok") for dev in ("vrdma0", "rxe0")}
floor = max(int(sys.argv[4]), ok["rxe0"] - len(gaps)) if int(sys.argv[4]) else 0
if ok["vrdma0"] < floor:
    print(f"FAIL: vrdma0 passed {ok['vrdma0']} tests, fewer than the floor {floor} "
          f"(rxe0 {ok['rxe0']} less {len(gaps)} known gaps, and at least {sys.argv[4]})")
    bad = 1
sys.exit(bad)
PY
for m in "${modules[@]}"; do
    if grep -aq "^PYV-MODULE vrdma0 $m rc=13[0-9]" "$work/console.txt"; then
        if grep -aq "^PYV-MODULE rxe0 $m rc=13[0-9]" "$work/console.txt"; then
            log "note: $m crashed the interpreter at exit on both devices (pyverbs, not the device)"
        else
            log "FAIL: $m crashed the interpreter on vrdma0 only"
            fail=1
        fi
    fi
done
[[ -z ${VUR_PYVERBS_TABLE:-} ]] || cp "$table" "$VUR_PYVERBS_TABLE"
if [[ -s $work/counters.json ]]; then
    msg=$(vm_daemon_leaks pyverbs "$work/counters.json") || fail=1
    log "$msg"
    # ODP tests that pass on vrdma0 went through the device's page faults (docs/virtio-rdma.md
    # §5.10): the pages were asked for and mapped, not pinned at registration.
    if grep -aq "^PYV vrdma0 tests.test_odp.* ok" "$work/console.txt"; then
        read -r faults updates < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))
print(c["port"]["odp_faults"], c["device"]["odp_updates"])' "$work/counters.json")
        log "ODP on vrdma0: $faults page faults, $updates UPDATE_ODP maps"
        if ((faults == 0 || updates == 0)); then
            log "FAIL: test_odp passed on vrdma0 without a page fault through the device"
            fail=1
        fi
    fi
else
    log "FAIL: no counters read from the daemon"
    fail=1
fi
kill -0 "$dpid" 2>/dev/null || { log "FAIL: the daemon died"; tail -20 "$work/daemon.log"; fail=1; }
if ((fail)); then
    log "FAIL in $((SECONDS - t_start)) s (table: $table)"
    exit 1
fi
log "PASS in $((SECONDS - t_start)) s"
