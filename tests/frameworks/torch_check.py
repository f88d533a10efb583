"""PyTorch on whichever libnccl.so.2 the process loaded: collectives, new_group, a DDP loop.

Run under torchrun (one process per rank). Writes one JSON file per rank to --out-dir with what
it saw: the NCCL version PyTorch reports, the libnccl file mapped into the process, each
collective's verdict, the loss of every DDP step and the mean step time. tests/frameworks/
run_torch.sh runs it on Braid and on NCCL and compares the two.

With fewer GPUs than ranks (--hosts), every rank poses as a host of its own (BRAID_HOSTID /
NCCL_HOSTID, set before the first NCCL call), so both libraries connect the ranks through
their network transport and accept two ranks on one GPU.
"""
import argparse
import json
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hosts", action="store_true", help="each rank poses as its own host")
    p.add_argument("--optim", choices=("adam", "sgd"), default="adam",
                   help="adam (default: moves the loss visibly) or sgd (lr 1e-2: the loss barely "
                        "moves through this deep a stack)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="then profile this many DDP steps (torch.profiler): GPU time per kernel, "
                        "written to profile_rankN.txt in --out-dir")
    p.add_argument("--compute-steps", type=int, default=0,
                   help="then time this many steps without gradient all-reduce (DDP no_sync)")
    return p.parse_args()


def maps():
    """(start, end, path) of every file mapping of this process (/proc/self/maps)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi, os.path.realpath(fields[5])))
    return out


def loaded_nccl():
    """Which libnccl files are mapped, and which one the NCCL calls go to.

    PyTorch's own start-up may map its bundled libnccl.so.2 by full path even when Braid is
    preloaded, so "mapped" alone proves little. What counts is where ncclAllReduce resolves:
    in the global scope (where a preloaded library sits, ahead of everything libtorch_cuda.so
    would find through its RPATH) or, when no library put it there, in the object that answers
    to the name "libnccl.so.2"; and whether Braid's own braidGetVersionString is there too.
    """
    import ctypes
    m = maps()
    mapped = sorted({p for _, _, p in m if "libnccl" in os.path.basename(p)})
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "ncclAllReduce"):
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    addr = ctypes.cast(lib.ncclAllReduce, ctypes.c_void_p).value
    owner = next((p for lo, hi, p in m if lo <= addr < hi), None)
    banner = None
    if hasattr(lib, "braidGetVersionString"):
        lib.braidGetVersionString.restype = ctypes.c_char_p
        banner = lib.braidGetVersionString().decode()
    return mapped, owner, banner


def check_collectives(dist, torch, rank, world, dev):
    """Each collective with known inputs; returns {name: "ok" | what went wrong}."""
    out = {}

    def verdict(name, got, want):
        out[name] = "ok" if torch.equal(got, want) else (
            "got %s... expected %s..." % (got.flatten()[:4].tolist(), want.flatten()[:4].tolist()))

    n = 1 << 16
    base = torch.arange(n, device=dev, dtype=torch.float32)
    t = base + rank
    dist.all_reduce(t)
    verdict("all_reduce", t, base * world + sum(range(world)))

    mine = torch.full((n,), float(rank + 1), device=dev)
    gathered = torch.empty(n * world, device=dev)
    dist.all_gather_into_tensor(gathered, mine)
    verdict("all_gather_into_tensor", gathered,
            torch.cat([torch.full((n,), float(r + 1), device=dev) for r in range(world)]))

    full = torch.arange(n * world, device=dev, dtype=torch.float32) * (rank + 1)
    part = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(part, full)
    scale = sum(r + 1 for r in range(world))
    verdict("reduce_scatter_tensor", part,
            torch.arange(rank * n, (rank + 1) * n, device=dev, dtype=torch.float32) * scale)

    b = torch.full((n,), float(rank + 7), device=dev)
    dist.broadcast(b, src=world - 1)
    verdict("broadcast", b, torch.full((n,), float(world - 1 + 7), device=dev))

    send = torch.arange(world * 4, device=dev, dtype=torch.float32) + 100 * rank
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    want = torch.cat([torch.arange(rank * 4, rank * 4 + 4, device=dev, dtype=torch.float32) + 100 * r
                      for r in range(world)])
    verdict("all_to_all_single", recv, want)

    nxt, prv = (rank + 1) % world, (rank - 1) % world
    s = torch.full((n,), float(rank), device=dev)
    r = torch.empty(n, device=dev)
    if world > 1:
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt), dist.P2POp(dist.irecv, r, prv)])
        for q in reqs:
            q.wait()
        verdict("send_recv", r, torch.full((n,), float(prv), device=dev))
        if rank == 0:
            dist.send(s, 1)
        elif rank == 1:
            dist.recv(r, 0)
        if rank == 1:
            verdict("send/recv (blocking)", r, torch.zeros(n, device=dev))

    # A group of every rank but the last (all of them when alone): ncclCommSplit under the hood.
    members = list(range(max(1, world - 1)))
    g = dist.new_group(members)
    if rank in members:
        t = torch.ones(n, device=dev) * (rank + 1)
        dist.all_reduce(t, group=g)
        verdict("new_group all_reduce", t, torch.full((n,), float(sum(m + 1 for m in members)), device=dev))
    dist.barrier()
    torch.cuda.synchronize()
    return out


def profile_steps(args, torch, rank, step):
    """GPU time per kernel over a few DDP steps, and how much of the collectives' time ran
    beside other kernels: where a step's time goes, library against library."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profile_steps):
            step()
    def annotation(e):  # a record_function range on the GPU timeline, not a kernel
        return (getattr(e, "is_user_annotation", False) or e.name.startswith("nccl:") or
                "#" in e.name or e.name.startswith("DistributedDataParallel"))
    kernels = [e for e in prof.events()
               if getattr(e.device_type, "name", "") == "CUDA" and not annotation(e)]
    dur = lambda e: e.time_range.end - e.time_range.start  # noqa: E731 (us)
    total = {}
    for e in kernels:
        t = total.setdefault(e.name, [0, 0.0])
        t[0] += 1
        t[1] += dur(e)
    comm = [e for e in kernels if "nccl" in e.name.lower() or "braid" in e.name.lower()]
    other = sorted(((e.time_range.start, e.time_range.end) for e in kernels if e not in comm))
    busy = 0.0  # collective time with another kernel running at the same moment
    for c in comm:
        lo, hi = c.time_range.start, c.time_range.end
        cover, at = 0.0, lo
        for s0, e0 in other:
            if e0 <= at or s0 >= hi:
                continue
            s1, e1 = max(s0, at), min(e0, hi)
            if e1 > s1:
                cover += e1 - s1
                at = e1
        busy += cover
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "profile_rank%d.txt" % rank), "w") as f:
        n = args.profile_steps
        f.write("%d steps; per step: kernel, calls, GPU us\n" % n)
        for name, (calls, us) in sorted(total.items(), key=lambda kv: -kv[1][1])[:25]:
            f.write("%10.1f us %5.1f calls  %s\n" % (us / n, calls / n, name[:110]))
        ct = sum(dur(e) for e in comm)
        f.write("collectives %.1f us per step, %.1f us of it beside other kernels\n" % (ct / n, busy / n))


def ddp_loop(args, dist, torch, rank, dev):
    """8 x Linear(4096, 4096) + GELU, Adam, fixed data per rank; the loss of each step.

    Adam, not plain SGD: with this deep a stack the raw gradients are tiny and SGD would leave
    the loss at its first value to six digits, which a broken all-reduce would match too.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(1234)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    if args.optim == "sgd":
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
    else:
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev)
    gen.manual_seed(99 + rank)
    x = torch.randn(args.batch, args.width, device=dev, generator=gen)
    y = torch.randn(args.batch, args.width, device=dev, generator=gen)
    def step():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0, loss

    losses, times = [], []
    for _ in range(args.steps):
        t, loss = step()
        times.append(t)
        losses.append(loss.item())
    nparams = sum(p.numel() for p in model.parameters())
    warm = times[5:] if len(times) > 10 else times
    if args.profile_steps > 0:
        try:
            profile_steps(args, torch, rank, step)
        except Exception as e:  # a diagnostic: never the run's verdict
            print("rank %d: profile failed: %r" % (rank, e), flush=True)
    compute = []
    with ddp.no_sync():  # the same step without the gradients' all-reduce: what overlaps it
        for _ in range(args.compute_steps):
            compute.append(step()[0])
    compute = compute[2:] if len(compute) > 4 else compute
    return losses, sum(warm) / len(warm), nparams, (sum(compute) / len(compute) if compute else None)


def main():
    args = parse()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.hosts:
        os.environ["BRAID_HOSTID"] = os.environ["NCCL_HOSTID"] = "torch-host%d" % rank
    import torch
    import torch.distributed as dist
    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", local % ngpu)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    result = {"rank": rank, "world": world, "torch": torch.__version__,
              "nccl_version": ".".join(str(v) for v in torch.cuda.nccl.version())}
    result["collectives"] = check_collectives(dist, torch, rank, world, dev)
    result["losses"], result["step_s"], result["params"], result["compute_step_s"] = ddp_loop(
        args, dist, torch, rank, dev)
    result["libnccl_mapped"], result["ncclAllReduce_from"], result["braid_banner"] = loaded_nccl()
    dist.destroy_process_group()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    bad = {k: v for k, v in result["collectives"].items() if v != "ok"}
    compute = result["compute_step_s"]
    print("rank %d: nccl %s, ncclAllReduce from %s (%s), step %.2f ms%s, collectives %s" % (
        rank, result["nccl_version"], result["ncclAllReduce_from"], result["braid_banner"],
        result["step_s"] * 1e3,
        "" if compute is None else " (%.2f ms without the all-reduce)" % (compute * 1e3),
        "ok" if not bad else bad), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
