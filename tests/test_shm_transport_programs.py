"""The one-host transport's C++ test program (tests/cpp/shm_transport_test.cpp: byte rings,
doorbells, streamed and by-reference messages, fork, cancel, abort, destroy, sleep and wake),
plain and again under AddressSanitizer and UndefinedBehaviorSanitizer.

Torch-free, so that tests/cpp_prebuild.py can import the programs and compile their units on
idle CPU before these tests run (the sanitized program's compile was about 15 s of this
file's time in a clean clone).
"""

from __future__ import annotations

import os
import subprocess

import cpp_build
import pytest

# What cpp_build.check_unit("shm_transport_test", groups=["shm"]) builds.
SHM_TRANSPORT = cpp_build.Program(
    "shm_transport_test",
    "tests/cpp/shm_transport_test.cpp",
    groups=["shm"],
    flags=cpp_build.PLAIN,
)

# Requests that outlive their transport, a send cancelled twice while partly in the ring, and
# a receive cancelled mid-stream touch freed or overlapping memory only a sanitizer sees. The
# shm group's objects are those of test_algorithms_asan.py's program (same flags): shared.
SHM_TRANSPORT_ASAN = cpp_build.Program(
    "shm_transport_asan_test",
    "tests/cpp/shm_transport_test.cpp",
    groups=["shm"],
    flags=[*cpp_build.ASAN_UBSAN, "-Werror", "-pthread"],
)


def test_shm_transport() -> None:
    cpp_build.run_checks(SHM_TRANSPORT.build())


@pytest.mark.slow
def test_shm_transport_under_address_sanitizer() -> None:
    env = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    result = subprocess.run(
        [str(SHM_TRANSPORT_ASAN.build())],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    assert "shm_transport_test: " in result.stdout and " 0 failed" in result.stdout, result.stdout
