"""``ucxbackend.bench.launcher``: the ranks' environment, supervision (a failed rank, the
deadline, wrong results), ``--timeout`` on a real run, and a run under torchrun instead.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_harness import REPO, RUN_TIMEOUT, TINY, bench_env, needs_native, run_bench

import ucxbackend
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import launcher as bench_launcher


def test_child_env() -> None:
    env = bench_launcher.child_env({"PATH": "/bin", "PYTHONPATH": "/x"}, 1, 3, 12345)
    assert env["RANK"] == env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == "3" and env["MASTER_PORT"] == "12345"
    assert env["MASTER_ADDR"] == "127.0.0.1"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].endswith(os.pathsep + "/x")
    # first the directory this ucxbackend was imported from, so that the ranks import it too
    root = env["PYTHONPATH"].split(os.pathsep)[0]
    assert Path(root, "ucxbackend", "__init__.py").samefile(ucxbackend.__file__)
    assert bench_launcher.child_env({"OMP_NUM_THREADS": "4"}, 0, 2, 1)["OMP_NUM_THREADS"] == "4"


def test_supervise_kills_the_rest_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_launcher, "_FAIL_GRACE_S", 0.5)
    fail = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    hang = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    err = io.StringIO()
    start = time.monotonic()
    assert bench_launcher.supervise([fail, hang], 30.0, err) == bench_common.EXIT_FAILED
    assert time.monotonic() - start < 10
    assert hang.returncode is not None
    assert "rank 0 exited with status 3" in err.getvalue()
    assert "rank 1 was killed" in err.getvalue()


def test_supervise_deadline_and_wrong_results() -> None:
    hang = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    err = io.StringIO()
    assert bench_launcher.supervise([hang], 0.5, err) == bench_common.EXIT_FAILED
    assert "timed out after 0.5s; killed ranks [0]" in err.getvalue()
    codes = [subprocess.Popen([sys.executable, "-c", f"raise SystemExit({c})"]) for c in (0, 1)]
    assert bench_launcher.supervise(codes, 30.0, io.StringIO()) == bench_common.EXIT_WRONG


@needs_native
def test_timeout_kills_the_run() -> None:
    start = time.monotonic()
    proc = run_bench(
        "all_reduce", "-b", "8", "-e", "8", "-n", "10000000", "-w", "0", "--timeout", "2"
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "timed out after 2s" in proc.stderr
    assert time.monotonic() - start < 30


@pytest.mark.slow
@needs_native
def test_under_torchrun(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "ucxbackend",
        "bench",
        "all_gather",
        *TINY,
        "--json",
        str(out_json),
    ]
    # TMPDIR: torchrun's torchelastic_* log dir goes with the test's.
    env = bench_env(TMPDIR=str(tmp_path))
    proc = subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# all_gather") == 1  # only rank 0 prints
    assert json.loads(out_json.read_text())["world_size"] == 2
