"""How fast a survivor learns, under torch.distributed, that its peer was SIGKILLed.

The bar: with one rank SIGKILLed in the middle of a stream of collectives (its process reaped
at once, or left a zombie by a parent that does not wait for it; BRAID_TIMEOUT unset, 0 or
large), the survivor's collective raises within 5 s of the kill, and the exception's text or
the survivor's library log names the dead rank.

  python3 torch_deadpeer.py one --out DIR [--kill reaped|zombie] [--ops allreduce|mixed]
                                [--visible all|isolated] [--seed N] [--expect braid|nccl]
      One mode. This process is the parent: it starts 2 ranks with multiprocessing's spawn
      context (no launcher agent watches them), each on its own GPU, waits until both run
      collectives, sleeps a seeded random delay, records the time (time.monotonic) in a shared
      Value and SIGKILLs rank 1; with --kill reaped it joins rank 1 at once, with --kill zombie
      it leaves rank 1 unreaped until the end (and checks that it is a zombie then). Rank 0
      records when a call raised. Verdict in DIR/result.json; exit 0 when the bar is met.
      BRAID_TIMEOUT is whatever the caller's environment says.

  python3 torch_deadpeer.py matrix --out DIR --lib LIBNCCL [--nccl] [--seed N] [--modes REGEX]
      Every mode (kill reaped/zombie x BRAID_TIMEOUT unset/0/600 x every GPU visible/one GPU per
      process x all-reduces/mixed collectives), each as a `one` subprocess with a hard deadline,
      on Braid (LIBNCCL preloaded); with --nccl also on PyTorch's own NCCL, informative only
      (once per mode without BRAID_TIMEOUT, which NCCL ignores). Prints a table; exit 0 only if
      every mode run on Braid met the bar, and fails when no mode ran.

How the error reaches Python: TORCH_NCCL_BLOCKING_WAIT=1, so every collective's wait() (which
the synchronous collectives call) holds the calling thread and polls ncclCommGetAsyncError
(WorkNCCL::isCompleted) every few milliseconds; an asynchronous error is raised from that
thread, after torch aborts the communicator. TORCH_NCCL_ASYNC_ERROR_HANDLING=0 keeps torch's
watchdog (where this torch still runs one beside blocking wait) from taking the process down
first. The process group's timeout is 60 s, far past the 5 s bar, so torch's own timeout never
stands in for the library's verdict: an exception that comes only at 60 s fails.

Rank 0's library log (NCCL_DEBUG=WARN) goes to DIR/nccl_rank0.log (NCCL_DEBUG_FILE).
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

BAR_S = 5.0                    # the bar: exception within this many seconds of the kill
PG_TIMEOUT_S = 60              # the process group's timeout (torch's own verdict)
READY_LIMIT_S = 120            # import, CUDA, init and warm-up of both ranks
AFTER_KILL_LIMIT_S = PG_TIMEOUT_S + 20  # rank 0 must have reported by then
MODE_DEADLINE_S = READY_LIMIT_S + AFTER_KILL_LIMIT_S + 30  # hard limit on one mode's process
DELAY_S = (0.3, 3.0)           # the kill comes this long after both ranks run collectives
NUMEL = 16 << 20               # 64 MB of float32
NAMES_DEAD_RANK = re.compile(r"\brank 1\b")


def now():
    return time.monotonic()


def loaded_braid():
    """Braid's version banner when its libnccl.so.2 is in the global scope (preloaded), else None."""
    import ctypes
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "braidGetVersionString"):
        return None
    lib.braidGetVersionString.restype = ctypes.c_char_p
    return lib.braidGetVersionString().decode()


def rank_ops(torch, dist, ops, dev, rank):
    """The collectives of one step, as (name, call) pairs; each call takes the step number."""
    if ops == "allreduce":
        x = torch.full((NUMEL,), float(rank + 1), device=dev)
        return [("all_reduce", lambda step: dist.all_reduce(x))]
    half = torch.full((NUMEL // 2,), float(rank + 1), device=dev)
    full = torch.empty(NUMEL, device=dev)
    part = torch.empty(NUMEL // 2, device=dev)
    buf = torch.full((NUMEL,), float(rank), device=dev)
    return [
        ("all_gather_into_tensor", lambda step: dist.all_gather_into_tensor(full, half)),
        ("reduce_scatter_tensor", lambda step: dist.reduce_scatter_tensor(part, full)),
        ("broadcast", lambda step: dist.broadcast(buf, src=step % 2)),  # from each rank in turn
    ]


def rank_main(rank, cfg, kill_t, ready):
    """One rank: init, a checked warm-up, then collectives until one raises (rank 0 reports)."""
    if cfg["visible"] == "isolated":
        os.environ["CUDA_VISIBLE_DEVICES"] = cfg["gpus"][rank]  # before CUDA initializes
    os.environ["NCCL_DEBUG"] = "WARN"
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(cfg["out"], "nccl_rank%d.log" % rank)
    os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    result = {"rank": rank, "pid": os.getpid()}
    where = "import torch"
    try:
        import datetime
        import torch
        import torch.distributed as dist
        where = "init"
        dev = torch.device("cuda", 0 if cfg["visible"] == "isolated" else rank)
        torch.cuda.set_device(dev)
        store = dist.FileStore(os.path.join(cfg["out"], "store"), 2)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        v = torch.cuda.nccl.version()  # a tuple, or an int in older torch
        result["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        result["braid"] = loaded_braid()
        where = "warm-up"
        x = torch.full((1 << 20,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if x[0].item() != 3.0 or x[-1].item() != 3.0:
            raise RuntimeError("warm-up all_reduce gave %s, expected 3.0" % x[0].item())
        ops = rank_ops(torch, dist, cfg["ops"], dev, rank)
        for step in range(2):
            for _, call in ops:
                call(step)
        torch.cuda.synchronize()
        ready.set()
        step = 0
        while True:
            for name, call in ops:
                where = name
                call(step)
            where = "torch.cuda.synchronize"
            torch.cuda.synchronize()
            step += 1
            result["steps"] = step
    except BaseException as e:  # noqa: B036 -- whatever raised is the answer
        t = now()
        result.update(where=where, t_exc=t, t_kill=kill_t.value,
                      exc_type=type(e).__module__ + "." + type(e).__name__, exc_text=str(e))
    if rank == 0:
        with open(os.path.join(cfg["out"], "rank0.json"), "w") as f:
            json.dump(result, f, indent=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no destroy: the communicator may be unusable, and this is the answer


def proc_state(pid):
    """The state letter of /proc/PID/stat ('Z' for a zombie), or None when there is no such pid."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def rank1_death(p1, kill):
    """Seconds from SIGKILL until rank 1 is reaped (reaped) or a zombie (zombie), without
    reaping it in the second case (no waitpid: p1.is_alive() would reap)."""
    t0 = now()
    if kill == "reaped":
        p1.join(30)
        return (now() - t0) if p1.exitcode is not None else None
    while now() - t0 < 30:
        if proc_state(p1.pid) == "Z":
            return now() - t0
        time.sleep(0.005)
    return None


def run_one(args):
    """One mode; writes OUT/result.json and returns its verdict (True: the bar was met)."""
    import multiprocessing as mp
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    for name in ("store", "rank0.json", "nccl_rank0.log", "nccl_rank1.log"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")
    if len(gpus) < 2:
        print("FAIL: 2 ranks need 2 GPUs; CUDA_VISIBLE_DEVICES=%s" % ",".join(gpus))
        return False
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    delay = random.Random(seed).uniform(*DELAY_S)
    cfg = {"out": out, "ops": args.ops, "visible": args.visible, "gpus": gpus}
    res = {"kill": args.kill, "ops": args.ops, "visible": args.visible, "expect": args.expect,
           "braid_timeout": os.environ.get("BRAID_TIMEOUT", "unset"), "seed": seed,
           "delay_s": round(delay, 3), "pass": False}
    print("mode: kill %s, ops %s, GPUs %s, BRAID_TIMEOUT=%s; seed %d: kill %.3f s after both "
          "ranks run collectives" % (args.kill, args.ops, args.visible, res["braid_timeout"],
                                     seed, delay), flush=True)
    ctx = mp.get_context("spawn")
    kill_t = ctx.Value("d", 0.0)
    ready = [ctx.Event(), ctx.Event()]
    procs = [ctx.Process(target=rank_main, args=(r, cfg, kill_t, ready[r]), name="rank%d" % r)
             for r in range(2)]
    for p in procs:
        p.start()
    p0, p1 = procs
    try:
        res["why"] = wait_and_kill(res, p0, p1, ready, kill_t, delay, args.kill)
    finally:
        for p in procs:  # nothing outlives the mode; rank 1 is reaped here at the latest
            if p.exitcode is None and p.pid and proc_state(p.pid) not in (None, "Z"):
                os.kill(p.pid, signal.SIGKILL)
            p.join(30)
    judge(res, out)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(res, f, indent=1)
    print("RESULT %s %s" % ("PASS" if res["pass"] else "FAIL", res["why"]), flush=True)
    return res["pass"]


def wait_and_kill(res, p0, p1, ready, kill_t, delay, kill):
    """Waits for both ranks, kills rank 1, waits for rank 0's report; returns why it failed, or
    None when it got as far as rank 0's report."""
    t0 = now()
    for r, ev in enumerate(ready):
        while not ev.wait(0.5):
            if not p0.is_alive() or not p1.is_alive():  # before the kill: reaping is harmless
                return "rank %d did not reach its collectives (a rank exited first)" % r
            if now() - t0 > READY_LIMIT_S:
                return "rank %d did not reach its collectives within %d s" % (r, READY_LIMIT_S)
    res["ready_s"] = round(now() - t0, 3)
    time.sleep(delay)
    if not p0.is_alive() or not p1.is_alive():
        return "a rank exited before the kill"
    kill_t.value = now()  # taken before the signal: the latency measured is an upper bound
    os.kill(p1.pid, signal.SIGKILL)
    death = rank1_death(p1, kill)
    res["rank1_death_s"] = None if death is None else round(death, 3)
    if death is None:
        return "rank 1 did not %s within 30 s of SIGKILL" % (
            "exit" if kill == "reaped" else "become a zombie")
    p0.join(max(0.0, AFTER_KILL_LIMIT_S - (now() - kill_t.value)))
    if p0.exitcode is None:
        return "rank 0 raised nothing within %d s of the kill" % AFTER_KILL_LIMIT_S
    if kill == "zombie":
        res["rank1_state_at_end"] = proc_state(p1.pid)
        if res["rank1_state_at_end"] != "Z":
            return "rank 1 was not a zombie at the end (state %s): the mode did not hold" % (
                res["rank1_state_at_end"],)
    return None


def judge(res, out):
    """Fills res["pass"] and res["why"] from rank 0's report and log."""
    path = os.path.join(out, "rank0.json")
    r0 = {}
    if os.path.exists(path):
        with open(path) as f:
            r0 = json.load(f)
    res["rank0"] = r0
    log = ""
    if os.path.exists(os.path.join(out, "nccl_rank0.log")):
        with open(os.path.join(out, "nccl_rank0.log"), errors="replace") as f:
            log = f.read()
    named = [l for l in log.splitlines() if NAMES_DEAD_RANK.search(l)]
    res["log_names_rank1"] = named[:3]
    text = r0.get("exc_text", "")
    res["exc_names_rank1"] = bool(NAMES_DEAD_RANK.search(text))
    if "t_exc" in r0 and r0.get("t_kill", 0) > 0:
        res["latency_s"] = round(r0["t_exc"] - r0["t_kill"], 3)
    if res.get("why"):
        pass
    elif "t_exc" not in r0:
        res["why"] = "rank 0 exited without reporting an exception"
    elif r0.get("t_kill", 0) <= 0:
        res["why"] = "rank 0 raised before the kill, in %s: %s" % (r0["where"], text[:300])
    elif res["expect"] == "braid" and not r0.get("braid"):
        res["why"] = "Braid was not loaded in rank 0 (no braidGetVersionString)"
    elif res["expect"] == "nccl" and r0.get("braid"):
        res["why"] = "Braid was loaded in rank 0, where PyTorch's own NCCL was to run"
    elif res["latency_s"] > BAR_S:
        res["why"] = "rank 0 raised %.3f s after the kill (bar %.1f s)" % (res["latency_s"], BAR_S)
    elif not (res["exc_names_rank1"] or named):
        res["why"] = "neither the exception nor rank 0's log names rank 1"
    else:
        res["pass"] = True
        res["why"] = "raised in %s %.3f s after the kill" % (r0["where"], res["latency_s"])
    if r0:
        print("rank 0: %s, %s steps; raised in %s: %s" % (
            ("Braid " + r0["braid"]) if r0.get("braid") else "NCCL %s" % r0.get("nccl_version"),
            r0.get("steps", 0), r0.get("where"), r0.get("exc_type")))
        print("  " + text[:1200].replace("\n", "\n  "))
    for line in named[:3]:
        print("  log: " + line)
    print("rank 1: %s %s s after SIGKILL" % (
        "reaped" if res["kill"] == "reaped" else "a zombie", res.get("rank1_death_s")))


def mode_list(pattern):
    modes = []
    for ops in ("allreduce", "mixed"):
        for visible in ("all", "isolated"):
            for kill in ("reaped", "zombie"):
                for bt in ("unset", "0", "600"):
                    name = "%s %s %s BRAID_TIMEOUT=%s" % (ops, visible, kill, bt)
                    if not pattern or re.search(pattern, name):
                        modes.append((name, ops, visible, kill, bt))
    return modes


def run_mode(out, lib, mode, seed):
    """One mode in a process group of its own, killed whole at the deadline; its result dict."""
    name, ops, visible, kill, bt = mode
    env = dict(os.environ)
    env.pop("BRAID_TIMEOUT", None)
    env.pop("LD_PRELOAD", None)
    if bt != "unset":
        env["BRAID_TIMEOUT"] = bt
    if lib:
        env["LD_PRELOAD"] = lib
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "result.json")):
        os.remove(os.path.join(out, "result.json"))  # a result of an earlier run is no answer
    cmd = [sys.executable, os.path.abspath(__file__), "one", "--out", out, "--kill", kill,
           "--ops", ops, "--visible", visible, "--seed", str(seed),
           "--expect", "braid" if lib else "nccl"]
    with open(os.path.join(out, "one.log"), "w") as logf:
        p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            p.wait(MODE_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return {"pass": False, "why": "hung: killed at the %d s deadline" % MODE_DEADLINE_S}
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # whatever of the mode is left
            except ProcessLookupError:
                pass
    try:
        with open(os.path.join(out, "result.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"pass": False, "why": "no result (exit %s); see %s/one.log" % (p.returncode, out)}


def print_tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return
    for line in tail:
        print("   | " + line)


def cell(r):
    if r is None:
        return "-"
    lat = r.get("latency_s")
    text = ("%.2f s" % lat) if lat is not None else "none"
    return text + (" ok" if r.get("pass") else " FAIL")


def run_matrix(args):
    out = os.path.abspath(args.out)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    modes = mode_list(args.modes)
    print("seed %d (TORCH_DEADPEER_SEED=%d repeats every delay); %d modes" % (seed, seed, len(modes)),
          flush=True)
    rows = []
    failed = 0
    for i, mode in enumerate(modes):
        name, bt = mode[0], mode[4]
        slug = re.sub(r"[^A-Za-z0-9]+", "_", name)
        braid = run_mode(os.path.join(out, "braid", slug), args.lib, mode, seed + i)
        failed += not braid["pass"]
        print("== braid %-45s %-12s %s" % (name, cell(braid), braid.get("why")), flush=True)
        if not braid["pass"]:
            print_tail(os.path.join(out, "braid", slug, "one.log"))
        nccl = None
        if args.nccl and bt == "unset":  # NCCL ignores BRAID_TIMEOUT: once per mode
            nccl = run_mode(os.path.join(out, "nccl", slug), None, mode, seed + i)
            print("== nccl  %-45s %-12s %s" % (name, cell(nccl), nccl.get("why")), flush=True)
        rows.append((name, braid, nccl))
    print("\ntime from SIGKILL of rank 1 to rank 0's exception (bar %.1f s; NCCL informative)"
          % BAR_S)
    print("%-45s %-14s %-14s %s" % ("mode", "Braid", "NCCL", "Braid: why"))
    for name, braid, nccl in rows:
        print("%-45s %-14s %-14s %s" % (name, cell(braid), cell(nccl) if nccl or not args.nccl
                                        or "unset" in name else "(as unset)",
                                        braid.get("why")))
    print("results in %s" % out)
    if not rows:
        print("FAIL: no mode ran (--modes %r matches none)" % args.modes)
        return 1
    print("%d of %d modes met the bar on Braid" % (len(rows) - failed, len(rows)))
    return 0 if failed == 0 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("one")
    one.add_argument("--out", required=True)
    one.add_argument("--kill", choices=("reaped", "zombie"), default="reaped")
    one.add_argument("--ops", choices=("allreduce", "mixed"), default="allreduce")
    one.add_argument("--visible", choices=("all", "isolated"), default="all")
    one.add_argument("--seed", type=int)
    one.add_argument("--expect", choices=("braid", "nccl"), default="braid",
                     help="braid: fail unless rank 0 runs on Braid's libnccl.so.2")
    mat = sub.add_parser("matrix")
    mat.add_argument("--out", required=True)
    mat.add_argument("--lib", required=True, help="Braid's libnccl.so.2, preloaded")
    mat.add_argument("--nccl", action="store_true", help="also on PyTorch's NCCL (informative)")
    mat.add_argument("--seed", type=int)
    mat.add_argument("--modes", default="", help="run only the modes whose name matches")
    args = p.parse_args()
    if args.cmd == "one":
        return 0 if run_one(args) else 1
    return run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
