#!/usr/bin/env python3
"""Where the microseconds of one guest round trip go, seen from the host.

    latency-trace.py --qemu PID --daemon PID [--seconds S] [--keep FILE]

Records the system calls and scheduler switches of one QEMU process and the daemon serving
its virtio-rdma device for S seconds (perf, raw_syscalls and sched tracepoints, those two
processes only), then cuts the timeline at the eventfds the two share, which it finds by
their eventfd-id in /proc/PID/fdinfo:

    kick    a QEMU thread writes a shared eventfd: the guest rang a doorbell (a virtqueue
            notify, which QEMU turns into the kick eventfd's write: a TCG exit)
    wake    the daemon reads that eventfd (its worker woke up for it)
    call    the daemon writes a shared eventfd: an interrupt for the guest (CQ event,
            control reply)
    inject  QEMU's main loop reads that eventfd (it injects the interrupt next)

and prints each stage's median, 90th percentile and count, in microseconds:

    kick -> wake      the host scheduler, kick to the daemon's worker
    wake -> call      the daemon: the doorbell, the engine, the UDP send and receive, the
                      CQE written, the event queued (wakes that call no one are not counted)
    wake -> idle      the daemon's busy time per wake-up (to its next epoll_wait)
    call -> inject    the host scheduler, the interrupt's eventfd to QEMU's main loop
    inject -> kick    everything inside the guest: QEMU's interrupt injection, the guest's
                      interrupt handler, the application's wake-up, its next post and the
                      doorbell's exit; under TCG all of it emulated
    idle -> kick      (poll mode, no call in between) from the daemon going idle to the next
                      doorbell: the guest polling the CQE the daemon wrote, then posting
    kick -> kick      one period of the guest's doorbells

System call numbers are x86-64's. Exits 2 when perf is missing or fails, or the processes
share no eventfd.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

NR = {"read": 0, "write": 1, "epoll_wait": 232, "epoll_pwait": 281, "epoll_pwait2": 441}


def eventfds(pid):
    """fd -> eventfd-id of one process."""
    out = {}
    d = f"/proc/{pid}/fdinfo"
    for fd in os.listdir(d):
        try:
            text = open(os.path.join(d, fd)).read()
        except OSError:
            continue
        m = re.search(r"^eventfd-id:\s*(\d+)", text, re.M)
        if m:
            out[int(fd)] = int(m[1])
    return out


def threads(pid):
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


LINE = re.compile(r"^\s*(\d+)\s+(\d+\.\d+):\s+(\S+):\s*(.*)$")


def parse(script, qemu, daemon, q_fds, d_fds):
    """The timeline: (time_us, kind) with kind one of kick, wake, call, inject, idle."""
    ev = []
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        tid, t, name, rest = int(m[1]), float(m[2]) * 1e6, m[3], m[4]
        if name != "raw_syscalls:sys_enter":
            continue
        a = re.match(r"NR (\d+) \(([0-9a-f]+)", rest)
        if not a:
            continue
        nr, fd = int(a[1]), int(a[2], 16)
        if tid in qemu:
            if nr == NR["write"] and fd in q_fds:
                ev.append((t, "kick"))
            elif nr == NR["read"] and fd in q_fds:
                ev.append((t, "inject"))
        elif tid in daemon:
            if nr == NR["read"] and fd in d_fds:
                ev.append((t, "wake"))
            elif nr == NR["write"] and fd in d_fds:
                ev.append((t, "call"))
            elif nr in (NR["epoll_wait"], NR["epoll_pwait"], NR["epoll_pwait2"]):
                ev.append((t, "idle"))
    ev.sort()
    return ev


# The stages that end at an event of the kind on the left and start at the latest event of
# the kind on the right, counted when that one came after the previous event of the left kind.
SPANS = {"wake": "kick", "call": "wake", "inject": "call", "idle": "wake"}


def stages(ev):
    """Each stage's samples in microseconds."""
    out = {k: [] for k in ("kick -> wake", "wake -> call", "wake -> idle", "call -> inject",
                           "inject -> kick", "idle -> kick", "kick -> kick")}
    last = {}
    for t, kind in ev:
        if kind == "kick":
            if "kick" in last:
                out["kick -> kick"].append(t - last["kick"])
            if "inject" in last and last["inject"] > last.get("kick", -1):
                out["inject -> kick"].append(t - last["inject"])
            elif "idle" in last and last["idle"] > last.get("kick", -1) and \
                    last.get("call", -1) < last.get("kick", -1):
                out["idle -> kick"].append(t - last["idle"])
        else:
            start = SPANS[kind]
            if start in last and last[start] > last.get(kind, -1):
                out[f"{start} -> {kind}"].append(t - last[start])
        last[kind] = t
    return out


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qemu", type=int, required=True)
    ap.add_argument("--daemon", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--keep", help="keep perf's data in this file")
    a = ap.parse_args()
    q_ev, d_ev = eventfds(a.qemu), eventfds(a.daemon)
    shared = set(q_ev.values()) & set(d_ev.values())
    if not shared:
        print(f"latency-trace: processes {a.qemu} and {a.daemon} share no eventfd")
        sys.exit(2)
    q_fds = {fd for fd, i in q_ev.items() if i in shared}
    d_fds = {fd for fd, i in d_ev.items() if i in shared}
    if a.keep:
        data = a.keep
    else:
        with tempfile.NamedTemporaryFile(prefix="latency-trace.", suffix=".perf", delete=False) as f:
            data = f.name
    rec = ["perf", "record", "-q", "-o", data, "-e", "raw_syscalls:sys_enter",
           "-e", "sched:sched_switch", "-p", f"{a.qemu},{a.daemon}", "--", "sleep", str(a.seconds)]
    try:
        subprocess.run(rec, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        script = subprocess.run(["perf", "script", "-i", data, "-F", "tid,time,event,trace"],
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"latency-trace: perf failed: {e}")
        sys.exit(2)
    finally:
        if not a.keep and os.path.exists(data):
            os.unlink(data)
    ev = parse(script, threads(a.qemu), threads(a.daemon), q_fds, d_fds)
    s = stages(ev)
    print(f"latency-trace: {a.seconds:g} s, {len(shared)} shared eventfds, "
          f"{sum(1 for _, k in ev if k == 'kick')} kicks, {sum(1 for _, k in ev if k == 'call')} calls")
    print(f"{'stage':<16} {'median us':>10} {'p90 us':>10} {'count':>7}")
    for k, v in s.items():
        if v:
            print(f"{k:<16} {statistics.median(v):>10.1f} {pct(v, 0.9):>10.1f} {len(v):>7}")
        else:
            print(f"{k:<16} {'-':>10} {'-':>10} {0:>7}")


if __name__ == "__main__":
    main()
