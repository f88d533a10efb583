"""Training steps and torch.distributed collectives, timed, on whichever libnccl.so.2 the process
loaded: what a framework user sees of a collective library.

Run under torchrun (one process per rank); run_torch_steps.sh runs it on Braid and on PyTorch's
own NCCL in alternating rounds and torch_steps_compare.py sets the two side by side.

  torch_steps.py --out-dir DIR [--what ddp,fsdp2,colls] [--steps N] [--backend nccl|gloo]

  ddp    DistributedDataParallel over 8 x Linear(4096, 4096) + GELU in float32 (134 M
         parameters), Adam, fixed data per rank: the loss of every step, the mean step time.
  fsdp2  fully_shard (FSDP2) over 10 pre-norm MLP blocks of width 2048 (336 M parameters),
         bfloat16 compute and float32 gradient reduction (MixedPrecisionPolicy), AdamW; each
         block sharded on its own, then the root: the loss of every step, the mean step time.
  colls  all_reduce, all_gather_into_tensor and reduce_scatter_tensor of float32 at 1 MB,
         16 MB and 256 MB (the larger of input and output, as nccl-tests counts): each checked
         once against known values, then timed (mean over the iterations, host clock around a
         synchronized loop, as a training loop waits for them).

Writes DIR/rankN.json: the library that answered (torch_check.loaded_nccl), and per part the
losses, times and verdicts. --backend gloo runs the same on CPUs (smaller models: --small), for
checking this script where no GPU is; nothing of it is a measurement of a GPU library.
"""
import argparse
import json
import os
import sys
import time

COLL_SIZES = (1 << 20, 16 << 20, 256 << 20)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", required=True)
    p.add_argument("--what", default="ddp,fsdp2,colls")
    p.add_argument("--steps", type=int, default=30, help="steps of each training loop")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the mean time")
    p.add_argument("--iters", type=int, default=20, help="timed iterations of each collective")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--small", action="store_true", help="small models and sizes (CPU checks)")
    return p.parse_args()


class Clock:
    """Wall time of GPU work: synchronize, then the host clock (or only the host clock on CPUs)."""

    def __init__(self, torch, dev):
        self.torch, self.cuda = torch, dev.type == "cuda"

    def now(self):
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()


def train(args, torch, clock, model, opt, x, y):
    """args.steps steps of mse(model(x), y); (losses, mean step ms after the warm-up)."""
    losses, times = [], []
    for _ in range(args.steps):
        t0 = clock.now()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        times.append(clock.now() - t0)
        losses.append(loss.item())
    warm = times[args.warmup:] if len(times) > args.warmup + 2 else times
    return losses, 1e3 * sum(warm) / len(warm)


def data(torch, dev, rank, batch, width):
    gen = torch.Generator(device=dev)
    gen.manual_seed(99 + rank)
    return (torch.randn(batch, width, device=dev, generator=gen),
            torch.randn(batch, width, device=dev, generator=gen))


def part_ddp(args, torch, dist, clock, rank, dev):
    from torch.nn.parallel import DistributedDataParallel as DDP
    width, layers, batch = (256, 4, 32) if args.small else (4096, 8, 256)
    torch.manual_seed(1234)
    stack = []
    for _ in range(layers):
        stack += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*stack).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    x, y = data(torch, dev, rank, batch, width)
    losses, step_ms = train(args, torch, clock, ddp, opt, x, y)
    return {"losses": losses, "step_ms": step_ms,
            "params": sum(p.numel() for p in model.parameters()), "dtype": "float32"}


def part_fsdp2(args, torch, dist, clock, rank, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    width, blocks, batch = (128, 3, 16) if args.small else (2048, 10, 64)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    torch.manual_seed(1234)
    model = torch.nn.Sequential(*[Block() for _ in range(blocks)]).to(dev)
    params = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = data(torch, dev, rank, batch, width)
    losses, step_ms = train(args, torch, clock, model, opt, x, y)
    return {"losses": losses, "step_ms": step_ms, "params": params,
            "dtype": "bfloat16 compute, float32 reduction"}


def coll_case(torch, dist, op, n, rank, world, dev):
    """(run, check) for one collective of n float32 elements in all (n a multiple of world):
    rank r contributes r + 1 everywhere; check() says "ok" or what came out instead."""
    part, total = n // world, float(world * (world + 1) // 2)
    if op == "all_reduce":
        buf = torch.full((n,), float(rank + 1), device=dev)
        expect = torch.full((n,), total, device=dev)
        run = lambda: dist.all_reduce(buf)  # noqa: E731
    elif op == "all_gather_into_tensor":
        src = torch.full((part,), float(rank + 1), device=dev)
        buf = torch.empty(n, device=dev)
        expect = torch.arange(1, world + 1, device=dev, dtype=torch.float32).repeat_interleave(part)
        run = lambda: dist.all_gather_into_tensor(buf, src)  # noqa: E731
    else:
        src = torch.full((n,), float(rank + 1), device=dev)
        buf = torch.empty(part, device=dev)
        expect = torch.full((part,), total, device=dev)
        run = lambda: dist.reduce_scatter_tensor(buf, src)  # noqa: E731

    def check():
        return "ok" if torch.equal(buf, expect) else "wrong: %s..." % buf.flatten()[:4].tolist()
    return run, check


def part_colls(args, torch, dist, clock, rank, dev):
    """{"<op> <size>": {"us": mean, "bytes": size, "check": "ok" | what was wrong}}."""
    world = dist.get_world_size()
    out = {}
    for size in (tuple(s >> 8 for s in COLL_SIZES) if args.small else COLL_SIZES):
        n = size // 4 // world * world
        for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
            run, check = coll_case(torch, dist, op, n, rank, world, dev)
            run()  # all_reduce sums in place: checked after its first call only
            verdict = check()
            for _ in range(3):
                run()
            iters = max(2, args.iters // 2) if size >= (256 << 20) else args.iters
            dist.barrier()
            t0 = clock.now()
            for _ in range(iters):
                run()
            us = 1e6 * (clock.now() - t0) / iters
            label = "%d MB" % (size >> 20) if size >= (1 << 20) else "%d KB" % (size >> 10)
            out["%s %s" % (op, label)] = {"us": us, "bytes": n * 4, "check": verdict}
    return out


def main():
    args = parse()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    import torch
    import torch.distributed as dist
    if args.backend == "nccl":
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    clock = Clock(torch, dev)
    result = {"rank": rank, "world": world, "torch": torch.__version__, "backend": args.backend}
    if args.backend == "nccl":
        result["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    parts = {"ddp": part_ddp, "fsdp2": part_fsdp2, "colls": part_colls}
    for what in args.what.split(","):
        result[what] = parts[what](args, torch, dist, clock, rank, dev)
        dist.barrier()
    if args.backend == "nccl":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_check import loaded_nccl
        result["libnccl_mapped"], result["ncclAllReduce_from"], result["braid_banner"] = loaded_nccl()
    dist.destroy_process_group()
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    bad = {k: v["check"] for k, v in result.get("colls", {}).items() if v["check"] != "ok"}
    line = []
    for what in ("ddp", "fsdp2"):
        if what in result:
            line.append("%s %.2f ms/step (loss %.6g -> %.6g)" % (
                what, result[what]["step_ms"], result[what]["losses"][0], result[what]["losses"][-1]))
    if "colls" in result:
        line.append("collectives %s" % ("ok" if not bad else bad))
    print("rank %d: %s" % (rank, ", ".join(line)), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
