"""``scripts/socket_allreduce.cpp``, the plain-socket all_reduce that docs/performance.md
measures next to ucx and iperf3 on the namespace rig (issue #23): built with g++ and run as two
ranks over loopback in every mode. The program checks its own result (every element
2^(warmup+iters) after summing ones), so a fold that loses or doubles a piece exits 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_harness import REPO
from dist_harness import free_port

sys.path.insert(0, str(REPO / "scripts"))

from rig_socket_allreduce import build

DEADLINE_S = 60


def _run_pair(exe: Path, mbytes: int, iters: int, warmup: int, mode: str) -> list[dict[str, Any]]:
    port = free_port()
    argv = [str(exe), "?", "127.0.0.1", "127.0.0.1", str(port), str(mbytes), str(iters),
            str(warmup), mode]
    procs = []
    try:
        for rank in (0, 1):
            argv[1] = str(rank)
            procs.append(subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=DEADLINE_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"{mode} {mbytes} MB: rank exited {p.returncode}: {err}"
    return [json.loads(out) for out, _ in outs]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_socket_allreduce_modes(tmp_path: Path) -> None:
    """Every mode completes over loopback with its result checked, for a tensor of one piece
    per half (1 MB: 512 KiB halves) and one of three pieces per half (3 MB)."""
    exe = build(tmp_path)
    for mbytes in (1, 3):
        for mode in ("fold", "copyout", "move", "epoll"):
            results = _run_pair(exe, mbytes, iters=3, warmup=1, mode=mode)
            assert [r["rank"] for r in results] == [0, 1]
            for r in results:
                assert r["mode"] == mode and r["seconds"] > 0 and r["cpu"] >= 0, r


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_socket_allreduce_rejects_bad_arguments(tmp_path: Path) -> None:
    """Bad arguments exit 2 with the usage line, before any socket is opened."""
    exe = build(tmp_path)
    for bad in (["0"], ["2", "a", "b", "1", "1", "1", "1", "fold"],
                ["0", "a", "b", "1", "1", "1", "1", "sum"],
                ["0", "a", "b", "1", "1", "100", "1", "fold"]):
        proc = subprocess.run([str(exe), *bad], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "usage:" in proc.stderr, bad
