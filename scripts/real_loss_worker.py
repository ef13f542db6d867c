"""One rank of ``scripts/rig_real_loss.py``: timed all_reduces on a ``udp`` group, each checked.

Started once per rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` in the
environment; the udp knobs in ``UCXBACKEND_UDP_CONFIG`` / ``UCXBACKEND_UDP_FAULTS``). Every
iteration all_reduces (SUM) an int64 tensor whose values depend on the rank and the iteration,
and compares the result bit for bit with the sum numpy computes from the same inputs; a
mismatch exits 1 naming the iteration and the first bad index. On success every rank prints
one line ``REAL_LOSS_RESULT <json>``: its rank, each timed op's wall time, what the timed ops
together changed in its udp counters (``ucxbackend.stats``, read once they settle) and its
transport's fault counters.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import ucxbackend

# The udp counters the comparison reads, summed over this rank's peers (ucxbackend.stats).
COUNTERS = ("retransmitted_packets", "declared_lost", "rto_expiries", "data_packets_sent",
            "spurious_retransmissions")
# The progress thread publishes an op's counters just after its Work completes, and again when
# it goes idle (the op's late ACKs and retransmissions): read them once they stop changing.
SETTLE_STEP_S = 0.05
SETTLE_MAX_S = 2.0


def _settled_counters() -> dict[str, int]:
    deadline = time.monotonic() + SETTLE_MAX_S
    prev: dict[str, int] | None = None
    while True:
        time.sleep(SETTLE_STEP_S)
        total = ucxbackend.stats()["total"]
        cur = {c: int(total.get(c, 0)) for c in COUNTERS}
        if cur == prev or time.monotonic() >= deadline:
            return cur
        prev = cur


def _input(rank: int, iteration: int, numel: int) -> np.ndarray:
    # Large values, so that a wrong word shows; distinct per rank and iteration.
    base = np.arange(numel, dtype=np.int64) * 2654435761
    return base ^ np.int64((rank + 1) * 1_000_003 + iteration * 7919)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    numel = max(args.bytes // 8, 1)
    dist.init_process_group("udp", timeout=timedelta(seconds=args.timeout))
    times: list[float] = []
    try:
        before: dict[str, int] = {}
        for it in range(args.warmup + args.iters):
            if it == args.warmup:
                dist.barrier()
                before = _settled_counters()
            t = torch.from_numpy(_input(rank, it, numel).copy())
            want = np.sum([_input(r, it, numel) for r in range(world)], axis=0)  # wraps, as torch
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            elapsed = time.perf_counter() - start
            got = t.numpy()
            if not np.array_equal(got, want):
                bad = int(np.flatnonzero(got != want)[0])
                print(f"rank {rank}: all_reduce iteration {it} ({args.bytes} B int64) wrong at "
                      f"index {bad}: {got[bad]} != {want[bad]}", file=sys.stderr)
                return 1
            if it >= args.warmup:
                times.append(elapsed)
        dist.barrier()
        after = _settled_counters()
        faults = {k: v for k, v in ucxbackend.stats()["transport"].items()
                  if k.startswith("faults_")}
        print("REAL_LOSS_RESULT " + json.dumps({
            "rank": rank, "times_s": times, "counters": {c: after[c] - before[c] for c in after},
            "faults": faults}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
