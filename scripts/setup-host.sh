#!/usr/bin/env bash
# Installs everything the build, the tests and the VM test bed need on Debian 12, then builds
# the guest images (cached by their inputs). Idempotent; prints how long each slow step takes.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
    echo "setup-host: not root: skipping apt packages and guest images (the Rust tests still run)"
    exit 0
fi
t0=$SECONDS
# VM test bed: QEMU (bookworm-backports), debootstrap, tshark, scapy, ...
images/host-setup.sh
echo "setup-host: packages in $((SECONDS - t0)) s"
if [[ -x images/build.sh ]]; then
    t1=$SECONDS
    images/build.sh
    echo "setup-host: guest images in $((SECONDS - t1)) s"
fi
