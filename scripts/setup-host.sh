#!/usr/bin/env bash
# Installs everything the build, the tests and the VM test bed need on Debian 12, then builds
# QEMU with the virtio-rdma device and the guest images (both cached by their inputs, outside
# the work tree: /var/cache/vhost-user-rdma, or VUR_CACHE_ROOT). Idempotent; prints how long
# each slow step takes.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) -ne 0 ]]; then
    echo "setup-host: not root: skipping apt packages and guest images (the Rust tests still run)"
    exit 0
fi
t0=$SECONDS
# VM test bed: QEMU (bookworm-backports), debootstrap, tshark, scapy, ...
images/host-setup.sh
# The oldest Rust the workspace claims (rust-version) and the one before it, for
# tests/toolchain/msrv.test.sh; only with rustup (a distribution's Rust has one version).
if command -v rustup >/dev/null; then
    msrv=$(awk -F'"' '/^rust-version *=/ {print $2; exit}' Cargo.toml)
    t1=$SECONDS
    rustup toolchain install "$msrv" "1.$((${msrv#1.} - 1))" --profile minimal >/dev/null ||
        echo "setup-host: rustup could not install Rust $msrv (tests/toolchain/msrv.test.sh will say so)"
    echo "setup-host: Rust $msrv and the one before it (rustup) in $((SECONDS - t1)) s"
fi
echo "setup-host: packages in $((SECONDS - t0)) s"
# QEMU with the vhost-user-rdma-pci device (built once per patch + script + source version,
# cached outside the work tree).
t1=$SECONDS
guest-driver-patches/qemu/build.sh >/dev/null
echo "setup-host: patched QEMU in $((SECONDS - t1)) s ($(guest-driver-patches/qemu/build.sh --print-bin))"
if [[ -x images/build.sh ]]; then
    t1=$SECONDS
    images/build.sh
    echo "setup-host: guest images in $((SECONDS - t1)) s"
fi
