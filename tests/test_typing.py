"""The package type-checks strict (mypy, configured in pyproject.toml), as `make lint` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    proc = subprocess.run(  # mypy's cache (.mypy_cache, ignored by git) makes reruns quick
        [sys.executable, "-m", "mypy"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout
