"""The program behind the ``mpi`` column of ``python -m ucxbackend bench``: mpi4py ``Allreduce``.

Started by rank 0 of the bench (:func:`.mpi.run_mpi_reference`, which builds the command) as
``mpirun --allow-run-as-root --oversubscribe -n N --mca btl self,vader python -m
ucxbackend.bench.mpi_worker --sizes=... --out=FILE``; not meant to be run by hand. It times in-place
``Allreduce`` (``MPI.IN_PLACE``, as torch's all_reduce is in place) exactly as the bench times
a torch backend: one checked iteration, warm-up, barrier, ``iters`` timed iterations, the
per-rank mean/median/min/max per iteration reduced across ranks with MAX. Rank 0 writes the
results as JSON to ``--out``. Sizes are the bench's all_reduce sizes, in bytes.

half, bfloat16 and avg have no MPI equivalent here: those rows are reported unsupported.
The bench's test hook ``UCXBACKEND_BENCH_CORRUPT=mpi`` corrupts one checked element here too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .cases import count_wrong, make_case_data, poison_value
from .common import CORRUPT_ENV, MPI, OPS, TORCH_DTYPES
from .mpi import WORKER_MODULE
from .sizes import layout_for
from .timing import time_stats

_NUMPY_DTYPES: dict[torch.dtype, Any] = {
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int32: np.int32,
    torch.uint32: np.uint32,
    torch.int64: np.int64,
    torch.uint64: np.uint64,
    torch.float32: np.float32,
    torch.float64: np.float64,
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {WORKER_MODULE}", description=__doc__)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--warmup_iters", type=int, required=True)
    p.add_argument("--datatype", required=True)
    p.add_argument("--op", required=True, choices=OPS)
    p.add_argument("--check", type=int, choices=(0, 1), default=1)
    p.add_argument("--out", required=True)
    return p


def _unsupported_reason(dtype: torch.dtype, op: str) -> str | None:
    if dtype not in _NUMPY_DTYPES:
        return f"MPI has no {dtype} reduction here"
    if op == "avg":
        return "MPI has no avg reduction"
    return None


def _measure(comm: Any, mpi: Any, args: argparse.Namespace, nbytes: int) -> dict[str, Any]:
    dtype = TORCH_DTYPES[args.datatype]
    rank, world = comm.Get_rank(), comm.Get_size()
    elsize = torch.empty((), dtype=dtype).element_size()
    layout = layout_for("all_reduce", nbytes, elsize, world)
    record: dict[str, Any] = {"bytes": layout.nbytes, "count": layout.count}
    reason = _unsupported_reason(dtype, args.op)
    if reason is not None:
        return {**record, "supported": False, "error": reason, "time_us": None, "wrong": None}
    data = make_case_data(
        "all_reduce", layout, dtype, args.op, rank, world, 0, with_expected=bool(args.check)
    )
    assert data.send is not None
    buf = data.send.numpy().astype(_NUMPY_DTYPES[dtype], copy=True)
    mpi_op = {"sum": mpi.SUM, "prod": mpi.PROD, "min": mpi.MIN, "max": mpi.MAX}[args.op]
    comm.Allreduce(mpi.IN_PLACE, buf, op=mpi_op)
    wrong = None
    if args.check:
        if os.environ.get(CORRUPT_ENV) == MPI and rank == 0:
            buf[0] = poison_value(dtype)
        assert data.expected is not None
        local = count_wrong(torch.from_numpy(buf), data.expected, args.op)
        wrong = int(comm.allreduce(local, op=mpi.SUM))
    buf[:] = 0
    for _ in range(args.warmup_iters):
        comm.Allreduce(mpi.IN_PLACE, buf, op=mpi_op)
    comm.Barrier()
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        comm.Allreduce(mpi.IN_PLACE, buf, op=mpi_op)
        times.append(time.perf_counter() - start)
    local_stats = np.array(time_stats(times), dtype=np.float64)
    stats = np.empty_like(local_stats)
    comm.Allreduce(local_stats, stats, op=mpi.MAX)
    keys = ("mean", "median", "min", "max")
    time_us = dict(zip(keys, (float(x) * 1e6 for x in stats), strict=True))
    return {**record, "supported": True, "error": None, "time_us": time_us, "wrong": wrong}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rows = [_measure(comm, MPI, args, nbytes) for nbytes in sizes]
    if comm.Get_rank() == 0:
        doc = {
            "library": MPI.Get_library_version().strip().splitlines()[0].split(",")[0],
            "mpi4py": mpi4py.__version__,
            "world_size": comm.Get_size(),
            "rows": rows,
        }
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
