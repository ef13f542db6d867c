"""What the bench tests share (``tests/test_bench_*.py``, one file per module of
``ucxbackend.bench``): running ``python -m ucxbackend bench`` in a subprocess with a deadline
(:func:`run_bench`, the process group killed past it, in a clean environment from
:func:`bench_env`), parsing its options (:func:`options`), and reading its table back
(:func:`parse_tables`, :func:`cell`).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from session_run import run_in_session

import ucxbackend
from ucxbackend import cli
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import options as bench_options

REPO = Path(__file__).resolve().parent.parent
TINY = ("-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1")
RUN_TIMEOUT = 120

needs_native = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)


def bench_env(**extra: str) -> dict[str, str]:
    drop = ("UCX_", "UCXBACKEND_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "_UCXBENCH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def run_bench(
    *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``python -m ucxbackend bench ARGS``; the whole process group is killed on timeout."""
    return run_command("bench", *args, env=env, timeout=timeout)


def run_command(
    command: str, *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``python -m ucxbackend COMMAND ARGS`` (``bench``, ``soak``) in :func:`bench_env`; the
    whole process group is killed on timeout."""
    cmd = [sys.executable, "-m", "ucxbackend", command, *args]
    run = run_in_session(cmd, timeout=timeout, env=bench_env() if env is None else env, cwd=REPO)
    if run.timed_out:
        pytest.fail(f"{command} did not finish within {timeout}s\n{run.out}\n{run.err}")
    return subprocess.CompletedProcess(cmd, run.returncode, run.out, run.err)


def parse_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["bench", *argv])


def options(*argv: str) -> bench_options.BenchOptions:
    return bench_options.BenchOptions.from_args(parse_args(*argv))


def parse_tables(stdout: str) -> dict[str, dict[str, Any]]:
    """collective -> {"columns": [...], "ratios": [...], "rows": [[field, ...], ...]}."""
    tables: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in stdout.splitlines():
        m = re.fullmatch(r"# (\w+)", line)
        if m and m.group(1) in bench_common.COLLECTIVES:
            current = tables.setdefault(m.group(1), {"head": [], "rows": [], "footer": []})
            continue
        if current is None:
            continue
        if line.startswith("#"):
            (current["footer"] if current["rows"] else current["head"]).append(line)
        elif line.strip():
            current["rows"].append(line.split())
    for table in tables.values():
        names_line, head_line = table["head"][0], table["head"][1]
        table["columns"] = names_line.strip("# ").split()
        table["ratios"] = [w for w in head_line.split() if "/" in w]
    return tables


def cell(table: dict[str, Any], row: Sequence[str], backend: str, what: str) -> str:
    """A field of a parsed row: what is time, algbw, busbw or wrong."""
    per = 4 if "#wrong" in table["head"][1] else 3
    i = 5 + table["columns"].index(backend) * per + ("time", "algbw", "busbw", "wrong").index(what)
    return row[i]


def assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
