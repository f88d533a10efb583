"""PyTorch's symmetric memory on whichever libnccl.so.2 the process loaded.

torch.distributed._symmetric_memory with its NCCL backend allocates with ncclMemAlloc,
registers with ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC), creates a device
communicator with ncclDevCommCreate and reads the peers' buffers through ncclGetLsaPointer
(NCCL's nccl_device.h, compiled into libtorch): all of it runs on Braid when Braid is the
libnccl.so.2 in the process. With --backend CUDA the same ops run on PyTorch's own cuMem
mappings instead (the reference: same kernels, same inputs, so the same bits are expected).

One process per rank (torchrun, or run_torch_symm.sh's isolated mode). Per rank:
  1. set_backend, empty, rendezvous, get_backend, the handle's rank and world size;
  2. each rank fills its buffer with rank-specific values; after a barrier every rank reads
     every peer's buffer through get_buffer (and writes into the next rank's), exactly;
  3. torch.ops.symm_mem one_shot_all_reduce(_out), two_shot_all_reduce_(_out) on float32 and
     bfloat16, random and integer-valued data, 8 KiB .. 16 MiB: each result against the exact
     sum (float64 over all ranks' inputs) within a bound suited to the dtype, exactly for
     integer-valued data, and dist.all_reduce of the same data against the same;
  4. the median time of each op and of dist.all_reduce (CUDA events, after a warm-up).
Every feature this torch lacks is reported "not in this torch"; every one that raises is a
FAIL with the exception. The run fails on any FAIL and when no check ran at all. Writes
rank<N>.json (features, checks, times) and rank<N>.pt (a digest and a sample of every
result, for the comparison between backends) to --out-dir.

  torch_symm_mem.py --compare DIR [--reference DIR] [--informative DIR] [--lib-dir DIR]
compares runs: the time tables side by side, and each result of DIR against the same result
of --reference (a failure when they differ beyond the dtype's bound, or at all for
integer-valued data) and of --informative (printed only). --lib-dir: DIR's run must have
resolved ncclCommWindowRegister to Braid's library in that folder.

By hand (from the repository root, BUILD the Braid build folder):
  bash tests/frameworks/run_torch_symm.sh BUILD 2          # Braid NCCL backend, CUDA backend, then NCCL
  TORCH_ISOLATED=1 bash tests/frameworks/run_torch_symm.sh BUILD 2   # one GPU per process
  TORCH_BRAID_ONLY=1 ...                                   # without the NCCL run
or one mode alone:
  LD_PRELOAD=BUILD/src/libnccl.so.2 torchrun --nproc-per-node 2 \\
      tests/frameworks/torch_symm_mem.py --backend NCCL --out-dir /tmp/symm-braid   # on Braid
  torchrun --nproc-per-node 2 tests/frameworks/torch_symm_mem.py --backend NCCL \\
      --out-dir /tmp/symm-nccl                                                      # on NCCL
"""
import argparse
import json
import os
import sys
import traceback
import warnings

KIB = 1024
DEFAULT_SIZES = [8 * KIB, 32 * KIB, 128 * KIB, 512 * KIB, 2 * KIB * KIB, 8 * KIB * KIB, 16 * KIB * KIB]
SAMPLE = 4096  # elements of each result kept for the comparison between runs
# The ops this test runs, with their schema in torch.ops.symm_mem; timed: the ones in the table.
OPS = ("one_shot_all_reduce", "one_shot_all_reduce_out", "two_shot_all_reduce_", "two_shot_all_reduce_out")
TIMED = ("one_shot_all_reduce", "two_shot_all_reduce_")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="NCCL", help="symmetric-memory backend (NCCL or CUDA)")
    p.add_argument("--out-dir")
    p.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                   help="buffer sizes in bytes, comma-separated")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per op and size")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compare", metavar="DIR", help="compare runs instead of running")
    p.add_argument("--reference", metavar="DIR", help="with --compare: results must agree")
    p.add_argument("--informative", metavar="DIR", action="append", default=[],
                   help="with --compare: printed beside, never a failure")
    p.add_argument("--lib-dir", help="with --compare: Braid's library folder")
    return p.parse_args()


class Report:
    """Verdicts per feature and per check, printed as they come."""

    def __init__(self, rank):
        self.rank = rank
        self.features = {}  # name -> "ok" | "not in this torch" | "FAIL ..." | "NYI ..."
        self.checks = {}    # case -> "ok" | what went wrong
        self.failures = 0

    def say(self, line):
        print("rank %d: %s" % (self.rank, line), flush=True)

    def feature(self, name, verdict):
        self.features[name] = verdict
        if verdict.startswith("FAIL"):
            self.failures += 1
        self.say("%s: %s" % (name, verdict))

    def check(self, name, ok, detail=""):
        self.checks[name] = "ok" if ok else ("FAIL " + detail)
        if not ok:
            self.failures += 1
            self.say("%s: FAIL %s" % (name, detail))

    def attempt(self, name, fn, *a, **kw):
        """fn(*a, **kw), its exception a FAIL of feature `name` (or, where torch itself says
        it is not implemented, a note). Returns (ok, value)."""
        try:
            value = fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 (every exception is a verdict here)
            text = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else "")
            if "NYI" in str(e) or isinstance(e, NotImplementedError):
                self.feature(name, "not implemented by this torch (%s)" % text)
            else:
                self.feature(name, "FAIL " + text)
                if os.environ.get("TORCH_SYMM_TRACEBACK"):
                    traceback.print_exc()
            return False, None
        self.feature(name, "ok")
        return True, value


def digest(torch, t):
    """A fingerprint of a tensor's bits (two position-weighted sums of its words, on the GPU:
    integer sums, the same whatever the order) and an evenly spaced float32 sample of it."""
    flat = t.detach().contiguous().view(-1)
    words = flat.view(torch.int16 if flat.element_size() == 2 else torch.int32).long()
    i = torch.arange(words.numel(), device=flat.device, dtype=torch.int64)
    h1 = (words * (i * 2654435761 % 2147483647 + 1)).sum().item()
    h2 = (words * (i * 40503 % 65521 + 7)).sum().item()
    idx = torch.linspace(0, flat.numel() - 1, min(SAMPLE, flat.numel()), device=flat.device).long()
    return "%x:%x:%d" % (h1 & (2 ** 64 - 1), h2 & (2 ** 64 - 1), words.numel()), flat[idx].float().cpu()


def unit_roundoff(torch, dtype):
    return {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}[dtype]


def within(torch, got, exact, sabs, world, dtype):
    """Whether |got - exact| <= (world + 1) u sum|x_i| everywhere: world - 1 additions and the
    final rounding, each off by at most u of the magnitudes summed, in whatever order. Returns
    (ok, worst |error| / bound)."""
    bound = (world + 1) * unit_roundoff(torch, dtype) * sabs + 1e-30
    err = (got.double() - exact).abs()
    ratio = (err / bound).max().item() if err.numel() else 0.0
    return ratio <= 1.0 and torch.isfinite(got).all().item(), ratio


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def time_op(torch, fn, warmup, iters):
    """Median microseconds of fn() on the current stream (CUDA events around each call)."""
    for _ in range(warmup):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return median([a.elapsed_time(b) * 1e3 for a, b in ev])


def peer_values(torch, rank, n, dev):
    """What rank `rank` writes in its buffer: distinct per rank and per element, exact in fp32."""
    return (torch.arange(n, device=dev, dtype=torch.float32) % 4093) + 10000.0 * (rank + 1)


def check_buffers(R, torch, dist, symm, hdl, buf, rank, world, dev):
    """Each rank fills its buffer; after a barrier each reads every peer's (get_buffer) and writes
    the second half of the next rank's; after another, each checks what its neighbour wrote."""
    n = buf.numel()
    half = n // 2
    buf.copy_(peer_values(torch, rank, n, dev))
    torch.cuda.synchronize()
    dist.barrier()
    if hasattr(hdl, "barrier"):  # the handle's own barrier (signal pads; NYI on some NCCL backends)
        R.attempt("handle.barrier", hdl.barrier, 0)
        torch.cuda.synchronize()
    else:
        R.feature("handle.barrier", "not in this torch")
    if not hasattr(hdl, "get_buffer"):
        R.feature("get_buffer", "not in this torch")
        return
    got = {}
    for p in range(world):
        fine, view = R.attempt("get_buffer(peer %d)" % p, hdl.get_buffer, p, (n,), torch.float32, 0)
        if fine:
            got[p] = view.clone()  # a copy kernel reading peer p's memory through the mapping
    torch.cuda.synchronize()
    for p, t in got.items():
        want = peer_values(torch, p, n, dev)
        bad = (t != want).nonzero()
        R.check("get_buffer read of rank %d" % p, bad.numel() == 0,
                "" if bad.numel() == 0 else "%d of %d elements differ, first at %d: %s, expected %s" % (
                    bad.shape[0], n, bad[0].item(), t[bad[0]].item(), want[bad[0]].item()))
    dist.barrier()  # every rank has read before any writes into a peer
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if nxt in got:
        fine, view = R.attempt("get_buffer write to rank %d" % nxt, hdl.get_buffer, nxt, (n,), torch.float32, 0)
        if fine:
            view[half:].fill_(-1.0 - rank)
    torch.cuda.synchronize()
    dist.barrier()
    if got:
        mine = buf[half:].clone()
        want = torch.full_like(mine, -1.0 - prv)
        R.check("get_buffer write by rank %d" % prv, torch.equal(mine, want),
                "my buffer's second half holds %s..., expected %s" % (mine[:3].tolist(), want[0].item()))
        R.check("get_buffer first half kept", torch.equal(buf[:half], peer_values(torch, rank, n, dev)[:half]),
                "the first half changed")
    if hasattr(symm, "get"):  # one-sided get into a local tensor (newer torch)
        dst = torch.empty(n, device=dev, dtype=torch.float32)
        fine, _ = R.attempt("symm_mem.get", symm.get, dst, hdl, nxt)
        if fine:
            torch.cuda.synchronize()
            want = peer_values(torch, nxt, n, dev)
            want[half:] = -1.0 - rank  # what this rank wrote there
            R.check("symm_mem.get from rank %d" % nxt, torch.equal(dst, want), "data differ")
    else:
        R.feature("symm_mem.get", "not in this torch")
    dist.barrier()


def make_data(torch, rank, dtype, n, kind, seed, dev):
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed * 64 + rank)
    if kind == "int":  # integer-valued: every order of summation gives the same bits
        return torch.randint(-8, 9, (n,), device=dev, generator=gen).to(dtype)
    return torch.randn(n, device=dev, generator=gen, dtype=torch.float32).to(dtype)


def run_op(torch, op, name, buf, data, group_name):
    """Runs one op on symmetric buffer `buf` (holding `data`); returns the result tensor."""
    if name == "one_shot_all_reduce":
        return op(buf, "sum", group_name)
    if name == "one_shot_all_reduce_out":
        out = torch.empty_like(data)
        op(buf, "sum", group_name, out)
        return out
    if name == "two_shot_all_reduce_":
        op(buf, "sum", group_name)
        return buf
    if name == "two_shot_all_reduce_out":
        out = torch.empty_like(data)
        op(buf, "sum", group_name, out)
        return out
    raise ValueError(name)


def check_ops(R, args, torch, dist, symm, bufs, group_name, rank, world, dev, samples):
    """Every op, dtype, kind and size against the exact sum and against dist.all_reduce."""
    ops = {}
    for name in OPS:
        op = getattr(torch.ops.symm_mem, name, None) if hasattr(torch.ops, "symm_mem") else None
        if op is None:
            R.feature(name, "not in this torch")
        else:
            ops[name] = op
    sizes = [int(s) for s in args.sizes.split(",")]
    broken = set()  # ops that raised once: reported once, not once per size
    seed = 0
    for dtype, buf in bufs.items():
        dname = str(dtype).replace("torch.", "")
        for kind in ("int", "randn"):
            for size in sizes:
                n = size // buf.element_size()
                seed += 1
                data = make_data(torch, rank, dtype, n, kind, seed, dev)
                gathered = torch.empty(world * n, device=dev, dtype=dtype)
                dist.all_gather_into_tensor(gathered, data)
                g = gathered.view(world, n).double()
                exact, sabs = g.sum(0), g.abs().sum(0)
                ref = data.clone()
                dist.all_reduce(ref)
                case = "%s %s %d B" % (dname, kind, size)
                if kind == "int":
                    R.check("dist.all_reduce " + case, torch.equal(ref.double(), exact), "not the exact sum")
                else:
                    ok, ratio = within(torch, ref, exact, sabs, world, dtype)
                    R.check("dist.all_reduce " + case, ok, "error %.3g x the bound" % ratio)
                for name, op in ops.items():
                    if name in broken:
                        continue
                    sym = buf[:n]
                    sym.copy_(data)
                    try:
                        out = run_op(torch, op, name, sym, data, group_name)
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        broken.add(name)
                        R.feature(name, "FAIL %s: %s (%s)" % (type(e).__name__, str(e).strip().splitlines()[0]
                                                               if str(e).strip() else "", case))
                        continue
                    if kind == "int":
                        same = torch.equal(out.double(), exact)
                        R.check("%s %s" % (name, case), same and torch.equal(out, ref),
                                "differs from the exact sum" if not same else "differs from dist.all_reduce")
                    else:
                        ok, ratio = within(torch, out, exact, sabs, world, dtype)
                        R.check("%s %s" % (name, case), ok, "error %.3g x the bound (max |diff| "
                                "to dist.all_reduce %.3g)" % (ratio, (out.double() - ref.double()).abs().max().item()))
                    samples["%s %s" % (name, case)] = digest(torch, out)
                del data, gathered, g, exact, sabs, ref
    for name in ops:
        if name not in broken:
            R.feature(name, "ok")
    return ops, broken


def timings(args, torch, dist, ops, broken, bufs, group_name, dev):
    """Median microseconds per (op, dtype, size): the timed symm_mem ops and dist.all_reduce."""
    out = {}
    sizes = [int(s) for s in args.sizes.split(",")]
    for dtype, buf in bufs.items():
        dname = str(dtype).replace("torch.", "")
        for size in sizes:
            n = size // buf.element_size()
            data = torch.randn(n, device=dev).to(dtype)
            sym = buf[:n]
            sym.copy_(data)
            for name in TIMED:
                if name in ops and name not in broken:
                    op = ops[name]
                    out["%s %s %d" % (name, dname, size)] = time_op(
                        torch, lambda: run_op(torch, op, name, sym, data, group_name), args.warmup, args.iters)
            t = data.clone()
            out["dist.all_reduce %s %d" % (dname, size)] = time_op(
                torch, lambda: dist.all_reduce(t), args.warmup, args.iters)
            torch.cuda.synchronize()
            dist.barrier()
    return out


def resolved_from(names):
    """Which mapped file each of `names` resolves to in this process (global scope first, then
    the object answering to libnccl.so.2), as torch_check.py does for ncclAllReduce."""
    import ctypes
    from torch_check import maps
    m = maps()
    out = {}
    scope = ctypes.CDLL(None)
    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        lib = None
    for name in names:
        for h in (scope, lib):
            if h is not None and hasattr(h, name):
                addr = ctypes.cast(getattr(h, name), ctypes.c_void_p).value
                out[name] = next((p for lo, hi, p in m if lo <= addr < hi), None)
                break
        else:
            out[name] = None
    return out


def main_run(args):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    import torch
    import torch.distributed as dist
    R = Report(rank)
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)  # eager: the NCCL comm exists for rendezvous
    result = {"rank": rank, "world": world, "torch": torch.__version__, "backend": args.backend,
              "nccl_version": ".".join(str(v) for v in torch.cuda.nccl.version())}
    samples = {}
    times = {}
    try:
        import torch.distributed._symmetric_memory as symm
    except ImportError as e:
        symm = None
        R.feature("torch.distributed._symmetric_memory", "not in this torch (%s)" % e)
    group = dist.group.WORLD
    group_name = getattr(group, "group_name", None) or dist.distributed_c10d._get_default_group().group_name
    ready = symm is not None
    current = None
    if ready and hasattr(symm, "get_backend"):
        try:
            current = symm.get_backend(dev)
        except Exception:  # noqa: BLE001 (no backend yet: set_backend decides)
            current = None
    if ready and current == args.backend:
        # torch registers its default backend (CUDA unless TORCH_SYMMMEM says otherwise) as the
        # allocator itself, not as a name set_backend can look up: asking for it again fails.
        R.feature("set_backend", "%s already (torch's default)" % args.backend)
    elif ready and hasattr(symm, "set_backend"):
        ready, _ = R.attempt("set_backend(%s)" % args.backend, symm.set_backend, args.backend)
    elif ready:
        R.feature("set_backend", "not in this torch")
        ready = args.backend == "CUDA"  # the only backend an older torch has
    if ready and hasattr(symm, "enable_symm_mem_for_group"):  # needed by older torch, a no-op after
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ready, _ = R.attempt("enable_symm_mem_for_group", symm.enable_symm_mem_for_group, group_name)
    bufs, hdls = {}, {}
    if ready:
        max_bytes = max(int(s) for s in args.sizes.split(","))
        for dtype in (torch.float32, torch.bfloat16):
            ok, t = R.attempt("empty(%s)" % dtype, symm.empty, max_bytes // torch.tensor([], dtype=dtype).element_size(),
                              dtype=dtype, device=dev)
            if not ok:
                continue
            ok, h = R.attempt("rendezvous(%s)" % dtype, symm.rendezvous, t, group_name)
            if ok:
                bufs[dtype], hdls[dtype] = t, h
                R.check("rendezvous(%s) rank, world" % dtype, (h.rank, h.world_size) == (rank, world),
                        "handle says rank %s of %s" % (h.rank, h.world_size))
        if hasattr(symm, "get_backend"):
            ok, name = R.attempt("get_backend", symm.get_backend, dev)
            if ok:
                R.check("get_backend is %s" % args.backend, name == args.backend, "it is %r" % name)
    if torch.float32 in bufs:
        try:
            check_buffers(R, torch, dist, symm, hdls[torch.float32], bufs[torch.float32], rank, world, dev)
        except Exception as e:  # noqa: BLE001
            R.feature("peer buffers", "FAIL %s: %s" % (type(e).__name__, e))
    if bufs:
        ops, broken = check_ops(R, args, torch, dist, symm, bufs, group_name, rank, world, dev, samples)
        times = timings(args, torch, dist, ops, broken, bufs, group_name, dev)
    torch.cuda.synchronize()
    result["resolved"] = resolved_from(("ncclAllReduce", "ncclCommWindowRegister", "ncclMemAlloc",
                                        "ncclDevCommCreate", "braidGetVersionString"))
    result.update(features=R.features, checks=R.checks, times_us=times, failures=R.failures)
    dist.barrier()
    dist.destroy_process_group()
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "rank%d.json" % rank), "w") as f:
            json.dump(result, f, indent=1)
        torch.save(samples, os.path.join(args.out_dir, "rank%d.pt" % rank))
    if rank == 0 and times:
        print_times({args.backend: times})
    passed = symm_checks_passed(R.checks)
    verdict = "ok" if R.failures == 0 and passed > 0 else "FAIL"
    R.say("torch %s, NCCL %s (as torch reports it), backend %s: %d checks passed, %d failures%s; "
          "ncclCommWindowRegister from %s -> %s" % (
              result["torch"], result["nccl_version"], args.backend, passed, R.failures,
              " (no symmetric-memory check ran)" if passed == 0 else "",
              result["resolved"].get("ncclCommWindowRegister"), verdict))
    return 0 if verdict == "ok" else 1


def symm_checks_passed(checks):
    """The passed checks of symmetric memory itself: those of dist.all_reduce alone do not make
    a run that tested something."""
    return sum(1 for k, v in checks.items() if v == "ok" and not k.startswith("dist."))


def print_times(columns):
    """columns: {label: {"op dtype size": us}}: one row per op, dtype and size."""
    keys = []
    for t in columns.values():
        keys += [k for k in t if k not in keys]
    keys.sort(key=lambda k: (k.rsplit(" ", 2)[0], k.rsplit(" ", 2)[1], int(k.rsplit(" ", 1)[1])))
    labels = list(columns)
    w = {l: max(len(l), 14) for l in labels}
    print("%-24s %-9s %10s  %s" % ("op", "dtype", "bytes", "  ".join("%*s" % (w[l], l) for l in labels)))
    for k in keys:
        name, dtype, size = k.rsplit(" ", 2)
        cells = ["%*.1f us" % (w[l] - 3, columns[l][k]) if k in columns[l] else "%*s" % (w[l], "-")
                 for l in labels]
        print("%-24s %-9s %10s  %s" % (name, dtype, size, "  ".join(cells)), flush=True)


def load_run(d):
    import torch
    runs = []
    for name in sorted(os.listdir(d)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                r = json.load(f)
            pt = os.path.join(d, name[:-5] + ".pt")
            r["samples"] = torch.load(pt) if os.path.exists(pt) else {}
            runs.append(r)
    return runs


def agree(torch, case, a, b, world):
    """Whether results a and b ((fingerprint, sample)) of one case agree: same bits, or for random data
    within twice the dtype's bound of each other on the sample."""
    if a[0] == b[0]:
        return True, "identical"
    if " int " in case:
        return False, "integer-valued results differ"
    dtype = torch.bfloat16 if "bfloat16" in case else torch.float32
    # Both are within (world+1) u sum|x_i| of the exact sum; |x_i| is about 1 for randn data.
    tol = 2 * (world + 1) * unit_roundoff(torch, dtype) * world * 6.0
    diff = (a[1] - b[1]).abs().max().item()
    return diff <= tol, "bits differ, max sampled difference %.3g (allowed %.3g)" % (diff, tol)


def main_compare(args):
    import torch
    primary = load_run(args.compare)
    if not primary:
        print("FAIL no results in %s" % args.compare)
        return 1
    others = []
    if args.reference:
        others.append(("reference", args.reference, True))
    others += [("informative", d, False) for d in args.informative]
    bad = []
    p0 = primary[0]
    if len(primary) != p0["world"]:
        bad.append("%s: %d of %d ranks wrote results" % (args.compare, len(primary), p0["world"]))
    if args.lib_dir:
        lib = os.path.realpath(args.lib_dir) + os.sep
        for r in primary:
            where = r["resolved"].get("ncclCommWindowRegister") or ""
            if not where.startswith(lib) or not r["resolved"].get("braidGetVersionString"):
                bad.append("%s rank %d: ncclCommWindowRegister resolves to %s, not Braid" % (
                    args.compare, r["rank"], where))
    for r in primary:
        if r["failures"] or not symm_checks_passed(r["checks"]):
            bad.append("%s rank %d: %d failures, %d symmetric-memory checks passed" % (
                args.compare, r["rank"], r["failures"], symm_checks_passed(r["checks"])))
    columns = {"%s (%s)" % (os.path.basename(args.compare.rstrip("/")), p0["backend"]): p0["times_us"]}
    for role, d, counts in others:
        runs = load_run(d) if os.path.isdir(d) else []
        if not runs:
            print("%s %s: no results" % (role, d))
            continue
        label = "%s (%s)" % (os.path.basename(d.rstrip("/")), runs[0]["backend"])
        columns[label] = runs[0]["times_us"]
        same = differ = 0
        for r in runs:
            fails = [k for k, v in r["features"].items() if v.startswith("FAIL")]
            if fails or r["failures"]:
                print("%s %s rank %d: %d failures (%s)" % (role, label, r["rank"], r["failures"], ", ".join(fails)))
            mine = next((x for x in primary if x["rank"] == r["rank"]), None)
            if mine is None:
                continue
            for case, a in mine["samples"].items():
                if case not in r["samples"]:
                    continue
                ok, how = agree(torch, case, a, r["samples"][case], r["world"])
                if how == "identical":
                    same += 1
                elif ok:
                    differ += 1
                else:
                    line = "rank %d %s: %s against %s" % (r["rank"], case, how, label)
                    if counts:
                        bad.append(line)
                    else:
                        print("informative: " + line)
        print("results against %s: %d identical, %d within the bound but not identical" % (label, same, differ))
    print("torch %s, %d ranks; NCCL version torch reports: %s" % (p0["torch"], p0["world"], p0["nccl_version"]))
    print("features (rank 0 of %s):" % args.compare)
    for k, v in p0["features"].items():
        print("  %s: %s" % (k, v))
    print("median times, microseconds (CUDA events, rank 0):")
    print_times(columns)
    for line in bad:
        print("FAIL " + line)
    return 1 if bad else 0


def main():
    args = parse()
    if args.compare:
        return main_compare(args)
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
