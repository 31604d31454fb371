#!/bin/bash
# Guest side of tests/vm/guest-pair.test.sh: two guests step through the same list of tools in
# lock step, synchronised through files in the shared 9p directory (/vur/sync). Each step names
# the guest that runs the tool's server; the other runs its client against the server's eth1
# (out-of-band) address. RDMA traffic goes through each guest's own RDMA device.
# Env (run-vm.sh --env):
#   PAIR_DEV        this guest's RDMA device (vrdma0 or rxe0)
#   PAIR_OOB        this guest's out-of-band address A/N, put on the NIC with MAC PAIR_OOB_MAC
#   PAIR_PEER_OOB   the other guest's out-of-band address (clients connect to it)
#   PAIR_PEER_ROCE  the other guest's RoCE address (rping)
#   PAIR_GID6       when set, the IPv6 address whose RoCE v2 GID the tools use (default: the
#                   IPv4 GID of eth0's address)
#   PAIR_PEER_MAC   when set, a permanent neighbour entry PAIR_PEER_ROCE → this MAC on eth0:
#                   a virtio-rdma guest's eth0 is attached to nothing, and rdma_cm resolves
#                   the peer's address through it (the udp transport ignores the MAC)
#   PAIR_GW         when set, the other guest's RoCE address is reached through this gateway
#                   on eth0 (hosts with a router between them): a route to PAIR_PEER_ROCE via
#                   it, and the permanent neighbour entry (PAIR_PEER_MAC) is the gateway's
#   PAIR_OOB_GW     when set, the other guest's out-of-band address is reached through this
#                   gateway on the out-of-band NIC
#   PAIR_STEPS      comma-separated TOOL@GUEST (GUEST: the VUR_NAME running the server)
#   PAIR_ITERS      iterations per tool (default 200)
#   PAIR_DC_MSGS    datacheck: messages per operation and direction (default 48)
#   PAIR_MTU        path MTU for perftest and the pingpongs (default 1024)
#   PAIR_ACK_TIMEOUT perftest's ACK timeout exponent -u (default 20: 4 s)
#   PAIR_SOAK       when set, run the steps round after round until the host creates
#                   /vur/sync/stop (tests/vm/soak.test.sh)
set -uo pipefail

# Runs only inside a test guest (booted by tests/vm/run-vm.sh, whose kernel command line names
# it): the addresses and neighbour entries below are the guest's own, on NICs whose host ends
# are taps on a bridge in the test's network namespace. Never on a host.
grep -qw 'vur\.name=[^ ]*' /proc/cmdline 2>/dev/null && [[ -n ${VUR_NAME:-} ]] ||
    { echo "pair-guest.sh: not a test guest (no vur.name= on the kernel command line); refusing to configure addresses" >&2; exit 2; }

me=$VUR_NAME
here=$(cd "$(dirname "$0")" && pwd)
dev=${PAIR_DEV:?}
iters=${PAIR_ITERS:-200}
mtu=${PAIR_MTU:-1024}
ack_to=${PAIR_ACK_TIMEOUT:-20}
sync=/vur/sync
mkdir -p "$sync"
say() { echo "PAIR $me $*"; }

# The out-of-band NIC: found by MAC (it may be eth0 or eth1). It must not answer ARP for the
# RoCE address on eth0: that address lives on the host, with the daemon (arp_ignore=1).
oob_if=''
for n in /sys/class/net/*; do
    [[ $(cat "$n/address") == "${PAIR_OOB_MAC,,}" ]] && oob_if=${n##*/}
done
[[ -n $oob_if ]] || { say "FAIL no NIC with MAC $PAIR_OOB_MAC"; exit 1; }
ip link set "$oob_if" up
ip addr add "$PAIR_OOB" dev "$oob_if" 2>/dev/null || true
sysctl -q -w "net.ipv4.conf.$oob_if.arp_ignore=1"
# Multicast leaves through eth0 (the guests have no default route; rxe looks one up for every
# datagram to a group)
ip route replace 224.0.0.0/4 dev eth0 2>/dev/null || true
if [[ -n ${PAIR_GW:-} ]]; then
    ip route replace "$PAIR_PEER_ROCE" via "$PAIR_GW" dev eth0
    ip neigh replace "$PAIR_GW" lladdr "${PAIR_PEER_MAC:?PAIR_GW needs PAIR_PEER_MAC}" dev eth0 nud permanent
elif [[ -n ${PAIR_PEER_MAC:-} ]]; then
    ip neigh replace "$PAIR_PEER_ROCE" lladdr "$PAIR_PEER_MAC" dev eth0 nud permanent
fi
if [[ -n ${PAIR_OOB_GW:-} ]]; then
    ip route replace "$PAIR_PEER_OOB" via "$PAIR_OOB_GW" dev "$oob_if"
fi

# The GID index of this guest's RoCE address (eth0's; not the out-of-band one, which rxe0
# may list too when both are on one NIC).
if [[ -n ${PAIR_GID6:-} ]]; then
    want=$(python3 -c 'import ipaddress, sys; print(ipaddress.IPv6Address(sys.argv[1]).exploded)' "$PAIR_GID6")
else
    IFS=. read -r a b c d <<<"$VUR_ADDR"
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
fi
gid=''
for _ in $(seq 100); do
    gid=$(cd "/sys/class/infiniband/$dev/ports/1/gids" && grep -lx "$want" -- * 2>/dev/null |
        while read -r g; do
            [[ $(cat "../gid_attrs/types/$g" 2>/dev/null) == "RoCE v2" ]] && echo "$g" && break
        done)
    [[ -n $gid ]] && break
    sleep 0.1
done
[[ -n $gid ]] || { say "FAIL no RoCE v2 GID for ${PAIR_GID6:-$VUR_ADDR} on $dev within 10 s"; exit 1; }
say "dev=$dev gid-index=$gid gid=$(cat "/sys/class/infiniband/$dev/ports/1/gids/$gid") oob=$oob_if:$PAIR_OOB"

wait_file() { # wait_file PATH SECONDS WHAT
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ -e $1 ]] && return 0
        sleep 0.1
    done
    say "timeout after $2 s waiting for $3"
    return 1
}

listening() { # a TCP listener (pingpongs, perftest), an RDMA CM listener (rping), or (an
    # address: mckey) a CM ID bound to that multicast group
    # (Read whole, then matched: under pipefail a pipeline fails when any part does — a grep
    # that finds no CM ID, a writer cut off by grep -q — and a listener would go unseen.)
    local l
    if [[ $1 == *.* ]]; then
        l=$(rdma resource show cm_id 2>/dev/null) || true
        grep -qF "dst-addr $1:" <<<"$l"
        return
    fi
    # (a CM ID only once it listens: one merely bound to the port rejects a connection that
    # comes before its rdma_listen, and the client fails with REJECTED, invalid service ID.
    # Only a CM ID on a device ("link DEV/PORT") takes a connection, so only those count.
    # The REJECTED failures of ib_send_lat -R were not this but perftest's own race: see
    # send_lat_cm in tool_cmds)
    l=$(ss -ltn; rdma resource show cm_id 2>/dev/null | grep -w LISTEN | grep -w link) || true
    grep -qE ":$1( |$)" <<<"$l"
}

# tool_cmds TOOL PORT: "LISTEN-PORT|SERVER-COMMAND|CLIENT-COMMAND". The client command is the
# server's plus the server's out-of-band address when empty; @SELF@ is this guest's RoCE
# address, @PEER@ the other guest's (the rdma_cm tools connect to it).
tool_cmds() {
    local p=$2
    case $1 in
    # the libibverbs examples: a compatibility smoke. -c (--chk) makes their server look at
    # byte 0 of each page and print "invalid data in page N", exit code 0: run_step fails
    # such a step. The data check is datacheck's.
    rc | uc | srq) echo "$p|ibv_$1_pingpong -d $dev -g $gid -n $iters -m $mtu -p $p -c|" ;;
    ud) echo "$p|ibv_ud_pingpong -d $dev -g $gid -n $iters -s $((mtu < 2048 ? mtu : 2048)) -p $p -c|" ;;
    # every byte of SEND, WRITE (with and without immediate) and READ on RC, SEND and WRITE on
    # UC, SEND on UD and through an SRQ, both ways, checked (tests/vm/vur-datacheck.py, shipped
    # beside this script); one "DATACHECK ok transport=T" line per transport
    datacheck) echo "$p|python3 $here/vur-datacheck.py -d $dev -g $gid -m $mtu -u $ack_to -n ${PAIR_DC_MSGS:-48} -p $p|" ;;
    # the same with every buffer of a virtio-rdma side a dma-buf MR (udmabuf, ibv_reg_dmabuf_mr);
    # Linux rxe cannot register one, so an rxe side keeps plain MRs
    datacheck_dmabuf)
        local dm=''
        [[ $dev == vrdma* ]] && dm=' --dmabuf'
        echo "$p|python3 $here/vur-datacheck.py -d $dev -g $gid -m $mtu -u $ack_to -n ${PAIR_DC_MSGS:-48}$dm -p $p|"
        ;;
    # -u 20 (PAIR_ACK_TIMEOUT's default): a 4 s ACK timeout (perftest's default is 67 ms):
    # under TCG a busy guest misses 67 ms often, and a retransmitting rxe 6.12 requester can
    # hang on its completer bug (docs/interop.md). Two devices retransmit in their daemons,
    # on the host: the soak, which drops packets, runs them with -u 14.
    send_lat | write_lat) echo "$p|ib_$1 -d $dev -x $gid -F -m $mtu -u $ack_to -n $iters -s 64 -p $p|" ;;
    send_bw | write_bw | read_bw) echo "$p|ib_$1 -d $dev -x $gid -F -m $mtu -u $ack_to -n $iters -s 65536 -p $p|" ;;
    atomic_bw) echo "$p|ib_atomic_bw -d $dev -x $gid -F -m $mtu -u $ack_to -n $iters -p $p|" ;;
    # rdma_cm: addresses resolved through eth0, connections set up by the CM over QP1
    rping) echo "$p|rping -s -a @SELF@ -p $p -C 20 -S 1000 -v|rping -c -a @PEER@ -p $p -C 20 -S 1000 -v -V" ;;
    ucmatose) echo "7471|ucmatose -b @SELF@ -c 2 -C 20|ucmatose -s @PEER@ -c 2 -C 20" ;;
    udaddy) echo "7174|udaddy -b @SELF@ -C 20|udaddy -s @PEER@ -C 20" ;;
    rdma_server) echo "$p|rdma_server -s @SELF@ -p $p|rdma_client -s @PEER@ -p $p" ;;
    # perftest over an rdma_cm connection (-z: its setup data cross an RC QP the CM
    # connected). Not -R: that mode listens twice on the port, and after a handshake the
    # client connects its data QPs at once while the server is still making its second
    # listener; the client that loses the race gets REJECTED (invalid service ID) and dies
    # on its error path (an uninitialised message pointer in create_rdma_cm_connection,
    # perftest_communication.c). Slower servers (a TCG guest) lose it now and then.
    send_lat_cm) echo "$p|ib_send_lat -d $dev -z -F -n $iters -s 64 -p $p|ib_send_lat -d $dev -z -F -n $iters -s 64 -p $p @PEER@" ;;
    # NVMe over RDMA: kernel verbs end to end (nvmet-rdma target, nvme-rdma host)
    nvme) echo "4420|nvme_target|nvme_host @PEER@" ;;
    # UD multicast through rdma_cm: the server joins 239.77.0.1 and receives 20 datagrams the
    # client sends to the group (IGMP from the guests' own stacks)
    mckey) echo "239.77.0.1|mckey_run -m 239.77.0.1 -b @SELF@ -C 20|mckey_run -m 239.77.0.1 -b @SELF@ -s -C 20" ;;
    # IP between the guests' out-of-band NICs (eth0 itself where the daemon is the NIC): ping,
    # then 16 MiB over TCP checked end to end
    tcp) echo "$p|tcp_server $p|tcp_client $PAIR_PEER_OOB $p" ;;
    *) return 1 ;;
    esac
}

# nvme_target: a 64 MiB file-backed namespace exported over RDMA on this guest's RoCE address;
# stays up until the client of step $STEP is done, then comes down cleanly.
nvme_target() {
    local c=/sys/kernel/config/nvmet s
    modprobe nvmet-rdma || return 1
    mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config || return 1
    s=$c/subsystems/vur-nvme
    truncate -s 64M /tmp/nvme.img
    mkdir "$s" && echo 1 >"$s/attr_allow_any_host" && mkdir "$s/namespaces/1" &&
        echo /tmp/nvme.img >"$s/namespaces/1/device_path" &&
        echo 1 >"$s/namespaces/1/buffered_io" && echo 1 >"$s/namespaces/1/enable" &&
        mkdir "$c/ports/1" && echo rdma >"$c/ports/1/addr_trtype" &&
        echo ipv4 >"$c/ports/1/addr_adrfam" && echo "$VUR_ADDR" >"$c/ports/1/addr_traddr" &&
        echo 4420 >"$c/ports/1/addr_trsvcid" && ln -s "$s" "$c/ports/1/subsystems/vur-nvme" ||
        { echo "nvmet configuration failed"; return 1; }
    echo "nvmet: vur-nvme on rdma $VUR_ADDR:4420"
    until [[ -e $sync/$STEP.client.done ]]; do sleep 0.2; done
    rm "$c/ports/1/subsystems/vur-nvme" && rmdir "$c/ports/1" "$s/namespaces/1" "$s" ||
        { echo "nvmet teardown failed"; return 1; }
    echo "nvmet: torn down"
}

# nvme_host ADDR: connect over RDMA, write 16 MiB of random data with O_DIRECT, read it back,
# compare, disconnect.
nvme_host() {
    local blk='' ctrl
    modprobe nvme-rdma || return 1
    echo "transport=rdma,traddr=$1,trsvcid=4420,nqn=vur-nvme" >/dev/nvme-fabrics ||
        { echo "nvme connect failed"; return 1; }
    # the controller this connect made (transport rdma), and its namespace's block device
    # (the head node nvmeXnY, a block special file: never a path that dd would create)
    for _ in $(seq 100); do
        ctrl='' blk=''
        for c in /sys/class/nvme/nvme[0-9]*; do
            [[ $(cat "$c/transport" 2>/dev/null) == rdma ]] && ctrl=${c##*/}
        done
        for b in /sys/block/nvme*; do
            [[ ${b##*/} =~ ^nvme[0-9]+n[0-9]+$ && -b /dev/${b##*/} ]] && blk=/dev/${b##*/}
        done
        [[ -n $ctrl && -n $blk ]] && break
        sleep 0.1
    done
    [[ -n $ctrl && -n $blk ]] || { echo "no rdma controller with a namespace within 10 s"; return 1; }
    echo "nvme: $blk via $ctrl ($(cat "/sys/class/nvme/$ctrl/transport") $(cat "/sys/class/nvme/$ctrl/address"))"
    head -c 16M /dev/urandom >/tmp/pattern
    dd if=/tmp/pattern of="$blk" bs=1M oflag=direct status=none &&
        dd if="$blk" of=/tmp/back bs=1M count=16 iflag=direct status=none &&
        cmp /tmp/pattern /tmp/back &&
        read -r _ _ rd _ _ _ wr _ <"/sys/block/${blk##*/}/stat" && ((rd >= 32768 && wr >= 32768)) &&
        echo "nvme: 16 MiB written and read back equal ($wr sectors written, $rd read)" ||
        { echo "nvme: data check failed"; echo 1 >"/sys/class/nvme/$ctrl/delete_controller"; return 1; }
    echo 1 >"/sys/class/nvme/$ctrl/delete_controller"
}
# tcp_server PORT: accept one connection, read until its end, answer with the SHA-256 of what
# came.
tcp_server() {
    python3 -c 'import hashlib, socket, sys
s = socket.create_server(("", int(sys.argv[1])))
c, peer = s.accept()
h, n = hashlib.sha256(), 0
while b := c.recv(1 << 16):
    h.update(b)
    n += len(b)
c.sendall(h.hexdigest().encode())
c.close()
print(f"tcp: {n} bytes from {peer[0]}")' "$1"
}

# tcp_client ADDR PORT: three pings to ADDR, then 16 MiB of random data to the server, whose
# digest must be the data's; says how long the transfer took.
tcp_client() {
    ping -c 3 -i 0.2 -W 5 "$1" || { echo "ping $1 failed"; return 1; }
    python3 -c 'import hashlib, os, socket, sys, time
data = os.urandom(16 << 20)
want = hashlib.sha256(data).hexdigest()
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
t0 = time.monotonic()
c.sendall(data)
c.shutdown(socket.SHUT_WR)
got = b"".join(iter(lambda: c.recv(256), b"")).decode()
s = time.monotonic() - t0
ok = got == want
print(f"tcp: 16 MiB in {s:.2f} s ({16 / s:.1f} MiB/s), the server digest " + ("matches" if ok else "differs: " + got))
sys.exit(0 if ok else 1)' "$1" "$2"
}
# mckey_run ARGS...: mckey, failing unless its data transfers completed (mckey itself exits 0
# after a failed join).
mckey_run() {
    local out rc=0
    out=$(mckey "$@" 2>&1) || rc=$?
    echo "$out"
    ((rc == 0)) && [[ $out == *"data transfers complete"* && $out != *ERROR* ]]
}
export -f nvme_target nvme_host tcp_server tcp_client mckey_run
export sync VUR_ADDR

# run_step I TOOL SERVER: step I (unique across rounds: it names the sync files) runs TOOL's
# server on guest SERVER and its client on the other; counts a failure in $failed.
run_step() {
    local i=$1 tool=$2 srv=$3 port cmds lport scmd ccmd rc t0 role cmd pid ms res argv
    port=$((18515 + i % 20000))
    cmds=$(tool_cmds "$tool" "$port") || { say "FAIL unknown tool $tool"; exit 1; }
    IFS='|' read -r lport scmd ccmd <<<"$cmds"
    scmd=${scmd//@SELF@/$VUR_ADDR}
    [[ -n $ccmd ]] || ccmd="$scmd $PAIR_PEER_OOB"
    ccmd=${ccmd//@PEER@/$PAIR_PEER_ROCE}
    ccmd=${ccmd//@SELF@/$VUR_ADDR}
    rc=0
    t0=${EPOCHREALTIME/./}
    if [[ $srv == "$me" ]]; then
        role=server cmd=$scmd
        read -ra argv <<<"$cmd"
        [[ $(type -t "${argv[0]}") != function ]] || argv=(bash -c "${argv[*]}")
        STEP=$i timeout 150 "${argv[@]}" >"/tmp/$i.log" 2>&1 &
        pid=$!
        # bounded by time: one look at the sockets and CM IDs takes a while under TCG, and a
        # cold first start of a tool seconds; a server not listening after 30 s is a failure
        # (its client is let go all the same, to end the step)
        until listening "$lport"; do
            (((${EPOCHREALTIME/./} - t0) / 1000000 < 30)) || { say "step $i: FAIL nothing listened on $lport within 30 s"; rc=98; break; }
            sleep 0.05
        done
        touch "$sync/$i.ready"
        # The server ends when its client does; if the client is gone and the server is still
        # waiting 20 s later, it waits for something that will not come.
        while kill -0 "$pid" 2>/dev/null; do
            if [[ -e $sync/$i.client.done ]]; then
                for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
                kill -0 "$pid" 2>/dev/null && { say "step $i: the server still ran 20 s after the client ended"; kill "$pid"; }
                break
            fi
            sleep 0.1
        done
        wait "$pid" || rc=$?
        touch "$sync/$i.server.done"
        wait_file "$sync/$i.client.done" 160 "the client of step $i" || rc=99
    else
        role=client cmd=$ccmd
        if wait_file "$sync/$i.ready" 180 "the server of step $i ($tool on $srv)"; then
            read -ra argv <<<"$cmd"
            [[ $(type -t "${argv[0]}") != function ]] || argv=(bash -c "${argv[*]}")
            STEP=$i timeout 150 "${argv[@]}" >"/tmp/$i.log" 2>&1 || rc=$?
        else
            rc=99
        fi
        touch "$sync/$i.client.done"
        wait_file "$sync/$i.server.done" 180 "the server of step $i to end" || rc=99
    fi
    ms=$(((${EPOCHREALTIME/./} - t0) / 1000))
    # a libibverbs example's --chk finding (it exits 0 after it)
    if grep -q 'invalid data' "/tmp/$i.log"; then
        echo "step $i: FAIL: $tool printed 'invalid data' (its --chk found a wrong byte)" >>"/tmp/$i.log"
        ((rc != 0)) || rc=97
    fi
    # the client's figure: perftest's t_avg (usec) or BW average (MB/s)
    res=''
    if [[ $role == client ]]; then
        case $tool in
        send_lat | write_lat | send_lat_cm) res=$(awk '/^ *64 +[0-9]+ /{print "t_avg_us=" $6; exit}' "/tmp/$i.log") ;;
        tcp) res=$(sed -n 's/.*(\([0-9.]*\) MiB\/s).*/tcp_MiBps=\1/p' "/tmp/$i.log") ;;
        *_bw) res=$(awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ /{print "bw_avg_MBps=" $4; exit}' "/tmp/$i.log") ;;
        esac
    fi
    # (the soak: the first round's, for the host's check of the commands, and failures)
    if [[ -z $soak ]] || ((round == 0 || rc != 0)); then
        echo "== step $i $tool $role: $cmd"
        grep -vE '^ *(local|remote) address: ' "/tmp/$i.log" | tail -n 12
        say "STEP $i $tool server=$srv role=$role rc=$rc wall=${ms}ms${res:+ $res}"
    fi
    rm -f "/tmp/$i.log"
    ((rc == 0)) || failed=$((failed + 1))
}

IFS=, read -ra steps <<<"${PAIR_STEPS:?}"
failed=0
# PAIR_SOAK=1: the step list again and again, until the host creates $sync/stop. The guest that
# serves the first step decides at the start of each round whether there is another, and
# writes it down for the other (round.R: go or stop); a round always runs to its end. Before
# each decision it says the devices are quiet (quiet.R) and waits for the host's sample
# (sampled.R).
soak=${PAIR_SOAK:-}
n=0 round=0 t_soak=$SECONDS
while :; do
    if [[ -n $soak ]]; then
        if [[ ${steps[0]#*@} == "$me" ]]; then
            # Nothing runs now (the last step ended on both guests): the host samples the
            # daemons' heap at this quiet point before the round starts.
            touch "$sync/quiet.$round"
            wait_file "$sync/sampled.$round" 30 "the host's sample before round $round" || true
            if [[ -e $sync/stop ]]; then echo stop; else echo go; fi >"$sync/round.$round.tmp"
            mv "$sync/round.$round.tmp" "$sync/round.$round"
        else
            wait_file "$sync/round.$round" 600 "the decision on round $round" ||
                { failed=$((failed + 1)); break; }
        fi
        [[ $(cat "$sync/round.$round") == go ]] || break
    fi
    for s in "${steps[@]}"; do
        run_step "$n" "${s%@*}" "${s#*@}"
        n=$((n + 1))
    done
    round=$((round + 1))
    [[ -n $soak ]] || break
    say "SOAK round $round done: $n steps, $failed failed, $((SECONDS - t_soak)) s"
done
# Stay up until the other guest has finished too: powering off drops this guest's device, and
# the other side may still wait for the last ACK.
touch "$sync/end.$me"
for _ in $(seq 600); do
    [[ $(find "$sync" -maxdepth 1 -name 'end.*' | wc -l) -ge 2 ]] && break
    sleep 0.1
done
# Traffic really went through this guest's device: Linux rxe counts its packets (the daemon's
# counters are read on the host).
if [[ -d /sys/class/infiniband/$dev/ports/1/hw_counters ]]; then
    hc=/sys/class/infiniband/$dev/ports/1/hw_counters
    say "hw_counters $(cd "$hc" && for f in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_seq_err ack_deferred retry_exceeded_err send_err; do [[ -f $f ]] && printf '%s=%s ' "$f" "$(cat "$f")"; done)"
    if (($(cat "$hc/sent_pkts") == 0 || $(cat "$hc/rcvd_pkts") == 0)); then
        say "FAIL $dev sent or received no packet"
        failed=$((failed + 1))
    fi
fi
# What the kernel still holds on this device (ib_mad's QP1, and e.g. ib_core's CQ pool once a
# kernel ULP used it): the host checks that the daemon holds exactly that, nothing more.
if [[ $dev == vrdma* ]]; then
    echo "$(rdma resource show qp link "$dev/1" 2>/dev/null | grep -c lqpn)" \
        "$(rdma resource show cq dev "$dev" 2>/dev/null | grep -c cqn)" \
        "$(rdma resource show srq dev "$dev" 2>/dev/null | grep -c srqn)" >"$sync/objects.$me"
    say "kernel objects on $dev (qps cqs srqs): $(cat "$sync/objects.$me")"
fi
touch "$sync/tools-done.$me"
for _ in $(seq 300); do [[ -f $sync/counters-read ]] && break; sleep 0.1; done
say "failed=$failed"
if ((failed)); then
    dmesg | grep -iE 'virtio_rdma|vrdma|rdma_rxe|infiniband' | tail -20
fi
exit "$failed"
