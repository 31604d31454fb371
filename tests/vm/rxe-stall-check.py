#!/usr/bin/env python3
"""Does a stalled interop run show the Linux rxe completer bug of docs/interop.md
("A Linux rxe 6.12 requester that never completes a SEND")?

    tests/vm/rxe-stall-check.py --tool IP GUEST-ETH0.pcap [GUEST-IFB0.pcap]

GUEST-ETH0.pcap is the guest's capture on eth0 (its own transmissions after egress netem,
and what arrives before ingress netem); GUEST-IFB0.pcap the capture on ifb0, i.e. what
ingress netem let through to the guest's stack (absent when there was no ingress netem).

The signature, every part of which must be in the captures:
1. the tool's last request packets are a retransmission burst: consecutive PSNs s.. that it
   had sent before, of a message whose LAST (PSN l, AckReq) it had also sent before;
2. an ACK of PSN l reached the tool after the burst began and before the burst's own LAST
   left (or with no LAST in the burst: that one was lost on the way out). rxe's completer
   then moves comp.psn past the WQE without completing it, because the WQE is in state
   "processing", not "pending" (rxe_comp.c, COMPST_WRITE_SEND -> COMPST_UPDATE_COMP);
3. no ACK reached the tool after that (what was sent was dropped by netem);
4. the tool sent no request packet after the burst: its retransmit timer fires, finds
   req.psn == comp.psn and neither retries nor re-arms (rxe_comp.c, COMPST_ERROR_RETRY).
Exit 0 and one line of evidence when all hold; exit 1 saying which part is missing.
"""
import struct
import sys

ACK, SEND_FIRST, SEND_LAST, SEND_LAST_IMM = 17, 0, 2, 3


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        sys.exit(f"{path}: not a classic pcap file")
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack(e + "I", data[20:24])[0]
    off = 24
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        frame = data[off:off + incl]
        off += incl
        ts = sec + frac / (1e9 if nano else 1e6)
        l3 = frame[14:] if linktype == 1 else frame
        if linktype == 1 and frame[12:14] != b"\x08\x00":
            continue
        if len(l3) < 20 + 8 + 12 or l3[0] >> 4 != 4 or l3[9] != 17:
            continue
        ihl = (l3[0] & 15) * 4
        udp = l3[ihl:ihl + 8]
        if struct.unpack("!H", udp[2:4])[0] != 4791:
            continue
        bth = l3[ihl + 8:]
        src = ".".join(str(b) for b in l3[12:16])
        dst = ".".join(str(b) for b in l3[16:20])
        opcode = bth[0]
        psn = struct.unpack("!I", bth[8:12])[0] & 0xFFFFFF
        ackreq = bth[8] >> 7
        syndrome = bth[12] if opcode == ACK and len(bth) >= 16 else None
        yield ts, src, dst, opcode, psn, ackreq, syndrome


def main():
    args = sys.argv[1:]
    if len(args) < 3 or args[0] != "--tool":
        sys.exit(__doc__)
    tool, eth0 = args[1], args[2]
    ifb0 = args[3] if len(args) > 3 else None
    seen = list(frames(eth0))
    sent = [f for f in seen if f[1] == tool]
    arrived = [f for f in seen if f[2] == tool]
    delivered = list(frames(ifb0)) if ifb0 else arrived

    def fail(why):
        print(f"rxe-stall-check: no: {why}")
        sys.exit(1)

    requests = [f for f in sent if f[3] < 0x10]  # RC requests are opcodes 0x00-0x0f
    if not requests:
        fail("the tool sent no request")
    # The burst: the longest run of consecutive PSNs that ends with the last request.
    i = len(requests) - 1
    while i > 0 and requests[i - 1][4] == (requests[i][4] - 1) & 0xFFFFFF:
        i -= 1
    burst, before = requests[i:], requests[:i]
    if not any(r[4] == burst[0][4] for r in before):
        fail(f"the tool's last requests (PSN {burst[0][4]}..{burst[-1][4]}) are not a retransmission")
    lasts = [r for r in before if r[3] in (SEND_LAST, SEND_LAST_IMM) and r[5]
             and (r[4] - burst[0][4]) & 0xFFFFFF < 0x800000]
    if not lasts:
        fail(f"no SEND LAST with AckReq at or after PSN {burst[0][4]} before the retransmission")
    l = min(lasts, key=lambda r: (r[4] - burst[0][4]) & 0xFFFFFF)[4]
    retx_last = [r for r in burst if r[4] == l]
    until = retx_last[0][0] if retx_last else float("inf")
    mid = [a for a in delivered if a[3] == ACK and a[4] == l and (a[6] or 0) & 0x60 == 0
           and burst[0][0] < a[0] < until]
    if not mid:
        fail(f"no ACK of PSN {l} reached the tool while it retransmitted PSN {burst[0][4]}..{l}")
    late = [a for a in delivered if a[3] == ACK and a[0] > max(mid[0][0], until if retx_last else 0)]
    if late:
        fail(f"{len(late)} ACK(s) reached the tool after that")
    dropped = len([a for a in arrived if a[3] == ACK and a[0] > mid[0][0]])
    how = (f"before the retransmitted LAST left ({(until - mid[0][0]) * 1e3:.2f} ms later)" if retx_last
           else "and the retransmitted LAST never left the guest (egress netem)")
    print(f"rxe-stall-check: yes: the tool retransmitted from PSN {burst[0][4]}; the ACK of {l} "
          f"(its message's last PSN) reached it {(mid[0][0] - burst[0][0]) * 1e3:.2f} ms after the "
          f"retransmission began, {how}; {dropped} later ACK(s) were dropped by netem; "
          f"the tool sent no request after that")

if __name__ == "__main__":
    main()
