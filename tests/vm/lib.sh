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
