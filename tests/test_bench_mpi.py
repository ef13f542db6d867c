"""``ucxbackend.bench.mpi``: the mpi column: why it is skipped, the mpirun command (which
starts ``ucxbackend.bench.mpi_worker``), and real runs with and without mpirun.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from bench_harness import TINY, bench_env, cell, needs_native, options, parse_tables, run_bench

import ucxbackend
from ucxbackend.bench import mpi as bench_mpi
from ucxbackend.bench import sizes as bench_sizes


def test_mpi_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_mpi.shutil, "which", lambda name: None)
    assert "mpirun not found" in (bench_mpi.mpi_skip_reason() or "")
    opts = options("--backends", "ucx,mpi")
    outcome = bench_mpi.run_mpi_reference(opts, 2, [bench_sizes.Layout("all_reduce", 8, 2)], 10)
    assert outcome.status == "skipped" and "mpirun" in (outcome.reason or "")
    cmd = bench_mpi.mpi_command(opts, 3, [8, 64], "/tmp/x.json")
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
    assert cmd[cmd.index("-m") + 1] == "ucxbackend.bench.mpi_worker" and "--sizes=8,64" in cmd
    assert importlib.util.find_spec("ucxbackend.bench.mpi_worker") is not None


@needs_native
@pytest.mark.skipif(
    bench_mpi.mpi_skip_reason() is not None,
    reason=f"mpi column unavailable: {bench_mpi.mpi_skip_reason()}",
)
def test_mpi_column(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = run_bench(
        "all_reduce,broadcast", *TINY, "--backends", "ucx,gloo,mpi", "--json", str(out_json)
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
