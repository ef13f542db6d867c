"""Every collective algorithm in one process (tests/cpp/algorithms_test.cpp): ranks on threads
over an in-memory transport, at world sizes 1-5 and 8, with and without shared-memory
staging, uneven sizes, every dtype x reduce op, each result compared byte for byte with a
reference the program computes. No torch, no UCX, no extension build: one pytest case per
op x algorithm, so a failure names the algorithm. Reproduce one with
``tests/cpp/build/algorithms_test GROUP``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import cpp_build
import pytest

PROGRAM = "tests/cpp/algorithms_test.cpp"
SOURCE_GROUPS = ["algorithm_checks", "collectives", "shm", "inproc"]
GROUPS = [
    "inproc_transport",
    "comm_errors",
    "allreduce_ring",
    "allreduce_recursive_doubling",
    "allreduce_rabenseifner",
    "allreduce_pair_slots",
    "allreduce_fused_pair",
    "allreduce_half_made",
    "staged_failures",
    "abandoned_wire",
    "abandoned_receive",
    "reduce_scatter_ring",
    "reduce_scatter_recursive_halving",
    "reduce_binomial",
    "reduce_chain",
    "broadcast_binomial",
    "broadcast_chain",
    "all_gather_ring",
    "all_gather_bruck",
    "all_gather_linear",
    "gather",
    "scatter",
    "all_to_all_pairwise",
    "all_to_all_linear",
    "barrier",
    "device_memory_routing",
    "device_pair_allreduce",
    "peer_map_allreduce",
    "peer_map_routing",
    "peer_map_failures",
    "scratch_fits_the_message",
]
RUN_TIMEOUT_S = 120  # a group takes about a second; a hung op fails at its 5 s deadline


# Also compiled ahead of this file by tests/cpp_prebuild.py.
ALGORITHMS = cpp_build.Program("algorithms_test", PROGRAM, SOURCE_GROUPS, cpp_build.PLAIN)


@pytest.fixture(scope="module")
def algorithms_test() -> Path:
    return ALGORITHMS.build()


def _run(binary: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def test_groups_are_all_listed(algorithms_test: Path) -> None:
    result = _run(algorithms_test, ["--list"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == GROUPS


@pytest.mark.parametrize("group", GROUPS)
def test_algorithm(algorithms_test: Path, group: str) -> None:
    result = _run(algorithms_test, [group])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert f"[{group}] ok" in result.stdout


# Every group again under ThreadSanitizer: tests/test_algorithms_tsan.py.
