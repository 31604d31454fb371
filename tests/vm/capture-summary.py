#!/usr/bin/env python3
"""Summarise a tests/vm/capture-rxe.sh run.

Reads the RoCE-only pcap and the full bridge pcap, maps every RoCE packet to the test
that produced it (right before test i, guest B sends one ICMP echo request with 100+i
payload bytes to guest A, so a packet belongs to the last test whose marker precedes
it; test i's out-of-band exchange uses port 18515+i), recomputes the ICRC of
every packet the way Linux rxe does (rxe_icrc.c), runs tshark's decoder over it, and
writes the README for rxe-core/tests/data plus a dump of the TCP out-of-band payloads.
Standard library only (plus the tshark binary).
"""

import argparse
import collections
import os
import re
import struct
import subprocess
import zlib

BASE_PORT = 18515
ROCE_PORT = 4791

_OPS = {
    0x00: "SEND_FIRST", 0x01: "SEND_MIDDLE", 0x02: "SEND_LAST", 0x03: "SEND_LAST_WITH_IMMEDIATE",
    0x04: "SEND_ONLY", 0x05: "SEND_ONLY_WITH_IMMEDIATE", 0x06: "RDMA_WRITE_FIRST",
    0x07: "RDMA_WRITE_MIDDLE", 0x08: "RDMA_WRITE_LAST", 0x09: "RDMA_WRITE_LAST_WITH_IMMEDIATE",
    0x0A: "RDMA_WRITE_ONLY", 0x0B: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", 0x0C: "RDMA_READ_REQUEST",
    0x0D: "RDMA_READ_RESPONSE_FIRST", 0x0E: "RDMA_READ_RESPONSE_MIDDLE",
    0x0F: "RDMA_READ_RESPONSE_LAST", 0x10: "RDMA_READ_RESPONSE_ONLY", 0x11: "ACKNOWLEDGE",
    0x12: "ATOMIC_ACKNOWLEDGE", 0x13: "COMPARE_SWAP", 0x14: "FETCH_ADD",
    0x16: "SEND_LAST_WITH_INVALIDATE", 0x17: "SEND_ONLY_WITH_INVALIDATE",
}


def opname(op):
    prefix = {0: "RC", 1: "UC", 2: "RD", 3: "UD"}.get(op >> 5, "?")
    return f"{prefix}_{_OPS.get(op & 0x1F, 'RESERVED')}"


def read_pcap(path):
    """Yield (frame_number, timestamp, bytes) from a classic little/big-endian pcap."""
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise SystemExit(f"{path}: not a pcap file (use dumpcap -P)")
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    if linktype != 1:
        raise SystemExit(f"{path}: link type {linktype}, expected Ethernet")
    off, n = 24, 0
    while off + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack(endian + "IIII", data[off:off + 16])
        off += 16
        n += 1
        yield n, sec + frac / (1e9 if nano else 1e6), data[off:off + incl]
        off += incl


def parse_ip(frame):
    """Return (version, ip_header_bytes, l4_proto, l4_bytes, src, dst) or None."""
    ethertype = struct.unpack(">H", frame[12:14])[0]
    p = frame[14:]
    if ethertype == 0x0800:
        ihl = (p[0] & 0xF) * 4
        total = struct.unpack(">H", p[2:4])[0]
        src = ".".join(str(b) for b in p[12:16])
        dst = ".".join(str(b) for b in p[16:20])
        return 4, p[:ihl], p[9], p[ihl:total], src, dst
    if ethertype == 0x86DD:
        plen = struct.unpack(">H", p[4:6])[0]
        src = _v6(p[8:24])
        dst = _v6(p[24:40])
        return 6, p[:40], p[6], p[40:40 + plen], src, dst
    return None


def _v6(b):
    import ipaddress

    return str(ipaddress.IPv6Address(bytes(b)))


def rxe_icrc(ip_version, iphdr, udp):
    """ICRC as Linux rxe computes it (drivers/infiniband/sw/rxe/rxe_icrc.c, IBTA A17.3.3)."""
    ip = bytearray(iphdr)
    if ip_version == 4:
        ip[1] = 0xFF  # tos
        ip[8] = 0xFF  # ttl
        ip[10:12] = b"\xff\xff"  # header checksum
    else:
        ip[0] |= 0x0F  # traffic class (high nibble) ...
        ip[1:4] = b"\xff\xff\xff"  # ... rest of traffic class + flow label
        ip[7] = 0xFF  # hop limit
    u = bytearray(udp[:-4])
    u[6:8] = b"\xff\xff"  # udp checksum
    u[8 + 4] = 0xFF  # BTH resv8a (FECN/BECN/resv6)
    crc = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(u))  # 8 bytes of 1s: masked LRH
    return struct.pack("<I", crc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--roce", required=True)
    ap.add_argument("--full", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--oob", required=True)
    a = ap.parse_args()

    # Tests: ids and results from the guests' console logs.
    tests = {}
    for role in ("A", "B"):
        path = os.path.join(a.shared, f"{role}.console.log")
        if not os.path.exists(path):
            continue
        for line in open(path, errors="replace"):
            m = re.match(r"CAPTURE-TEST (\d+) (\S+) port=(\d+) rc=(\d+)", line.strip())
            if m:
                i = int(m.group(1))
                t = tests.setdefault(i, {"id": m.group(2), "port": int(m.group(3))})
                t["rc_" + role] = int(m.group(4))
    for t in tests.values():
        for side in ("server", "client"):
            cmdf = os.path.join(a.shared, "out", f"{t['id']}.{side}.cmd")
            t[side] = open(cmdf).read().strip() if os.path.exists(cmdf) else "?"

    # Test markers (ICMP echo requests of 100+i bytes) and out-of-band TCP payloads.
    marker = {}
    oob = collections.defaultdict(list)
    for n, ts, fr in read_pcap(a.full):
        ip = parse_ip(fr)
        if ip and ip[2] == 1 and ip[3][0] == 8 and 100 <= len(ip[3]) - 8 < 200:
            marker.setdefault(len(ip[3]) - 8 - 100, ts)
        if not ip or ip[2] != 6:
            continue
        _v, _h, _p, l4, src, dst = ip
        sport, dport = struct.unpack(">HH", l4[:4])
        doff = (l4[12] >> 4) * 4
        port = dport if BASE_PORT <= dport < BASE_PORT + 100 else sport
        payload = bytes(l4[doff:])
        if payload:
            oob[port].append((n, ts, f"{src}:{sport}", f"{dst}:{dport}", payload))
    starts = sorted((ts, i) for i, ts in marker.items())

    def test_of(ts):
        test = None
        for t0, i in starts:
            if t0 <= ts:
                test = i
        return test

    # RoCE packets.
    per_test = collections.defaultdict(list)
    total = collections.Counter()
    facts = collections.defaultdict(collections.Counter)
    icrc_ok = icrc_bad = 0
    first_ts = None
    for n, ts, fr in read_pcap(a.roce):
        ip = parse_ip(fr)
        if not ip or ip[2] != 17:
            continue
        ver, iphdr, _p, udp, src, dst = ip
        if struct.unpack(">H", udp[2:4])[0] != ROCE_PORT:
            continue
        first_ts = ts if first_ts is None else first_ts
        op = udp[8]
        total[op] += 1
        if rxe_icrc(ver, iphdr, udp) == bytes(udp[-4:]):
            icrc_ok += 1
        else:
            icrc_bad += 1
        qpn = struct.unpack(">I", udp[8 + 4:8 + 8])[0] & 0xFFFFFF
        if ver == 4:
            facts["IPv4 TOS"][f"0x{iphdr[1]:02x}"] += 1
            facts["IPv4 TTL"][str(iphdr[8])] += 1
            facts["IPv4 DF bit"][str((iphdr[6] >> 6) & 1)] += 1
        else:
            facts["IPv6 hop limit"][str(iphdr[7])] += 1
            tc = ((iphdr[0] & 0xF) << 4) | (iphdr[1] >> 4)
            flow = ((iphdr[1] & 0xF) << 16) | (iphdr[2] << 8) | iphdr[3]
            facts["IPv6 traffic class / flow label"][f"0x{tc:02x} / 0x{flow:05x}"] += 1
        facts["UDP checksum"]["0 (none)" if udp[6:8] == b"\0\0" else "set"] += 1
        facts["UDP source port"][str(struct.unpack(">H", udp[0:2])[0])] += 1
        facts["BTH P_Key"][f"0x{struct.unpack('>H', udp[10:12])[0]:04x}"] += 1
        facts["BTH TVer / MigReq"][f"{udp[9] & 0xF} / {(udp[9] >> 6) & 1}"] += 1
        if op & 0x1F in (0x11, 0x12) and op >> 5 == 0:  # RC ACK / atomic ACK: AETH
            facts["AETH syndrome (ACK, NAK)"][f"0x{udp[20]:02x}"] += 1
        per_test[test_of(ts)].append((n, op, src, dst, qpn, ver))

    # tshark's view of the same file. Wireshark >= 4.2 names the RoCEv2 dissector "rroce"
    # for decode-as; 4.0 (bookworm) has no such name but decodes UDP 4791 as RRoCE anyway.
    ts_fields = ["-T", "fields", "-e", "infiniband.bth.opcode"]
    ts_cmd = ["tshark", "-r", a.roce, "-d", "udp.port==4791,rroce"] + ts_fields
    ts = subprocess.run(ts_cmd, capture_output=True, text=True)
    if ts.returncode != 0:
        ts_cmd = ["tshark", "-r", a.roce] + ts_fields
        ts = subprocess.run(ts_cmd, capture_output=True, text=True, check=True)
    ts_out = ts.stdout
    ts_version = subprocess.run(["tshark", "--version"], capture_output=True,
                                text=True).stdout.split("\n")[0].rstrip(".")
    ts_shown = " ".join(["tshark", "-r", "rxe-6.12-capture.pcap"] + ts_cmd[3:]).replace(
        "-e infiniband.bth.opcode", "-e infiniband.bth.opcode | sort | uniq -c")
    ts_counts = collections.Counter(x for x in ts_out.split("\n") if x)
    uniq = "\n".join(f"{c:>7} {v}" for v, c in sorted(ts_counts.items()))  # as sort | uniq -c

    manifest = {}
    for line in open(a.manifest):
        if ":" in line and not line.startswith(("#", " ")):
            k, v = line.split(":", 1)
            manifest.setdefault(k.strip(), v.strip())
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                          text=True).stdout.split("\n")[0]

    size = os.path.getsize(a.roce)
    nframes = sum(total.values())
    L = []
    L.append("# rxe-6.12-capture.pcap — RoCEv2 packets of real Linux rxe\n")
    L.append("Generated by `sudo tests/vm/capture-rxe.sh` (summary by `tests/vm/capture-summary.py`);")
    L.append("do not edit by hand, re-run the script instead.\n")
    L.append(f"- file: `rxe-6.12-capture.pcap`, classic pcap (Ethernet), {nframes} frames, {size} bytes;")
    L.append("  captured with `dumpcap -i <bridge> -P -f \"udp port 4791\"` on the host bridge between")
    L.append("  two QEMU (TCG) guests, so every frame is exactly what a guest's rxe put on the wire.")
    L.append(f"- guest kernel: {manifest.get('kernel', '?')} (`{manifest.get('kernel-package', '?')}`), "
             "`rdma_rxe` module, `rdma link add rxe0 type rxe netdev eth0`")
    L.append(f"- rdma-core {manifest.get('rdma-core', '?')} (ibverbs-utils: ibv_*_pingpong), "
             f"perftest {manifest.get('perftest', '?')}, iproute2 {manifest.get('iproute2', '?')}; "
             "Debian trixie")
    L.append(f"- host: {qemu}, virtio-net on a tap, Linux bridge, eth0 MTU 1500 (RoCE active_mtu 1024)")
    L.append("- guest A = 10.77.0.2 / fd77::2 runs every server; guest B = 10.77.0.3 / fd77::3 runs every")
    L.append("  client (`<command> 10.77.0.2`). GID index: the IPv4 RoCE v2 GID (`::ffff:10.77.0.x`),")
    L.append("  found with `vur-gid v4` (images/vur-gid); the last test uses the IPv6 GID (fd77::x).")
    L.append("- test i uses port 18515+i (`-p`) for its out-of-band exchange. Right before starting")
    L.append("  test i's client, B sends one ICMP echo request with 100+i payload bytes to A (not in")
    L.append("  this file, it only holds udp port 4791): test i's packets are those after its marker")
    L.append("  and before the next one. Tests run strictly one after another.")
    L.append(f"- ICRC recomputed as rxe_icrc.c does (masked IP/UDP/BTH fields, 8 bytes of 1s, CRC-32,"
             f" little-endian on the wire): {icrc_ok} match, {icrc_bad} mismatch.\n")
    L.append("## Which command made which packets\n")
    L.append("| # | test | server (guest A) | client (guest B) | frames | packets | IP | opcodes (count) |")
    L.append("|---|------|------------------|------------------|--------|---------|----|-----------------|")
    for i in sorted(tests):
        t = tests[i]
        pk = per_test.get(i, [])
        frames = f"{pk[0][0]}–{pk[-1][0]}" if pk else "—"
        ops = collections.Counter(p[1] for p in pk)
        ops_s = ", ".join(f"{opname(o)} ({c})" for o, c in sorted(ops.items())) or "—"
        res = "" if t.get("rc_A") == 0 and t.get("rc_B") == 0 else \
            f" **(failed: A rc={t.get('rc_A')}, B rc={t.get('rc_B')})**"
        ipv = "/".join(f"v{v}" for v in sorted({p[5] for p in pk})) or "—"
        L.append(f"| {i} | {t['id']}{res} | `{t['server']}` | `{t['client']}` | {frames} | "
                 f"{len(pk)} | {ipv} | {ops_s} |")
    if per_test.get(None):
        L.append(f"\n{len(per_test[None])} packets came before the first test's marker.")
    L.append("\n## Header field values seen (packets per value)\n")
    for k in sorted(facts):
        vals = ", ".join(f"{v} ({c})" for v, c in sorted(facts[k].items(), key=lambda x: -x[1]))
        L.append(f"- {k}: {vals}")
    L.append("\n## Decode summary\n")
    L.append(f"`{ts_shown}` ({ts_version}; every frame decodes as RRoCE):\n")
    L.append("```")
    L.append(uniq)
    L.append("```\n")
    L.append("Opcode names (IBTA 9.2, table 38):\n")
    L.append("| opcode | name | packets |")
    L.append("|--------|------|---------|")
    for op, c in sorted(total.items()):
        L.append(f"| {op} (0x{op:02x}) | {opname(op)} | {c} |")
    L.append("")
    with open(a.summary, "w") as f:
        f.write("\n".join(L) + "\n")

    with open(a.oob, "w") as f:
        f.write("# TCP payloads of the out-of-band exchanges (frame, time, src -> dst, bytes)\n")
        for port in sorted(oob):
            i = port - BASE_PORT
            name = tests.get(i, {}).get("id", "?")
            f.write(f"\n## port {port}: test {i} {name}\n")
            t0 = oob[port][0][1]
            for n, ts, src, dst, payload in oob[port]:
                text = payload.decode("latin-1")
                printable = all(32 <= ord(c) < 127 or c in "\r\n\t\0" for c in text)
                f.write(f"frame {n} +{ts - t0:.3f}s {src} -> {dst} {len(payload)} bytes\n")
                if printable:
                    f.write("  ascii: " + repr(text) + "\n")
                f.write("  hex:   " + payload.hex() + "\n")
    print(f"summary: {a.summary}; oob: {a.oob}; {nframes} RoCE frames, ICRC ok {icrc_ok} bad {icrc_bad}")


if __name__ == "__main__":
    main()
