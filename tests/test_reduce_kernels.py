"""The reduction kernels on their own (tests/cpp/reduce_kernels_test.cpp): half and bfloat16
SUM/PRODUCT/MIN/MAX against a branching reference for every accumulator value, bit for bit,
built as shipped (where the CPU has AVX2, the loaded clone is the AVX2 one) and with the
clones off (the x86-64 baseline loops)."""

from __future__ import annotations

import cpp_build
import pytest


def _program(variant: str) -> cpp_build.Program:
    # The define reaches only the kernels: the test itself is one object for both variants.
    define = ["-DUCXB_NO_NARROW_CLONES"] if variant == "baseline" else []
    return cpp_build.Program(
        f"reduce_kernels_test_{variant}",
        "tests/cpp/reduce_kernels_test.cpp",
        groups=["reduce_kernels"],
        flags=["-O3", "-Werror"],
        unit_flags=lambda source: define if source == "csrc/collectives/reduce_kernels.cpp" else [],
    )


# Both variants, for tests/cpp_prebuild.py, which compiles them on idle CPU.
PROGRAMS = {variant: _program(variant) for variant in ("shipped", "baseline")}


@pytest.mark.parametrize("variant", PROGRAMS)
def test_narrow_float_kernels_match_reference(variant: str) -> None:
    cpp_build.run_checks(PROGRAMS[variant].build(), timeout=120.0, program="reduce_kernels_test")
