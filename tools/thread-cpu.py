#!/usr/bin/env python3
"""Where the CPU goes while a program runs: every INTERVAL seconds, the CPU time of the
threads of the processes named NAME and their context switches, summed by thread name
(braid-proxy0, braid-sock1, ...), and the whole machine's split (user, system, softirq, idle), as percent of one CPU.

  python3 tools/thread-cpu.py NAME [interval=2] [samples=30]

Stops when no process named NAME is left (after one appeared) or after `samples` samples.
Reads /proc only; changes nothing.
"""
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def threads(name):
    """{(pid, tid): (thread name, cpu ticks, context switches)} of the processes named `name`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != name[:15]:
                    continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    s = f.read()
                comm = s[s.index("(") + 1:s.rindex(")")]
                fields = s[s.rindex(")") + 2:].split()
                switches = 0
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if "ctxt_switches" in line:
                            switches += int(line.split()[-1])
                # utime + stime, context switches (voluntary + not)
                out[(pid, tid)] = (comm, int(fields[11]) + int(fields[12]), switches)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
    return out


def machine():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return {"user": v[0] + v[1], "system": v[2], "idle": v[3] + v[4], "irq": v[5],
            "softirq": v[6], "steal": v[7] if len(v) > 7 else 0}


def main():
    name = sys.argv[1]
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    seen = False
    before, mbefore = threads(name), machine()
    for i in range(samples):
        time.sleep(interval)
        now, mnow = threads(name), machine()
        if not now:
            if seen:
                break
            before, mbefore = now, mnow
            continue
        seen = True
        groups = {}
        for key, (comm, ticks, switches) in now.items():
            prev = before.get(key, (comm, 0, 0))
            g = groups.setdefault(comm, [0, 0, 0])
            g[0] += ticks - prev[1]
            g[1] += 1
            g[2] += switches - prev[2]
        total = sum(g[0] for g in groups.values())
        mtot = sum(mnow[k] - mbefore[k] for k in mnow) or 1
        split = " ".join(f"{k} {100.0 * (mnow[k] - mbefore[k]) / mtot:.0f}%" for k in mnow)
        print(f"t={i * interval + interval:.0f}s {name}: {100.0 * total / TICK / interval:.0f}% of a CPU "
              f"in {len(now)} threads; machine ({os.cpu_count()} CPUs): {split}")
        for comm, (ticks, count, switches) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:12]:
            if ticks:
                print(f"    {comm:16s} x{count:<3d} {100.0 * ticks / TICK / interval:6.0f}%  "
                      f"{switches / interval:8.0f} switches/s")
        sys.stdout.flush()
        before, mbefore = now, mnow


if __name__ == "__main__":
    main()
