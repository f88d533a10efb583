"""torch_steps_compare.py on made-up results (no PyTorch, no GPU): the table (a library's best
run, each run its slowest rank; the ratio; the range over the runs) and each failure it must
report (a run that loaded the wrong library, a wrong collective result, losses that differ, a
loss that did not fall).

  python3 torch_steps_compare_test.py
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "/opt/braid/lib"


def rank_result(rank, lib, step_ms, us, losses):
    braid = lib == "braid"
    return {
        "rank": rank, "world": 2, "torch": "2.11.0", "backend": "nccl", "nccl_version": "2.28.9",
        "ddp": {"losses": list(losses), "step_ms": step_ms, "params": 134000000, "dtype": "float32"},
        "colls": {"all_reduce 16 MB": {"us": us, "bytes": 16 << 20, "check": "ok"}},
        "ncclAllReduce_from": (LIB + "/libnccl.so.2") if braid else "/usr/lib/libnccl.so.2",
        "braid_banner": "Braid 0.1.0" if braid else None,
    }


# (library, run): per rank (step ms, all_reduce us); a run's time is its slower rank's.
RUNS = {
    ("braid", 1): [(10.0, 100.0), (10.5, 90.0)],
    ("braid", 2): [(9.0, 80.0), (9.5, 85.0)],
    ("nccl", 1): [(11.0, 120.0), (11.0, 110.0)],
    ("nccl", 2): [(12.0, 95.0), (12.5, 99.0)],
}
LOSSES = [1.0, 0.9, 0.5]


def write(out, runs):
    for (lib, n), ranks in runs.items():
        d = os.path.join(out, "%s_r%d" % (lib, n))
        os.makedirs(d)
        for rank, r in enumerate(ranks):
            with open(os.path.join(d, "rank%d.json" % rank), "w") as f:
                json.dump(r, f)


def results(mutate=None):
    runs = {k: [rank_result(i, k[0], s, u, LOSSES) for i, (s, u) in enumerate(v)]
            for k, v in RUNS.items()}
    if mutate:
        mutate(runs)
    return runs


def compare(runs):
    with tempfile.TemporaryDirectory() as out:
        write(out, runs)
        p = subprocess.run([sys.executable, os.path.join(HERE, "torch_steps_compare.py"), out, LIB],
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


def main():
    failures, checks = [], [0]

    def check(cond, what):
        checks[0] += 1
        if not cond:
            failures.append(what)

    rc, text = compare(results())
    check(rc == 0, "clean results: exit %d\n%s" % (rc, text))
    # DDP: Braid's runs 10.5 and 9.5 (best 9.5), NCCL's 11.0 and 12.5 (best 11.0).
    check("| 9.50 | 11.00 | 1.158 | 9.50-10.50 | 11.00-12.50 |" in text, "DDP row:\n" + text)
    # all_reduce: Braid 100 and 85 (best 85), NCCL 120 and 99 (best 99).
    check("| all_reduce 16 MB, us | 85.0 | 99.0 | 1.165 | 85.0-100.0 | 99.0-120.0 |" in text,
          "all_reduce row:\n" + text)

    def wrong_lib(runs):
        runs[("nccl", 2)][1]["ncclAllReduce_from"] = LIB + "/libnccl.so.2"
        runs[("nccl", 2)][1]["braid_banner"] = "Braid 0.1.0"

    def wrong_result(runs):
        runs[("braid", 2)][0]["colls"]["all_reduce 16 MB"]["check"] = "wrong: [1.0]..."

    def loss_differs(runs):
        runs[("braid", 1)][1]["ddp"]["losses"][2] = 0.51

    def loss_flat(runs):
        for k in runs:
            for r in runs[k]:
                r["ddp"]["losses"] = [1.0, 1.0, 0.9999]

    for name, mutate, says in (("wrong library", wrong_lib, "nccl_r2 rank 1: ncclAllReduce comes from"),
                               ("wrong result", wrong_result, "braid_r2 rank 0 all_reduce 16 MB: wrong"),
                               ("losses differ", loss_differs, "ddp rank 1 step 2: loss"),
                               ("loss did not fall", loss_flat, "the loss went from")):
        rc, text = compare(results(mutate))
        check(rc == 1 and "FAIL: " in text and says in text,
              "%s: exit %d, expected 1 with '%s'\n%s" % (name, rc, says, text))

    for f in failures:
        print("FAIL " + f)
    print("%d of %d checks failed" % (len(failures), checks[0]) if failures
          else "all %d checks passed" % checks[0])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
