#!/usr/bin/env bash
# Two guests, the RDMA tools across them (tests/vm/pair-guest.sh runs in both, in lock step):
#
#   devices  two guests with the virtio-rdma device, each served by its own vhost-user-rdma
#            daemon on the udp transport: the server always on guest "a", the client on "b"
#   rxe      a guest with the virtio-rdma device against a guest running Linux rdma_rxe on its
#            virtio-net: every tool in both directions; a capture on the bridge must show each
#            connection on one UDP source port both ways, the one rxe picks for it
#            (tests/vm/sport-check.py)
#   rxe6     the same pair with IPv6 GIDs: the daemon's udp transport on fd77::2 (--udp-gso)
#            sends runs of packets as UDP GSO and takes them as UDP GRO; the verbs tools and
#            perftest in both directions, and the daemon must have sent GSO runs with every
#            ICRC it received right
#   rxe-shards  the rxe pair with the daemon's engine in two shards, the second on a thread and a
#            UDP socket of its own (--engine-shards 2 --shard-threads): every tool in both
#            directions, and that shard's socket must have received exactly its QPs' packets
#   rxe-gso  the rxe pair with the daemon's udp transport on IPv4 with --udp-gso: runs of packets
#            leave as UDP GSO sends, each segment's ICRC for the IP ID the kernel gives it (its
#            index in the run), which Linux rxe checks; every tool in both directions, and the
#            daemon must have sent GSO runs with every ICRC it received right
#   rxe-io   the rxe pair with the daemon's UDP socket served by an I/O thread beside its worker
#            (--io-thread): every tool in both directions, and every packet the daemon sent
#            and received must have gone through that thread, none dropped on the way
#   same-host  the devices pair served by ONE daemon process (two --socket-path, --same-host):
#            every tool, and no RoCE packet between the guests may cross the kernel (the
#            devices' UDP sockets send and receive nothing); RC payloads cross with one copy,
#            guest memory to guest memory (same_host tx_ref_bytes)
#
#   routed   the devices pair on two hosts with a router between them: each guest and its
#            daemon in a network namespace of their own (host A 10.91.1.2, host B 10.91.2.2),
#            the test's namespace routing between them (not one bridge), the router-B link
#            at MTU 1280 below the guests' and hosts' 1500: every tool across (RDMA at path
#            MTU 1024 fits; TCP finds the path MTU from the router's ICMP); a capture on the
#            router must show each QP's packets from the UDP source port rxe gives that QP
#            (RC/UC: both ways, the ACKs included; UD: a hash of the sender's QPN;
#            tests/vm/sport-check.py), no fragment, no packet above 1280, no ICMP error for RoCE
#
#   nic      two guests whose daemons are their RoCE NICs (--net-socket): each daemon serves its
#            guest's virtio-net eth0 and virtio-rdma device on one veth into the bridge, so both
#            guests sit on one L2 with their own MACs and addresses, ARP their own; IP (ping,
#            16 MiB over TCP) and every tool run over eth0, RDMA from the guests' own addresses
#            (rdma_cm resolving them as on any RoCE NIC, no static neighbour)
#
#   nic-rxe  interop on one L2: a guest whose daemon is its NIC (as in nic) and a guest running
#            Linux rdma_rxe on its own virtio-net, on the same bridge: every tool both ways
#
#   soak     the devices pair with every tool, round after round, for VUR_SOAK_SECS seconds
#            (default 120), while every 400th RC packet (but plain ACKs) between the daemons is dropped
#            (nftables on the namespace's loopback; VUR_SOAK_DROP_EVERY): every tool run must
#            succeed, the daemons' memory (RssAnon) and fd count stay flat after the warm-up,
#            and at the end they hold exactly what the guests' kernels hold. tests/vm/soak.test.sh
#
#   sudo tests/vm/guest-pair.test.sh [--repeat N] [devices|rxe|rxe-shards|rxe-gso|rxe-io|rxe6|same-host|routed|nic|nic-rxe|all|soak] [TOOL...]
#   default: all (devices, rxe, rxe-shards, rxe-gso, rxe-io, rxe6, same-host, routed, nic, nic-rxe), every tool. --repeat N runs each
#   mode N times (logs per run: $work/MODE.R) and prints a pass count per mode (rxe6: the tools with a GID index: rc uc
#   ud srq send_lat send_bw write_lat write_bw read_bw atomic_bw datacheck); soak: datacheck rc uc ud
#   srq send_bw write_bw read_bw atomic_bw rping udaddy nvme
#
# Tools: tcp (ping and 16 MiB over TCP between the out-of-band addresses: QEMU's own virtio-net
# on a tap in devices and rxe, the daemon's in the nic modes), mckey (UD multicast through
# rdma_cm: devices and nic), datacheck (tests/vm/vur-datacheck.py: every byte of SEND, WRITE and READ on RC,
# SEND and WRITE on UC, SEND on UD and through an SRQ, both ways, checked: the data check of
# every mode; once per mode, as it moves every payload both ways itself: in the rxe and nic-rxe
# modes the device guest serves), datacheck_dmabuf (the same with every buffer of a virtio-rdma
# side a dma-buf MR: a udmabuf, ibv_reg_dmabuf_mr through guest-driver-patches/rdma-core's
# librxe; in the defaults of devices and rxe, where rxe's side keeps plain MRs), rc uc ud srq (the libibverbs examples with -c: a smoke; their server looks at
# byte 0 of each page, and a step that prints "invalid data" fails), send_lat send_bw
# write_lat write_bw read_bw atomic_bw (perftest: completes), rping (rdma_cm, -V: each ping's
# data verified, the CM over each side's QP1). The host checks every step's command line and
# output on both consoles (step_audit).
#
# Addresses (all inside the test's own network namespace, tests/vm/net.sh exec):
#   10.77.0.0/24  RoCE. A daemon's udp transport is bound to an address on the namespace's
#                 loopback (a 10.77.0.2, b 10.77.0.3); its guest's eth0, the netdev the
#                 virtio-rdma port pairs with, holds the same address and is attached to
#                 nothing. The rxe guest (10.77.0.4) is on the bridge (vurbr0, 10.77.0.1/24),
#                 and the host answers its ARP for 10.77.0.2: that is where the daemon is.
#   fd77::/64     RoCE in rxe6: the daemon on fd77::2 (on the bridge, where the rxe guest's
#                 neighbour solicitations reach it), the rxe guest on fd77::4.
#   10.78.0.0/24  out of band (the tools' TCP exchange): every guest's NIC on the bridge.
# In devices mode an eBPF tap (vhost-user-rdma tap) on the namespace's loopback captures the
# daemons' traffic; the capture must hold every packet they sent (VUR_PAIR_TAP=0: no tap).
# Env: VUR_PAIR_ITERS (default 200), VUR_PAIR_KEEP=1 (keep the logs), VUR_PAIR_CAPTURE=1 (keep a
# capture of RoCE and ICMP on the bridge, in every mode), VUR_DAEMON, VUR_IMAGES, VUR_QEMU.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t_start=$SECONDS
log() { printf '[guest-pair %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require guest-pair
vm_device_prereqs guest-pair
vm_netns guest-pair "$@"

repeat=1
if [[ ${1:-} == --repeat ]]; then
    repeat=${2:-}
    [[ $repeat =~ ^[1-9][0-9]*$ ]] ||
        { echo "usage: $0 [--repeat N] [devices|rxe|rxe-shards|rxe-gso|rxe-io|rxe6|same-host|routed|nic|nic-rxe|all|soak] [TOOL...]" >&2; exit 2; }
    shift 2
fi

modes=(devices rxe rxe-shards rxe-gso rxe-io rxe6 same-host routed nic nic-rxe)
case ${1:-all} in
devices | rxe | rxe-shards | rxe-gso | rxe-io | rxe6 | same-host | routed | soak | nic | nic-rxe) modes=("$1"); shift ;;
all) shift || true ;;
-*) echo "usage: $0 [--repeat N] [devices|rxe|rxe-shards|rxe-gso|rxe-io|rxe6|same-host|routed|nic|nic-rxe|all|soak] [TOOL...]" >&2; exit 2 ;;
esac
# the tools that take a GID index (rxe6; the rdma_cm tools and tcp stay on IPv4)
gid_tools=(datacheck rc uc ud srq send_lat send_bw write_lat write_bw read_bw atomic_bw)
rdma_tools=(datacheck rc uc ud srq send_lat send_bw write_lat write_bw read_bw atomic_bw rping ucmatose udaddy rdma_server send_lat_cm nvme)
# mckey (UD multicast through rdma_cm): in the defaults of the devices mode (the udp
# transports join the group on the namespace's loopback, where their addresses are) and of the
# nic modes (the daemons are the NICs; against rxe the device sends and rxe receives: rxe 6.12
# as a sender puts one of mckey's 20 datagrams on the wire, sent_pkts=1, and stalls); not in
# routed (multicast is not routed) or same-host (it crosses the kernel); in the other rxe
# modes only when named (the daemon's address is on loopback, where the rxe guest's multicast
# does not reach)
all_tools=(tcp "${rdma_tools[@]}" mckey datacheck_dmabuf)
tools=("$@")
nic_defaults=$((${#tools[@]} == 0))
if [[ ${modes[*]} == soak ]]; then
    command -v nft >/dev/null || vm_missing "guest-pair soak: nft not installed (nftables; images/host-setup.sh)"
    ((${#tools[@]})) || tools=(datacheck rc uc ud srq send_bw write_bw read_bw atomic_bw rping udaddy nvme)
    soak_secs=${VUR_SOAK_SECS:-120}
    drop_every=${VUR_SOAK_DROP_EVERY:-400}
    [[ $soak_secs =~ ^[1-9][0-9]*$ && $drop_every =~ ^[1-9][0-9]*$ ]] ||
        { echo "VUR_SOAK_SECS and VUR_SOAK_DROP_EVERY must be positive integers" >&2; exit 2; }
fi
((${#tools[@]})) || tools=(tcp "${rdma_tools[@]}")
for t in "${tools[@]}"; do
    [[ " ${all_tools[*]} " == *" $t "* ]] || { echo "unknown tool $t (${all_tools[*]})" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-guest-pair.XXXXXX")
pids=()
# routed: the hosts' network namespaces (routed_net), deleted with what runs in them
host_ns=()
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$? p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    routed_net_down
    if ((rc == 0)) && [[ -z ${VUR_PAIR_KEEP:-} ]]; then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$here/net.sh" up vurtapA vurtapB
iters=${VUR_PAIR_ITERS:-200}
guest_timeout=1200

# daemon NAME ADDR MAC [ARGS...]: start the daemon of guest NAME (directory $dir/daemon-NAME)
daemon() {
    vm_start_daemon "$dir/daemon-$1" "$2" "$3" "${@:4}" || return 1
    daemons+=("$1:$REPLY")
    pids+=("$REPLY")
}

# nic_daemon NAME IP MAC IFACE: the daemon that is guest NAME's RoCE NIC: a veth pair IFACE
# (the daemon's end, no address of the host's) and IFACE's peer on the bridge; the daemon
# serves the guest's virtio-net (net.sock) and virtio-rdma device on IFACE. IP is the guest's
# (for the log; the daemon learns it from the guest's GIDs).
nic_daemon() {
    local name=$1 ip=$2 mac=$3 ifc=$4
    ip link add "$ifc" type veth peer name "${ifc}p" || return 1
    sysctl -q -w "net.ipv6.conf.$ifc.disable_ipv6=1" || true
    ip link set "${ifc}p" master "${VUR_BRIDGE:-vurbr0}" up && ip link set "$ifc" up || return 1
    # --udp-addr is not used with --iface; a loopback address keeps the guest's off the host
    vm_start_daemon "$dir/daemon-$name" "127.0.0.$((${#daemons[@]} + 2))" "$mac" \
        --iface "$ifc" --net-socket "$dir/daemon-$name/net.sock" || return 1
    log "nic: daemon of guest $name ($ip, $mac) on $ifc"
    daemons+=("$name:$REPLY")
    pids+=("$REPLY")
}

# routed_net: hosts A and B as network namespaces of their own, each joined to this one (the
# router) by a veth pair: A 10.91.1.2/24 (link MTU 1500), B 10.91.2.2/24 (link MTU 1280, both
# ends), default routes through the router (10.91.1.1, 10.91.2.1). Each host has the tap of
# its guest's out-of-band NIC (vurtapA, vurtapB: 10.78.1.1/24, 10.78.2.1/24) and forwards
# for it; the router routes 10.78.N.0/24 to host N. Sets $ns_a and $ns_b.
routed_net() {
    local x n i mtu
    ns_a=vur-hostA-$$ ns_b=vur-hostB-$$
    for n in "$ns_a" "$ns_b"; do
        ip netns add "$n" || return 1
        host_ns+=("$n")
    done
    for x in A B; do
        if [[ $x == A ]]; then n=$ns_a i=1 mtu=1500; else n=$ns_b i=2 mtu=1280; fi
        ip link add "r$x" type veth peer name "h$x" netns "$n" &&
            ip addr add "10.91.$i.1/24" dev "r$x" && ip link set "r$x" mtu "$mtu" up &&
            ip route add "10.78.$i.0/24" via "10.91.$i.2" &&
            ip -n "$n" link set lo up &&
            ip -n "$n" addr add "10.91.$i.2/24" dev "h$x" &&
            ip -n "$n" link set "h$x" mtu "$mtu" up &&
            ip -n "$n" route add default via "10.91.$i.1" &&
            ip -n "$n" tuntap add dev "vurtap$x" mode tap &&
            ip -n "$n" addr add "10.78.$i.1/24" dev "vurtap$x" &&
            ip -n "$n" link set "vurtap$x" up &&
            ip netns exec "$n" sysctl -q -w net.ipv4.ip_forward=1 || return 1
    done
    sysctl -q -w net.ipv4.ip_forward=1
    log "routed: host A ($ns_a) 10.91.1.2 <-> router <-> host B ($ns_b) 10.91.2.2, router-B MTU 1280"
}

# routed_net_down: stop what still runs in the hosts' namespaces and delete them.
routed_net_down() {
    local n p
    for n in "${host_ns[@]}"; do
        for p in $(ip netns pids "$n" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
        for _ in $(seq 50); do
            [[ -z $(ip netns pids "$n" 2>/dev/null) ]] && break
            sleep 0.1
        done
        for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$n" 2>/dev/null || true
    done
    host_ns=()
    ip link del rA 2>/dev/null || true
    ip link del rB 2>/dev/null || true
}

# guest NAME RUN-VM-ARGS... : boot one guest of the pair (background), in network namespace
# $guest_ns when set; its exit code lands in $dir/NAME.rc
guest() {
    local name=$1 in=()
    shift
    [[ -n ${guest_ns:-} ]] && in=(ip netns exec "$guest_ns")
    { "${in[@]}" "$here/run-vm.sh" --name "$name" --qemu "$qemu" --images "$images" --shared "$dir/share" \
        --scenario "$here/pair-guest.sh" --file "$here/vur-datacheck.py" --timeout "$guest_timeout" --env "PAIR_ITERS=$iters" \
        --env "PAIR_STEPS=$steps" "$@" >"$dir/$name.run.log" 2>&1; echo $? >"$dir/$name.rc"; } &
    vm_pids+=($!)
}

# pair_steps A B [TOOL...]: every tool (default: $tools) once with its server on guest A and
# once on B; datacheck once, on A (it moves every payload both ways itself); mckey once, its
# receiver on B (the rxe guest: A, the device, sends).
pair_steps() {
    local a=$1 b=$2 t
    shift 2
    (($#)) || set -- "${tools[@]}"
    for t in "$@"; do
        if [[ $t == datacheck || $t == datacheck_dmabuf ]]; then
            steps+="${steps:+,}$t@$a"
        elif [[ $t == mckey ]]; then
            # the device sends, the rxe guest ($b) receives: rxe 6.12 as a multicast sender
            # puts the first of mckey's datagrams on the wire and no more (sent_pkts=1, its
            # mckey waits for the send completions until it is stopped)
            steps+="${steps:+,}$t@$b"
        else
            steps+="${steps:+,}$t@$a,$t@$b"
        fi
    done
}

run_mode() {
    local mode=$1 t fail=0 n
    dir=$work/$mode${run_tag:-}
    mkdir -p "$dir/share/sync"
    steps=''
    vm_pids=()
    daemons=()
    case $mode in
    devices | soak | same-host)
        local soak_env=()
        if [[ $mode != soak ]]; then
            local dt=("${tools[@]}")
            [[ $mode == devices ]] && ((nic_defaults)) && dt+=(mckey datacheck_dmabuf)
            for t in "${dt[@]}"; do steps+="${steps:+,}$t@a"; done
        else
            # servers alternate between the guests, so that both directions carry each kind
            n=0
            for t in "${tools[@]}"; do
                if ((n++ % 2 == 0)); then steps+="${steps:+,}$t@a"; else steps+="${steps:+,}$t@b"; fi
            done
            soak_env=(--env PAIR_SOAK=1 --env PAIR_ACK_TIMEOUT=14)
            guest_timeout=$((soak_secs + 900))
            soak_drop || return 1
        fi
        if [[ $mode == same-host ]]; then
            # one process, two devices: b's socket, address, MAC and counters are its second
            ip addr replace 10.77.0.3/32 dev lo
            mkdir -p "$dir/daemon-b"
            vm_start_daemon "$dir/daemon-a" 10.77.0.2 52:54:00:77:00:02 --same-host \
                --socket-path "$dir/daemon-b/rdma.sock" --udp-addr 10.77.0.3:4791 \
                --mac 52:54:00:77:00:03 --counters-socket "$dir/daemon-b/counters.sock" || return 1
            daemons+=("a:$REPLY" "b:$REPLY")
            pids+=("$REPLY")
            for _ in $(seq 100); do [[ -S $dir/daemon-b/rdma.sock ]] && break; sleep 0.1; done
            [[ -S $dir/daemon-b/rdma.sock ]] ||
                { log "$mode: FAIL: the daemon's second socket did not appear within 10 s"; return 1; }
        else
            daemon a 10.77.0.2 52:54:00:77:00:02 || return 1
            daemon b 10.77.0.3 52:54:00:77:00:03 || return 1
        fi
        guest a --rdma-sock "$dir/daemon-a/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:02 \
            --ip 10.77.0.2/24 --no-rxe --tap2 vurtapA --mac2 52:54:00:78:00:02 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.0.2/24 --env PAIR_OOB_MAC=52:54:00:78:00:02 \
            --env PAIR_PEER_OOB=10.78.0.3 --env PAIR_PEER_ROCE=10.77.0.3 \
            --env PAIR_PEER_MAC=52:54:00:77:00:03 "${soak_env[@]}"
        guest b --rdma-sock "$dir/daemon-b/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:03 \
            --ip 10.77.0.3/24 --no-rxe --tap2 vurtapB --mac2 52:54:00:78:00:03 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.0.3/24 --env PAIR_OOB_MAC=52:54:00:78:00:03 \
            --env PAIR_PEER_OOB=10.78.0.2 --env PAIR_PEER_ROCE=10.77.0.2 \
            --env PAIR_PEER_MAC=52:54:00:77:00:02 "${soak_env[@]}"
        ;;
    routed)
        for t in "${tools[@]}"; do steps+="${steps:+,}$t@a"; done
        routed_net || { log "$mode: FAIL: the hosts' network could not be built"; return 1; }
        VM_DAEMON_NS=$ns_a daemon a 10.91.1.2 52:54:00:77:00:02 || return 1
        VM_DAEMON_NS=$ns_b daemon b 10.91.2.2 52:54:00:77:00:03 || return 1
        # Each guest's eth0 (attached to nothing) holds its daemon's address; the peer is off
        # its subnet, through a gateway whose MAC the udp transport never uses.
        guest_ns=$ns_a guest a --rdma-sock "$dir/daemon-a/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:02 \
            --ip 10.91.1.2/24 --no-rxe --tap2 vurtapA --mac2 52:54:00:78:00:02 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.1.2/24 --env PAIR_OOB_MAC=52:54:00:78:00:02 \
            --env PAIR_OOB_GW=10.78.1.1 --env PAIR_PEER_OOB=10.78.2.2 --env PAIR_PEER_ROCE=10.91.2.2 \
            --env PAIR_GW=10.91.1.1 --env PAIR_PEER_MAC=52:54:00:91:01:01
        guest_ns=$ns_b guest b --rdma-sock "$dir/daemon-b/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:03 \
            --ip 10.91.2.2/24 --no-rxe --tap2 vurtapB --mac2 52:54:00:78:00:03 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.2.2/24 --env PAIR_OOB_MAC=52:54:00:78:00:03 \
            --env PAIR_OOB_GW=10.78.2.1 --env PAIR_PEER_OOB=10.78.1.2 --env PAIR_PEER_ROCE=10.91.1.2 \
            --env PAIR_GW=10.91.2.1 --env PAIR_PEER_MAC=52:54:00:91:02:01
        ;;
    nic)
        local nt=("${tools[@]}")
        ((nic_defaults)) && nt+=(mckey)
        for t in "${nt[@]}"; do steps+="${steps:+,}$t@a"; done
        nic_own="52:54:00:77:00:02=10.77.0.2,52:54:00:77:00:03=10.77.0.3"
        nic_daemon a 10.77.0.2 52:54:00:77:00:02 vhA || return 1
        nic_daemon b 10.77.0.3 52:54:00:77:00:03 vhB || return 1
        guest a --rdma-sock "$dir/daemon-a/rdma.sock" --net-sock "$dir/daemon-a/net.sock" --host-mtu 1500 \
            --mac 52:54:00:77:00:02 --ip 10.77.0.2/24 --no-rxe --env PAIR_DEV=vrdma0 \
            --env PAIR_OOB=10.77.0.2/24 --env PAIR_OOB_MAC=52:54:00:77:00:02 \
            --env PAIR_PEER_OOB=10.77.0.3 --env PAIR_PEER_ROCE=10.77.0.3
        guest b --rdma-sock "$dir/daemon-b/rdma.sock" --net-sock "$dir/daemon-b/net.sock" --host-mtu 1500 \
            --mac 52:54:00:77:00:03 --ip 10.77.0.3/24 --no-rxe --env PAIR_DEV=vrdma0 \
            --env PAIR_OOB=10.77.0.3/24 --env PAIR_OOB_MAC=52:54:00:77:00:03 \
            --env PAIR_PEER_OOB=10.77.0.2 --env PAIR_PEER_ROCE=10.77.0.2
        ;;
    nic-rxe)
        pair_steps dev rxe
        ((nic_defaults)) && pair_steps dev rxe mckey
        nic_own="52:54:00:77:00:02=10.77.0.2,52:54:00:77:00:04=10.77.0.4"
        nic_daemon dev 10.77.0.2 52:54:00:77:00:02 vhA || return 1
        guest dev --rdma-sock "$dir/daemon-dev/rdma.sock" --net-sock "$dir/daemon-dev/net.sock" --host-mtu 1500 \
            --mac 52:54:00:77:00:02 --ip 10.77.0.2/24 --no-rxe --env PAIR_DEV=vrdma0 \
            --env PAIR_OOB=10.77.0.2/24 --env PAIR_OOB_MAC=52:54:00:77:00:02 \
            --env PAIR_PEER_OOB=10.77.0.4 --env PAIR_PEER_ROCE=10.77.0.4
        guest rxe --tap vurtapB --mac 52:54:00:77:00:04 --ip 10.77.0.4/24 \
            --env PAIR_DEV=rxe0 --env PAIR_OOB=10.77.0.4/24 --env PAIR_OOB_MAC=52:54:00:77:00:04 \
            --env PAIR_PEER_OOB=10.77.0.2 --env PAIR_PEER_ROCE=10.77.0.2
        ;;
    rxe6)
        local t6=()
        for t in "${tools[@]}"; do
            [[ " ${gid_tools[*]} " == *" $t "* ]] && t6+=("$t")
        done
        ((${#t6[@]})) || { log "rxe6: none of the tools takes a GID index (${gid_tools[*]}): skipped"; return 0; }
        pair_steps dev rxe "${t6[@]}"
        daemon dev fd77::2 52:54:00:77:00:02 --udp-gso || return 1
        guest dev --rdma-sock "$dir/daemon-dev/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:02 \
            --ip 10.77.0.2/24 --ip6 fd77::2/64 --no-rxe --tap2 vurtapA --mac2 52:54:00:78:00:02 \
            --env PAIR_DEV=vrdma0 --env PAIR_GID6=fd77::2 --env PAIR_OOB=10.78.0.2/24 \
            --env PAIR_OOB_MAC=52:54:00:78:00:02 --env PAIR_PEER_OOB=10.78.0.4 \
            --env PAIR_PEER_ROCE=fd77::4 --env PAIR_PEER_MAC=52:54:00:77:00:04
        guest rxe --tap vurtapB --mac 52:54:00:77:00:04 --ip 10.77.0.4/24 --ip6 fd77::4/64 \
            --env PAIR_DEV=rxe0 --env PAIR_GID6=fd77::4 --env PAIR_OOB=10.78.0.4/24 \
            --env PAIR_OOB_MAC=52:54:00:77:00:04 --env PAIR_PEER_OOB=10.78.0.2 \
            --env PAIR_PEER_ROCE=fd77::2
        ;;
    rxe | rxe-io | rxe-shards | rxe-gso)
        pair_steps dev rxe
        # the device's buffers as dma-buf MRs against rxe's plain ones: in rxe's defaults
        [[ $mode == rxe ]] && ((nic_defaults)) && pair_steps dev rxe datacheck_dmabuf
        local io=()
        [[ $mode == rxe-io ]] && io=(--io-thread)
        [[ $mode == rxe-shards ]] && io=(--engine-shards 2 --shard-threads)
        [[ $mode == rxe-gso ]] && io=(--udp-gso)
        daemon dev 10.77.0.2 52:54:00:77:00:02 "${io[@]}" || return 1
        guest dev --rdma-sock "$dir/daemon-dev/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:02 \
            --ip 10.77.0.2/24 --no-rxe --tap2 vurtapA --mac2 52:54:00:78:00:02 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.0.2/24 --env PAIR_OOB_MAC=52:54:00:78:00:02 \
            --env PAIR_PEER_OOB=10.78.0.4 --env PAIR_PEER_ROCE=10.77.0.4 \
            --env PAIR_PEER_MAC=52:54:00:77:00:04
        guest rxe --tap vurtapB --mac 52:54:00:77:00:04 --ip 10.77.0.4/24 \
            --env PAIR_DEV=rxe0 --env PAIR_OOB=10.78.0.4/24 --env PAIR_OOB_MAC=52:54:00:77:00:04 \
            --env PAIR_PEER_OOB=10.78.0.2 --env PAIR_PEER_ROCE=10.77.0.2
        ;;
    esac
    # devices: the daemons' RoCE crosses the namespace's loopback; tap it (docs/tap.md) and
    # hold the capture against the daemons' own counters afterwards.
    tap_pid=''
    local tap=${VUR_PAIR_TAP:-1}
    if [[ $mode == devices && $tap == 1 && " ${VUR_DAEMON_ARGS:-} " == *" --udp-gso "* ]]; then
        # A GSO run crosses lo as one frame, which the tap sees once (docs/tap.md): its
        # frame count could not match the daemons' packet count.
        log "$mode: no tap on lo: the daemons run with --udp-gso (VUR_DAEMON_ARGS)"
        tap=0
    fi
    if [[ $mode == devices && $tap == 1 ]]; then
        "$daemon" tap --iface lo --write "$dir/lo.pcapng" --snaplen 96 2>"$dir/tap.err" &
        tap_pid=$!
        pids+=("$tap_pid")
        for _ in $(seq 200); do
            grep -qs '^tap: attached' "$dir/tap.err" && break
            kill -0 "$tap_pid" 2>/dev/null || break
            sleep 0.1
        done
        grep -qs '^tap: attached' "$dir/tap.err" ||
            { cat "$dir/tap.err"; log "$mode: FAIL: the tap on lo did not attach within 20 s"; return 1; }
    fi
    # nic: every RoCE frame and ICMP message on the bridge, for nic_check afterwards; rxe: the
    # same, for sport_check; routed: on the router's link to host A, for sport_check
    cap_pid=''
    if [[ $mode == nic* || $mode == routed || $mode == rxe || -n ${VUR_PAIR_CAPTURE:-} ]]; then
        local cap_if=${VUR_BRIDGE:-vurbr0}
        [[ $mode == routed ]] && cap_if=rA
        # routed: whole CM MADs (their REQ's flow label sets the connection's port)
        local snap=128
        [[ $mode == routed || $mode == rxe || $mode == nic* ]] && snap=400
        tshark -i "$cap_if" -s "$snap" -f 'udp port 4791 or icmp' -w "$dir/bridge.pcapng" \
            >"$dir/tshark.log" 2>&1 &
        cap_pid=$!
        pids+=("$cap_pid")
        for _ in $(seq 200); do
            grep -qs '^Capturing on' "$dir/tshark.log" && break
            kill -0 "$cap_pid" 2>/dev/null || break
            sleep 0.1
        done
        grep -qs '^Capturing on' "$dir/tshark.log" ||
            { cat "$dir/tshark.log"; log "$mode: FAIL: tshark on $cap_if did not start within 20 s"; return 1; }
    fi
    log "$mode: two guests booting; steps: $steps"
    # The daemons' counters once both guests have run every tool (they are still connected).
    (
        for _ in $(seq $((guest_timeout * 10))); do
            n=$(find "$dir/share/sync" -maxdepth 1 -name 'tools-done.*' | wc -l)
            ((n >= 2)) && break
            sleep 0.1
        done
        for d in "${daemons[@]}"; do
            vm_daemon_counters "$dir/daemon-${d%%:*}/counters.sock" >"$dir/${d%%:*}.counters.json" 2>&1 || true
        done
        touch "$dir/share/sync/counters-read"
    ) &
    local watcher=$! sampler=''
    if [[ $mode == soak ]]; then
        soak_sample "$dir" &
        sampler=$!
        pids+=("$sampler")
    fi
    wait "${vm_pids[@]}" || true
    if [[ -n $sampler ]]; then
        kill "$sampler" 2>/dev/null || true
        wait "$sampler" 2>/dev/null || true
        soak_check "$dir" || fail=1
    fi
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
    for n in "$dir"/share/*.console.log; do
        tr -d '\r' <"$n" | grep -a -E '^PAIR |^\[vur-init' || true
    done
    step_audit "$mode" || fail=1
    if [[ -n $tap_pid ]]; then
        tap_check "$mode" "$tap_pid" || fail=1
    fi
    if [[ -n $cap_pid && $mode == routed ]]; then
        sport_check "$mode" "$cap_pid" --max-len 1280 || fail=1
    elif [[ -n $cap_pid && $mode == rxe ]]; then
        sport_check "$mode" "$cap_pid" || fail=1
    elif [[ -n $cap_pid && $mode == nic* ]]; then
        nic_check "$cap_pid" || fail=1
        sport_check "$mode" "$cap_pid" --max-len 1500 || fail=1
    elif [[ -n $cap_pid ]]; then
        stop_capture "$cap_pid"
        log "$mode: capture on $cap_if kept in $dir/bridge.pcapng (VUR_PAIR_CAPTURE)"
    fi
    for n in "$dir"/*.rc; do
        local g rc
        g=$(basename "$n" .rc)
        rc=$(cat "$n")
        log "$mode: guest $g rc=$rc"
        if ((rc != 0)); then
            fail=1
            tail -n 45 "$dir/$g.run.log"
        fi
    done
    if [[ $mode == rxe-gso ]]; then
        # A GSO segment whose ICRC rxe finds wrong is dropped (rxe counts no ICRC error), and
        # what follows it arrives out of sequence and is resent: none may have been.
        local hw
        hw=$(cat "$dir/rxe.run.log" "$dir/share/rxe.console.log" 2>/dev/null |
            grep -ao 'PAIR rxe hw_counters .*' | tail -1)
        if [[ $hw != *" out_of_seq_request=0 "* || $hw != *" duplicate_request=0 "* ]]; then
            log "$mode: FAIL: rxe saw requests out of sequence or resent (a GSO segment dropped?): ${hw:-no hw_counters line}"
            fail=1
        fi
    fi
    for d in "${daemons[@]}"; do
        local g=${d%%:*} pid=${d#*:} msg
        if ! kill -0 "$pid" 2>/dev/null; then
            log "$mode: FAIL: the daemon of guest $g died"
            tail -20 "$dir/daemon-$g/daemon.log"
            fail=1
            continue
        fi
        if [[ -s $dir/$g.counters.json ]]; then
            msg=$(vm_daemon_leaks "$mode/$g" "$dir/$g.counters.json" "$(cat "$dir/share/sync/objects.$g" 2>/dev/null)") || fail=1
            log "$msg"
            if [[ $mode == same-host ]]; then
                msg=$(vm_daemon_same_host "$mode/$g" "$dir/$g.counters.json") || fail=1
            else
                msg=$(vm_daemon_traffic "$mode/$g" "$dir/$g.counters.json") || fail=1
            fi
            log "$msg"
            if [[ $mode == rxe6 || $mode == rxe-gso ]]; then
                msg=$(vm_daemon_gso "$mode/$g" "$dir/$g.counters.json") || fail=1
                log "$msg"
            fi
            if [[ $mode == rxe-io ]]; then
                msg=$(vm_daemon_io "$mode/$g" "$dir/$g.counters.json") || fail=1
                log "$msg"
            fi
            if [[ $mode == rxe-shards ]] && ! grep -q '"shard_sockets"' "$dir/$g.counters.json"; then
                log "$mode/$g: FAIL: the daemon's counters show no shard sockets (--shard-threads)"
                fail=1
            fi
        else
            log "$mode: FAIL: no counters from the daemon of guest $g (its guest did not reach the end)"
            fail=1
        fi
    done
    # Stopped once every device was looked at (in same-host mode both are one process).
    for d in "${daemons[@]}"; do
        kill "${d#*:}" 2>/dev/null || true
        wait "${d#*:}" 2>/dev/null || true
    done
    ip addr flush dev lo scope global 2>/dev/null || true
    ip -6 addr del fd77::2/128 dev "${VUR_BRIDGE:-vurbr0}" 2>/dev/null || true
    if [[ $mode == nic* ]]; then
        ip link del vhA 2>/dev/null || true
        ip link del vhB 2>/dev/null || true
    fi
    [[ $mode == routed ]] && routed_net_down
    return "$fail"
}

# step_audit MODE: every step of $steps ran, on both guests, the command it meant, as their
# consoles show it ("== step I TOOL ROLE: CMD", its output's last lines, "PAIR G STEP I ..."):
# the libibverbs examples with -c and no "invalid data" in their output; datacheck with
# "DATACHECK ok transport=T role=ROLE" for rc, uc, ud and srq and its "DATACHECK done" line.
# The soak shows the first round's steps only (later rounds print failures alone).
step_audit() {
    local mode=$1 out rc=0 seen nbad
    out=$(python3 - "$steps" "$dir/share" <<'PY'
import glob, os, re, sys
steps = [s.split("@") for s in sys.argv[1].split(",")]
bad, seen = [], 0
for path in sorted(glob.glob(os.path.join(sys.argv[2], "*.console.log"))):
    me = os.path.basename(path)[: -len(".console.log")]
    text = open(path, "rb").read().decode("utf-8", "replace").replace("\r", "")
    blocks = {}
    cur = None
    for line in text.split("\n"):
        m = re.match(r"== step (\d+) (\S+) (server|client): (.*)$", line)
        if m:
            cur = int(m[1])
            if cur in blocks:
                bad.append(f"{me}: step {cur} shown twice")
            blocks[cur] = {"tool": m[2], "role": m[3], "cmd": m[4], "out": []}
            continue
        if cur is not None and re.match(rf"PAIR {re.escape(me)} STEP {cur} ", line):
            blocks[cur]["end"] = line
            cur = None
        elif cur is not None:
            blocks[cur]["out"].append(line)
    for i, (tool, srv) in enumerate(steps):
        role = "server" if srv == me else "client"
        b = blocks.get(i)
        if b is None or "end" not in b:
            bad.append(f"{me}: step {i} ({tool} {role}) is missing from the console")
            continue
        seen += 1
        if (b["tool"], b["role"]) != (tool, role):
            bad.append(f"{me}: step {i} ran {b['tool']} {b['role']}, not {tool} {role}")
            continue
        argv = b["cmd"].split()
        out = "\n".join(b["out"])
        if tool in ("rc", "uc", "ud", "srq"):
            if argv[0] != f"ibv_{tool}_pingpong" or "-c" not in argv:
                bad.append(f"{me}: step {i} {tool} {role}: the command lacks -c: {b['cmd']}")
            if "invalid data" in out:
                bad.append(f"{me}: step {i} {tool} {role}: 'invalid data' in its output")
        if tool in ("datacheck", "datacheck_dmabuf"):
            if "vur-datacheck.py" not in b["cmd"] or "-d" not in argv or "-g" not in argv:
                bad.append(f"{me}: step {i} {tool} {role}: not vur-datacheck.py -d DEV -g GID: {b['cmd']}")
            # datacheck_dmabuf: a virtio-rdma side's buffers are dma-buf MRs (an rxe side's not)
            dev = argv[argv.index("-d") + 1] if "-d" in argv[:-1] else ""
            mem = "dmabuf" if tool == "datacheck_dmabuf" and dev.startswith("vrdma") else "mr"
            for t in ("rc", "uc", "ud", "srq"):
                if not re.search(rf"^DATACHECK ok transport={t} role={role} dev=\S+ mem={mem} ", out, re.M):
                    bad.append(f"{me}: step {i} {tool} {role}: no 'DATACHECK ok transport={t} role={role} dev=... mem={mem}' line")
            if not re.search(rf"^DATACHECK done role={role} ", out, re.M):
                bad.append(f"{me}: step {i} {tool} {role}: no 'DATACHECK done' line")
for b in bad:
    print(b)
print(f"{seen} {len(bad)}")
sys.exit(1 if bad else 0)
PY
    ) || rc=$?
    echo "$out" | sed '$d' | sed "s/^/  $mode: FAIL: /"
    read -r seen nbad <<<"$(echo "$out" | tail -1)"
    if ((rc != 0)); then
        log "$mode: FAIL: the steps' commands and outputs (${nbad:-?} problems above, $seen steps seen)"
        return 1
    fi
    log "$mode: every step ran its command on both guests ($seen step runs; pingpongs with -c, datacheck's four transports ok)"
}

# nic_check PID: stop the capture on the bridge; every RoCE frame on it must come from one of
# the guests with its own MAC and address ($nic_own: MAC=IP,...), and no ICMP port
# unreachable may answer UDP 4791 (RoCE reaching a guest's IP stack would).
nic_check() {
    local pid=$1 out roce bad unreach
    stop_capture "$pid"
    local prog
    prog=$(
        cat <<'PY'
import sys
own = dict(p.split("=") for p in sys.argv[1].split(","))
roce = bad = unreach = 0
for line in sys.stdin:
    src, ip, dport, itype, icode, ports = (line.rstrip("\n").split("\t") + [""] * 6)[:6]
    # the outermost headers: tshark may decode a payload as more (its EoIB heuristic found an
    # Ethernet header in one RDMA payload: "52:54:00:77:00:02,f5:2f:fb:c6:01:06")
    src, ip, dport = src.split(",")[0], ip.split(",")[0], dport.split(",")[0]
    if dport == "4791":
        roce += 1
        if own.get(src) != ip:
            bad += 1
            if bad <= 3:
                print("  foreign RoCE frame:", src, ip)
    if itype.split(",")[0] == "3" and icode.split(",")[0] == "3" and "4791" in ports:
        unreach += 1
print(f"{roce} {bad} {unreach}")
PY
    )
    out=$(tshark -n -r "$dir/bridge.pcapng" -T fields -e eth.src -e ip.src -e udp.dstport \
        -e icmp.type -e icmp.code -e udp.port 2>/dev/null | python3 -c "$prog" "$nic_own") ||
        { log "nic: FAIL: the capture on the bridge is unreadable"; return 1; }
    echo "$out" | sed '$d'
    read -r roce bad unreach <<<"$(echo "$out" | tail -1)"
    log "nic: bridge capture: $roce RoCE frames, $bad not from a guest's own MAC and address, $unreach ICMP port unreachable for UDP 4791"
    ((roce > 0 && bad == 0 && unreach == 0)) || { log "nic: FAIL: the bridge capture"; return 1; }
    # QEMU's host_mtu=1500 reached each daemon (NET_SET_MTU, checked against its veth's MTU)
    local d m
    for d in "${daemons[@]}"; do
        m=$(vm_daemon_counters "$dir/daemon-${d%%:*}/counters.sock" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["net"]["mtu"])' 2>/dev/null) || m='?'
        [[ $m == 1500 ]] || { log "nic: FAIL: daemon ${d%%:*}: net.mtu is $m, not the guest's host_mtu 1500"; return 1; }
    done
    log "nic: every daemon got the guest's MTU from QEMU (NET_SET_MTU 1500)"
}

# stop_capture PID: stop tshark and wait for it to close its file.
stop_capture() {
    kill -INT "$1" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$1" 2>/dev/null && kill -9 "$1"
    wait "$1" 2>/dev/null || true
}

# sport_check MODE PID [--max-len N]: stop the capture (if still running), then every RoCE packet in it must have
# come from the UDP source port Linux rxe gives its QP (tests/vm/sport-check.py: UD from the
# hash of its source QPN; RC/UC the same port both ways, that of their two QPNs unless rdma_cm
# gave the connection a flow label, which against rxe shows that rxe picked the same port), and
# none from 4791, fragmented, longer than N, or quoted by an ICMP error. The daemons never
# fell back to their bound port (tx_sport_fallback).
sport_check() {
    local mode=$1 out d fb
    stop_capture "$2"
    shift 2
    out=$(python3 "$here/sport-check.py" "$dir/bridge.pcapng" "$@")
    local rc=$?
    echo "$out" | sed '$d'
    local roce flows by_qpns by_cm nports nbad long frags icmp_roce icmp_other
    read -r roce flows by_qpns by_cm nports nbad long frags icmp_roce icmp_other <<<"$(echo "$out" | tail -1)"
    log "$mode: capture: $roce RoCE packets; $flows RC/UC flows from $nports source ports: $by_qpns on their QPNs' port, $by_cm on their rdma_cm flow label's (both ways); $nbad wrong; ${long:-?} too long, ${frags:-?} fragments, ${icmp_roce:-?} ICMP errors for RoCE, ${icmp_other:-?} ICMP messages about other traffic"
    ((rc == 0)) || { log "$mode: FAIL: the source ports in the capture (tests/vm/sport-check.py)"; return 1; }
    for d in "${daemons[@]}"; do
        fb=$(vm_daemon_counters "$dir/daemon-${d%%:*}/counters.sock" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["transport"]["tx_sport_fallback"])' 2>/dev/null) || fb='?'
        [[ $fb == 0 ]] || { log "$mode: FAIL: daemon ${d%%:*}: tx_sport_fallback is $fb"; return 1; }
    done
}

# tap_check MODE PID: stop the tap on lo; every packet the daemons sent must be in the capture
# once as egress (written + lost to a full ring), and decode as RoCE. Reads the daemons'
# counters again: they outlive the guests.
tap_check() {
    local mode=$1 pid=$2 tx=0 d n egress total roce lost
    kill -INT "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; log "$mode: FAIL: the tap still ran 10 s after SIGINT"; return 1; }
    wait "$pid" || { cat "$dir/tap.err"; log "$mode: FAIL: the tap failed"; return 1; }
    for d in "${daemons[@]}"; do
        n=$(vm_daemon_counters "$dir/daemon-${d%%:*}/counters.sock" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["transport"]["tx_packets"])') ||
            { log "$mode: FAIL: no counters from daemon ${d%%:*} after the run"; return 1; }
        tx=$((tx + n))
    done
    total=$(tshark -n -r "$dir/lo.pcapng" -T fields -e frame.number 2>/dev/null | wc -l)
    egress=$(tshark -n -r "$dir/lo.pcapng" -Y 'frame.interface_id == 1' -T fields -e frame.number 2>/dev/null | wc -l)
    roce=$(tshark -n -r "$dir/lo.pcapng" -Y infiniband -T fields -e frame.number 2>/dev/null | wc -l)
    lost=$(sed -n 's/.* \([0-9][0-9]*\) lost to a full ring buffer.*/\1/p' "$dir/tap.err" | tail -1)
    log "$mode: tap on lo: $total frames ($egress egress, $roce decode as RoCE), ${lost:-?} lost to a full ring; the daemons sent $tx"
    grep '^tap: done' "$dir/tap.err" | sed "s/^/  /"
    ((roce == total && egress + ${lost:-0} == tx && egress > 0)) ||
        { log "$mode: FAIL: the capture does not hold what the daemons sent"; return 1; }
}

# soak_drop: drop every $drop_every-th RC packet (BTH opcode 0x00–0x1f) to UDP 4791 as it is
# received on this namespace's loopback: a loss the sender does not see (a drop on output would
# fail its sendmsg). UC and UD traffic, and the CM's MADs on QP1, pass: their applications do
# not recover from loss. So do plain ACKs (0x11): the pingpongs end without a handshake, and
# when the last ACK of a run is lost its sender retransmits to a QP the peer has already
# destroyed and ends with RETRY_EXC_ERR, as it would on any RC fabric (every lost request is
# still answered by an ACK after its retransmission; READ responses and atomic ACKs are lost
# too).
soak_drop() {
    nft -f - <<EOF || { log "soak: FAIL: could not install the nftables drop rule"; return 1; }
table inet vur_soak {
    chain in {
        type filter hook input priority 0; policy accept;
        udp dport 4791 @th,64,3 0 @th,64,8 != 0x11 numgen inc mod $drop_every 0 counter drop
    }
}
EOF
}

# soak_dropped: how many packets the rule has dropped.
soak_dropped() {
    nft list table inet vur_soak 2>/dev/null | sed -n 's/.*counter packets \([0-9]*\) .*/\1/p'
}

# soak_heap NAME: "LIVE-BYTES LIVE-BLOCKS" of daemon NAME's heap, from its counters socket.
soak_heap() {
    vm_daemon_counters "$dir/daemon-$1/counters.sock" | python3 -c 'import json,sys
h = json.load(sys.stdin).get("heap", {})
print(h.get("live_bytes", -1), h.get("live_blocks", -1))' 2>/dev/null || echo "-1 -1"
}

# soak_sample DIR: from the guests' first round on, sample every daemon's RssAnon (KiB) and fd
# count every 2 s into DIR/NAME.samples ("SECONDS RSSANON FDS"), and, whenever the guests say
# that nothing runs (quiet.R, before round R), its RssAnon and live heap into DIR/NAME.quiet
# ("ROUND SECONDS RSSANON VMDATA HEAP-BYTES HEAP-BLOCKS") before letting them go on (sampled.R).
# Creates the guests' stop file after $soak_secs and five quiet points (rounds 0–4: on a slow
# machine a round takes minutes, and the check wants three points after its warm-up); ends
# when both guests are done.
# soak_fds NAME PID: the daemon's open fds, less the sockets of its QPs' source ports (they
# open and close with the QPs: transport.tx_sport_open), read between two readings of that
# count that agree (a socket opened or closed meanwhile would make the sample off by one;
# each reading's connection is closed before the fds are counted).
soak_fds() {
    local n a b i
    sport_open() {
        vm_daemon_counters "$dir/daemon-$1/counters.sock" 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["transport"]["tx_sport_open"])' 2>/dev/null || echo 0
    }
    for i in 1 2 3 4 5; do
        a=$(sport_open "$1")
        n=$(find "/proc/$2/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        b=$(sport_open "$1")
        [[ $a == "$b" ]] && break
    done
    echo $((n - b))
}

soak_sample() {
    # Stop once the time is up and five quiet points are in.
    soak_stop_if_due() {
        if ((t >= soak_secs && r >= 5)) && [[ ! -e $sync/stop ]]; then
            touch "$sync/stop"
            log "soak: $t s, $r quiet points: stop after this round; $(soak_dropped) RC packets dropped so far"
        fi
    }
    local dir=$1 sync=$1/share/sync t0 t d name pid r=0 next=0
    for _ in $(seq 6000); do [[ -e $sync/quiet.0 ]] && break; sleep 0.1; done
    [[ -e $sync/quiet.0 ]] || return 0
    t0=$SECONDS
    log "soak: traffic starts; $soak_secs s, every ${drop_every}th RC packet dropped"
    while :; do
        t=$((SECONDS - t0))
        if [[ -e $sync/quiet.$r ]]; then
            for d in "${daemons[@]}"; do
                name=${d%%:*} pid=${d#*:}
                echo "$r $t $(awk '/^RssAnon:/{r = $2} /^VmData:/{d = $2} END {print r, d}' "/proc/$pid/status" 2>/dev/null) $(soak_heap "$name")" >>"$dir/$name.quiet"
            done
            r=$((r + 1))
            # Decided before the guests go on, so that the round after this point is the
            # last when the soak is due.
            soak_stop_if_due
            touch "$sync/sampled.$((r - 1))"
        fi
        if ((t >= next)); then
            next=$((t + 2))
            for d in "${daemons[@]}"; do
                name=${d%%:*} pid=${d#*:}
                echo "$t $(awk '/^RssAnon:/{print $2}' "/proc/$pid/status" 2>/dev/null) $(soak_fds "$name" "$pid")" >>"$dir/$name.samples"
            done
        fi
        soak_stop_if_due
        (($(find "$sync" -maxdepth 1 -name 'tools-done.*' | wc -l) >= 2)) && break
        sleep 0.1
    done
}

# soak_check DIR: after the warm-up (the first round and a third of the others), at the quiet
# points (least-squares fits over them):
# - the daemons' live heap (what they hold: a leak) grows by at most 1 KiB a minute (at least
#   4 KiB over the run) unless all but 1 KiB of that is one step (one buffer reaching a new
#   high-water mark), their fd count (less the source-port sockets open, soak_fds) by at most
#   0.5 a minute;
# - their VmData (what the allocator has mapped: its high-water mark, as glibc never unmaps a
#   thread arena's pages) by at most 4 KiB a minute, and at least 128 KiB: with real guests
#   the allocator's free chunks fragment while the tools' objects come and go, and the
#   arena's top creeps for minutes before it levels off (docs/daemon.md, "Memory"); in runs
#   of ten minutes or more, the second half must be within 4 KiB a minute (levelled off).
# RssAnon is reported: it moves inside VmData as the allocator reuses and gives back freed
# pages. The drop rule really dropped; the guests ran at least two rounds.
soak_check() {
    local dir=$1 d name rc=0 dropped rounds
    for d in "${daemons[@]}"; do
        name=${d%%:*}
        python3 - "$name" "$dir/$name.quiet" "$dir/$name.samples" <<'PY' || rc=1
import sys
name, quiet, periodic = sys.argv[1], sys.argv[2], sys.argv[3]
q = [list(map(float, l.split())) for l in open(quiet) if l.strip()]
p = [list(map(float, l.split())) for l in open(periodic) if l.strip()]
def fit(pts):
    """least-squares slope per minute and the window in minutes of (seconds, value) points"""
    n = len(pts)
    xs = [x / 60 for x, _ in pts]
    ys = [y for _, y in pts]
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den, xs[-1] - xs[0]
# the warm-up: the first round and the first third of the others (the first rounds reach the
# heap's high-water marks: the largest QPs, MRs and page lists the tools make)
q = [r for r in q if r[0] >= 1]
q = q[len(q) // 3:]
if len(q) < 3 or min(r[4] for r in q) < 0:
    print(f"soak: FAIL: daemon {name}: {len(q)} quiet points after the warm-up, or no heap counters")
    sys.exit(1)
warm = q[0][1]
p = [r for r in p if r[0] >= warm]
fail = []
hs, win = fit([(r[1], r[4]) for r in q])
ds, _ = fit([(r[1], r[3]) for r in q])
rs, _ = fit([(r[1], r[2]) for r in q])
fs, _ = fit([(r[0], r[2]) for r in p]) if len(p) >= 2 else (0.0, 0.0)
heap_ok = max(1024 * win, 4096)
# A leak grows round after round; a buffer that reaches a new high-water mark once (a
# reallocation: the block count stays) is one step, not a leak. So the growth beyond the
# largest single step must be more than 1 KiB too.
grew = [max(0.0, y[4] - x[4]) for x, y in zip(q, q[1:])]
beyond_step = sum(grew) - max(grew, default=0.0)
data_ok = max(4 * win, 128)
half = q[len(q) // 2:]
ds2, win2 = fit([(r[1], r[3]) for r in half]) if len(half) >= 3 else (0.0, 0.0)
print(f"soak: daemon {name}: {len(q)} quiet points over {win:.1f} min after a {warm:.0f} s warm-up: "
      f"live heap {q[0][4]:.0f} -> {q[-1][4]:.0f} bytes in {q[0][5]:.0f} -> {q[-1][5]:.0f} blocks, "
      f"slope {hs:+.0f} bytes/min ({hs * win:.0f} fitted, {heap_ok:.0f} allowed), {beyond_step:.0f} beyond its largest step; "
      f"VmData {q[0][3]:.0f} -> {q[-1][3]:.0f} KiB, slope {ds:+.1f} KiB/min ({ds * win:.0f} fitted, "
      f"{data_ok:.0f} allowed), second half {ds2:+.1f} KiB/min over {win2:.1f} min; "
      f"RssAnon {q[0][2]:.0f} -> {q[-1][2]:.0f} KiB, slope {rs:+.1f} KiB/min; "
      f"fds {p[0][2]:.0f} -> {p[-1][2]:.0f}, slope {fs:+.2f}/min")
if hs * win > heap_ok and beyond_step > 1024:
    fail.append("live heap grows")
if ds * win > data_ok:
    fail.append("VmData grows")
if win >= 10 and ds2 > 4:
    fail.append("VmData has not levelled off")
if fs > 0.5:
    fail.append("fd count grows")
if fail:
    print(f"soak: FAIL: daemon {name}: " + ", ".join(fail))
    sys.exit(1)
PY
    done
    dropped=$(soak_dropped)
    rounds=$(find "$dir/share/sync" -maxdepth 1 -name 'round.*' | wc -l)
    log "soak: $((rounds - 1)) rounds of ${#tools[@]} tools; ${dropped:-?} RC packets dropped and recovered from"
    ((${dropped:-0} > 0)) || { log "soak: FAIL: no packet was dropped: the loss was not real"; rc=1; }
    ((rounds >= 3)) || { log "soak: FAIL: fewer than two rounds"; rc=1; }
    return "$rc"
}

failed=()
passes=()
for m in "${modes[@]}"; do
    p=0
    for ((r = 1; r <= repeat; r++)); do
        run_tag=''
        ((repeat > 1)) && run_tag=.$r
        t0=$SECONDS
        if run_mode "$m"; then
            # the tools of the steps that ran (a mode may add its own)
            ran=$(tr ',' '\n' <<<"$steps" | sed 's/@.*//' | awk '!seen[$0]++' | paste -sd' ')
            log "$m$run_tag: PASS ($ran) in $((SECONDS - t0)) s"
            p=$((p + 1))
        else
            log "$m$run_tag: FAIL in $((SECONDS - t0)) s (logs: $work/$m$run_tag)"
            failed+=("$m$run_tag")
        fi
    done
    passes+=("$m $p/$repeat")
done
if ((repeat > 1)); then
    log "pass count per mode ($repeat repetitions):"
    for p in "${passes[@]}"; do log "  $p"; done
fi
if ((${#failed[@]})); then
    log "FAIL: ${failed[*]} in $((SECONDS - t_start)) s"
    exit 1
fi
log "PASS: ${modes[*]} in $((SECONDS - t_start)) s"
