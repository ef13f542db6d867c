"""Heap allocations per small all_reduce, counted on rank 0 of a 2-rank job.

Builds a malloc/calloc/realloc counter (a few lines of C, into a temporary directory), preloads
it into both ranks, and prints rank 0's allocations per op over a timed loop after a warm-up,
every thread of the process counted (the progress thread too). Deterministic where timings on a
shared host are not: docs/performance.md, "A small op's fixed cost", uses it.

    OMP_NUM_THREADS=1 python scripts/allocs_per_op.py [--backend ucx] [--bytes 8] [--ops 2000]

Run it from outside the repository with PYTHONPATH naming the checkout to measure. Needs cc.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

COUNTER_C = r"""
#include <stddef.h>
#include <stdatomic.h>
extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
static atomic_ulong calls;
static void count(void) { atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed); }
void* malloc(size_t n) { count(); return __libc_malloc(n); }
void* calloc(size_t k, size_t n) { count(); return __libc_calloc(k, n); }
void* realloc(void* p, size_t n) { count(); return __libc_realloc(p, n); }
unsigned long allocs_so_far(void) { return atomic_load(&calls); }
"""
WARMUP = 500


def _rank(backend: str, nbytes: int, ops: int) -> None:
    import torch
    import torch.distributed as dist

    import ucxbackend  # noqa: F401  (registers the backends)

    counter = ctypes.CDLL(os.environ["ALLOCS_COUNTER"])
    counter.allocs_so_far.restype = ctypes.c_ulong
    dist.init_process_group(backend)
    t = torch.ones(max(1, nbytes // 4))
    for _ in range(WARMUP):
        dist.all_reduce(t)
    before = counter.allocs_so_far()
    for _ in range(ops):
        dist.all_reduce(t)
    after = counter.allocs_so_far()
    if dist.get_rank() == 0:
        print(f"{backend} {nbytes} B all_reduce: {(after - before) / ops:.2f} allocations per op")
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="ucx")
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        _rank(args.backend, args.bytes, args.ops)
        return 0
    with tempfile.TemporaryDirectory(prefix="allocs_") as tmp:
        source = os.path.join(tmp, "counter.c")
        library = os.path.join(tmp, "libcounter.so")
        with open(source, "w") as f:
            f.write(COUNTER_C)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
        env = {**os.environ, "ALLOCS_COUNTER": library, "LD_PRELOAD": library}
        env.setdefault("OMP_NUM_THREADS", "1")
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-port", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   "127.0.0.1:0", os.path.abspath(__file__), "--rank",
                   "--backend", args.backend, "--bytes", str(args.bytes), "--ops", str(args.ops)]
        return subprocess.run(command, env=env, timeout=600).returncode


if __name__ == "__main__":
    sys.exit(main())
