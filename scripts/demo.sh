#!/usr/bin/env bash
# The main job of a fresh checkout: build, then show the engine at work.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -p rxe-core --bench engine -- --quick
