#!/usr/bin/env python3
"""Independent ICRC check of every RoCEv2 frame in a pcap.

    tests/vm/icrc-check.py FILE.pcap [--expect-src IP ...]

Two implementations that share no code with rxe-core, and each frame must pass both:
1. standard library: byte offsets masked as rxe_icrc.c describes, zlib's CRC-32;
2. scapy: the frame parsed by scapy's layers; IPv4 through scapy's own RoCE ICRC
   (scapy.contrib.roce, which knows IPv4 only), IPv6 by masking scapy's named fields (tc, fl,
   hlim, UDP chksum, BTH fecn/becn/resv6) and a table CRC-32 of this file's own.
Without scapy only the first runs, and the script says so; under CI=true a missing scapy, or a
capture with no frame that both checked, is a failure. Prints per-source counts; exits 1 on any
mismatch, when an --expect-src address sent no frame, or when no frame was checked.
"""
import os
import struct
import sys
import zlib
from collections import Counter


def read_pcap(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        sys.exit(f"{path}: not a classic pcap file")
    linktype = struct.unpack(e + "I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        yield linktype, data[off:off + incl]
        off += incl


def split(frame, linktype):
    """-> (version, ip_header, udp_header, roce) or None when not RoCEv2."""
    if linktype == 1:
        if len(frame) < 14:
            return None
        et = struct.unpack("!H", frame[12:14])[0]
        l3 = frame[14:]
        if et == 0x8100:
            et = struct.unpack("!H", frame[16:18])[0]
            l3 = frame[18:]
    elif linktype == 101:
        l3 = frame
        et = 0x0800 if frame[:1] and frame[0] >> 4 == 4 else 0x86DD
    else:
        return None
    if et == 0x0800:
        if len(l3) < 28 or l3[9] != 17:
            return None
        ihl = (l3[0] & 15) * 4
        total = struct.unpack("!H", l3[2:4])[0]
        ip, udp, roce = l3[:ihl], l3[ihl:ihl + 8], l3[ihl + 8:total]
        v = 4
    elif et == 0x86DD:
        if len(l3) < 48 or l3[6] != 17:
            return None
        plen = struct.unpack("!H", l3[4:6])[0]
        ip, udp, roce = l3[:40], l3[40:48], l3[48:40 + plen]
        v = 6
    else:
        return None
    if struct.unpack("!H", udp[2:4])[0] != 4791 or len(roce) < 16:
        return None
    return v, ip, udp, roce


def icrc_stdlib(v, ip, udp, roce):
    ip = bytearray(ip)
    if v == 4:
        ip[1] = 0xFF            # TOS
        ip[8] = 0xFF            # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
    else:
        ip[0] |= 0x0F           # traffic class, high nibble
        ip[1:4] = b"\xff\xff\xff"  # traffic class low nibble + flow label
        ip[7] = 0xFF            # hop limit
    udp = bytearray(udp)
    udp[6:8] = b"\xff\xff"      # UDP checksum
    bth = bytearray(roce[:12])
    bth[4] = 0xFF               # FECN, BECN, resv6
    data = b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth) + roce[12:-4]
    return struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0xEDB88320 if _c & 1 else 0)
    _TABLE.append(_c)


def crc32_table(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def have_scapy():
    try:
        import scapy.contrib.roce  # noqa: F401
        from scapy.all import Ether  # noqa: F401
        return True
    except Exception:
        return False


def icrc_scapy(frame, linktype):
    from scapy.all import Ether, IP, IPv6, UDP, raw
    from scapy.contrib.roce import BTH
    if linktype == 1:
        p = Ether(frame)
    else:
        p = IP(frame) if frame[0] >> 4 == 4 else IPv6(frame)
    if BTH not in p:
        return None
    if IP in p:
        q = p.copy()
        q[BTH].icrc = None
        return raw(q[BTH])[-4:]
    if IPv6 not in p or UDP not in p:
        return None
    q = p[IPv6].copy()
    q.tc = 0xFF
    q.fl = 0xFFFFF
    q.hlim = 0xFF
    q[UDP].chksum = 0xFFFF
    q[BTH].fecn = 1
    q[BTH].becn = 1
    q[BTH].resv6 = 0x3F
    covered = raw(q)[:-4]
    return struct.pack("<I", crc32_table(b"\xff" * 8 + covered))


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    path = args[0]
    expect = [a for i, a in enumerate(args[2:], 2) if args[i - 1] == "--expect-src"]
    ok, bad, scapy_checked = Counter(), Counter(), 0
    ci = os.environ.get("CI") == "true"
    use_scapy = have_scapy()
    if not use_scapy:
        if ci:
            sys.exit("icrc-check: FAIL: scapy is not installed (CI=true needs both implementations)")
        print("icrc-check: scapy not installed: only the standard-library implementation runs")
    import ipaddress
    for linktype, frame in read_pcap(path):
        s = split(frame, linktype)
        if s is None:
            continue
        v, ip, udp, roce = s
        src = str(ipaddress.ip_address(ip[12:16] if v == 4 else ip[8:24]))
        good = icrc_stdlib(v, ip, udp, roce) == roce[-4:]
        if use_scapy:
            sc = icrc_scapy(frame, linktype)
            if sc is None:
                print(f"icrc-check: scapy did not see a RoCE frame from {src}")
                good = False
            else:
                scapy_checked += 1
                good = good and sc == roce[-4:]
        (ok if good else bad)[src] += 1
    for src in sorted(set(ok) | set(bad)):
        print(f"icrc-check: {src}: {ok[src]} frames good, {bad[src]} bad")
    print(f"icrc-check: {sum(ok.values())} good, {sum(bad.values())} bad; both implementations checked {scapy_checked}")
    missing = [a for a in expect if ok[a] + bad[a] == 0]
    for a in missing:
        print(f"icrc-check: no frame from {a}")
    if not ok and not bad:
        print("icrc-check: no RoCEv2 frame in the capture")
    sys.exit(1 if bad or missing or not ok or (use_scapy and scapy_checked == 0) else 0)


if __name__ == "__main__":
    main()
