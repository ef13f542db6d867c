"""Split and shrink (docs/failure-model.md#split-and-shrink), on both backends.

* ``dist.split_group``: every child computes exact collectives (int64, compared with numpy),
  a rank in no split gets ``None`` as torch documents, a second split of the same parent works,
  and the parent goes on working. torch only splits a group bound to an accelerator; these
  CPU ranks bind the default group to the CPU and tell torch an accelerator is there (the CPU),
  which is all ``split_group`` asks before it calls the backend's ``split``. torch 2.13's
  ``split_group`` reads ``parent_backend.options`` when ``pg_options`` is None, which torch
  binds for NCCL and XCCL only: a ucx/udp caller passes ``Backend.Options(<backend>)``.
* ``dist.distributed_c10d.shrink_group`` after a rank was SIGKILLed: the survivors build the
  smaller group without the dead rank and without a new rendezvous, and its all_reduce is exact.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_harness import run_world
from session_run import run_in_session
from world_pool import pooled

OURS = ["ucx", "udp"]
WORLD_TIMEOUT = 120.0


def _data(rank: int, salt: int, n: int = 5) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) + 1) * (rank + 1) * 1000 + salt


def _bind_to_cpu() -> None:
    """What ``dist.split_group`` checks before it calls ``split``, satisfied on a CPU rank."""
    dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cpu", 0)
    torch.accelerator.is_available = lambda: True  # type: ignore[assignment]
    torch.accelerator.current_accelerator = (  # type: ignore[assignment]
        lambda check_available=False: torch.device("cpu", 0)
    )


def _split_world(rank: int, ws: int, backend: str) -> dict[str, Any]:
    _bind_to_cpu()
    opts = torch._C._distributed_c10d.Backend.Options(backend)
    out: dict[str, Any] = {}
    # rank 3 is in no split: torch gives it None.
    first = dist.split_group(
        split_ranks=[[0, 1], [2]], timeout=timedelta(seconds=30), pg_options=opts
    )
    out["first_none"] = first is None
    if first is not None:
        members = [0, 1] if rank in (0, 1) else [2]
        out["first_size"] = dist.get_world_size(first)
        out["first_rank"] = dist.get_rank(first)
        t = torch.from_numpy(_data(rank, 1))
        dist.all_reduce(t, group=first)
        out["first_sum_ok"] = bool(np.array_equal(t.numpy(), sum(_data(r, 1) for r in members)))
    # A second split of the same parent, with every rank in a child.
    second = dist.split_group(
        split_ranks=[[0, 2], [1, 3]], timeout=timedelta(seconds=30), pg_options=opts
    )
    assert second is not None
    members = [0, 2] if rank % 2 == 0 else [1, 3]
    out["second_rank"] = dist.get_rank(second)
    t = torch.from_numpy(_data(rank, 2))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=second)
    out["second_max_ok"] = bool(
        np.array_equal(t.numpy(), np.maximum.reduce([_data(r, 2) for r in members]))
    )
    gathered = [torch.zeros(5, dtype=torch.int64) for _ in members]
    dist.all_gather(gathered, torch.from_numpy(_data(rank, 3)), group=second)
    out["second_gather_ok"] = all(
        np.array_equal(g.numpy(), _data(r, 3)) for g, r in zip(gathered, members, strict=True)
    )
    # The parent still works after both splits.
    t = torch.from_numpy(_data(rank, 4))
    dist.all_reduce(t)
    out["parent_sum_ok"] = bool(np.array_equal(t.numpy(), sum(_data(r, 4) for r in range(ws))))
    for g in (first, second):
        if g is not None:
            dist.destroy_process_group(g)
    return out


@pytest.mark.parametrize("backend", OURS)
def test_split_group_children_compute_exact_collectives(backend: str) -> None:
    results = run_world(_split_world, 4, backend=backend, timeout=WORLD_TIMEOUT, args=(backend,))
    assert [r["first_none"] for r in results] == [False, False, False, True]
    assert [r.get("first_size") for r in results] == [2, 2, 1, None]
    assert [r.get("first_rank") for r in results] == [0, 1, 0, None]
    assert [r.get("first_sum_ok") for r in results] == [True, True, True, None]
    assert [r["second_rank"] for r in results] == [0, 0, 1, 1]
    assert all(r["second_max_ok"] and r["second_gather_ok"] for r in results), results
    assert all(r["parent_sum_ok"] for r in results), results


DEAD = 1
# How long a survivor waits on the parent's doomed op before it gives up (the op cannot
# finish without the dead rank, so any wait shows the failure; a short one keeps the test quick).
PARENT_WAIT_S = 1.0


def _shrink_world(rank: int, ws: int) -> dict[str, Any]:
    store = dist.distributed_c10d._get_default_store()
    t = torch.from_numpy(_data(rank, 0))
    dist.all_reduce(t)  # every connection is up before the death
    out: dict[str, Any] = {
        "warm_ok": bool(np.array_equal(t.numpy(), sum(_data(r, 0) for r in range(ws))))
    }
    if rank == DEAD:
        store.set("dying", "1")
        os.kill(os.getpid(), signal.SIGKILL)
    store.wait(["dying"], timedelta(seconds=30))
    time.sleep(0.5)
    # The parent's next op cannot complete: the survivors see it fail (peer gone or timeout).
    work = dist.all_reduce(torch.ones(3, dtype=torch.int64), async_op=True)
    try:
        work.wait(timedelta(seconds=PARENT_WAIT_S))
        out["parent_failed"] = False
    except RuntimeError:
        out["parent_failed"] = True
    start = time.monotonic()
    small = dist.distributed_c10d.shrink_group([DEAD])
    out["shrink_s"] = time.monotonic() - start
    out["size"] = dist.get_world_size(small)
    out["rank"] = dist.get_rank(small)
    survivors = [r for r in range(ws) if r != DEAD]
    t = torch.from_numpy(_data(rank, 7))
    dist.all_reduce(t, group=small)
    out["sum_ok"] = bool(np.array_equal(t.numpy(), sum(_data(r, 7) for r in survivors)))
    # The shrunk default group is the default now: a second op without group= uses it.
    t = torch.from_numpy(_data(rank, 8))
    dist.all_reduce(t)
    out["default_sum_ok"] = bool(np.array_equal(t.numpy(), sum(_data(r, 8) for r in survivors)))
    return out


@pytest.mark.parametrize("backend", OURS)
def test_shrink_after_a_sigkilled_rank_lets_the_survivors_go_on(backend: str) -> None:
    results = run_world(
        _shrink_world,
        4,
        backend=backend,
        timeout=WORLD_TIMEOUT,
        pg_timeout=20.0,
        expect_fail_ranks={DEAD},
    )
    assert results[DEAD] is None
    survivors = [r for i, r in enumerate(results) if i != DEAD]
    assert all(r["warm_ok"] for r in survivors), survivors
    assert all(r["parent_failed"] for r in survivors), survivors
    assert [r["size"] for r in survivors] == [3, 3, 3]
    assert [r["rank"] for r in survivors] == [0, 1, 2]
    assert all(r["sum_ok"] and r["default_sum_ok"] for r in survivors), survivors
    # No wait for the dead rank: the shrink ends well before the group's 20 s timeout (the
    # survivors enter it up to PARENT_WAIT_S apart, after their failed op).
    assert all(r["shrink_s"] < 15.0 for r in survivors), survivors


def test_ranks_left_out_of_new_group_have_a_nocolor_split() -> None:
    # new_group on a device-bound default group calls this on the ranks left out once the
    # backend supports splitting; torch binds it for NCCL only.
    import ucxbackend  # noqa: F401  (adds it)

    backend_cls = torch._C._distributed_c10d.Backend
    assert backend_cls.perform_nocolor_split(None, torch.device("cpu")) is None


def _ddp_after_shrink(rank: int, ws: int) -> Any:
    import ucxbackend

    if rank == ws - 1:
        return None  # leaves: the others shrink it away
    ucxbackend.shrink_group([ws - 1])
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    ddp(torch.full((2, 3), float(rank + 1))).sum().backward()
    return [p.grad.clone() for p in ddp.parameters()]


@pytest.mark.parametrize("backend", OURS)
def test_ddp_runs_on_a_group_shrunk_through_ucxbackend(backend: str) -> None:
    # torch 2.13 labels a shrunk group's backend GLOO; DDP's constructor then crashed
    # (SIGSEGV in its logger) until ucxbackend.shrink_group re-registered it as custom.
    results = run_world(_ddp_after_shrink, 3, backend=backend, timeout=WORLD_TIMEOUT)
    (w0, b0), (w1, b1) = results[0], results[1]
    assert torch.equal(w0, w1) and torch.equal(b0, b1)
    # Inputs 1s on rank 0, 2s on rank 1, two rows each: the mean weight grad is 3, bias 2.
    assert torch.equal(w0, torch.full((1, 3), 3.0)) and torch.equal(b0, torch.full((1,), 2.0))


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "shrink_ddp.py"
STEPS = 20
EXAMPLE_DEADLINE_S = 100


def _example_run(backend: str, *extra: str) -> tuple[float, str]:
    """The example's final loss and its output."""
    repo = EXAMPLE.parent.parent
    path = os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(EXAMPLE), "--backend", backend, "--timeout", "5"]
    cmd += ["--steps", str(STEPS), *extra]
    # A session of its own: past the deadline its ranks (the fork server's children, not the
    # example's) die with it.
    run = run_in_session(cmd, timeout=EXAMPLE_DEADLINE_S, env=env)
    out, err = run.out, run.err
    if run.timed_out:
        pytest.fail(f"{backend}: the example ran past {EXAMPLE_DEADLINE_S} s:\n{out}{err}")
    assert run.returncode == 0, f"{backend}: the example exited {run.returncode}:\n{out}{err}"
    m = re.search(r"RESULT backend=\S+ world_size=2 final_loss=(\S+)", out)
    assert m, out
    return float(m.group(1)), out


@pytest.fixture(scope="module")
def full_batch_loss() -> float:
    """The example's final loss, replayed in this process without torch.distributed.

    The example weights each rank's loss by its share of the data, so every step applies the
    whole data set's mean-loss gradient whatever the world size: a two-rank run ends where
    plain full-batch gradient descent on one process ends, up to rounding (1.8e-16 relative,
    measured on 2026-11-26). The replay is independent of the backend under test and takes
    milliseconds, where a two-rank run of the example spawns two ranks that each import
    torch and, in DDP's constructor, torch._dynamo (seconds of CPU each).
    """
    spec = importlib.util.spec_from_file_location("shrink_ddp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    x, y = example.data()
    net = example.model()
    for _ in range(STEPS):
        net.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= example.LR * p.grad
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(net(x), y).item())


def _example_that_loses_a_rank(backend: str) -> tuple[float, str]:
    return _example_run(backend, "--world-size", "3", "--kill-rank", "2")


# The two runs side by side (tests/world_pool.py): ucx's rank 0 spends most of the --timeout
# waiting for the dead rank's data (its ring neighbour's send fails at once; its own receive
# cannot), a wait the other run fills.
@pytest.mark.parametrize("backend", OURS)
@pooled(_example_that_loses_a_rank)
def test_ddp_example_that_loses_a_rank_ends_as_a_two_rank_run(
    backend: str, full_batch_loss: float, pooled_result: Callable[[], tuple[float, str]]
) -> None:
    killed, out = pooled_result()
    assert "rank 2 was killed, as asked" in out, out  # the parent reaped it as it died
    assert killed == pytest.approx(full_batch_loss, rel=1e-9, abs=0.0)
