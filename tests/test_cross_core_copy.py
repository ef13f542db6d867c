"""``scripts/cross_core_copy.cpp``, the probe for a machine whose shared-memory speed drifts
(why the bench has ``--rounds``): built with g++ and run in both store modes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from bench_harness import REPO


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cross_core_copy_probe(tmp_path: Path) -> None:
    """scripts/cross_core_copy.cpp (docs/performance.md's check for a machine whose shared-memory
    speed drifts): one line per second, both store modes; bad arguments exit 2."""
    exe = tmp_path / "cross_core_copy"
    subprocess.run(
        [
            "g++",
            "-O2",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(exe),
            str(REPO / "scripts" / "cross_core_copy.cpp"),
        ],
        check=True,
        timeout=120,
    )
    for args, seconds in ((("2", "262144", "cached"), 2), (("1", "65536", "streaming"), 1)):
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert [int(line.split()[0]) for line in lines] == list(range(1, seconds + 1))
        for line in lines:
            m = re.fullmatch(r"\d+ (\d+\.\d\d) GB/s", line)
            assert m is not None and float(m.group(1)) > 0, line
    for bad in (("0",), ("1", "1000"), ("1", "1048576", "fast")):
        proc = subprocess.run([str(exe), *bad], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "usage:" in proc.stderr, bad
