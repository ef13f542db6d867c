"""MIN/MAX of -0.0 against +0.0 and NaN on CUDA tensors: both ranks end with the same bits.

The device folds with ATen's minimum/maximum, which keep one operand on a tie by their own
rule; the higher rank of each exchange swaps the operands (``Reduction.swapped``,
``DeviceMemory::reduce``) so that both ranks compute the lower rank's value op the higher's.
One world of 2 ranks on GPU 0 (cuda_ipc) runs ``tests/signed_zero.py`` on CUDA tensors and, in
the same ranks and groups, on CPU tensors (the ucx backend serves both): per group (automatic
choice, and each all_reduce algorithm forced with small chunks, so many double-buffered
chunks per exchange) and device, the result's bytes are the same on every rank and its values
equal MIN/MAX of the inputs gathered over Gloo as CPU copies (-0.0 == +0.0).

Which zero a tie gives may differ between CPU and CUDA (each keeps its own kernel's rule):
``test_device_tie_rule`` records the device's rule and how many elements the two devices'
results differ in as JUnit properties, without failing. If the device's minimum/maximum keep
the same zero in either order, the swap cannot show here (the property says so).
"""

from __future__ import annotations

from typing import Any

import pytest
import signed_zero as sz

from gpu.cuda_harness import WorldCache, cuda_world

DEVICES = ("cuda:0", "cpu")
_world = WorldCache(lambda: cuda_world(sz.signed_zero_main, args=(DEVICES,)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", sz.GROUP_NAMES)
@pytest.mark.parametrize("check", sz.CHECKS)
def test_signed_zero_ties_on_cuda(device: str, group: str, check: str) -> None:
    name = sz.check_name(group, device, check)
    per_rank = _world.get()
    problems = [
        out["results"].get(name, {"ok": False, "detail": f"[rank {r}] never ran"})
        for r, out in enumerate(per_rank)
    ]
    assert all(p["ok"] for p in problems), "\n".join(p["detail"] for p in problems if not p["ok"])


def test_device_tie_rule(record_property: Any) -> None:
    facts = _world.get()[0]["facts"]
    ties = facts["device ties"]
    for key, value in ties.items():
        record_property(key, value)
    order_matters = (
        ties["minimum(-0,+0)"] != ties["minimum(+0,-0)"]
        or ties["maximum(-0,+0)"] != ties["maximum(+0,-0)"]
    )
    record_property("device minimum/maximum depend on operand order at ties", order_matters)
    for group in sz.GROUP_NAMES:
        record_property(f"{group}: elements whose bits differ, cuda vs cpu", facts[group])
