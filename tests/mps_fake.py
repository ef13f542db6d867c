"""A fake ``nvidia-cuda-mps-control`` for tests on machines without a GPU (test_mps.py,
test_gpu_session.py).

It records every invocation as a JSON line in ``$FAKE_MPS_RECORD`` (its arguments, what it
read on stdin, its ``CUDA_MPS_*`` environment) and plays the daemon's part that
``ucxbackend.mps`` uses: ``-d`` makes the control pipe in ``$CUDA_MPS_PIPE_DIRECTORY`` and
returns, ``quit`` on stdin removes it (and fails, as the real one does, where there is no
daemon). ``FAKE_MPS`` makes it misbehave: ``no-pipe`` (``-d`` returns 0 but no pipe
appears), ``refuse`` (``-d`` fails), ``stuck-quit`` (``quit`` fails).
"""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

from ucxbackend import mps

FAKE_CONTROL = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    argv = sys.argv[1:]
    stdin = "" if argv else sys.stdin.read()
    env = {{k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_")}}
    with open(os.environ["FAKE_MPS_RECORD"], "a") as f:
        f.write(json.dumps({{"argv": argv, "stdin": stdin, "env": env}}) + "\\n")
    how = os.environ.get("FAKE_MPS", "")
    pipe = os.path.join(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"), "control")
    if argv == ["-d"]:
        if how == "refuse":
            print("An instance of this daemon is already running")
            sys.exit(1)
        if how != "no-pipe":
            os.mkfifo(pipe)
        sys.exit(0)
    if stdin.strip() == "quit":
        if how == "stuck-quit" or not os.path.exists(pipe):
            print("Cannot find MPS control daemon process")
            sys.exit(1)
        os.unlink(pipe)
        sys.exit(0)
    sys.exit(2)
    """
)


def install_fake_control(folder: Path) -> tuple[Path, Path]:
    """The fake in ``folder/bin`` (put that first on PATH) and its empty record file (set
    ``FAKE_MPS_RECORD`` to it): (bin folder, record)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(FAKE_CONTROL.format(python=sys.executable))
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    record = folder / "record.jsonl"
    record.touch()
    return bin_dir, record


def calls(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def kinds(record: Path) -> list[str]:
    """Each invocation as "start" (``-d``) or what it read on stdin ("quit")."""
    return ["start" if c["argv"] == ["-d"] else c["stdin"].strip() for c in calls(record)]
