"""``ucxbackend.bench.runner``: the order in which ``--rounds`` times the backends, and real
2- and 3-rank runs of every collective on ucx and Gloo (table and JSON agree, ``#wrong`` 0,
unsupported cases n/a). The runs skip with a reason when ``ucxbackend._C`` is not built;
every subprocess has a timeout and is killed past it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_harness import TINY, assert_clean, cell, needs_native, options, parse_tables, run_bench

import ucxbackend
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import report as bench_report
from ucxbackend.bench import runner as bench_runner
from ucxbackend.bench import timing as bench_timing


@needs_native
def test_all_reduce_ucx_vs_gloo(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = run_bench(
        "all_reduce", *TINY, "--backends", "ucx,gloo", "-c", "1", "--json", str(out_json)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(proc)
    assert "[bench]" not in proc.stderr  # no progress lines when stderr is not a TTY
    tables = parse_tables(proc.stdout)
    assert list(tables) == ["all_reduce"]
    table = tables["all_reduce"]
    assert table["columns"] == ["ucx", "gloo"]
    assert table["ratios"] == ["ucx/gloo"]
    rows = table["rows"]
    assert [int(r[0]) for r in rows] == [8, 64, 512, 4096, 32768]
    assert [int(r[1]) for r in rows] == [2, 16, 128, 1024, 8192]
    for row in rows:
        assert row[2:5] == ["float", "sum", "-1"]
        for backend in ("ucx", "gloo"):
            assert cell(table, row, backend, "wrong") == "0"
            assert float(cell(table, row, backend, "time")) > 0
        # The ratio is Gloo's time over ucx's (report.ratio), printed to 2 decimals: checked
        # against the row's own times, not against a speed (3 iterations on a loaded host can
        # make ucx 200x slower once, which prints 0.00).
        ucx_time = float(cell(table, row, "ucx", "time"))
        gloo_time = float(cell(table, row, "gloo", "time"))
        assert float(row[-1]) == pytest.approx(gloo_time / ucx_time, rel=0.02, abs=0.006), row
    assert any(line.startswith("# Avg bus bandwidth    : ucx ") for line in table["footer"])
    assert "# #wrong (all columns) : 0 OK" in table["footer"]

    doc = json.loads(out_json.read_text())
    assert doc["world_size"] == 2 and doc["ok"] is True and doc["wrong_total"] == 0
    assert doc["columns"] == ["ucx", "gloo"]
    assert doc["versions"]["ucx"] == ucxbackend._C.ucx_version()
    assert doc["command"][:4] == ["python", "-m", "ucxbackend", "bench"]
    records = {(r["backend"], r["bytes"]): r for r in doc["results"]}
    assert len(records) == 10
    for row in rows:
        for backend in ("ucx", "gloo"):
            rec = records[(backend, int(row[0]))]
            assert rec["count"] == int(row[1]) and rec["dtype"] == "float" and rec["op"] == "sum"
            t = rec["time_us"]
            assert t["min"] <= t["mean"] <= t["max"]
            assert t["min"] <= t["median"] <= t["max"]
            assert bench_report._fmt_time(t["mean"]) == cell(table, row, backend, "time")
            assert f"{rec['busbw']:.2f}" == cell(table, row, backend, "busbw")
            assert f"{rec['algbw']:.2f}" == cell(table, row, backend, "algbw")
            assert rec["wrong"] == 0
    # How the ucx ops waited (bench/waits.py), counted over the timed ops only: each rank's
    # op runs inline, is handed over or (the group busy, as right after the barrier) queued,
    # so inline and handed over add up to at most one per op and rank, and these small ops
    # mostly run inline; Gloo has no such block.
    iters = int(TINY[TINY.index("-n") + 1])
    inline = 0.0
    for row in rows:
        waits = records[("ucx", int(row[0]))]["waits"]
        assert waits["iters"] == iters
        per_op = waits["per_op"]
        assert 0 <= per_op["inline"] + per_op["handed_over"] <= 2.0, per_op
        assert per_op["yields"] >= 0 and per_op["voluntary_ctxt_switches"] >= 0
        inline += per_op["inline"]
        assert records[("gloo", int(row[0]))]["waits"] is None
    assert inline > 0, "no timed ucx op counted inline"
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# wait statistics ("))
    block = [line.split() for line in lines[start + 2 :] if line.startswith("#") and len(line) > 1]
    assert [(int(cells[1]), cells[2]) for cells in block] == [
        (8, "ucx"), (64, "ucx"), (512, "ucx"), (4096, "ucx"), (32768, "ucx")
    ], block


def test_fake_column_is_the_dispatch_floor() -> None:
    # torch's fake backend moves nothing: its column is timed but never checked (#wrong n/a),
    # so a run with it still passes, and no real backend is needed for it.
    proc = run_bench("all_reduce", *TINY, "--backends", "gloo,fake", "-c", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(proc)
    table = parse_tables(proc.stdout)["all_reduce"]
    assert table["columns"] == ["gloo", "fake"]
    for row in table["rows"]:
        assert cell(table, row, "gloo", "wrong") == "0"
        assert cell(table, row, "fake", "wrong") == "n/a"
        assert float(cell(table, row, "fake", "time")) > 0
    assert "# #wrong (all columns) : 0 OK" in table["footer"]


@needs_native
def test_other_collectives() -> None:
    others = [c for c in bench_common.COLLECTIVES if c != "all_reduce"]
    # in 3 rounds: the backends take turns, each round re-warmed, results still checked
    proc = run_bench(",".join(others), *TINY, "--rounds", "3", "--verbose")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(proc)
    assert " iters: 3 rounds: 3 validation: 1 " in proc.stdout
    tables = parse_tables(proc.stdout)
    assert list(tables) == others
    for coll, table in tables.items():
        assert table["columns"] == ["ucx", "gloo"]
        for row in table["rows"]:
            for backend in ("ucx", "gloo"):
                assert cell(table, row, backend, "wrong") == "0", (coll, row)
                assert cell(table, row, backend, "time") != "n/a", (coll, row)
    # size = whole buffer (a multiple of world size x 4 bytes), count = per rank
    assert [(int(r[0]), int(r[1])) for r in tables["all_gather"]["rows"]][:2] == [(8, 1), (64, 8)]
    assert tables["broadcast"]["rows"][0][3:5] == ["none", "0"]
    assert tables["reduce"]["rows"][0][3:5] == ["sum", "0"]
    assert len(tables["barrier"]["rows"]) == 1
    assert "[bench] sendrecv gloo 32K" in proc.stderr  # --verbose: plain progress lines


@needs_native
def test_three_ranks(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = run_bench(
        "all_reduce,reduce_scatter,sendrecv",
        *TINY,
        "--nproc",
        "3",
        "-r",
        "2",
        "--json",
        str(out_json),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tables = parse_tables(proc.stdout)
    assert "#  Rank  2 Pid" in proc.stdout
    assert [int(r[0]) for r in tables["reduce_scatter"]["rows"]] == [12, 60, 504, 4092, 32760]
    doc = json.loads(out_json.read_text())
    assert doc["world_size"] == 3 and doc["ok"] is True
    assert {r["wrong"] for r in doc["results"]} == {0}


@needs_native
def test_int32_max_and_unsupported_dtype() -> None:
    proc = run_bench(
        "all_reduce,reduce",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "-d",
        "int32",
        "-o",
        "max",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tables = parse_tables(proc.stdout)
    for table in tables.values():
        for row in table["rows"]:
            assert row[2:4] == ["int32", "max"]
            assert cell(table, row, "ucx", "wrong") == cell(table, row, "gloo", "wrong") == "0"
    # avg on an integer dtype is supported by neither: n/a and a reason, not a crash
    proc = run_bench(
        "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "-d", "int8", "-o", "avg"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = parse_tables(proc.stdout)["all_reduce"]
    assert cell(table, table["rows"][0], "ucx", "time") == "n/a"
    assert cell(table, table["rows"][0], "gloo", "time") == "n/a"
    assert any(line.startswith("# n/a ucx: ValueError") for line in table["footer"])


def test_backends_take_turns_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """--rounds 3: every backend is checked and warmed up once, then times its rounds in
    turn with the others (each round re-warmed), and its result covers all its rounds."""
    calls: list[tuple[str, str, int, bool]] = []

    def prepare(ctx: Any, backend: str, layout: Any, data: Any) -> Any:
        calls.append(("prepare", backend, 0, False))
        if backend == "broken":
            return bench_timing.Measurement(False, "unsupported here")
        return bench_timing.Timed(backend, None, lambda: None, 0, udp=False)

    def time_round(ctx: Any, timed: bench_timing.Timed, iters: int, rewarm: bool) -> None:
        calls.append(("round", timed.backend, iters, rewarm))
        timed.times += [1e-6 * len(calls)] * iters

    def finish(ctx: Any, timed: bench_timing.Timed) -> bench_timing.Measurement:
        calls.append(("finish", timed.backend, len(timed.times), False))
        return bench_timing.Measurement(
            True, None, {"mean": 1.0, "median": 1.0, "min": 1.0, "max": 1.0}
        )

    monkeypatch.setattr(bench_runner, "prepare", prepare)
    monkeypatch.setattr(bench_runner, "time_round", time_round)
    monkeypatch.setattr(bench_runner, "finish", finish)
    opts = options("all_reduce", "-b", "1K", "-e", "1K", "-n", "7", "--rounds", "3")
    opts = dataclasses.replace(opts, backends=("ucx", "broken", "gloo"))
    ctx = types.SimpleNamespace(opts=opts, rank=1, world=2, device=torch.device("cpu"))
    sweep = bench_runner._Sweep(ctx, io.StringIO(), io.StringIO(), False, None)  # type: ignore[arg-type]
    row = sweep.size(sweep.layouts["all_reduce"][0])
    assert calls == [
        ("prepare", "ucx", 0, False),
        ("prepare", "broken", 0, False),
        ("prepare", "gloo", 0, False),
        ("round", "ucx", 3, True),
        ("round", "gloo", 3, True),
        ("round", "ucx", 2, True),
        ("round", "gloo", 2, True),
        ("round", "ucx", 2, True),
        ("round", "gloo", 2, True),
        ("finish", "ucx", 7, False),
        ("finish", "gloo", 7, False),
    ]
    assert row.results["broken"].error == "unsupported here"
    assert row.results["ucx"].supported and row.results["gloo"].supported
