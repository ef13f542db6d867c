"""``ucxbackend.bench.mpi``: the mpi column: why it is skipped, the mpirun command (which
starts ``ucxbackend.bench.mpi_worker``), the session that times it in rounds (its workers
asleep between them, a worker's death failing the cells), and real runs with and without
mpirun, the mpi column taking its turn in every round.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_harness import (
    REPO,
    TINY,
    bench_env,
    cell,
    needs_native,
    options,
    parse_tables,
    run_bench,
)

import ucxbackend
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import mpi as bench_mpi
from ucxbackend.bench import runner as bench_runner
from ucxbackend.bench import sizes as bench_sizes
from ucxbackend.bench import timing as bench_timing
from ucxbackend.bench.timing import Measurement

needs_mpi = pytest.mark.skipif(
    bench_mpi.mpi_skip_reason() is not None,
    reason=f"mpi column unavailable: {bench_mpi.mpi_skip_reason()}",
)


def test_mpi_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_mpi.shutil, "which", lambda name: None)
    assert "mpirun not found" in (bench_mpi.mpi_skip_reason() or "")
    opts = options("--backends", "ucx,mpi")
    outcome, session = bench_mpi.start_mpi_session(opts, 2, 10)
    assert outcome.status == "skipped" and "mpirun" in (outcome.reason or "") and session is None
    cmd = bench_mpi.mpi_command(opts, 3, "/tmp/x/control")
    assert cmd[:8] == [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        "3",
        "--mca",
        "btl",
        "self,vader",
    ]
    # mpirun starts the package's worker: python -m ucxbackend.bench.mpi_worker
    assert cmd[cmd.index("-m") + 1] == "ucxbackend.bench.mpi_worker"
    assert "--control=/tmp/x/control" in cmd
    assert importlib.util.find_spec("ucxbackend.bench.mpi_worker") is not None


def test_mpi_takes_its_turn_in_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """--rounds 3 with mpi: mpi is checked and warmed up with the others, then times a round
    in its column's turn in every round (not in one block before or after the others), and
    the other ranks wait for it on the control group each time."""
    calls: list[tuple[str, str, int]] = []

    def prepare(ctx: Any, backend: str, layout: Any, data: Any) -> Any:
        calls.append(("prepare", backend, 0))
        return bench_timing.Timed(backend, None, lambda: None, 0, udp=False)

    def time_round(ctx: Any, timed: bench_timing.Timed, iters: int, rewarm: bool) -> None:
        calls.append(("round", timed.backend, iters))

    def finish(ctx: Any, timed: bench_timing.Timed) -> Measurement:
        calls.append(("finish", timed.backend, 0))
        return Measurement(True, None, {"mean": 1.0, "median": 1.0, "min": 1.0, "max": 1.0})

    class Session:
        def prepare(self, layout: bench_sizes.Layout) -> bench_mpi.MpiTimed:
            calls.append(("prepare", "mpi", 0))
            return bench_mpi.MpiTimed(layout.nbytes, 0, [[], []])

        def round(self, timed: bench_mpi.MpiTimed, iters: int, rewarm: bool) -> None:
            calls.append(("round", "mpi", iters))
            for t in timed.times:
                t += [2e-6] * iters

        finish = staticmethod(bench_mpi.MpiSession.finish)

    monkeypatch.setattr(bench_runner, "prepare", prepare)
    monkeypatch.setattr(bench_runner, "time_round", time_round)
    monkeypatch.setattr(bench_runner, "finish", finish)
    monkeypatch.setattr(
        bench_runner.dist, "barrier", lambda group=None: calls.append(("barrier", "ctrl", 0))
    )
    opts = options("all_reduce", "-b", "1K", "-e", "1K", "-n", "7", "--rounds", "3",
                   "--backends", "ucx,gloo,mpi")
    ctx = types.SimpleNamespace(
        opts=opts, rank=0, world=2, device=torch.device("cpu"), ctrl=None, all_ok=lambda ok: ok
    )
    sweep = bench_runner._Sweep(ctx, io.StringIO(), io.StringIO(), True, Session())  # type: ignore[arg-type]
    assert sweep.columns == ("ucx", "gloo", "mpi")
    row = sweep.size(sweep.layouts["all_reduce"][0])
    turn = [("round", "ucx"), ("round", "gloo"), ("round", "mpi"), ("barrier", "ctrl")]
    assert [c[:2] for c in calls] == [
        ("prepare", "ucx"), ("prepare", "gloo"), ("prepare", "mpi"),
        *turn, *turn, *turn,
        ("finish", "ucx"), ("finish", "gloo"),
    ]
    assert [n for what, col, n in calls if what == "round" and col == "mpi"] == [3, 2, 2]
    mpi = row.results["mpi"]
    assert mpi.supported and mpi.time_us == pytest.approx(dict.fromkeys(mpi.time_us, 2.0))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[bench_mpi.MpiSession]:
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv(bench_common.CORRUPT_ENV, "mpi")  # one wrong element, on MPI rank 0
    opts = options("--backends", "ucx,mpi", "-w", "2", "-n", "4", "--timeout", "60")
    outcome, s = bench_mpi.start_mpi_session(opts, 2, 60)
    assert outcome.status == "ok" and s is not None, outcome.reason
    assert outcome.library and outcome.mpi4py
    try:
        yield s
    finally:
        s.close()
    assert s.proc.returncode is not None  # close() ended mpirun


@needs_mpi
def test_mpi_session_rounds(session: bench_mpi.MpiSession) -> None:
    timed = session.prepare(bench_sizes.Layout("all_reduce", 4096, 1024))
    assert isinstance(timed, bench_mpi.MpiTimed)
    assert timed.wrong == 1  # the corrupted element, counted by an independent reference
    # Between commands the workers sleep in recv: an MPI rank left waiting in an MPI call
    # would busy-poll, taking a core from the torch columns timed in the same rounds.
    before = [_cpu_s(pid) for pid in session.pids]
    time.sleep(1.0)
    used = [_cpu_s(pid) - b for pid, b in zip(session.pids, before, strict=True)]
    assert max(used) < 0.2, f"idle mpi workers used {used} CPU seconds in 1 s"
    session.round(timed, 3, rewarm=False)
    session.round(timed, 2, rewarm=True)
    assert [len(t) for t in timed.times] == [5, 5] and len(timed.spans) == 2
    m = session.finish(timed)
    assert m.supported and m.time_us is not None and m.wrong == 1
    # each statistic is the max over MPI ranks of that rank's statistic over both rounds
    per_rank_max = max(max(t) for t in timed.times) * 1e6
    assert m.time_us["max"] == pytest.approx(per_rank_max)
    assert m.time_us["min"] <= m.time_us["median"] <= m.time_us["max"]


@needs_mpi
def test_mpi_session_worker_death(session: bench_mpi.MpiSession) -> None:
    timed = session.prepare(bench_sizes.Layout("all_reduce", 64, 16))
    assert isinstance(timed, bench_mpi.MpiTimed)
    os.kill(session.pids[1], signal.SIGKILL)
    session.round(timed, 2, rewarm=False)
    failed = session.finish(timed)
    assert not failed.supported and "mpi rank" in (failed.error or "")
    later = session.prepare(bench_sizes.Layout("all_reduce", 128, 32))
    assert isinstance(later, Measurement) and "failed earlier" in (later.error or "")


@needs_native
@needs_mpi
def test_mpi_column(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = run_bench(
        "all_reduce,broadcast", *TINY, "--rounds", "3", "--backends", "ucx,gloo,mpi",
        "--json", str(out_json),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# mpi: " in proc.stdout
    tables = parse_tables(proc.stdout)
    ar, bc = tables["all_reduce"], tables["broadcast"]
    assert ar["columns"] == ["ucx", "gloo", "mpi"] and ar["ratios"] == ["ucx/gloo", "ucx/mpi"]
    for row in ar["rows"]:
        assert cell(ar, row, "mpi", "wrong") == "0"
        assert float(cell(ar, row, "mpi", "time")) > 0
    assert {cell(bc, row, "mpi", "time") for row in bc["rows"]} == {"n/a"}
    doc = json.loads(out_json.read_text())
    assert doc["mpi"]["status"] == "ok" and doc["versions"]["mpi"]
    assert len([r for r in doc["results"] if r["backend"] == "mpi" and r["supported"]]) == 5
    # Every round ran every column, mpi included, in column order: ucx, gloo, mpi, ucx, ...
    for nbytes in {r["bytes"] for r in doc["results"] if r["collective"] == "all_reduce"}:
        spans = sorted(
            (start, end, r["backend"])
            for r in doc["results"]
            if r["collective"] == "all_reduce" and r["bytes"] == nbytes
            for start, end in r["round_spans"]
        )
        assert [b for _, _, b in spans] == ["ucx", "gloo", "mpi"] * 3, (nbytes, spans)
        ends = [end for _, end, _ in spans]
        assert all(ends[i] <= spans[i + 1][0] for i in range(len(spans) - 1)), spans


def test_mpi_column_skipped_when_missing(tmp_path: Path) -> None:
    if not ucxbackend.is_available():
        pytest.skip(f"ucxbackend._C not built ({ucxbackend.load_error()})")
    # a PATH without mpirun (python found through sys.executable)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    env = bench_env(PATH=str(bindir))
    proc = run_bench(
        "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--backends", "ucx,mpi", env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# mpi column skipped: mpirun not found on PATH" in proc.stdout
    assert parse_tables(proc.stdout)["all_reduce"]["columns"] == ["ucx"]
