# shellcheck shell=bash
# Shared by the packaging tests (source it after scripts/lib/apt-sources.sh): a clean Debian
# root to install into, made once with debootstrap and cached by this recipe.

# pkg_clean_root SUITE: prints the path of a cached minbase root of SUITE with systemd (made
# with debootstrap from the machine's archive the first time, under
# $VUR_CACHE_ROOT/roots or /var/cache/vhost-user-rdma/roots); the caller copies it before
# changing anything. Fails saying why.
pkg_clean_root() {
    local suite=$1 cache base uri t1
    cache=${VUR_CACHE_ROOT:-/var/cache/vhost-user-rdma}/roots
    # ROOT-RECIPE: what the key covers (this function).
    base=$cache/$suite-systemd-$(declare -f pkg_clean_root | sha256sum | cut -c1-12)
    mkdir -p "$cache"
    (
        flock 9
        if [[ ! -x $base/usr/bin/systemctl ]]; then
            uri=$(apt_archive_uri) || { echo "no Debian archive in /etc/apt to debootstrap from" >&2; exit 1; }
            t1=$SECONDS
            rm -rf "$base.tmp"
            debootstrap --variant=minbase --include=systemd "$suite" "$base.tmp" "$uri" \
                >"$cache/debootstrap-$suite.log" 2>&1 ||
                { tail -20 "$cache/debootstrap-$suite.log" >&2; echo "debootstrap $suite failed" >&2; exit 1; }
            rm -rf "$base" && mv "$base.tmp" "$base"
            # Roots of an older recipe go.
            find "$cache" -maxdepth 1 -name "$suite-systemd-*" ! -path "$base" -exec rm -rf {} +
            echo "debootstrap $suite (minbase, systemd) in $((SECONDS - t1)) s" >&2
        fi
    ) 9>"$cache/.lock" || return 1
    printf '%s\n' "$base"
}
