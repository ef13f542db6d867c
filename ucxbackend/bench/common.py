"""The vocabulary every bench module shares: collectives, dtypes, reduce ops, time
statistics, exit statuses, the environment variables the bench sets or reads, and the two
error types. Nothing here computes; every other module imports from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import torch

COLLECTIVES: Final = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "gather",
    "all_to_all",
    "barrier",
    "sendrecv",
)
REDUCING: Final = frozenset({"all_reduce", "reduce_scatter", "reduce"})
ROOTED: Final = frozenset({"broadcast", "reduce", "gather"})

# nccl-tests names first; the display name of each dtype is its nccl-tests name.
DTYPE_NAMES: Final[Mapping[str, str]] = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "half": "half",
    "float16": "half",
    "float": "float",
    "float32": "float",
    "double": "double",
    "float64": "double",
    "bfloat16": "bfloat16",
}
TORCH_DTYPES: Final[Mapping[str, torch.dtype]] = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "uint32": torch.uint32,
    "int64": torch.int64,
    "uint64": torch.uint64,
    "half": torch.float16,
    "float": torch.float32,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
}
OPS: Final = ("sum", "prod", "min", "max", "avg")
STATS: Final = ("mean", "median", "min")
MPI: Final = "mpi"
CORRUPT_ENV: Final = "UCXBACKEND_BENCH_CORRUPT"
ARGV_ENV: Final = "_UCXBENCH_COMMAND"  # the user's command line, handed to the ranks we start
LAUNCH_ENV: Final = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
NCCL: Final = "nccl"
# torch's fake backend: every op returns a completed Work without moving a byte, so its time
# is torch's own dispatch, the floor under any c10d backend. Its results are never checked.
FAKE: Final = "fake"
FAKE_MODULE: Final = "torch.testing._internal.distributed.fake_pg"  # registers it

EXIT_OK: Final = 0
EXIT_WRONG: Final = 1
EXIT_USAGE: Final = 2
EXIT_FAILED: Final = 3


class BenchError(Exception):
    """A failure of the run itself (not of the results)."""


class UsageError(BenchError):
    """Bad options or an environment the options cannot work in."""


def split_list(text: str) -> list[str]:
    """``"a, B,,c"`` -> ``["a", "b", "c"]``: a comma-separated option value."""
    return [part.strip().lower() for part in text.split(",") if part.strip()]
