#!/usr/bin/env bash
# The main job of a fresh checkout: two vhost-user-rdma daemons on this machine, each with a test
# guest attached over a real vhost-user socket (guest RAM in a memfd), an RC ping-pong and a
# WRITE bandwidth run between them over UDP on loopback; then the engine alone.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/cargo.sh
. scripts/lib/cargo.sh
t0=$SECONDS
vur_cargo build --release -p vur-testguest --bins -p rxe-core
echo "build: $((SECONDS - t0)) s"
echo
echo "== two daemons, two test guests"
./target/release/vur-demo
echo
echo "== the engine alone"
cargo bench -q -p rxe-core --bench engine -- --quick
