#!/usr/bin/env bash
# tests/vm/latency-trace.py cuts a timeline at the right system calls: a written perf script
# output (two event-mode round trips and one poll-mode one, times chosen so that every stage
# has a known length) must give those lengths, and calls on eventfds the two processes do not
# share, or by other threads, must not count. No perf, no QEMU: the parser and the stages only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python3 - "$here/../vm" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import importlib
lt = importlib.import_module("latency-trace")

QEMU, VCPU, DAEMON, OTHER = 100, 101, 200, 300
q_fds, d_fds = {0x1d, 0x21}, {0x15, 0x1f}


def sc(tid, t_us, nr, fd):
    return f" {tid} {t_us / 1e6:.6f}: raw_syscalls:sys_enter: NR {nr} ({fd:x}, 0, 8, 0, 0, 0)"


lines = []
t = 1000.0
for _ in range(2):  # event mode: kick, wake, call, inject, next kick
    lines += [sc(VCPU, t, 1, 0x1d),             # kick
              sc(DAEMON, t + 30, 0, 0x1f),      # wake: kick -> wake 30
              sc(DAEMON, t + 70, 1, 0x15),      # call: wake -> call 40
              sc(DAEMON, t + 80, 232, 0xe),     # idle: wake -> idle 50
              sc(QEMU, t + 120, 0, 0x21),       # inject: call -> inject 50
              sc(VCPU, t + 121, 1, 0x7),        # a write to an eventfd not shared: ignored
              sc(OTHER, t + 122, 1, 0x1d),      # another process: ignored
              ]
    t += 250                                    # inject -> kick 130, kick -> kick 250
lines += [sc(VCPU, t, 1, 0x1d),                 # the next kick (event mode's last)
          sc(DAEMON, t + 20, 0, 0x1f),          # kick -> wake 20
          sc(DAEMON, t + 30, 232, 0xe),         # wake -> idle 10
          sc(VCPU, t + 60, 1, 0x1d)]            # poll mode: idle -> kick 30
ev = lt.parse("\n".join(lines), {QEMU, VCPU}, {DAEMON}, q_fds, d_fds)
s = lt.stages(ev)
want = {"kick -> wake": [30, 30, 20], "wake -> call": [40, 40], "wake -> idle": [50, 50, 10],
        "call -> inject": [50, 50], "inject -> kick": [130, 130], "idle -> kick": [30],
        "kick -> kick": [250, 250, 60]}
fail = 0
for k, v in want.items():
    got = [round(x) for x in s[k]]
    if got == v:
        print(f"ok: {k} {got}")
    else:
        print(f"FAIL: {k}: want {v}, got {got}")
        fail = 1
sys.exit(fail)
PY
