"""Peak extra resident memory of an all_reduce or a reduce: the backend's scratch and staging,
not the tensor.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 scripts/allreduce_peak_rss.py \
        --backend ucx --mbytes 256 [--op reduce]

Each rank allocates and touches the tensor first, then reads its peak RSS (VmHWM), runs the
op a few times and reads the peak again; rank 0 prints the largest growth over ranks. A
reduce goes to rank 0; the other ranks' growth is what a copy of their input would show.
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
    parser.add_argument("--op", choices=("all_reduce", "reduce"), default="all_reduce")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    group = dist.new_group(backend=args.backend)
    t = torch.ones(args.mbytes * (1 << 20) // 4)
    dist.all_reduce(torch.ones(1024), group=group)  # connect and warm up on a small tensor
    before = peak_rss_bytes()
    for _ in range(args.iters):
        if args.op == "reduce":
            t.fill_(1.0)  # Gloo may leave partial sums in non-root inputs
            dist.reduce(t, dst=0, group=group)
        else:
            dist.all_reduce(t, group=group)
    growth = torch.tensor([peak_rss_bytes() - before], dtype=torch.int64)
    dist.all_reduce(growth, op=dist.ReduceOp.MAX)
    ws = dist.get_world_size()
    if args.op == "all_reduce":
        expected = float(ws**args.iters)
    else:  # elsewhere the result is unspecified
        expected = float(ws) if dist.get_rank() == 0 else None
    ok = expected is None or bool(t[0].item() == expected and t[-1].item() == expected)
    wrong = torch.tensor([0 if ok else 1], dtype=torch.int64)
    dist.all_reduce(wrong, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(
            f"{args.backend} {args.op} of {args.mbytes} MB: peak RSS growth "
            f"{growth.item() / (1 << 20):.1f} MB (max over ranks); "
            f"result {'WRONG' if wrong.item() else 'ok'}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
