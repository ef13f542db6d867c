"""The ``mpi`` column: an mpi4py ``Allreduce`` reference for ``all_reduce``, as rank 0 sees it.

Call order: before the torch sweep rank 0 calls :func:`run_mpi_reference`: if
:func:`mpi_skip_reason` finds mpirun and mpi4py, it runs :func:`mpi_command` (``mpirun ...
python -m`` :data:`WORKER_MODULE`, the program in :mod:`.mpi_worker`) with the same sizes,
reads the JSON that program writes (``library``, ``mpi4py``, ``rows``) and returns an
:class:`MpiOutcome`, whose rows the runner puts in the ``mpi`` column. A missing or failing
MPI only skips the column.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .common import ARGV_ENV, LAUNCH_ENV
from .options import BenchOptions
from .sizes import Layout
from .timing import Measurement

logger = logging.getLogger(__name__)

# The program mpirun starts (``python -m``): :mod:`.mpi_worker`.
WORKER_MODULE: Final = "ucxbackend.bench.mpi_worker"


def mpi_skip_reason() -> str | None:
    """Why the mpi column cannot be measured here (None when it can)."""
    if shutil.which("mpirun") is None:
        return "mpirun not found on PATH (e.g. apt-get install openmpi-bin)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


def mpi_command(opts: BenchOptions, world: int, sizes: Sequence[int], out: str) -> list[str]:
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        str(world),
        "--mca",
        "btl",
        "self,vader",
        sys.executable,
        "-m",
        WORKER_MODULE,
        f"--sizes={','.join(str(s) for s in sizes)}",
        f"--iters={opts.iters}",
        f"--warmup_iters={opts.warmup_iters}",
        f"--datatype={opts.datatype}",
        f"--op={opts.op}",
        f"--check={int(opts.check)}",
        f"--out={out}",
    ]


def _mpi_env() -> dict[str, str]:
    """The environment without torchrun's rendezvous variables (they mean nothing to MPI)."""
    drop = (*LAUNCH_ENV, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", ARGV_ENV)
    return {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCHELASTIC")
    }


@dataclass
class MpiOutcome:
    status: str  # "ok", "skipped", "failed", "not requested"
    reason: str | None = None
    library: str | None = None
    mpi4py: str | None = None
    rows: dict[int, Measurement] = field(default_factory=dict)  # by bytes

    def describe(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "library": self.library,
            "mpi4py": self.mpi4py,
        }


def run_mpi_reference(
    opts: BenchOptions, world: int, layouts: Sequence[Layout], timeout: float
) -> MpiOutcome:
    """mpi4py Allreduce over the same sizes, in a child ``mpirun`` (rank 0 only)."""
    reason = mpi_skip_reason()
    if reason is not None:
        return MpiOutcome("skipped", reason)
    with tempfile.TemporaryDirectory(prefix="ucxbench_mpi_") as tmp:
        out = os.path.join(tmp, "mpi.json")
        cmd = mpi_command(opts, world, [lay.nbytes for lay in layouts], out)
        logger.info("mpi reference: %s", " ".join(cmd))
        try:
            proc = subprocess.run(
                cmd, env=_mpi_env(), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return MpiOutcome("failed", f"mpirun did not finish within {timeout:.0f}s")
        except OSError as exc:
            return MpiOutcome("failed", f"mpirun could not be started: {exc}")
        if proc.returncode != 0 or not os.path.exists(out):
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return MpiOutcome("failed", f"mpirun exited with status {proc.returncode}: {tail}")
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
    rows = {
        int(r["bytes"]): Measurement(r["supported"], r.get("error"), r.get("time_us"), r["wrong"])
        for r in doc["rows"]
    }
    return MpiOutcome("ok", None, doc.get("library"), doc.get("mpi4py"), rows)
