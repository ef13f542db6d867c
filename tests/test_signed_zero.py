"""MIN/MAX of -0.0 against +0.0 and NaN on CPU tensors: every rank ends with the same bits, at 2
ranks (the exchange and shared-memory paths) and 4 (recursive doubling folds at every level),
under every all_reduce algorithm (``tests/signed_zero.py``; its CUDA twin is
``tests/gpu/test_cuda_signed_zero.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import signed_zero as sz
from dist_harness import run_world

WORLD_TIMEOUT = 120.0
_worlds: dict[int, list[Any] | Exception] = {}


def _world(ws: int) -> list[Any]:
    # A world that failed fails every item of its size at once, not once per item (each
    # rerun could take WORLD_TIMEOUT).
    if ws not in _worlds:
        try:
            _worlds[ws] = run_world(
                sz.signed_zero_main, ws, args=(("cpu",),), timeout=WORLD_TIMEOUT
            )
        except Exception as exc:  # kept, and raised again for every item of this size
            _worlds[ws] = exc
    world = _worlds[ws]
    if isinstance(world, Exception):
        raise world
    return world


@pytest.mark.parametrize("ws", [2, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("group", sz.GROUP_NAMES)
@pytest.mark.parametrize("check", sz.CHECKS)
def test_signed_zero_ties(ws: int, group: str, check: str) -> None:
    name = sz.check_name(group, "cpu", check)
    problems = [
        out["results"].get(name, {"ok": False, "detail": f"[rank {r}] never ran"})
        for r, out in enumerate(_world(ws))
    ]
    assert all(p["ok"] for p in problems), "\n".join(p["detail"] for p in problems if not p["ok"])
