# Shared by the VM tests (source it): prerequisite checks with the SKIP / CI=true rule, and the
# network namespace every test with a network runs in.
# shellcheck shell=bash

# The test network of tests/vm/net.sh, inside the test's own namespace: host bridge and the
# first guest, IPv4 and IPv6.
# shellcheck disable=SC2034 # used by the scripts that source this file
host4=10.77.0.1 guest4=10.77.0.2 host6=fd77::1 guest6=fd77::2

# Exit code of a test that skipped (tests/run.sh counts it apart from passes).
# shellcheck disable=SC2034
VM_SKIP=77

# vm_missing REASON: one line and exit $VM_SKIP ("SKIP: ...") — or, under CI=true, where the
# prerequisites are installed by .ci/run, a failure.
vm_missing() {
    if [[ ${CI:-} == true ]]; then
        echo "FAIL: $* (CI=true: prerequisites must be installed)"
        exit 1
    fi
    echo "SKIP: $*"
    exit "$VM_SKIP"
}

# vm_require NAME [COMMAND...]: root, QEMU, the given commands and the guest image; sets
# $images to the image directory.
vm_require() {
    local name=$1 c
    shift
    [[ $(id -u) -eq 0 ]] || vm_missing "$name needs root (network namespace, tap device, bridge)"
    for c in qemu-system-x86_64 ip "$@"; do
        command -v "$c" >/dev/null || vm_missing "$name: $c not installed (images/host-setup.sh)"
    done
    images=${VUR_IMAGES:-$("$repo/images/build.sh" --print-dir)}
    [[ -f $images/vmlinuz && -f $images/initrd.img ]] ||
        vm_missing "$name: no guest image in $images (sudo images/build.sh)"
}

# vm_in_netns: true when this script already runs in the namespace tests/vm/net.sh made for it.
vm_in_netns() {
    [[ -n ${VUR_NETNS:-} && $(ip netns identify $$ 2>/dev/null) == "$VUR_NETNS" ]]
}

# vm_netns NAME "$@": run this script again inside a network namespace of its own
# (tests/vm/net.sh exec), which is deleted when it ends, and exit with its exit code. Returns
# at once when already inside. Everything the test makes — bridge, taps, QEMU, host-side
# peers, captures, netem — then lives in that namespace.
vm_netns() {
    local name=$1
    shift
    vm_in_netns && return 0
    exec "$repo/tests/vm/net.sh" exec --name "$name" -- "$BASH" "$0" "$@"
}

# vm_repeat_arg "$@": the test's only option, [--repeat N]; sets $repeat (default 1).
vm_repeat_arg() {
    repeat=1
    case ${1:-} in
    --repeat) repeat=${2:-}; [[ $repeat =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [--repeat N]" >&2; exit 2; } ;;
    "") ;;
    *) echo "usage: $0 [--repeat N]" >&2; exit 2 ;;
    esac
}

# vm_select_cases ARRAY VAR: when environment variable VAR lists case numbers ("3 6"), keep only
# those entries of ARRAY (each starts with its number); a list that selects nothing fails.
vm_select_cases() {
    local -n _cases=$1
    local sel=${!2:-} c
    local keep=()
    [[ -n $sel ]] || return 0
    for c in "${_cases[@]}"; do
        [[ " $sel " == *" ${c%% *} "* ]] && keep+=("$c")
    done
    ((${#keep[@]})) || { echo "FAIL: $2='$sel' selects no case"; exit 1; }
    _cases=("${keep[@]}")
}

# vm_device_prereqs NAME: what a guest with the virtio-rdma device needs besides vm_require —
# the image's virtio_rdma.ko, QEMU with vhost-user-rdma-pci ($qemu; env VUR_QEMU) and the
# daemon binary ($daemon; env VUR_DAEMON, else target/release, else target/debug).
vm_device_prereqs() {
    local name=$1 d
    [[ -f $images/virtio_rdma.ko ]] ||
        vm_missing "$name: the image in $images has no virtio_rdma.ko (sudo images/build.sh)"
    qemu=${VUR_QEMU:-}
    [[ -n $qemu ]] || qemu=$(bash "$repo/guest-driver-patches/qemu/build.sh" --print-bin 2>/dev/null) ||
        vm_missing "$name: no QEMU with vhost-user-rdma-pci (guest-driver-patches/qemu/build.sh)"
    [[ -x $qemu ]] || vm_missing "$name: $qemu is not executable"
    daemon=${VUR_DAEMON:-}
    if [[ -z $daemon ]]; then
        for d in "$repo/target/release/vhost-user-rdma" "$repo/target/debug/vhost-user-rdma"; do
            [[ -x $d ]] && daemon=$d && break
        done
    fi
    [[ -n $daemon ]] ||
        vm_missing "$name: no vhost-user-rdma binary (cargo build --release -p vhost-user-rdma)"
}

# vm_start_daemon DIR ADDR MAC [ARG...]: start $daemon with its vhost-user socket DIR/rdma.sock,
# counters socket DIR/counters.sock, log DIR/daemon.log and its udp transport on ADDR:4791
# (ADDR is added to this namespace's loopback; an IPv6 ADDR to the bridge, where neighbour
# solicitations for it arrive); wait (10 s at most) for the socket. Sets
# $REPLY to the daemon's pid; fails saying why. $VUR_DAEMON_ARGS is added to every daemon's
# arguments.
vm_start_daemon() {
    local dir=$1 addr=$2 mac=$3 pid
    shift 3
    mkdir -p "$dir"
    local udp=$addr:4791 in=()
    if [[ -n ${VM_DAEMON_NS:-} ]]; then
        # In the network namespace of a host of the test's own (tests/vm/guest-pair.test.sh
        # routed), whose link holds the address.
        in=(ip netns exec "$VM_DAEMON_NS")
    elif [[ $addr == *:* ]]; then
        # IPv6: on the bridge, where the peers' neighbour solicitations arrive (the kernel
        # answers them only for addresses of the interface they reach)
        ip -6 addr replace "$addr/128" dev "${VUR_BRIDGE:-vurbr0}" nodad
        udp=[$addr]:4791
    else
        ip addr replace "$addr/32" dev lo
    fi
    # $VUR_DAEMON_ARGS: arguments for every daemon of a run (e.g. --engine-shards 3).
    # shellcheck disable=SC2086
    "${in[@]}" "$daemon" --socket-path "$dir/rdma.sock" --udp-addr "$udp" --mac "$mac" \
        --counters-socket "$dir/counters.sock" "$@" ${VUR_DAEMON_ARGS:-} >"$dir/daemon.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        [[ -S $dir/rdma.sock ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ ! -S $dir/rdma.sock ]]; then
        cat "$dir/daemon.log"
        echo "FAIL: the daemon's socket $dir/rdma.sock did not appear within 10 s"
        return 1
    fi
    REPLY=$pid
}

# vm_daemon_counters SOCKET: one JSON object from a daemon's counters socket on stdout.
vm_daemon_counters() {
    python3 -c 'import socket,sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
print(b"".join(iter(lambda: s.recv(65536), b"")).decode())' "$1"
}

# vm_daemon_leaks NAME COUNTERS.json [EXPECTED]: fail (return 1, one line saying what) when
# the daemon holds other objects than the guest's kernel: EXPECTED ("QPS CQS SRQS", what the
# guest's `rdma resource show` lists once its applications have exited) when given, else at most
# QP1 and its CQ (ib_mad).
vm_daemon_leaks() {
    local objs nqp ncq nsrq
    objs=$(python3 -c 'import json,sys; o=json.load(open(sys.argv[1])).get("objects",{}); print(o.get("qps",-1), o.get("cqs",-1), o.get("srqs",-1))' "$2" 2>/dev/null) ||
        { echo "$1: counters unreadable"; return 1; }
    read -r nqp ncq nsrq <<<"$objs"
    if [[ -n ${3:-} ]]; then
        echo "$1: daemon objects after the tools (qps cqs srqs): $objs; the guest's kernel holds $3"
        [[ $objs == "$3" ]] || { echo "$1: FAIL: the device holds other objects than the guest"; return 1; }
        return 0
    fi
    echo "$1: daemon objects after the tools (qps cqs srqs): $objs"
    ((nqp >= 0 && nqp <= 1 && ncq >= 0 && ncq <= 1 && nsrq == 0)) ||
        { echo "$1: FAIL: objects left in the device after every tool exited"; return 1; }
}

# vm_daemon_gso NAME COUNTERS.json: print a daemon's UDP GSO/GRO counters; fail (return 1) when
# it sent no GSO run (a udp transport with --udp-gso carrying multi-packet messages must) or the kernel
# refused a GSO send.
vm_daemon_gso() {
    python3 - "$1" "$2" <<'PY'
import json, sys
t = json.load(open(sys.argv[2])).get("transport", {})
keys = ("tx_gso_sends", "tx_gso_segments", "tx_gso_refused", "rx_gro_runs", "rx_gro_segments")
print(sys.argv[1] + ": udp " + " ".join(f"{k}={t.get(k, '?')}" for k in keys))
if not t.get("tx_gso_sends") or t.get("tx_gso_refused"):
    print(sys.argv[1] + ": FAIL: no GSO run sent, or a GSO send refused")
    sys.exit(1)
PY
}

# vm_daemon_io NAME COUNTERS.json: one line with a device's I/O-thread counters; fail (return
# 1) when no send batch went through the I/O thread, a datagram the socket received did not
# go through its inbox, or one was dropped there. (The I/O thread checks each ICRC: a packet
# whose IPv4 ID opened a new sequence is learned and dropped there, `rx_icrc_id_learned`, and
# one that needs the ID solve but is for no live QP, a straggler of a QP destroyed, is dropped
# before it, `rx_icrc_no_qp`: neither reaches the inbox.)
vm_daemon_io() {
    python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[2]))
t, io = j.get("transport", {}), j.get("io_thread", {})
keys = ("tx_batches", "tx_inline", "tx_channel_full", "io_wakeups", "rx_packets", "rx_dropped")
print(sys.argv[1] + ": io_thread " + " ".join(f"{k}={io.get(k, '?')}" for k in keys)
      + f"; transport tx_packets={t.get('tx_packets', '?')} rx_packets={t.get('rx_packets', '?')}")
bad = [] if io.get("tx_batches") else ["no send batch through the I/O thread"]
learned, no_qp = t.get("rx_icrc_id_learned", 0), t.get("rx_icrc_no_qp", 0)
if not t.get("rx_packets") or io.get("rx_packets") != t.get("rx_packets") - learned - no_qp:
    bad.append("received datagrams not all through the I/O thread's inbox "
               f"({io.get('rx_packets')} of {t.get('rx_packets')}, {learned} dropped as learned IDs, "
               f"{no_qp} for no live QP)")
bad += ["io_thread rx_dropped"] if io.get("rx_dropped") else []
if bad:
    print(sys.argv[1] + ": FAIL: " + ", ".join(bad))
    sys.exit(1)
PY
}

# vm_daemon_same_host NAME COUNTERS.json: one line with a device's same-host and transport
# counters; fail (return 1) when RoCE crossed its UDP socket, nothing crossed the shortcut, no
# payload crossed as references, no batch ran to completion on the sender's thread, or a
# packet was dropped at its inbox.
vm_daemon_same_host() {
    python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[2]))
t, h = j.get("transport", {}), j.get("same_host", {})
keys = ("tx_packets", "rx_packets", "tx_ref_packets", "tx_ref_bytes", "rx_driven", "rx_dropped")
segs = j.get("port", {}).get("tx_segments", "?")
print(sys.argv[1] + ": same_host " + " ".join(f"{k}={h.get(k, '?')}" for k in keys)
      + f"; port tx_segments={segs}"
      + f"; transport tx_packets={t.get('tx_packets', '?')} rx_packets={t.get('rx_packets', '?')}")
bad = [k for k in ("tx_packets", "rx_packets", "tx_ref_bytes", "rx_driven") if not h.get(k)]
bad += ["same_host rx_dropped"] if h.get("rx_dropped") else []
bad += [f"transport {k}" for k in ("tx_packets", "rx_packets") if t.get(k) != 0]
if bad:
    print(sys.argv[1] + ": FAIL: " + ", ".join(bad))
    sys.exit(1)
PY
}

# vm_daemon_traffic NAME COUNTERS.json: one line with the daemon's transport counters (and,
# with --engine-shards, each shard's packets; with --shard-threads, each shard socket's); fail
# (return 1) when it sent or received nothing, received a packet whose ICRC was wrong, a shard
# carried nothing, or a shard's socket received other than exactly its shard's packets.
vm_daemon_traffic() {
    python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[2]))
t = j.get("transport", {})
keys = ("tx_packets", "rx_packets", "rx_icrc_ok", "rx_icrc_id_solved", "rx_icrc_id_learned", "rx_icrc_bad", "tx_dropped")
print(sys.argv[1] + ": transport " + " ".join(f"{k}={t.get(k, '?')}" for k in keys))
bad = [k for k in ("tx_packets", "rx_packets") if not t.get(k)] + [k for k in ("rx_icrc_bad",) if t.get(k)]
# --engine-shards: every shard carried traffic (the tools' QPs went to each in turn).
shards = sorted(k for k in j if k.startswith("shard") and k[5:].isdigit())
if shards:
    print(sys.argv[1] + ": " + " ".join(
        f"{k} rx_packets={j[k].get('rx_packets')} tx_packets={j[k].get('tx_packets')}" for k in shards))
    bad += [f"{k} idle" for k in shards if not (j[k].get("rx_packets") and j[k].get("tx_packets"))]
# --shard-threads: each shard's own socket received exactly its engine shard's packets (the
# kernel steers by QPN) and sent from it (a control command that finds doorbells waiting
# may send a shard's first packets from the worker's socket: at most the engine's). A socket
# drops the packets whose IPv4 ID opened a new sequence (learned, `rx_icrc_id_learned`) and
# those for no live QP (`rx_icrc_no_qp`), both counted over all the device's sockets: together
# they account for what a socket got beyond its shard.
extra = 0
for k, s in sorted(j.get("shard_sockets", {}).items()):
    e = j.get(k, {})
    print(f"{sys.argv[1]}: {k} socket rx_packets={s.get('rx_packets')} tx_packets={s.get('tx_packets')}")
    d = (s.get("rx_packets") or 0) - (e.get("rx_packets") or 0)
    extra += d
    if d < 0:
        bad.append(f"{k} socket received {s.get('rx_packets')}, the shard {e.get('rx_packets')}")
    if not (0 < (s.get("tx_packets") or 0) <= (e.get("tx_packets") or 0)):
        bad.append(f"{k} socket sent {s.get('tx_packets')}, the shard {e.get('tx_packets')}")
dropped = t.get("rx_icrc_id_learned", 0) + t.get("rx_icrc_no_qp", 0)
if extra > dropped:
    bad.append(f"the shard sockets received {extra} packets beyond their shards', "
               f"{t.get('rx_icrc_id_learned', 0)} dropped as learned IDs, "
               f"{t.get('rx_icrc_no_qp', 0)} for no live QP")
if bad:
    print(sys.argv[1] + ": FAIL: " + ", ".join(bad))
    sys.exit(1)
PY
}
