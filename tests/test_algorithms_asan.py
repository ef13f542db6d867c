"""The collective algorithms' groups that guard memory a failed op leaves behind, again under
AddressSanitizer and UndefinedBehaviorSanitizer (tests/test_algorithms_inproc.py runs them
plain), in a program of their own (tests/cpp/algorithms_asan_test.cpp) that links only these
groups' checks: the build compiles the algorithms, the staging slots and the in-memory
transport, and none of algorithms_test's other groups (docs/testing.md).

allreduce_half_made (tests/cpp/algorithms/failing_post_groups.cpp): a posted all_reduce that
fails while filling its slot must give up the receives it posted into its own buffers; one
left behind takes the peer's notice after those buffers are freed, which only a sanitizer sees.

abandoned_wire (tests/cpp/algorithms/abandoned_wire_groups.cpp): a tripwire its op gave up
but the transport could not stop catches a message after its Comm is gone; its callback must
not run into the freed Comm.
"""

from __future__ import annotations

import os
import subprocess

import cpp_build
import pytest

# The groups' own sources go in by name (extra_sources), the rest by source group; the groups'
# names are the program's (tests/cpp/algorithms_asan_test.cpp).
ASAN = cpp_build.Program(
    "algorithms_asan_test",
    "tests/cpp/algorithms_asan_test.cpp",
    groups=["collectives", "shm", "inproc"],
    flags=[*cpp_build.ASAN_UBSAN, "-Werror", "-pthread"],
    extra_sources=[
        "tests/cpp/algorithms/failing_post_groups.cpp",
        "tests/cpp/algorithms/abandoned_wire_groups.cpp",
    ],
)
GROUPS = ["allreduce_half_made", "abandoned_wire", "abandoned_receive"]


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS)
def test_under_address_sanitizer(group: str) -> None:
    env = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    result = subprocess.run(
        [str(ASAN.build()), group],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    assert f"[{group}] ok" in result.stdout
