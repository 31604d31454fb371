#!/usr/bin/env python3
"""The transport headers the tap's kernel program parsed (`vhost-user-rdma tap --decode`),
checked against two references that do not share its code:

  tap-headers.py craft EXPECTED --src IP --dst IP
      sends one RoCEv2 datagram (UDP 4791, from SRC to DST) per opcode of RC, UC, UD and RD,
      plus CNP, FLUSH, ATOMIC_WRITE and frames cut inside an extension header, every field
      random (fixed seed); writes the line the tap must print for each to EXPECTED.
  tap-headers.py expect DECODE EXPECTED [--prefix "IF DIR"]
      the DECODE lines with that prefix are exactly the EXPECTED lines, in order.
  tap-headers.py tshark DECODE PCAP [--prefix "IF DIR"]
      each frame of PCAP, as Wireshark's dissector (tshark) decodes it, gives the same line as
      the tap printed for it (the DECODE lines with that prefix, in order). Opcodes tshark does
      not know (RD, FLUSH, ATOMIC_WRITE, CNP) and frames the tap marked truncated are counted
      and skipped; every other frame is compared field by field.

The line format is the one of tap/src/roce.rs `describe` (the opcode name is not compared).
Exit 0 when all match, 1 with the first differences printed.
"""
import random
import socket
import struct
import subprocess
import sys

# Extension headers by operation (low five opcode bits), IBTA 9.2 Table 38 and IBTA 1.5
# (0x1c FLUSH: FETH then RETH; 0x1d ATOMIC_WRITE: RETH). Written out here as a table, apart
# from the bit sets of the C program.
OPS = {
    0x00: [], 0x01: [], 0x02: [], 0x03: ["imm"], 0x04: [], 0x05: ["imm"],
    0x06: ["reth"], 0x07: [], 0x08: [], 0x09: ["imm"], 0x0A: ["reth"], 0x0B: ["reth", "imm"],
    0x0C: ["reth"], 0x0D: ["aeth"], 0x0E: [], 0x0F: ["aeth"], 0x10: ["aeth"], 0x11: ["aeth"],
    0x12: ["aeth", "atomicack"], 0x13: ["atomic"], 0x14: ["atomic"],
    0x16: ["ieth"], 0x17: ["ieth"], 0x1C: ["feth", "reth"], 0x1D: ["reth"],
}
UC_OPS = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B]
SIZE = {"rdeth": 4, "deth": 8, "feth": 4, "reth": 16, "atomic": 28, "aeth": 4, "atomicack": 8,
        "imm": 4, "ieth": 4}


def headers(op):
    """The extension headers of opcode `op`, in wire order."""
    t, low = op >> 5, op & 0x1F
    if t == 3:
        return {0x04: ["deth"], 0x05: ["deth", "imm"]}.get(low, [])
    if t > 3 or low not in OPS:
        return []
    x = OPS[low]
    if t == 2:
        return ["rdeth"] + ([] if "aeth" in x else ["deth"]) + x
    return x


def line(op, f, hs, truncated):
    """The tap's line for a frame with BTH fields f and headers hs (name left out)."""
    b1 = f["b1"]
    s = (f"op=0x{op:02x} dqpn=0x{f['dqpn']:06x} psn={f['psn']} a={f['a']} se={b1 >> 7} "
         f"m={(b1 >> 6) & 1} pad={(b1 >> 4) & 3} tver={b1 & 15} pkey=0x{f['pkey']:04x}")
    for h in hs:
        if h == "rdeth":
            s += f" rdeth.ee=0x{f['ee']:06x}"
        elif h == "deth":
            s += f" deth.qkey=0x{f['qkey']:08x} deth.sqpn=0x{f['sqpn']:06x}"
        elif h == "feth":
            s += f" feth=0x{f['feth']:08x}"
        elif h == "reth":
            s += f" reth.va=0x{f['va']:016x} reth.rkey=0x{f['rkey']:08x} reth.len={f['len']}"
        elif h == "atomic":
            s += (f" atomic.va=0x{f['va']:016x} atomic.rkey=0x{f['rkey']:08x}"
                  f" atomic.swap=0x{f['swap']:016x} atomic.cmp=0x{f['cmp']:016x}")
        elif h == "aeth":
            s += f" aeth.syn=0x{f['syn']:02x} aeth.msn={f['msn']}"
        elif h == "atomicack":
            s += f" atomicack.orig=0x{f['orig']:016x}"
        elif h == "imm":
            s += f" imm=0x{f['imm']:08x}"
        elif h == "ieth":
            s += f" ieth.rkey=0x{f['irkey']:08x}"
    return s + (" truncated" if truncated else "")


def emit(op, f, h):
    if h == "rdeth":
        return struct.pack("!I", f["ee"])
    if h == "deth":
        return struct.pack("!II", f["qkey"], f["sqpn"])
    if h == "feth":
        return struct.pack("!I", f["feth"])
    if h == "reth":
        return struct.pack("!QII", f["va"], f["rkey"], f["len"])
    if h == "atomic":
        return struct.pack("!QIQQ", f["va"], f["rkey"], f["swap"], f["cmp"])
    if h == "aeth":
        return struct.pack("!I", f["syn"] << 24 | f["msn"])
    if h == "atomicack":
        return struct.pack("!Q", f["orig"])
    if h == "imm":
        return struct.pack("!I", f["imm"])
    return struct.pack("!I", f["irkey"])


def craft(expected, src, dst):
    rnd = random.Random(4791)
    ops = ([op for op in range(0x20) if op in OPS] + [0x20 | op for op in UC_OPS]
           + [0x40 | op for op in OPS if op not in (0x1C, 0x1D)] + [0x64, 0x65, 0x81])
    frames = []
    for op in ops:
        frames.append((op, None))
    # Cut inside the last header, for a few shapes.
    for op in (0x11, 0x0A, 0x13, 0x12, 0x64, 0x65, 0x1C):
        frames.append((op, 1 + rnd.randrange(SIZE[headers(op)[-1]] - 1)))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    out = []
    for op, cut in frames:
        f = {"b1": rnd.randrange(256), "pkey": rnd.randrange(1 << 16),
             "dqpn": rnd.randrange(1 << 24), "a": rnd.randrange(2), "psn": rnd.randrange(1 << 24),
             "ee": rnd.randrange(1 << 24), "qkey": rnd.randrange(1 << 32),
             "sqpn": rnd.randrange(1 << 24), "feth": rnd.randrange(1 << 32),
             "va": rnd.randrange(1 << 64), "rkey": rnd.randrange(1 << 32),
             "len": rnd.randrange(1 << 32), "swap": rnd.randrange(1 << 64),
             "cmp": rnd.randrange(1 << 64), "syn": rnd.randrange(256),
             "msn": rnd.randrange(1 << 24), "orig": rnd.randrange(1 << 64),
             "imm": rnd.randrange(1 << 32), "irkey": rnd.randrange(1 << 32)}
        hs = headers(op)
        bth = struct.pack("!BBHII", op, f["b1"], f["pkey"], f["dqpn"], f["a"] << 31 | f["psn"])
        body = b"".join(emit(op, f, h) for h in hs)
        if cut is None:
            # Some payload, then 4 bytes where the ICRC goes (not computed: the header parser
            # does not look at it).
            pkt = bth + body + bytes(rnd.randrange(4, 64)) + bytes(4)
            out.append(line(op, f, hs, False))
        else:
            pkt = bth + body[: len(body) - SIZE[hs[-1]] + cut]
            out.append(line(op, f, hs[:-1], True))
        s.sendto(pkt, (dst, 4791))
    with open(expected, "w") as w:
        w.write("".join(x + "\n" for x in out))
    print(f"sent {len(frames)} crafted frames ({len(ops)} opcodes, "
          f"{len(frames) - len(ops)} cut inside a header) from {src} to {dst}")


def decoded(path, prefix):
    """The tap's --decode lines ("IF DIR op=.. NAME ...") that start with `prefix`, without
    interface, direction and opcode name."""
    out = []
    with open(path) as r:
        for x in r:
            if prefix and not x.startswith(prefix + " "):
                continue
            t = x.split()
            out.append(" ".join(t[2:3] + t[4:]))
    return out


def expect(decode, expected, prefix):
    got = decoded(decode, prefix)
    want = []
    with open(expected) as r:
        for x in r:
            want.append(x.strip())
    return compare(got, want, "the crafted frames", len(want))


FIELDS = ["frame.number", "infiniband.bth.opcode", "infiniband.bth.se", "infiniband.bth.m",
          "infiniband.bth.padcnt", "infiniband.bth.tver", "infiniband.bth.p_key",
          "infiniband.bth.destqp", "infiniband.bth.a", "infiniband.bth.psn",
          "infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.reth.va",
          "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.atomiceth.swapdt",
          "infiniband.atomiceth.cmpdt", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
          "infiniband.atomicacketh.origremdt", "infiniband.immdt", "infiniband.ieth"]


def num(v):
    v = v.strip()
    if v in ("True", "False"):
        return int(v == "True")
    return int(v, 16) if v.startswith("0x") else int(v)


def tshark_lines(pcap):
    args = ["tshark", "-n", "-r", pcap, "-T", "fields", "-E", "occurrence=f"]
    for f in FIELDS:
        args += ["-e", f]
    res = subprocess.run(args, capture_output=True, text=True, check=True)
    out = []
    for row in res.stdout.splitlines():
        v = dict(zip(FIELDS, row.split("\t")))
        g = lambda k: v.get("infiniband." + k, "")
        if not g("bth.opcode"):
            out.append(None)
            continue
        op = num(g("bth.opcode"))
        f = {"b1": num(g("bth.se")) << 7 | num(g("bth.m")) << 6 | num(g("bth.padcnt")) << 4
             | num(g("bth.tver")), "pkey": num(g("bth.p_key")), "dqpn": num(g("bth.destqp")),
             "a": num(g("bth.a")), "psn": num(g("bth.psn"))}
        hs = []
        if g("deth.q_key"):
            hs.append("deth")
            f["qkey"], f["sqpn"] = num(g("deth.q_key")), num(g("deth.srcqp"))
        if g("atomiceth.swapdt"):
            hs.append("atomic")
            f["swap"], f["cmp"] = num(g("atomiceth.swapdt")), num(g("atomiceth.cmpdt"))
            f["va"], f["rkey"] = num(g("reth.va")), num(g("reth.r_key"))
        elif g("reth.va"):
            hs.append("reth")
            f["va"], f["rkey"], f["len"] = (num(g("reth.va")), num(g("reth.r_key")),
                                            num(g("reth.dmalen")))
        if g("aeth.syndrome"):
            hs.append("aeth")
            f["syn"], f["msn"] = num(g("aeth.syndrome")), num(g("aeth.msn"))
        if g("atomicacketh.origremdt"):
            hs.append("atomicack")
            f["orig"] = num(g("atomicacketh.origremdt"))
        if g("immdt"):
            hs.append("imm")
            f["imm"] = int(g("immdt").replace(":", ""), 16)
        if g("ieth"):
            hs.append("ieth")
            f["irkey"] = int(g("ieth").replace(":", ""), 16)
        out.append((op, line(op, f, hs, False)))
    return out


def by_tshark(decode, pcap, prefix):
    got = decoded(decode, prefix)
    ref = tshark_lines(pcap)
    if len(got) != len(ref):
        print(f"FAIL: the tap printed {len(got)} lines, {pcap} has {len(ref)} frames")
        return 1
    g2, w2, skipped = [], [], 0
    for g, r in zip(got, ref):
        op = int(g.split()[0][3:], 16)
        unknown = op >> 5 == 2 or op >= 0x80 or (op & 0x1F) in (0x1C, 0x1D)
        if unknown or g.endswith(" truncated"):
            skipped += 1
            continue
        g2.append(g)
        w2.append(r[1] if r else "(tshark: not RoCE)")
    rc = compare(g2, w2, f"tshark's decoding of {pcap}", len(ref))
    if skipped:
        print(f"  ({skipped} frames with opcodes tshark does not decode or cut short: not compared)")
    return rc


def compare(got, want, what, total):
    bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    if len(got) != len(want):
        print(f"FAIL: the tap printed {len(got)} lines, {what}: {len(want)}")
        return 1
    if bad:
        print(f"FAIL: {len(bad)} of {len(got)} frames differ from {what}; first ones:")
        for i, g, w in bad[:5]:
            print(f"  frame {i + 1}:\n    tap:  {g}\n    want: {w}")
        return 1
    print(f"{len(got)} of {total} frames: every header field as in {what}")
    return 0


def main(a):
    prefix = ""
    if "--prefix" in a:
        i = a.index("--prefix")
        prefix = a[i + 1]
        del a[i:i + 2]
    if len(a) == 6 and a[0] == "craft" and a[2] == "--src" and a[4] == "--dst":
        craft(a[1], a[3], a[5])
        return 0
    if len(a) == 3 and a[0] == "expect":
        return expect(a[1], a[2], prefix)
    if len(a) == 3 and a[0] == "tshark":
        return by_tshark(a[1], a[2], prefix)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
