"""Compiles the C++ test programs ahead of their tests, on idle CPU.

make test starts this with the session (``pytest --cpp-prebuild``, tests/conftest.py) under
SCHED_IDLE, the lowest priority. Much of a multi-rank test is one rank waiting for another or a
timeout running out, and the ThreadSanitizer and AddressSanitizer builds are about 90 s of
compiling, the plain programs of test_udp_core.py and test_algorithms_inproc.py about 55 s,
that their tests would otherwise do at full priority; here they fill the gaps instead, and
their tests (handed out after the first multi-rank files) find the units compiled.
Nothing here decides whether a test passes: a unit that fails to compile is left for its test
to compile and report, and a unit a test wants while this compiles it, the test compiles itself
(cpp_build.prebuild).

    chrt --idle 0 python tests/cpp_prebuild.py
"""

from __future__ import annotations

import os
import shutil
import sys

import cpp_build  # tests/ is sys.path[0]: this script's folder
from test_algorithms_asan import ASAN
from test_algorithms_inproc import ALGORITHMS
from test_algorithms_tsan import TSAN
from test_reduce_kernels import PROGRAMS as REDUCE_KERNELS
from test_shm_transport_programs import SHM_TRANSPORT, SHM_TRANSPORT_ASAN
from test_udp_auth_programs import AUTH, AUTH_UNAVAILABLE
from test_udp_core import PLAIN_PROGRAMS
from test_udp_core_sanitizers import SANITIZED
from test_udp_fuzz import FUZZER

# In the order make test hands out their files (tests/conftest.py's FILE_SECONDS, which puts
# test_udp_core.py and test_algorithms_inproc.py after the longest multi-rank files for this
# reason): the udp core's plain programs, the fuzzer (whose core units SANITIZED shares), the
# udp sanitizer program, the algorithms' ThreadSanitizer program, the one-host transport's
# plain and sanitized programs, the algorithms' plain and AddressSanitizer programs; then
# the reduction kernels' two programs (-O3) and the udp auth layer's, whose files come late.
PROGRAMS = [*PLAIN_PROGRAMS, FUZZER, SANITIZED, TSAN, SHM_TRANSPORT, SHM_TRANSPORT_ASAN,
            ALGORITHMS, ASAN, *REDUCE_KERNELS.values(), AUTH, AUTH_UNAVAILABLE]


def _remove_dead_scratch() -> None:
    """Scratch folders of prebuilds killed with their pytest (SIGKILL leaves no cleanup)."""
    for folder in cpp_build.BUILD.glob("prebuild-*"):
        pid = int(folder.name.removeprefix("prebuild-") or 0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def main() -> int:
    _remove_dead_scratch()
    for program in PROGRAMS:
        try:
            cpp_build.prebuild(program)
        except BaseException as e:  # pytest.skip/fail among them: the test will say why
            if isinstance(e, KeyboardInterrupt):
                raise
            print(f"cpp_prebuild: {program.name}: {e!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
