"""Peak extra resident memory of one all_reduce: the backend's scratch and staging, not the tensor.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 scripts/allreduce_peak_rss.py \
        --backend ucx --mbytes 256

Each rank allocates and touches the tensor first, then reads its peak RSS (VmHWM), runs the
all_reduce a few times and reads the peak again; rank 0 prints the largest growth over ranks.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import ucxbackend  # noqa: F401  (registers "ucx")


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="ucx")
    parser.add_argument("--mbytes", type=int, default=256)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    group = dist.new_group(backend=args.backend)
    t = torch.ones(args.mbytes * (1 << 20) // 4)
    dist.all_reduce(torch.ones(1024), group=group)  # connect and warm up on a small tensor
    before = peak_rss_bytes()
    for _ in range(args.iters):
        dist.all_reduce(t, group=group)
    growth = torch.tensor([peak_rss_bytes() - before], dtype=torch.int64)
    dist.all_reduce(growth, op=dist.ReduceOp.MAX)
    expected = float(dist.get_world_size() ** args.iters)
    ok = bool(t[0].item() == expected and t[-1].item() == expected)
    if dist.get_rank() == 0:
        print(
            f"{args.backend} all_reduce of {args.mbytes} MB: peak RSS growth "
            f"{growth.item() / (1 << 20):.1f} MB (max over ranks); result {'ok' if ok else 'WRONG'}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
