"""The progress thread's idle cost and the progress-mode knob reaching the native layer.

CPU time (not wall time) is measured, so a loaded machine does not make these flaky: an idle
group in the default "sleep" mode must burn under 2% of a core; "poll" mode must visibly spin,
which proves the knob is applied.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import run_world

IDLE_SECONDS = 3.0


def idle_cpu_fraction(rank: int, world_size: int) -> float:
    t = torch.ones(4)
    dist.all_reduce(t)  # the group is connected and has done real work
    assert t.tolist() == [float(world_size)] * 4
    dist.barrier()
    before = time.process_time()  # every thread of this process
    time.sleep(IDLE_SECONDS)
    used = time.process_time() - before
    dist.barrier()
    return used / IDLE_SECONDS


def test_idle_group_sleeps() -> None:
    skip_unless_ucx("measures the ucx progress thread")
    fractions = run_world(idle_cpu_fraction, 2, timeout=90)
    assert all(f < 0.02 for f in fractions), f"idle CPU per rank (fraction of a core): {fractions}"


@pytest.mark.slow
def test_poll_mode_spins() -> None:
    skip_unless_ucx("measures the ucx progress thread")
    fractions = run_world(
        idle_cpu_fraction, 2, timeout=90, env={"UCXBACKEND_PROGRESS_MODE": "poll"}
    )
    assert all(f > 0.2 for f in fractions), f"poll mode did not spin: {fractions}"
