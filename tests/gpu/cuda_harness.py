"""What the CUDA tests share: two-rank worlds on GPU 0, GPU sleeps, per-check outcomes.

Every world has two ranks on GPU 0 (``torch.cuda.set_device(0)`` in each rank; cuda_ipc
between them). A rank returns ``{check name: {"ok": bool, "detail": str}}`` and the parent turns
each into one pytest item (:func:`evaluate`), so one world serves many tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from dist_harness import run_world

WORLD = 2
# A hung world costs GPU time that is counted: fail it early. UCXB_GPU_WORLD_TIMEOUT (seconds)
# shortens it further where a session's device time is short (scripts/gpu_session.sh).
WORLD_TIMEOUT = float(os.environ.get("UCXB_GPU_WORLD_TIMEOUT", "150"))
PG_TIMEOUT = 30.0
# torch.cuda._sleep spins for this many GPU clock cycles per millisecond asked for: the top SM
# clock of an H100/H200 is 1.98 GHz, so a sleep lasts at least as long as asked (longer when
# the clock is lower or the GPU is shared; the tests only need "long").
CYCLES_PER_MS = 2_000_000


def cuda_world(
    fn: Callable[..., Any],
    *,
    backend: str = "ucx",
    env: Mapping[str, str] | None = None,
    args: tuple[Any, ...] = (),
    world_size: int = WORLD,
    timeout: float = WORLD_TIMEOUT,
) -> list[Any]:
    """``run_world`` on ``backend`` with the backends' defaults (CUDA tensors carried) unless
    ``env`` says otherwise."""
    return run_world(
        fn,
        world_size,
        backend=backend,
        env=dict(env or {}),
        args=args,
        timeout=timeout,
        pg_timeout=PG_TIMEOUT,
    )


def use_gpu0() -> Any:
    """In a rank: make GPU 0 current (both ranks share it); returns ``torch.device("cuda", 0)``."""
    import torch

    assert not torch.cuda._is_in_bad_fork(), (
        "this rank was forked from a process that had initialised CUDA: the fork server's "
        "preloads (dist_harness.PRELOAD, ucxbackend among them) must not touch CUDA"
    )
    assert torch.cuda.is_available(), "the rank sees no CUDA device"
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


def gpu_sleep(ms: float) -> None:
    """Queue a kernel that keeps the current stream busy for at least ``ms`` milliseconds."""
    import torch

    torch.cuda._sleep(int(ms * CYCLES_PER_MS))


class Outcomes:
    """A rank's named checks: ``check(name, ok, detail)``; ``run(name, fn)`` records a raise."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.results: dict[str, dict[str, Any]] = {}

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        prev = self.results.get(name)
        if prev is not None and not prev["ok"]:
            return  # keep the first failure of a check
        self.results[name] = {"ok": bool(ok), "detail": f"[rank {self.rank}] {detail}"}

    def run(self, name: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` (which records its own checks); an exception fails ``name``."""
        import traceback

        try:
            fn()
        except Exception as exc:
            tb = traceback.format_exc(limit=6)
            self.check(name, False, f"raised {type(exc).__name__}: {exc}\n{tb}")


def evaluate(per_rank: list[dict[str, dict[str, Any]]], name: str) -> None:
    """Fail unless every rank recorded ``name`` and it held on every rank."""
    problems = []
    for rank, results in enumerate(per_rank):
        got = results.get(name)
        if got is None:
            problems.append(f"[rank {rank}] check {name!r} never ran (recorded: {sorted(results)})")
        elif not got["ok"]:
            problems.append(got["detail"])
    assert not problems, "\n".join(problems)


class WorldCache:
    """A world run once for the items of a module; a failed world fails each of its items."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self._run = run
        self._done = False
        self._value: Any = None
        self._error: str | None = None

    def get(self) -> Any:
        if not self._done:
            self._done = True
            try:
                self._value = self._run()
            except (AssertionError, TimeoutError) as exc:
                self._error = f"{type(exc).__name__}: {exc}"
        if self._error is not None:
            pytest.fail(f"the world failed:\n{self._error}", pytrace=False)
        return self._value

