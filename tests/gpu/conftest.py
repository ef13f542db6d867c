"""Skips every test under ``tests/gpu/`` unless torch sees a CUDA device, and marks them ``gpu``.

Whether CUDA is available is asked in a subprocess: ``torch.cuda.is_available()`` calls
``cuInit`` in the process that asks, and the pytest process must stay free of CUDA (the ranks
come from a fork server, and a process that initialised CUDA cannot hand it to a forked child).
On a torch built without CUDA the answer is known without asking. A session-end check fails
the run if this process initialised CUDA all the same.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).resolve().parent

_PROBE = (
    "import torch\n"
    "ok = torch.cuda.is_available()\n"
    "print(int(ok), torch.cuda.get_device_name(0) if ok else '')\n"
)


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """(whether torch sees a CUDA device, what to say about it), asked in a subprocess."""
    if not torch.backends.cuda.is_built():
        return False, f"torch {torch.__version__} is built without CUDA"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"could not ask torch about CUDA: {exc}"
    if proc.returncode != 0:
        return False, f"asking torch about CUDA failed: {proc.stderr.strip()[-500:]}"
    flag, _, name = proc.stdout.strip().partition(" ")
    if flag != "1":
        return False, f"torch.cuda.is_available() is False (torch {torch.__version__})"
    return True, f"CUDA device 0: {name} (torch {torch.__version__}, CUDA {torch.version.cuda})"


def _ours(item: pytest.Item) -> bool:
    return _HERE in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if _ours(item)]
    if not mine:
        return
    available, why = cuda_status()
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if not available:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA device: {why}"))


def pytest_report_header(config: pytest.Config) -> str | None:
    if not any(Path(str(a)).resolve() in (_HERE, *_HERE.parents) for a in config.args):
        return None
    return f"tests/gpu: {cuda_status()[1]}"


@pytest.fixture(scope="session", autouse=True)
def _pytest_process_stays_free_of_cuda():
    yield
    # torch's own lazy initialisation: a test (or an import) touched CUDA in this process.
    assert not torch.cuda.is_initialized(), (
        "the pytest process initialised CUDA; ranks forked after that cannot use it"
    )


@pytest.fixture(autouse=True)
def _default_cuda_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worlds (started inside a test, with this process's environment) run on the
    backends' default for CUDA tensors, whatever the shell exported; a world that tests the
    knob sets it itself (``test_cuda_routing.py``)."""
    monkeypatch.delenv("UCXBACKEND_CUDA", raising=False)
