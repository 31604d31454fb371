# shellcheck shell=bash
# cargo for the scripts that run under sudo (the VM tests, the demos, the package): as root
# under sudo, cargo runs as the user who called sudo, so the tree's target/ and ~/.cargo stay
# theirs and their toolchain is found (root's PATH seldom has ~/.cargo/bin); as root without
# sudo (CI) or as a user, it runs as is. Without a cargo, or with one older than the
# workspace's rust-version, it says what to install instead of failing deep in a build.
#
#   . scripts/lib/cargo.sh; vur_cargo build --release -p vhost-user-rdma
#
# VUR_CARGO_PRINT=1 prints the command instead of running it (tests/scripts/cargo.test.sh).

# The workspace's rust-version (Cargo.toml), the oldest Rust it builds with.
vur_rust_version() {
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    awk -F'"' '/^rust-version *=/ {print $2; exit}' "$root/Cargo.toml"
}

vur_cargo() {
    local user='' home='' cargo='' have want
    if [[ $(id -u) -eq 0 && -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
        user=$SUDO_USER
        home=$(getent passwd "$user" | cut -d: -f6)
    fi
    if [[ -n $home && -x $home/.cargo/bin/cargo ]]; then
        cargo=$home/.cargo/bin/cargo
    elif command -v cargo >/dev/null; then
        cargo=$(command -v cargo)
    elif [[ -x ${HOME:-/nonexistent}/.cargo/bin/cargo ]]; then
        cargo=$HOME/.cargo/bin/cargo
    fi
    want=$(vur_rust_version)
    if [[ -z $cargo ]]; then
        echo "cargo not found${user:+ for $user}: install Rust $want or newer (rustup, or Debian's rustc and cargo if they are that new) and run again" >&2
        return 127
    fi
    have=$("$cargo" --version 2>/dev/null | awk '{print $2}')
    if [[ -n $want && $(printf '%s\n%s\n' "$want" "${have:-0}" | sort -V | head -1) != "$want" ]]; then
        echo "$cargo is Rust ${have:-of an unknown version}; this workspace needs $want or newer (rustup update)" >&2
        return 1
    fi
    local cmd=("$cargo" "$@")
    if [[ -n $user ]]; then
        # The user's environment for cargo: their home (~/.cargo, ~/.rustup) and PATH.
        cmd=(sudo -u "$user" -H env "PATH=$(dirname "$cargo"):/usr/local/bin:/usr/bin:/bin" "$cargo" "$@")
    fi
    if [[ -n ${VUR_CARGO_PRINT:-} ]]; then
        printf '%s\n' "${cmd[*]}"
        return 0
    fi
    "${cmd[@]}"
}
