# Shared by the VM tests (source it): prerequisite checks with the SKIP / CI=true rule.
# shellcheck shell=bash

# The test network of tests/vm/net.sh: host bridge and the first guest, IPv4 and IPv6.
# shellcheck disable=SC2034 # used by the scripts that source this file
host4=10.77.0.1 guest4=10.77.0.2 host6=fd77::1 guest6=fd77::2

# vm_missing REASON: one line and exit 0 ("SKIP: ...") — or, under CI=true, where the
# prerequisites are installed by .ci/run, a failure.
vm_missing() {
    if [[ ${CI:-} == true ]]; then
        echo "FAIL: $* (CI=true: prerequisites must be installed)"
        exit 1
    fi
    echo "SKIP: $*"
    exit 0
}

# vm_require NAME [COMMAND...]: root, QEMU, the given commands and the guest image; sets
# $images to the image directory.
vm_require() {
    local name=$1 c
    shift
    [[ $(id -u) -eq 0 ]] || vm_missing "$name needs root (tap device, bridge)"
    for c in qemu-system-x86_64 "$@"; do
        command -v "$c" >/dev/null || vm_missing "$name: $c not installed (images/host-setup.sh)"
    done
    images=${VUR_IMAGES:-$("$repo/images/build.sh" --print-dir)}
    [[ -f $images/vmlinuz && -f $images/initrd.img ]] ||
        vm_missing "$name: no guest image in $images (sudo images/build.sh)"
}
