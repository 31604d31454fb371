#!/usr/bin/env bash
# scripts/lib/apt-sources.sh reads the machine's apt configuration in both formats: a deb822
# debian.sources (Debian 12 cloud, trixie) and a classic sources.list (Debian 12 from the
# netinst image), a security archive listed first in each, options in brackets, a disabled
# stanza. Configurations written here, never the machine's; no network.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../scripts/lib/apt-sources.sh
. "$here/../../scripts/lib/apt-sources.sh"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail=0
check() { # NAME WANT GOT
    if [[ $2 == "$3" ]]; then echo "ok: $1"; else echo "FAIL: $1: want '$2', got '$3'"; fail=1; fi
}

mkdir -p "$t/deb822/sources.list.d"
cat >"$t/deb822/sources.list.d/debian.sources" <<'X'
Types: deb
URIs: http://security.example.invalid/debian-security
Suites: bookworm-security
Components: main

Types: deb deb-src
URIs: http://disabled.example.invalid/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb deb-src
URIs: http://archive.example.invalid/debian http://second.example.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
X
check "deb822" http://archive.example.invalid/debian "$(APT_ETC=$t/deb822 apt_archive_uri)"

mkdir -p "$t/classic/sources.list.d"
cat >"$t/classic/sources.list" <<'X'
# deb cdrom:[Debian GNU/Linux 12.0.0 _Bookworm_ - Official amd64 NETINST]/ bookworm main
deb http://security.example.invalid/debian-security bookworm-security main
deb-src http://src.example.invalid/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://classic.example.invalid/debian bookworm main
X
check "classic" http://classic.example.invalid/debian "$(APT_ETC=$t/classic apt_archive_uri)"

mkdir -p "$t/none/sources.list.d"
if APT_ETC=$t/none apt_archive_uri >/dev/null; then check "nothing configured fails" 1 0; else check "nothing configured fails" 1 1; fi

APT_ETC=$t/classic apt_copy_sources "$t/parts-classic"
check "classic copied" "host-sources.list" "$(ls "$t/parts-classic")"
APT_ETC=$t/deb822 apt_copy_sources "$t/parts-deb822"
check "deb822 copied" "host-debian.sources" "$(ls "$t/parts-deb822")"
if APT_ETC=$t/none apt_copy_sources "$t/parts-none"; then check "nothing to copy fails" 1 0; else check "nothing to copy fails" 1 1; fi

# The sources directory qemu/build.sh hands apt (Dir::Etc::SourceParts): the machine's sources
# and the suite's deb and deb-src from the archive they name, which apt itself parses (what
# `apt-get update` would fetch, printed without a download) from a classic sources.list as
# from deb822.
arch=$(dpkg --print-architecture)
for fmt in classic deb822; do
    APT_ETC=$t/$fmt apt_write_sources "$t/write-$fmt" bookworm-backports
    mkdir -p "$t/lists-$fmt/partial"
    uris=$(apt-get -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$t/write-$fmt" \
        -o "Dir::State::Lists=$t/lists-$fmt" --print-uris update 2>&1 || true)
    uri=$(APT_ETC=$t/$fmt apt_archive_uri)
    for want in "main/source/Sources" "main/binary-$arch/Packages"; do
        if grep -qF "'$uri/dists/bookworm-backports/$want" <<<"$uris"; then
            check "$fmt: apt fetches bookworm-backports $want" 1 1
        else
            check "$fmt: apt fetches bookworm-backports $want" "$want" "$uris"
        fi
    done
done
if APT_ETC=$t/none apt_write_sources "$t/write-none" bookworm-backports; then check "nothing to write from fails" 1 0; else check "nothing to write from fails" 1 1; fi
exit $fail
