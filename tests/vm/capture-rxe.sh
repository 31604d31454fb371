#!/usr/bin/env bash
# Golden capture of real Linux rxe (trixie kernel 6.12) traffic between two guests.
#
#   sudo tests/vm/capture-rxe.sh [--out DIR] [--no-install]
#
# Boots guest A (10.77.0.2, servers) and guest B (10.77.0.3, clients) on a bridge in a network
# namespace of its own (tests/vm/net.sh exec),
# runs the test list of tests/vm/capture-guest.sh (ibv_*_pingpong, ib_write_bw, ib_read_bw,
# ib_atomic_bw, ib_send_lat, one IPv6-GID run) and captures on the bridge:
#   DIR/roce.pcap   udp port 4791 only (pcap)            -> rxe-core/tests/data/rxe-6.12-capture.pcap
#   DIR/full.pcap   everything on the bridge, incl. the TCP out-of-band exchanges (not committed)
#   DIR/summary.md  per-test frame ranges, opcodes, ICRC check -> rxe-core/tests/data/README.md
#   DIR/oob.txt     the TCP payloads of the out-of-band exchanges
# DIR defaults to <repo>/.cache/capture/<date-time>. --no-install leaves rxe-core/tests/data alone.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
argv=("$@")
out=''
install=1
while (($#)); do
    case $1 in
    --out) out=$2; shift ;;
    --no-install) install=0 ;;
    *) echo "usage: $0 [--out DIR] [--no-install]" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '[capture %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[capture] error: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (bridge, taps, dumpcap)"
for t in qemu-system-x86_64 dumpcap tshark python3; do
    command -v "$t" >/dev/null || die "$t missing (sudo images/host-setup.sh)"
done
images=${VUR_IMAGES:-$("$repo/images/build.sh" --print-dir)}
[[ -f $images/initrd.img ]] || die "no guest image in $images (sudo images/build.sh)"
# The bridge, taps, guests and dumpcap live in a network namespace of their own.
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_netns capture "${argv[@]}"

export VUR_BRIDGE=${VUR_BRIDGE:-vurbr0}
taps=(vurtapA vurtapB)
[[ -n $out ]] || out=$repo/.cache/capture/$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
out=$(cd "$out" && pwd)
shared=$out/shared
mkdir -p "$shared"

t_start=$SECONDS
pids=()
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    "$here/net.sh" down "${taps[@]}" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$here/net.sh" up "${taps[@]}"

start_dumpcap() { # start_dumpcap FILE [FILTER]; waits until dumpcap is capturing
    local file=$1 err
    err=$out/${file##*/}.dumpcap.log
    if (($# > 1)); then
        dumpcap -q -i "$VUR_BRIDGE" -P -f "$2" -w "$file" 2>"$err" &
    else
        dumpcap -q -i "$VUR_BRIDGE" -P -w "$file" 2>"$err" &
    fi
    pids+=($!)
    for _ in $(seq 100); do
        grep -q 'Capturing on' "$err" 2>/dev/null && return 0
        sleep 0.1
    done
    cat "$err"
    die "dumpcap did not start"
}
start_dumpcap "$out/roce.pcap" "udp port 4791"
start_dumpcap "$out/full.pcap"
dumpcap_pids=("${pids[@]}")
log "capturing on $VUR_BRIDGE into $out"

log "booting guest A (servers) and guest B (clients)"
vm() { # vm NAME TAP IP4 IP6
    "$here/run-vm.sh" --name "$1" --tap "$2" --ip "$3/24" --ip6 "$4/64" --mtu 1500 \
        --scenario "$here/capture-guest.sh" --shared "$shared" --env SERVER=10.77.0.2 \
        --images "$images" --timeout 1200
}
vm A vurtapA 10.77.0.2 fd77::2 &
pid_a=$!
pids+=("$pid_a")
vm B vurtapB 10.77.0.3 fd77::3 &
pid_b=$!
pids+=("$pid_b")
rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
log "guests done: A rc=$rc_a B rc=$rc_b ($((SECONDS - t_start)) s)"

sleep 1
for p in "${dumpcap_pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
for p in "${dumpcap_pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()

grep -ah '^CAPTURE' "$shared/A.console.log" "$shared/B.console.log" | tr -d '\r' || true

log "summarising (tshark decode, per-test ranges, ICRC check)"
python3 "$here/capture-summary.py" --roce "$out/roce.pcap" --full "$out/full.pcap" \
    --shared "$shared" --manifest "$images/manifest.txt" \
    --summary "$out/summary.md" --oob "$out/oob.txt"
# Wireshark >= 4.2 calls the RoCEv2 decode-as target "rroce"; 4.0 (bookworm) does not know
# that name but decodes udp port 4791 as RRoCE by default.
decode=(-d 'udp.port==4791,rroce')
tshark -r "$out/roce.pcap" "${decode[@]}" -c 1 >/dev/null 2>&1 || decode=()
log "decode summary: tshark -r roce.pcap ${decode[*]} -T fields -e infiniband.bth.opcode | sort | uniq -c"
tshark -r "$out/roce.pcap" "${decode[@]}" -T fields -e infiniband.bth.opcode 2>/dev/null | sort | uniq -c

if ((rc_a != 0 || rc_b != 0)); then
    die "a guest failed (A rc=$rc_a, B rc=$rc_b); logs in $shared"
fi
if ((install)); then
    dest=$repo/rxe-core/tests/data
    mkdir -p "$dest"
    install -m 644 "$out/roce.pcap" "$dest/rxe-6.12-capture.pcap"
    install -m 644 "$out/summary.md" "$dest/README.md"
    log "installed $dest/rxe-6.12-capture.pcap ($(du -k "$dest/rxe-6.12-capture.pcap" | cut -f1) KiB) and README.md"
fi
log "done in $((SECONDS - t_start)) s; artifacts in $out"
