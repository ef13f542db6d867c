"""Data-parallel training demo: a tiny MLP on synthetic regression data with DDP.

Run under torchrun, once per backend, and compare the RESULT lines::

    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        examples/train_ddp.py --backend ucx
    OMP_NUM_THREADS=1 python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        examples/train_ddp.py --backend gloo

Everything is seeded, so for a given world size both backends must train to the same model.
Rank 0 prints the mean training loss of every epoch and finishes with one machine-readable line:

    RESULT backend=ucx world_size=2 steps=320 final_loss=... param_checksum=... \\
        param_sha256=... in_sync=1 seconds=...

``final_loss`` is the loss of the final model on the whole data set, ``param_checksum`` a
position-weighted float64 sum of all parameters, ``param_sha256`` the first 16 hex digits of the
SHA-256 of the parameters' bytes (equal only if the models are bit-identical), ``in_sync`` 1
when every rank ends with the same parameters as rank 0, ``seconds`` the training loop's wall time.

Collectives used: broadcast and all_reduce (SUM) explicitly; DDP adds allgather (parameter
shape check), broadcast (initial state) and all_reduce of gradient buckets.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--backend", choices=["ucx", "gloo"], default="ucx")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=4096, help="data set size (all ranks)")
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    return p.parse_args(argv)


def make_data(n: int, features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same synthetic data set on every rank: y = teacher(x) + noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w1 = torch.randn(features, 8, generator=g) / features**0.5
    w2 = torch.randn(8, 1, generator=g)
    y = torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(n, 1, generator=g)
    return x, y


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.backend == "ucx":
        import ucxbackend  # noqa: F401  (registers the "ucx" backend)

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    x, y = make_data(args.samples, args.features, args.seed)
    # Static sharding: rank r gets samples r, r+world, ...; equal shard sizes keep steps aligned.
    per_rank = args.samples // world
    x_local = x[rank::world][:per_rank].to(device)
    y_local = y[rank::world][:per_rank].to(device)
    steps_per_epoch = per_rank // args.batch_size
    if steps_per_epoch == 0:
        raise SystemExit("--batch-size is larger than a rank's shard")

    torch.manual_seed(args.seed)  # same init everywhere (DDP also broadcasts rank 0's)
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)
    ).to(device)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.MSELoss()
    shuffle = torch.Generator().manual_seed(args.seed + 1 + rank)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(per_rank, generator=shuffle).to(device)
        total = torch.zeros(1, dtype=torch.float64, device=device)
        for step in range(steps_per_epoch):
            idx = order[step * args.batch_size : (step + 1) * args.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x_local[idx]), y_local[idx])
            loss.backward()
            opt.step()
            total += loss.detach().double()
        dist.all_reduce(total)  # SUM over ranks
        if rank == 0:
            mean = total.item() / (steps_per_epoch * world)
            print(f"epoch {epoch + 1}/{args.epochs} loss {mean:.8f}", flush=True)
    seconds = time.perf_counter() - start

    params = flat_params(model)
    reference = params.clone()
    dist.broadcast(reference, src=0)
    mismatch = (params != reference).sum().to(torch.float64).reshape(1)
    dist.all_reduce(mismatch)

    if rank == 0:
        with torch.no_grad():
            final_loss = loss_fn(model(x.to(device)), y.to(device)).item()
        p64 = params.cpu().double()
        checksum = (p64 * torch.arange(1, p64.numel() + 1, dtype=torch.float64)).sum().item()
        sha = hashlib.sha256(params.cpu().numpy().tobytes()).hexdigest()[:16]
        print(
            f"RESULT backend={args.backend} world_size={world} "
            f"steps={steps_per_epoch * args.epochs} final_loss={final_loss:.17g} "
            f"param_checksum={checksum:.17g} param_sha256={sha} "
            f"in_sync={int(mismatch.item() == 0)} seconds={seconds:.3f}",
            flush=True,
        )
    rc = 0 if mismatch.item() == 0 else 1
    # Tear down explicitly, while the interpreter is fully alive: drop DDP (it holds a reference
    # to the process group), leave together, then destroy the group, which for ucx runs the
    # backend's shutdown here rather than during interpreter finalization.
    del ddp, opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    if args.backend == "gloo":
        # torch 2.13's gloo + DDP intermittently aborts *after* main() returns ("terminate
        # called without an active exception": a pt_gloo_runloop thread takes the GIL during
        # Py_Finalize). That is the baseline's problem, not a result; skip finalization.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
