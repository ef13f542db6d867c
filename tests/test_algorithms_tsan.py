"""Every group of the collective algorithms' test program (tests/test_algorithms_inproc.py)
again under ThreadSanitizer.

A file of its own so that make test hands it to a worker later than the plain groups: by then
tests/cpp_prebuild.py, started with the session at the lowest priority, has compiled much or
all of the program on CPU that the multi-rank tests leave idle (docs/testing.md).
"""

from __future__ import annotations

import os
import subprocess

import cpp_build
import pytest
from test_algorithms_inproc import PROGRAM, SOURCE_GROUPS

# -g1: line tables are all a report's stacks need. The kernels' AVX2 clones are left out:
# their ifunc resolvers run before ThreadSanitizer is set up.
TSAN = cpp_build.Program(
    "algorithms_test_tsan",
    PROGRAM,
    groups=SOURCE_GROUPS,
    flags=["-O1", "-g1", "-Werror", "-pthread", "-fsanitize=thread", "-DUCXB_NO_NARROW_CLONES"],
)


@pytest.mark.slow
def test_under_thread_sanitizer() -> None:
    """Every group again under ThreadSanitizer: the ranks share the in-memory transport's
    inboxes and the collectives' process-wide state, so a missing lock or an unguarded global
    shows up as a data race. (Each rank maps its peers' staging slots at addresses of its own,
    which ThreadSanitizer cannot relate; a slot reused too early shows as wrong bytes, here and
    in the plain run.) The sanitizer's worlds (ALGORITHMS_TEST_WORLDS=sanitizer,
    tests/cpp/algorithms/sweep.h) leave out those that only repeat another world's code paths
    many times over: the same lines and branches at a third of the run time (docs/testing.md)."""
    env = {"ALGORITHMS_TEST_TIMEOUT_S": "60", "ALGORITHMS_TEST_WORLDS": "sanitizer"}
    result = subprocess.run(
        [str(TSAN.build())], capture_output=True, text=True, timeout=900, env={**os.environ, **env}
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-8000:]
