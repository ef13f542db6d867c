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



LATE_SECONDS = 2.0


def waiting_cpu(rank: int, world_size: int) -> tuple[float, float] | None:
    """CPU, as fractions of a core, that rank 0 burns while its all_reduce waits LATE_SECONDS
    for a late rank 1: (the whole process, the calling thread alone)."""
    t = torch.ones(4)
    dist.all_reduce(t)  # connected
    dist.barrier()
    if rank == 1:
        time.sleep(LATE_SECONDS)
        dist.all_reduce(t)
        return None
    process, caller = time.process_time(), time.thread_time()
    start = time.monotonic()
    dist.all_reduce(t)  # the caller waits on the Work, the progress thread on the peer
    waited = time.monotonic() - start
    process, caller = time.process_time() - process, time.thread_time() - caller
    assert t.tolist() == [float(world_size) ** 2] * 4
    assert waited > LATE_SECONDS / 2, f"the op did not wait for the late rank ({waited:.3f} s)"
    return process / waited, caller / waited


def test_pending_op_spins_briefly_then_sleeps() -> None:
    # Both the caller's wait and the progress thread poll for spin_us (250 us) and then
    # block: a 2 s wait for a late peer must cost a few percent of a core, not a whole one.
    skip_unless_ucx("measures the ucx progress thread")
    result = run_world(waiting_cpu, 2, timeout=90)[0]
    assert result is not None and result[0] < 0.05, f"waiting CPU (process, caller): {result}"


def test_pending_op_spins_throughout_with_a_long_spin() -> None:
    # With spin_us longer than the wait, both sides poll the whole time: the knob reaches the
    # progress thread and the caller's Work.wait (measured on the calling thread alone).
    skip_unless_ucx("measures the ucx progress thread")
    result = run_world(waiting_cpu, 2, timeout=90, env={"UCXBACKEND_SPIN_US": "10000000"})[0]
    assert result is not None, "rank 0 returned nothing"
    process, caller = result
    assert process > 0.5, f"the waiting process did not spin: {result}"
    assert caller > 0.2, f"the caller's wait did not spin: {result}"
