"""pytest configuration shared by the ucxbackend tests.

The backend under test comes from ``UCXB_TEST_BACKEND`` (default ``ucx``);
``UCXB_TEST_BACKEND=gloo`` runs the same tests against Gloo as a reference.
The full matrix is marked ``slow``: ``pytest -m "not slow"`` is the quick run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Multi-rank tests import ``dist_harness`` and spawn children that import the
# test modules by name, so this directory must be importable everywhere (spawned
# children inherit sys.path).  The repository root goes last: an installed
# ``ucxbackend`` wins, a source tree with an in-place build is the fallback.
_TESTS_DIR = str(Path(__file__).resolve().parent)
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)
if _REPO_ROOT not in sys.path:
    sys.path.append(_REPO_ROOT)

from dist_harness import BACKEND  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: world sizes 3 and 4 and multi-MB sizes of the collective matrix "
        '(deselect with -m "not slow")',
    )
    config.addinivalue_line(
        "markers",
        "gpu: needs a CUDA device: every test under tests/gpu/ (skipped where torch sees none)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"ucxbackend tests: backend under test = {BACKEND!r} (UCXB_TEST_BACKEND)"


def is_gloo() -> bool:
    """True when the backend under test is Gloo (the reference run)."""
    return BACKEND == "gloo"


def is_ucx() -> bool:
    """True when the backend under test is the ucx backend."""
    return "ucx" in BACKEND


def skip_unless_ucx(reason: str) -> None:
    """Skip the calling test unless the ucx backend is under test."""
    if not is_ucx():
        pytest.skip(f"ucx only ({BACKEND} under test): {reason}")


@pytest.fixture
def backend() -> str:
    """Name of the backend under test (``UCXB_TEST_BACKEND``, default ``ucx``)."""
    return BACKEND
