#!/bin/bash
# Guest side of tests/vm/capture-rxe.sh: runs in guest A (servers) and guest B (clients).
# The two guests step through the same test list in lock step, synchronised through
# files in the 9p share (/vur/sync). Test i uses port 18515+i for its out-of-band
# exchange, and B sends one ICMP echo of 100+i payload bytes to A right before starting
# test i's client, so the host can tell the tests apart in its capture.
# Env (from run-vm.sh --env): SERVER (A's IPv4 address), VUR_NAME (A or B).
set -uo pipefail

role=$VUR_NAME
server=${SERVER:?}
sync=/vur/sync
out=/vur/out
mkdir -p "$sync" "$out"

# id|optional(0/1)|server command|client command (empty: server command + " @SERVER@").
# @G4@/@G6@: GID index of the IPv4/IPv6 RoCE v2 GID, @PORT@: 18515+i, @SERVER@: A's IPv4.
# Optional tests may fail without failing the run (their packets are still described).
tests=(
    "rc_pingpong_s64|0|ibv_rc_pingpong -d rxe0 -g @G4@ -n 5 -s 64 -p @PORT@|"
    "rc_pingpong_s3000_mtu1024|0|ibv_rc_pingpong -d rxe0 -g @G4@ -n 5 -s 3000 -m 1024 -p @PORT@|"
    "uc_pingpong|0|ibv_uc_pingpong -d rxe0 -g @G4@ -n 5 -p @PORT@|"
    "ud_pingpong_s512|0|ibv_ud_pingpong -d rxe0 -g @G4@ -n 5 -s 512 -p @PORT@|"
    "ib_write_bw|0|ib_write_bw -d rxe0 -x @G4@ -n 5 -s 4096 -F -p @PORT@|"
    "ib_read_bw|0|ib_read_bw -d rxe0 -x @G4@ -n 5 -s 4096 -F -p @PORT@|"
    "ib_atomic_bw_cmp_swap|0|ib_atomic_bw -d rxe0 -x @G4@ -n 5 -A CMP_AND_SWAP -F -p @PORT@|"
    "ib_atomic_bw_fetch_add|0|ib_atomic_bw -d rxe0 -x @G4@ -n 5 -A FETCH_AND_ADD -F -p @PORT@|"
    "ib_send_lat|0|ib_send_lat -d rxe0 -x @G4@ -n 5 -F -p @PORT@|"
    "rc_pingpong_s64_ipv6gid|1|ibv_rc_pingpong -d rxe0 -g @G6@ -n 5 -s 64 -p @PORT@|"
    "ib_write_bw_s512|1|ib_write_bw -d rxe0 -x @G4@ -n 5 -s 512 -F -p @PORT@|"
    "ib_write_bw_imm_s64|1|ib_write_bw -d rxe0 -x @G4@ -n 5 -s 64 --write_with_imm -F -p @PORT@|"
    "ib_read_bw_s512|1|ib_read_bw -d rxe0 -x @G4@ -n 5 -s 512 -F -p @PORT@|"
    "ib_write_bw_uc_s2048|1|ib_write_bw -d rxe0 -x @G4@ -c UC -n 5 -s 2048 -F -p @PORT@|"
    "ib_send_bw_ud_s512|1|ib_send_bw -d rxe0 -x @G4@ -c UD -n 5 -s 512 -F -p @PORT@|"
    "rping_rdma_cm|1|rping -s -a @SERVER@ -p @PORT@ -C 3 -S 64 -v|rping -c -a @SERVER@ -p @PORT@ -C 3 -S 64 -v"
)

g4=$(vur-gid v4) || { echo "CAPTURE no IPv4 GID"; exit 1; }
g6=$(vur-gid v6 || echo none)
echo "CAPTURE role=$role gid-v4=$g4 gid-v6=$g6"

wait_file() { # wait_file PATH SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [[ -e $1 ]] && return 0
        sleep 0.1
    done
    echo "CAPTURE timeout waiting for $1"
    return 1
}

listening() { # TCP listener (pingpong, perftest) or RDMA CM listener (rping)
    { ss -ltn; rdma resource show cm_id 2>/dev/null; } | grep -qE ":$1( |$)"
}

failed=0
for i in "${!tests[@]}"; do
    IFS='|' read -r id optional scmd ccmd <<<"${tests[i]}"
    port=$((18515 + i))
    [[ -n $ccmd ]] || ccmd="$scmd @SERVER@"
    subst() {
        local c=${1//@G4@/$g4}
        c=${c//@G6@/$g6}
        c=${c//@PORT@/$port}
        echo "${c//@SERVER@/$server}"
    }
    scmd=$(subst "$scmd")
    ccmd=$(subst "$ccmd")
    if [[ "$scmd " == *" none "* ]]; then
        echo "CAPTURE-TEST $i $id skipped (no GID)"
        [[ $role == A ]] && touch "$sync/$i.ready" "$sync/$i.A.done"
        [[ $role == B ]] && touch "$sync/$i.B.done"
        continue
    fi
    rc=0
    if [[ $role == A ]]; then
        echo "$scmd" >"$out/$id.server.cmd"
        read -ra argv <<<"$scmd"
        timeout 150 "${argv[@]}" >"$out/$id.server.log" 2>&1 &
        pid=$!
        for _ in $(seq 200); do listening "$port" && break; sleep 0.1; done
        touch "$sync/$i.ready"
        wait "$pid" || rc=$?
        echo "$rc" >"$sync/$i.A.rc"
        touch "$sync/$i.A.done"
        wait_file "$sync/$i.B.done" 200 || rc=99
    else
        wait_file "$sync/$i.ready" 200 || rc=99
        if ((rc == 0)); then
            # Marker for the host: one ICMP echo with 100+i payload bytes starts test i.
            ping -n -c 1 -W 2 -s $((100 + i)) "$server" >/dev/null || true
            echo "$ccmd" >"$out/$id.client.cmd"
            read -ra argv <<<"$ccmd"
            timeout 150 "${argv[@]}" >"$out/$id.client.log" 2>&1 || rc=$?
        fi
        echo "$rc" >"$sync/$i.B.rc"
        touch "$sync/$i.B.done"
        wait_file "$sync/$i.A.done" 200 || rc=99
    fi
    echo "CAPTURE-TEST $i $id port=$port rc=$rc optional=$optional"
    if ((rc != 0 && optional == 0)); then failed=$((failed + 1)); fi
    sleep 0.5 # a visible gap between tests in the capture
done
echo "CAPTURE role=$role failed=$failed"
exit "$failed"
