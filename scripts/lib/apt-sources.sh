# shellcheck shell=bash
# The machine's own apt configuration, read in either format: deb822 (*.sources, Debian 12's
# cloud images and trixie) or classic one-line (sources.list, *.list: a Debian 12 installed
# from the netinst image). Sourced by images/host-setup.sh, which derives every archive it uses
# from it, and by images/build.sh and guest-driver-patches/qemu/build.sh.
# APT_ETC (default /etc/apt) is where the configuration is read from.

# apt_archive_uri: prints the first Debian archive URI the machine uses for packages (a
# security archive is skipped), or fails.
apt_archive_uri() {
    local etc=${APT_ETC:-/etc/apt} f uri
    for f in "$etc"/sources.list.d/*.sources; do
        [[ -r $f ]] || continue
        # One stanza per paragraph: Types with deb, not disabled, Suites without -security.
        uri=$(awk 'BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^Types:/) types = $i
                    else if ($i ~ /^URIs:/) uris = $i
                    else if ($i ~ /^Suites:/) suites = $i
                    else if ($i ~ /^Enabled:/) { enabled = $i; sub(/^Enabled:[ \t]*/, "", enabled) }
                }
                if (types ~ /[ \t]deb([ \t]|$)/ && enabled != "no" && suites !~ /-security/ && uris != "") {
                    split(uris, a, /[ \t]+/); print a[2]; exit
                }
            }' "$f")
        [[ -n $uri ]] && { printf '%s\n' "$uri"; return 0; }
    done
    for f in "$etc/sources.list" "$etc"/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        # deb [options] URI SUITE COMPONENTS...
        uri=$(awk '$1 == "deb" {
                i = 2
                if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) !~ /-security/) { print $i; exit }
            }' "$f")
        [[ -n $uri ]] && { printf '%s\n' "$uri"; return 0; }
    done
    return 1
}

# apt_copy_sources DIR: copies the machine's source files, in whichever format, into DIR, a
# directory apt then reads as its Dir::Etc::SourceParts (it reads *.list and *.sources there).
apt_copy_sources() {
    local etc=${APT_ETC:-/etc/apt} dir=$1 f n=0
    mkdir -p "$dir"
    if [[ -r $etc/sources.list ]] && grep -q '^[[:space:]]*deb' "$etc/sources.list"; then
        cp "$etc/sources.list" "$dir/host-sources.list"
        n=$((n + 1))
    fi
    for f in "$etc"/sources.list.d/*.sources "$etc"/sources.list.d/*.list; do
        [[ -r $f ]] || continue
        cp "$f" "$dir/host-${f##*/}"
        n=$((n + 1))
    done
    ((n > 0))
}

# apt_write_sources DIR SUITE: a sources directory for apt's Dir::Etc::SourceParts with the
# machine's own sources (either format) and SUITE (deb and deb-src, main) from the machine's
# Debian archive: what guest-driver-patches/qemu/build.sh builds QEMU's dependencies from.
apt_write_sources() {
    local dir=$1 suite=$2 uri
    uri=$(apt_archive_uri) || return 1
    apt_copy_sources "$dir" || return 1
    cat >"$dir/vur-$suite.sources" <<SOURCES
Types: deb deb-src
URIs: $uri
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
}
