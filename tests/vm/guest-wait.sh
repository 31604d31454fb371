# Sourced inside a guest (shipped with run-vm.sh --file, found in /vur-scenario): bounded
# waits for listeners, so a client starts once its server is there instead of after a sleep.
# The caller sets wait_tag (its log prefix, e.g. DV) before the waits are used; each wait
# returns 1 after saying what it waited for.
# shellcheck shell=bash

# wait_listen PORT: bounded wait for a TCP listener (a pingpong or libibverbs example server:
# the tools exchange QP numbers over TCP, and by then the server has opened the device and made
# its QP)
wait_listen() {
    for _ in $(seq 200); do ss -ltn | grep -q ":$1 " && return 0; sleep 0.05; done
    echo "$wait_tag note: nothing listened on TCP $1 within 10 s"
    return 1
}

# wait_cm_listen PORT: bounded wait for an rdma_cm listener on a device (rping)
wait_cm_listen() {
    local l
    for _ in $(seq 200); do
        l=$(rdma resource show cm_id 2>/dev/null | grep -w LISTEN | grep -w link) || true
        grep -qE ":$1( |$)" <<<"$l" && return 0
        sleep 0.05
    done
    echo "$wait_tag note: no rdma_cm listener on port $1 within 10 s"
    return 1
}
