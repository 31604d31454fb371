#!/usr/bin/env python3
"""UDP source ports of the RoCE packets in a capture, against the rules Linux rxe follows.

    tests/vm/sport-check.py CAPTURE.pcapng [--max-len N]

Every RoCEv2 packet must come from the port its QP gets (rdma_get_udp_sport() and rxe):
- UD (opcodes 0x64, 0x65): 0xc000 + hash_32(source QPN, 14), the source QPN from its DETH;
- RC/UC: the fold of the address vector's flow label, or, with none, of the product of both
  QPNs: the same port both ways. A connection made by the verbs tools (no flow label) must
  use the port of its two QPNs (its destination QPN and that of the flow back on the port).
  A connection rdma_cm made (a CM REQ names one of its QPNs) carries the flow label rdma_cm
  gave its address vectors, which IPv4 does not show: both ways must use one port, which is
  then the one Linux rxe picks for it when rxe is one end (the rxe modes of
  tests/vm/guest-pair.test.sh).
No packet may come from 4791, be an IP fragment, or (with --max-len) be longer than N bytes of
IP; no ICMP "destination unreachable" may quote RoCE.

Prints the wrong flows (at most 5), then one line:
    ROCE FLOWS QPN_PORTS CM_PORTS PORTS WRONG TOO_LONG FRAGMENTS ICMP_ROCE ICMP_OTHER
and exits 1 if anything is wrong (or there is no RoCE at all), 2 if the capture is unreadable.
"""
import subprocess
import sys

FIELDS = [
    "ip.src", "ip.dst", "udp.srcport", "udp.dstport", "infiniband.bth.opcode",
    "infiniband.bth.destqp", "infiniband.deth.srcqp", "ip.len", "ip.flags.mf",
    "ip.frag_offset", "icmp.type", "infiniband.cm.req.localqpn", "infiniband.cm.rep.localqpn",
]


def fold(fl):
    return ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000


def rc_port(l, r):
    v = l * r
    return fold((v ^ (v >> 20) ^ (v >> 40)) & 0xFFFFF)


def ud_port(q):
    return 0xC000 + ((((q * 0x61C88647) & 0xFFFFFFFF) >> 18) & 0x3FFF)


def num(x):
    return int(x.split(",")[0], 0)


def main():
    path = sys.argv[1]
    max_len = int(sys.argv[sys.argv.index("--max-len") + 1]) if "--max-len" in sys.argv else None
    cmd = ["tshark", "-n", "-r", path, "-T", "fields"] + [a for f in FIELDS for a in ("-e", f)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"sport-check: cannot read {path}: {e}")
        sys.exit(2)
    flows, bad, cm_qpns = {}, [], set()
    roce = too_long = frags = icmp_roce = icmp_other = 0
    for line in out.splitlines():
        f = (line.split("\t") + [""] * len(FIELDS))[: len(FIELDS)]
        src, dst, sport, dport, op, dqp, sqp, iplen, mf, foff, icmp, req_q, rep_q = f
        # the outermost headers (a payload tshark decodes as more headers repeats the fields)
        src, dst, dport = src.split(",")[0], dst.split(",")[0], dport.split(",")[0]
        if icmp:
            if icmp.split(",")[0] == "3" and "4791" in dport:
                icmp_roce += 1
            else:
                icmp_other += 1
            continue
        if dport != "4791" or not op:
            continue
        roce += 1
        for q in (req_q, rep_q):
            if q:
                cm_qpns.add(num(q))
        if max_len is not None and num(iplen) > max_len:
            too_long += 1
        if mf in ("1", "True") or (foff and num(foff) != 0):
            frags += 1
        port, op, dqp = num(sport), num(op), num(dqp)
        if port == 4791:
            bad.append(f"{src}->{dst} qp {dqp:#x}: from port 4791")
        if op in (0x64, 0x65):
            if not sqp or port != ud_port(num(sqp)):
                bad.append(f"UD {src}->{dst} from qp {sqp or '?'}: port {port:#x}")
            continue
        flows.setdefault((src, dst, dqp), set()).add(port)
    by_qpns = by_cm = 0
    for (src, dst, dqp), ports in flows.items():
        if len(ports) != 1:
            bad.append(f"{src}->{dst} qp {dqp:#x}: ports {sorted(hex(p) for p in ports)}")
            continue
        p = next(iter(ports))
        back = [q for (s, d, q), pp in flows.items() if s == dst and d == src and p in pp]
        if any(rc_port(dqp, q) == p for q in back):
            by_qpns += 1
        elif back and (dqp in cm_qpns or any(q in cm_qpns for q in back)):
            by_cm += 1
        else:
            bad.append(f"{src}->{dst} qp {dqp:#x} port {p:#x}: no flow back on it"
                       + (" (an rdma_cm connection)" if dqp in cm_qpns else " of their two QPNs"))
    for b in bad[:5]:
        print("  " + b)
    ports = len({next(iter(p)) for p in flows.values()})
    print(f"{roce} {len(flows)} {by_qpns} {by_cm} {ports} {len(bad)} {too_long} {frags} {icmp_roce} {icmp_other}")
    sys.exit(1 if bad or roce == 0 or too_long or frags or icmp_roce else 0)


if __name__ == "__main__":
    main()
