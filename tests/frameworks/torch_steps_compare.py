"""Sets torch_steps.py's results on Braid and on PyTorch's NCCL side by side (run_torch_steps.sh
calls it).

  torch_steps_compare.py OUT_DIR BRAID_LIB_DIR [--markdown FILE]

OUT_DIR holds braid_r1, nccl_r1, braid_r2, ... (one folder per run, a rankN.json per rank). A
run's time for a part is its slowest rank's (a step, or a collective, ends when every rank's
does); a library's time is its best run's, and the table also gives each library's range over
its runs. Ratio = NCCL time / Braid time (above 1: Braid is
faster). Times are reported, never judged here.

Fails (exit 1) when: a run's calls did not go to the library it was meant for; a collective's
result was wrong; a training loop did not lower its loss (then equal losses would prove
nothing); or a step's loss on Braid differs from NCCL's by more than the reduction order can
explain (DDP in float32: 1e-5 relative; FSDP2, bfloat16 compute and float32 reduction: 1e-3).
"""
import json
import os
import re
import sys

LOSS_TOL = {"ddp": 1e-5, "fsdp2": 1e-3}


def load(d):
    ranks = []
    for name in sorted(os.listdir(d)):
        if re.fullmatch(r"rank\d+\.json", name):
            with open(os.path.join(d, name)) as f:
                ranks.append(json.load(f))
    if not ranks:
        sys.exit("no results in %s" % d)
    return sorted(ranks, key=lambda r: r["rank"])


def runs_of(out):
    runs = {"braid": [], "nccl": []}
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(braid|nccl)_r(\d+)", name)
        if m and os.path.isdir(os.path.join(out, name)):
            runs[m.group(1)].append((name, load(os.path.join(out, name))))
    return runs


def check_run(label, ranks, want_braid, libdir, bad):
    for r in ranks:
        owner = r.get("ncclAllReduce_from") or ""
        is_braid = owner.startswith(libdir + os.sep) and (r.get("braid_banner") or "").startswith("Braid")
        if is_braid != want_braid:
            bad.append("%s rank %d: ncclAllReduce comes from %s, Braid's banner %s" % (
                label, r["rank"], owner, r.get("braid_banner")))
        for name, c in r.get("colls", {}).items():
            if c["check"] != "ok":
                bad.append("%s rank %d %s: %s" % (label, r["rank"], name, c["check"]))
        for part in ("ddp", "fsdp2"):
            if part in r and not r[part]["losses"][-1] < (1 - 1e-3) * r[part]["losses"][0]:
                bad.append("%s rank %d %s: the loss went from %.6g to %.6g only" % (
                    label, r["rank"], part, r[part]["losses"][0], r[part]["losses"][-1]))


def run_times(runs, key):
    """Each run's time for `key` (a function of a rank's result): its slowest rank's."""
    return [max(key(r) for r in ranks) for _, ranks in runs]


def best(runs, key):
    """The best run's time for `key`."""
    times = run_times(runs, key)
    return min(times) if times else None


def spread(runs, key, fmt):
    """The runs' times for `key` as "lowest-highest" (one run: its time)."""
    t = run_times(runs, key)
    return fmt % min(t) if len(t) < 2 else (fmt + "-" + fmt) % (min(t), max(t))


def main():
    out, libdir = sys.argv[1], os.path.realpath(sys.argv[2])
    md = sys.argv[sys.argv.index("--markdown") + 1] if "--markdown" in sys.argv else None
    runs = runs_of(out)
    if not runs["braid"] or not runs["nccl"]:
        sys.exit("need runs of both libraries in %s (found %s)" % (
            out, ", ".join(n for lib in runs.values() for n, _ in lib) or "none"))
    bad = []
    for lib, want in (("braid", True), ("nccl", False)):
        for name, ranks in runs[lib]:
            check_run(name, ranks, want, libdir, bad)
    first_b, first_n = runs["braid"][0][1], runs["nccl"][0][1]
    worst = {}
    for part, tol in LOSS_TOL.items():
        if part not in first_b[0] or part not in first_n[0]:
            continue
        worst[part] = 0.0
        for b, n in zip(first_b, first_n):
            for step, (lb, ln) in enumerate(zip(b[part]["losses"], n[part]["losses"])):
                rel = abs(lb - ln) / max(abs(ln), 1e-30)
                worst[part] = max(worst[part], rel)
                if rel > tol:
                    bad.append("%s rank %d step %d: loss %.9g on Braid, %.9g on NCCL" % (
                        part, b["rank"], step, lb, ln))
                    break
    r0 = first_b[0]
    lines = ["PyTorch %s, %d ranks; Braid %s, NCCL %s; best of %d and %d runs" % (
        r0["torch"], r0["world"], r0.get("braid_banner"), first_n[0].get("nccl_version"),
        len(runs["braid"]), len(runs["nccl"])), "",
        "| what | Braid | NCCL | NCCL / Braid | Braid runs | NCCL runs |",
        "|---|---|---|---|---|---|"]
    for part, what in (("ddp", "DDP step, ms"), ("fsdp2", "FSDP2 step, ms")):
        if part in r0:
            key = lambda r, p=part: r[p]["step_ms"]  # noqa: E731
            b, n = best(runs["braid"], key), best(runs["nccl"], key)
            lines.append("| %s (%d M parameters, %s; worst loss difference %.2g) | %.2f | %.2f | %.3f | %s | %s |" % (
                what, r0[part]["params"] // 1000000, r0[part]["dtype"], worst.get(part, 0.0), b, n, n / b,
                spread(runs["braid"], key, "%.2f"), spread(runs["nccl"], key, "%.2f")))
    for name in r0.get("colls", {}):
        key = lambda r, k=name: r["colls"][k]["us"]  # noqa: E731
        b, n = best(runs["braid"], key), best(runs["nccl"], key)
        lines.append("| %s, us | %.1f | %.1f | %.3f | %s | %s |" % (
            name, b, n, n / b, spread(runs["braid"], key, "%.1f"), spread(runs["nccl"], key, "%.1f")))
    text = "\n".join(lines)
    print(text)
    if md:
        with open(md, "w") as f:
            f.write(text + "\n")
    for b in bad:
        print("FAIL: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
