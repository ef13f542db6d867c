"""Every scenario group of the UDP core's test program (tests/test_udp_core.py) again under
AddressSanitizer and UndefinedBehaviorSanitizer.

A file of its own so that make test hands it to a worker later than the plain groups: by then
tests/cpp_prebuild.py, started with the session at the lowest priority, has compiled much or
all of the program on CPU that the multi-rank tests leave idle (docs/testing.md).
"""

from __future__ import annotations

import cpp_build
import pytest
from test_udp_core import TEST_PROGRAM, _assert_passed, _run

_CORE = set(cpp_build.sources(["udp_sans_io"]))


def _unit_flags(source: str) -> list[str]:
    if source in _CORE:
        return cpp_build.COVERAGE
    return ["-Og"] if source == TEST_PROGRAM else []


# Built with the fuzzer's flags (tests/test_udp_fuzz.py): the two programs share the core's
# objects, which carry the fuzzer's coverage calls (no-ops here, tests/cpp/no_coverage.cpp: a
# fifth more run time, against compiling the core a second time). The test program's own unit
# is compiled -Og: half the compile time of -O1 (13 s less), 2-3 s more run time.
SANITIZED = cpp_build.Program(
    "udp_core_test_asan",
    TEST_PROGRAM,
    groups=["udp_sans_io", "udp_sim"],
    flags=cpp_build.ASAN_UBSAN,
    extra_sources=["tests/cpp/no_coverage.cpp"],
    unit_flags=_unit_flags,
)


@pytest.mark.slow
def test_sanitizers() -> None:
    """Every group under AddressSanitizer and UndefinedBehaviorSanitizer (SANITIZED)."""
    result = _run(
        SANITIZED.build(),
        [],
        env={
            "ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1",
            "UBSAN_OPTIONS": "print_stacktrace=1",
            # The lab's fault matrix on its diagonal only (tests/cpp/udp_core_test.cpp).
            "UCXB_CHECK_DIAGONAL": "1",
        },
        timeout=600,
    )
    _assert_passed(result, "(all groups, sanitizers)")
