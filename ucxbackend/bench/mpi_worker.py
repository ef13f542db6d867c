"""The program behind the ``mpi`` column of ``python -m ucxbackend bench``: mpi4py ``Allreduce``.

Started by rank 0 of the bench (:func:`.mpi.start_mpi_session`, which builds the command) as
``mpirun --allow-run-as-root --oversubscribe -n N --mca btl self,vader python -m
ucxbackend.bench.mpi_worker --control=SOCKET ...``; not meant to be run by hand. Every rank
connects to the bench's Unix socket ``--control``, says hello and then does what the bench
asks, one JSON line at a time (the protocol: :mod:`.mpi`), sleeping in ``recv`` in between, so
that it takes no core from the torch columns timed in the same rounds. It times in-place
``Allreduce`` (``MPI.IN_PLACE``, as torch's all_reduce is in place) as the bench times a torch
backend: one checked call and warm-up at ``prepare``; per ``round`` an untimed call if asked, a
barrier and the timed calls, whose seconds go back to the bench, which reduces them.

half, bfloat16 and avg have no MPI equivalent here: those sizes are reported unsupported.
The bench's test hook ``UCXBACKEND_BENCH_CORRUPT=mpi`` corrupts one checked element here too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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
    p.add_argument("--control", required=True, help="the bench's Unix socket")
    p.add_argument("--warmup_iters", type=int, required=True)
    p.add_argument("--datatype", required=True)
    p.add_argument("--op", required=True, choices=OPS)
    p.add_argument("--check", type=int, choices=(0, 1), default=1)
    return p


def _unsupported_reason(dtype: torch.dtype, op: str) -> str | None:
    if dtype not in _NUMPY_DTYPES:
        return f"MPI has no {dtype} reduction here"
    if op == "avg":
        return "MPI has no avg reduction"
    return None


class _Rank:
    """This MPI rank's state between commands: the current size's buffer and op."""

    def __init__(self, comm: Any, mpi: Any, args: argparse.Namespace) -> None:
        self.comm, self.mpi, self.args = comm, mpi, args
        self.dtype = TORCH_DTYPES[args.datatype]
        self.buf: Any = None
        self.mpi_op = {"sum": mpi.SUM, "prod": mpi.PROD, "min": mpi.MIN, "max": mpi.MAX}.get(
            args.op
        )

    def allreduce(self) -> None:
        self.comm.Allreduce(self.mpi.IN_PLACE, self.buf, op=self.mpi_op)

    def prepare(self, nbytes: int) -> dict[str, Any]:
        """Check one call at ``nbytes`` (this rank's wrong count) and warm up."""
        comm, args = self.comm, self.args
        rank, world = comm.Get_rank(), comm.Get_size()
        elsize = torch.empty((), dtype=self.dtype).element_size()
        layout = layout_for("all_reduce", nbytes, elsize, world)
        self.buf = None
        reason = _unsupported_reason(self.dtype, args.op)
        if reason is not None:
            return {"supported": False, "error": reason, "wrong": None}
        expected = bool(args.check)
        data = make_case_data(
            "all_reduce", layout, self.dtype, args.op, rank, world, 0, with_expected=expected
        )
        assert data.send is not None
        self.buf = data.send.numpy().astype(_NUMPY_DTYPES[self.dtype], copy=True)
        self.allreduce()
        wrong = None
        if args.check:
            if os.environ.get(CORRUPT_ENV) == MPI and rank == 0:
                self.buf[0] = poison_value(self.dtype)
            assert data.expected is not None
            wrong = count_wrong(torch.from_numpy(self.buf), data.expected, args.op)
        self.buf[:] = 0  # in place: keep repeated reductions from overflowing
        for _ in range(args.warmup_iters):
            self.allreduce()
        return {"supported": True, "error": None, "wrong": wrong}

    def round(self, iters: int, rewarm: bool) -> dict[str, Any]:
        """``iters`` timed calls after a barrier (and an untimed one first if ``rewarm``)."""
        if self.buf is None:
            raise RuntimeError("round before a supported prepare")
        if rewarm:
            self.allreduce()
        self.comm.Barrier()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            self.allreduce()
            times.append(time.perf_counter() - start)
        return {"times": times}


def _serve(rank: _Rank, f: Any) -> None:
    """Answer the bench's commands until ``exit`` or the socket closes."""
    for line in f:
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "exit":
            return
        try:
            if cmd == "prepare":
                answer = rank.prepare(int(msg["bytes"]))
            elif cmd == "round":
                answer = rank.round(int(msg["iters"]), bool(msg["rewarm"]))
            else:
                answer = {"failed": f"unknown command {cmd!r}"}
        except Exception as exc:  # the bench names the rank and the command
            answer = {"failed": f"{type(exc).__name__}: {exc}"}
        f.write(json.dumps(answer) + "\n")
        f.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(args.control)
        with sock.makefile("rw", encoding="utf-8", newline="\n") as f:
            hello = {
                "rank": comm.Get_rank(),
                "pid": os.getpid(),
                "library": MPI.Get_library_version().strip().splitlines()[0].split(",")[0],
                "mpi4py": mpi4py.__version__,
            }
            f.write(json.dumps(hello) + "\n")
            f.flush()
            _serve(_Rank(comm, MPI, args), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
