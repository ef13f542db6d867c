"""DDP training that loses a rank mid-run, shrinks its group and finishes with the survivors.

    OMP_NUM_THREADS=1 python examples/shrink_ddp.py --backend ucx --world-size 3 --kill-rank 2
    OMP_NUM_THREADS=1 python examples/shrink_ddp.py --backend ucx --world-size 2

The script starts its own ranks (torchrun would end the whole job when one dies) over a
FileStore, which outlives any rank. They are forked from a fork server that imports torch,
torch._dynamo (DDP's constructor imports it) and ucxbackend once, before any of them exists:
each would otherwise spend 3-4 s of CPU importing them itself. Training is full-batch
gradient descent in float64: each rank holds an equal share of the whole data set and DDP
sums the gradients of the per-rank losses, each weighted by its share. The update is then
the same whatever the world size, so a run that loses a rank and re-shares the data among
the survivors must end with the loss of a run that had the survivors' world size from the
start (up to rounding).

With --kill-rank, that rank SIGKILLs itself before its backward at --kill-step. The
survivors' backward fails (the peer is gone, or the op times out), they call
``ucxbackend.shrink_group([kill_rank])``, wrap the model in a new DDP over the shrunk (now
default) group, and redo that step. The parent reaps each rank as it exits (the killed one
expected to end by SIGKILL; any other early exit fails the run at once) and prints rank 0's
``RESULT backend=... world_size=... final_loss=...``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

SAMPLES = 240
# What every rank imports before its first step, imported once in the fork server.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "ucxbackend"]
LR = 0.1  # plain SGD step size; tests/test_split_shrink.py replays the run with it


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=g, dtype=torch.float64)
    y = x @ torch.randn(8, 1, generator=g, dtype=torch.float64) + 0.1
    return x, y


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(
        torch.float64
    )


def share(x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return x.tensor_split(size)[rank]


def rank_main(rank: int, args: Any, store_path: str, results: Any) -> None:
    import ucxbackend  # registers ucx and udp (imported already, in the fork server)

    store = dist.FileStore(store_path, args.world_size)
    dist.init_process_group(
        args.backend,
        store=store,
        rank=rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=args.timeout),
    )
    x, y = data()
    module = model()
    ddp = DDP(module)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    step = 0
    while step < args.steps:
        size, me = dist.get_world_size(), dist.get_rank()
        xs, ys = share(x, me, size), share(y, me, size)
        opt.zero_grad()
        # DDP averages over ranks; the weight makes the sum the whole data set's mean loss.
        weight = size * xs.shape[0] / SAMPLES
        loss = torch.nn.functional.mse_loss(ddp(xs), ys) * weight
        if rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
        except RuntimeError as exc:
            if args.kill_rank < 0:
                raise
            print(f"rank {rank}: step {step} failed ({str(exc)[:80]}...); shrinking", flush=True)
            del ddp
            # torch's shrink_group, with the shrunk group's backend type fixed for DDP.
            abort = dist.distributed_c10d.SHRINK_ABORT
            ucxbackend.shrink_group([args.kill_rank], shrink_flags=abort)
            ddp = DDP(module)
            continue  # redo the step on the shrunk group
        opt.step()
        step += 1
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(module(x), y).item()
    if dist.get_rank() == 0:
        results.put((dist.get_world_size(), final))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="ucx")
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=float, default=15.0)
    args = p.parse_args()
    if args.kill_rank == 0:
        p.error("--kill-rank 0 would take the reporting rank; pick another")
    # Before the fork server starts, so that it and the ranks forked from it see it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=rank_main, args=(r, args, os.path.join(tmp, "store"), results))
            for r in range(args.world_size)
        ]
        for proc in procs:
            proc.start()
        try:
            outcome = supervise(procs, results, args.kill_rank, args.timeout * 4 + 60)
        finally:
            end_all(procs)
    if isinstance(outcome, str):
        print(f"shrink_ddp: {outcome}", file=sys.stderr, flush=True)
        return 1
    world, final = outcome
    print(f"RESULT backend={args.backend} world_size={world} final_loss={final:.15e}", flush=True)
    return 0


def supervise(
    procs: list[Any], results: Any, kill_rank: int, deadline_s: float
) -> tuple[int, float] | str:
    """Waits for rank 0's result, reaping each rank as it exits, as torchrun's agent does: the
    rank that killed itself is expected to end by SIGKILL; any other rank that ends before
    the result without exit code 0 fails the run at once (its survivors would wait for it
    until their timeout). Returns the result, or why there is none."""
    deadline = time.monotonic() + deadline_s
    reaped: set[int] = set()

    def reap() -> str | None:
        for rank, proc in enumerate(procs):
            if rank in reaped or proc.exitcode is None:
                continue
            proc.join()
            reaped.add(rank)
            if rank == kill_rank and proc.exitcode == -signal.SIGKILL:
                print(f"rank {rank} was killed, as asked; the others shrink", flush=True)
            elif proc.exitcode != 0:
                return f"rank {rank} exited with code {proc.exitcode} before rank 0's result"
        return None

    while time.monotonic() < deadline:
        try:
            result = results.get(timeout=0.2)
        except queue.Empty:
            result = None
        if result is not None:
            # The survivors may shrink and finish before a 0.2 s look found the killed rank
            # (a rank that fails tells the others at once): reap what has ended by now.
            reap()
            return result  # type: ignore[no-any-return]
        failed = reap()
        if failed is not None:
            return failed
    return f"no result from rank 0 within {deadline_s:.0f} s"


def end_all(procs: list[Any]) -> None:
    """Lets every rank finish (rank 0 has sent its result; the others are tearing down), then
    kills whichever has not within 30 s, and reaps them all."""
    deadline = time.monotonic() + 30
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join()


if __name__ == "__main__":
    sys.exit(main())
