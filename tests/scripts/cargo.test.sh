#!/usr/bin/env bash
# scripts/lib/cargo.sh: which cargo runs, as whom, and what a missing or too old Rust says.
# Fake cargo programs in a temporary PATH; nothing is built, no user is created.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib/cargo.sh
. "$here/../../scripts/lib/cargo.sh"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail=0
check() { # NAME WANT GOT
    if [[ $2 == "$3" ]]; then echo "ok: $1"; else echo "FAIL: $1: want '$2', got '$3'"; fail=1; fi
}
want=$(vur_rust_version)
[[ $want =~ ^1\.[0-9]+ ]] || { echo "FAIL: no rust-version in Cargo.toml ($want)"; exit 1; }
mkdir -p "$t/new" "$t/old" "$t/none"
printf '#!/bin/sh\necho "cargo %s (test)"\n' "$want" >"$t/new/cargo"
printf '#!/bin/sh\necho "cargo 1.60.0 (test)"\n' >"$t/old/cargo"
chmod +x "$t/new/cargo" "$t/old/cargo"

got=$(PATH=$t/new:/usr/bin:/bin SUDO_USER='' HOME=$t VUR_CARGO_PRINT=1 vur_cargo build -q)
check "no sudo: cargo as is" "$t/new/cargo build -q" "$got"
if [[ $(id -u) -eq 0 ]]; then
    # Under sudo, as root: the calling user's cargo, run as that user (nobody has no home
    # with a toolchain, so the one on the PATH is taken).
    got=$(PATH=$t/new:/usr/bin:/bin SUDO_USER=nobody VUR_CARGO_PRINT=1 vur_cargo build -q)
    check "sudo: as the user who called it" \
        "sudo -u nobody -H env PATH=$t/new:/usr/local/bin:/usr/bin:/bin $t/new/cargo build -q" "$got"
    got=$(PATH=$t/new:/usr/bin:/bin SUDO_USER=root VUR_CARGO_PRINT=1 vur_cargo build)
    check "sudo from root: as is" "$t/new/cargo build" "$got"
else
    echo "ok: (the sudo cases need root; as a user cargo runs as is)"
fi
out=$(PATH=$t/old:/usr/bin:/bin SUDO_USER='' HOME=$t vur_cargo build 2>&1) && rc=0 || rc=$?
check "too old: refused" 1 "$rc"
[[ $out == *"needs $want or newer"* ]] && check "too old: says which" 1 1 || check "too old: says which" "needs $want" "$out"
out=$(PATH=$t/none:/usr/bin:/bin SUDO_USER='' HOME=$t vur_cargo build 2>&1) && rc=0 || rc=$?
if command -v -p cargo >/dev/null 2>&1 && [[ $(command -v -p cargo) == /usr/bin/cargo ]]; then
    echo "ok: (a system cargo in /usr/bin: the missing case is not reachable here)"
else
    check "missing: refused" 127 "$rc"
    [[ $out == *"install Rust $want or newer"* ]] && check "missing: says what" 1 1 || check "missing: says what" "install Rust" "$out"
fi
exit $fail
