"""The multi-process harness itself: ranks see the environment they are given, however started.

Ranks are forked from a preloaded fork server unless a variable read at import time differs
from the server's; then they are spawned, so that torch reads the variable as a real job would.
"""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist
from dist_harness import run_world

# What the harness itself adds to a rank's environment.
HARNESS_SETS = {"OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}


# Each rank meets the other before it returns. A rank that returned at once could end its
# process while its peer may still have been in Gloo's connectFullMesh: the likely cause of
# rank 0's rare "Connection closed by peer" there (2 failures in about 70 runs, 2026-11-27).


def _environment(rank: int, world_size: int) -> dict[str, str]:
    dist.barrier()
    return dict(os.environ)


def _debug_level(rank: int, world_size: int) -> str:
    dist.barrier()
    return str(dist.get_debug_level())


def test_a_rank_has_the_callers_environment_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    # Changed in the parent after the fork server may have started (HOME it surely had): a
    # forked rank must see the parent's environment of now, not the server's.
    monkeypatch.setenv("UCXB_HARNESS_PARENT", "from-parent")
    monkeypatch.delenv("HOME", raising=False)
    got = run_world(_environment, 2, backend="gloo", env={"UCXB_HARNESS_GIVEN": "given"})
    expected = {**os.environ, **HARNESS_SETS, "UCXB_HARNESS_GIVEN": "given"}
    for env in got:
        assert env == expected


def test_an_import_time_variable_is_read_at_import() -> None:
    # torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported: a rank forked from
    # a server that imported it without the variable would run at level OFF.
    got = run_world(_debug_level, 2, backend="gloo", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert got == ["DebugLevel.DETAIL"] * 2
