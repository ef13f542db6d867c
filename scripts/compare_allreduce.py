"""all_reduce on ucx and Gloo in the same torchrun job: latency and nccl-tests bus bandwidth.

A stop-gap until `python -m ucxbackend bench` (issue #3). Both groups span the same ranks;
each size is timed on one backend then the other, so noise hits both alike.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 scripts/compare_allreduce.py
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import ucxbackend  # noqa: F401  (registers "ucx")


def timed(group: dist.ProcessGroup, t: torch.Tensor, iters: int, warmup: int) -> float:
    """Best per-iteration time (s) over 3 rounds of `iters` all_reduces."""
    for _ in range(warmup):
        dist.all_reduce(t, group=group)
    best = float("inf")
    for _ in range(3):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        best = min(best, (time.perf_counter() - start) / iters)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="8,1048576,16777216,67108864", help="bytes, comma list")
    args = parser.parse_args()
    dist.init_process_group("ucx")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"ucx": dist.new_group(backend="ucx"), "gloo": dist.new_group(backend="gloo")}
    if rank == 0:
        print(f"{'bytes':>10} {'ucx us':>10} {'gloo us':>10} {'ucx busbw':>10} "
              f"{'gloo busbw':>10} {'gloo/ucx time':>14}")
    for size in (int(s) for s in args.sizes.split(",")):
        n = max(1, size // 4)
        iters = 200 if size <= 65536 else max(3, int(2e8 // size))
        times = {}
        for name, group in groups.items():
            # rank-valued input, reset to zero after one checked reduction: no overflow later
            t = torch.full((n,), float(rank))
            dist.all_reduce(t, group=group)
            assert t[0].item() == world * (world - 1) / 2, (name, t[0].item())
            t.zero_()
            times[name] = timed(group, t, iters, warmup=max(1, iters // 10))
        busbw = {k: n * 4 / v * 2 * (world - 1) / world / 1e9 for k, v in times.items()}
        if rank == 0:
            print(f"{n * 4:>10} {times['ucx'] * 1e6:>10.1f} {times['gloo'] * 1e6:>10.1f} "
                  f"{busbw['ucx']:>10.2f} {busbw['gloo']:>10.2f} "
                  f"{times['gloo'] / times['ucx']:>14.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
