#!/usr/bin/env bash
# A VM with the virtio-rdma device, end to end: the vhost-user-rdma daemon, QEMU with
# vhost-user-rdma-pci, the trixie guest with the virtio_rdma driver, and unmodified rdma-core
# inside: ibv_devinfo, then ibv_rc_pingpong and ib_write_bw between two processes in the guest
# over the device (the daemon's UDP transport carries the RoCEv2 traffic).
#
#   sudo scripts/setup-host.sh    # once: packages, patched QEMU, guest image (cached)
#   sudo scripts/vm-demo.sh [TOOL...]   (default: devinfo rc write_bw; see
#                                        tests/vm/device-verbs.test.sh for the list)
#
# Everything runs in a network namespace of its own, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/cargo.sh
. scripts/lib/cargo.sh
[[ $(id -u) -eq 0 ]] || { echo "vm-demo: needs root (network namespace, QEMU with shared memory): sudo $0" >&2; exit 2; }
((${#})) || set -- devinfo rc write_bw
t0=$SECONDS
vur_cargo build --release -p vhost-user-rdma
echo "build: $((SECONDS - t0)) s"
exec tests/vm/device-verbs.test.sh "$@"
