"""The reduction kernels on their own (tests/cpp/reduce_kernels_test.cpp): half and bfloat16
SUM/PRODUCT/MIN/MAX against a branching reference for every accumulator value, bit for bit,
built as shipped (where the CPU has AVX2, the loaded clone is the AVX2 one) and with the
clones off (the x86-64 baseline loops)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("variant", ["shipped", "baseline"])
def test_narrow_float_kernels_match_reference(tmp_path: Path, variant: str) -> None:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found")
    exe = tmp_path / f"reduce_kernels_test_{variant}"
    flags = ["-DUCXB_NO_NARROW_CLONES"] if variant == "baseline" else []
    subprocess.run(
        [compiler, "-std=c++20", "-O3", "-Wall", "-Wextra", "-Werror", "-I.", *flags,
         "csrc/collectives/reduce_kernels.cpp", "tests/cpp/reduce_kernels_test.cpp",
         "-o", exe],
        cwd=REPO,
        check=True,
        timeout=300,
    )
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr
