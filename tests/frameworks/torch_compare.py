"""Compares torch_check.py's results on Braid and on NCCL (run_torch.sh calls it).

  torch_compare.py BRAID_DIR NCCL_DIR BRAID_LIB_DIR

Fails (exit 1) when: training did not lower the loss by 2%; ncclAllReduce did not resolve to
Braid's libnccl.so.2 (with Braid's banner reachable) in the Braid run, or did in the NCCL run;
a collective was wrong on either; a step's loss differs by more than fp32 rounding allows.
Prints the step times side by side.
"""
import json
import os
import sys

REL_TOL = 1e-5  # per step; two ranks sum in either order to the same bits, more may round


def load(d):
    ranks = []
    for name in sorted(os.listdir(d)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                ranks.append(json.load(f))
    if not ranks:
        sys.exit("no results in %s" % d)
    return ranks


def main():
    braid, nccl, libdir = load(sys.argv[1]), load(sys.argv[2]), os.path.realpath(sys.argv[3])
    bad = []
    for label, runs, want_braid in (("braid", braid, True), ("nccl", nccl, False)):
        for r in runs:
            owner = r["ncclAllReduce_from"] or ""
            is_braid = owner.startswith(libdir + os.sep) and (r["braid_banner"] or "").startswith("Braid")
            if is_braid != want_braid:
                bad.append("%s rank %d: ncclAllReduce comes from %s, Braid's banner %s" % (
                    label, r["rank"], owner, r["braid_banner"]))
            for name, verdict in r["collectives"].items():
                if verdict != "ok":
                    bad.append("%s rank %d %s: %s" % (label, r["rank"], name, verdict))
    for label, runs in (("braid", braid), ("nccl", nccl)):
        for r in runs:  # training must move the loss, or equal losses prove nothing
            if not r["losses"][-1] < 0.98 * r["losses"][0]:
                bad.append("%s rank %d: the loss went from %.6f to %.6f only" % (
                    label, r["rank"], r["losses"][0], r["losses"][-1]))
    worst = 0.0
    for b, n in zip(braid, nccl):
        for step, (lb, ln) in enumerate(zip(b["losses"], n["losses"])):
            rel = abs(lb - ln) / max(abs(ln), 1e-30)
            worst = max(worst, rel)
            if rel > REL_TOL:
                bad.append("rank %d step %d: loss %.9g on Braid, %.9g on NCCL" % (b["rank"], step, lb, ln))
                break
    b0, n0 = braid[0], nccl[0]
    print("PyTorch %s, %d ranks, %d parameters, %d DDP steps" % (
        b0["torch"], b0["world"], b0["params"], len(b0["losses"])))
    print("  version PyTorch reports: Braid run %s, NCCL run %s" % (b0["nccl_version"], n0["nccl_version"]))
    print("  ncclAllReduce resolves to: Braid run %s (%s)" % (b0["ncclAllReduce_from"], b0["braid_banner"]))
    print("                             NCCL run  %s" % n0["ncclAllReduce_from"])
    print("  libnccl files mapped: Braid run %s" % b0["libnccl_mapped"])
    print("                        NCCL run  %s" % n0["libnccl_mapped"])
    print("  loss at step 0 / last: Braid %.6f / %.6f, NCCL %.6f / %.6f; worst relative difference %.3g" % (
        b0["losses"][0], b0["losses"][-1], n0["losses"][0], n0["losses"][-1], worst))
    for b, n in zip(braid, nccl):
        print("  rank %d step time: Braid %.2f ms, NCCL %.2f ms (NCCL / Braid = %.2f)" % (
            b["rank"], b["step_s"] * 1e3, n["step_s"] * 1e3, n["step_s"] / b["step_s"]))
    for line in bad:
        print("FAIL " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
