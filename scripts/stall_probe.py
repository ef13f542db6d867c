"""Why some 2-rank ucx all_reduce iterations on one host are slow (issue #23).

Starts two ranks on this host, runs ``--iters`` all_reduces of each size back to back and
records, per iteration and per rank: the time, and for the caller's thread and the progress
thread the change in the kernel's schedstat (CPU time, time runnable but waiting for a core),
their voluntary and involuntary context switches, the core each ended on, and this process's
``ucxbackend.wait_stats()`` (yields, yields that lost the core, sleeps, sleeps that timed out) and
``core_moves`` (``ucxbackend.inline_stats()``: a thread that left a core the peer rank waited on).
It prints, per size, the slow iterations (over ``--slow`` times the fastest) against the
others, so that a stall reads as one of:

- runqueue wait: the threads were runnable but another thread held the core (load, or both
  progress threads on one core: see ``same core``);
- CPU time: the copies themselves were slower (the host's slow mode: docs/performance.md);
- sleeps / timeouts: a wait slept, and ``sleep_timeouts`` says a wake-up never came.

    OMP_NUM_THREADS=1 python scripts/stall_probe.py --sizes 16M,64M --iters 100 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch.multiprocessing as mp

THREADS = ("caller", "progress")
SCHED = ("cpu_us", "runq_us", "voluntary", "involuntary")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _thread_sample(tid: int) -> list[int]:
    """[cpu ns, runqueue ns, voluntary, involuntary, last core] of one thread of this process."""
    base = f"/proc/self/task/{tid}"
    with open(base + "/schedstat") as f:
        cpu, runq, _ = (int(x) for x in f.read().split())
    switches = {}
    with open(base + "/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                switches[key] = int(value)
    with open(base + "/stat") as f:
        stat = f.read()
    core = int(stat[stat.rindex(")") + 2 :].split()[36])
    return [
        cpu,
        runq,
        switches["voluntary_ctxt_switches"],
        switches["nonvoluntary_ctxt_switches"],
        core,
    ]


def progress_tid() -> int:
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == "ucxb-progress":
                return int(tid)
    raise RuntimeError("no ucxb-progress thread in this process")


def _rank(
    rank: int, port: int, sizes: list[int], iters: int, warmup: int, out: str, pin: bool
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if pin:  # every thread of this rank (the progress thread inherits it) on a core of its own
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    import torch
    import torch.distributed as dist

    import ucxbackend

    dist.init_process_group("ucx", rank=rank, world_size=2)
    dist.all_reduce(torch.ones(8))
    tids = {"caller": os.getpid(), "progress": progress_tid()}
    results: dict[str, list[dict[str, Any]]] = {}
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(t)
        dist.barrier()
        rows = []
        for _ in range(iters):
            before = {k: _thread_sample(v) for k, v in tids.items()}
            waits = ucxbackend.wait_stats()
            moves = ucxbackend.inline_stats()["core_moves"]
            start = time.perf_counter_ns()
            dist.all_reduce(t)
            end = time.perf_counter_ns()
            waits_after = ucxbackend.wait_stats()
            waits_after["core_moves"] = ucxbackend.inline_stats()["core_moves"]
            waits["core_moves"] = moves
            after = {k: _thread_sample(v) for k, v in tids.items()}
            row: dict[str, Any] = {"us": (end - start) / 1e3}
            for k in THREADS:
                d = [a - b for a, b in zip(after[k][:4], before[k][:4], strict=True)]
                row[k] = {
                    "cpu_us": d[0] / 1e3,
                    "runq_us": d[1] / 1e3,
                    "voluntary": d[2],
                    "involuntary": d[3],
                    "core": after[k][4],
                }
            row["waits"] = {k: waits_after[k] - waits[k] for k in waits}
            rows.append(row)
        results[str(nbytes)] = rows
    dist.barrier()
    dist.destroy_process_group()
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(results, f)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def summarize(ranks: list[dict[str, list[dict[str, Any]]]], slow: float) -> str:
    lines = []
    for size in ranks[0]:
        per_rank = [r[size] for r in ranks]
        times = [max(rows[i]["us"] for rows in per_rank) for i in range(len(per_rank[0]))]
        fastest = min(times)
        groups = {
            "fast": [i for i, t in enumerate(times) if t < slow * fastest],
            "slow": [i for i, t in enumerate(times) if t >= slow * fastest],
        }
        same = sum(
            1
            for i in range(len(times))
            if len({rows[i]["progress"]["core"] for rows in per_rank}) == 1
        )
        lines.append(
            f"{int(size) >> 20} MiB: median {statistics.median(times):.0f} us, min {fastest:.0f},"
            f" max {max(times):.0f}; progress threads ended on one core in {same}/{len(times)}"
        )
        for name, idx in groups.items():
            if not idx:
                continue
            head = f"  {name} {len(idx)}: mean {_mean([times[i] for i in idx]):.0f} us"
            lines.append(head)
            for r, rows in enumerate(per_rank):
                parts = []
                for k in THREADS:
                    stats = ", ".join(
                        f"{s} {_mean([rows[i][k][s] for i in idx]):.1f}" for s in SCHED
                    )
                    parts.append(f"{k}: {stats}")
                waits = rows[0]["waits"].keys()
                per_op = ", ".join(
                    f"{w} {_mean([rows[i]['waits'][w] for i in idx]):.2f}" for w in waits
                )
                lines.append(f"    rank {r} {'; '.join(parts)}")
                lines.append(f"    rank {r} per op: {per_op}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sizes", default="16M,64M", help="comma-separated sizes (16M,64M)")
    p.add_argument("--iters", type=int, default=100, help="timed iterations per size (100)")
    p.add_argument("--warmup", type=int, default=20, help="untimed iterations first (20)")
    p.add_argument("--slow", type=float, default=1.5, help="slow: over this times the fastest")
    p.add_argument("--json", default="stall_probe.json", help="per-iteration records")
    p.add_argument(
        "--pin",
        action="store_true",
        help="pin rank r to the r-th allowed core: its progress thread cannot share the peer's",
    )
    args = p.parse_args(argv)
    sizes = [_size(s) for s in args.sizes.split(",")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(
        _rank,
        args=(port, sizes, args.iters, args.warmup, args.json, args.pin),
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    ranks = []
    for r in range(2):
        with open(f"{args.json}.rank{r}") as f:
            ranks.append(json.load(f))
        os.unlink(f"{args.json}.rank{r}")
    with open(args.json, "w") as f:
        json.dump(ranks, f)
    print(summarize(ranks, args.slow))
    return 0


if __name__ == "__main__":
    sys.exit(main())
