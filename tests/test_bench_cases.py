"""``ucxbackend.bench.cases``: check data exact in every dtype and order of reduction, the
expected output of every collective, ``count_wrong``; and, on real runs, that the check can
fail (the corruption hook) and that ``-c 0`` checks nothing.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from bench_harness import bench_env, cell, needs_native, parse_tables, run_bench

from ucxbackend.bench import cases as bench_cases
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import sizes as bench_sizes


def _reduce_in_dtype(op: str, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Reduce in the dtype itself, one step at a time, as a backend might."""
    acc = parts[0].clone()
    for p in parts[1:]:
        if op in ("sum", "avg"):
            acc = acc + p
        elif op == "prod":
            acc = acc * p
        elif op == "min":
            acc = torch.minimum(acc, p)
        else:
            acc = torch.maximum(acc, p)
    return acc


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "half", "float", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_patterns_reduce_exactly_in_every_order(dtype: str, op: str) -> None:
    tdtype = bench_common.TORCH_DTYPES[dtype]
    for world in (2, 3, 8):
        parts = [
            bench_cases.input_values(op, tdtype, r, world, 0, 600).to(tdtype) for r in range(world)
        ]
        expected = bench_cases.reduce_values(
            op,
            [bench_cases.input_values(op, tdtype, r, world, 0, 600) for r in range(world)],
            world,
        ).to(tdtype)
        for order in (parts, parts[::-1], parts[1:] + parts[:1]):
            got = _reduce_in_dtype(op, order)
            assert bench_cases.count_wrong(got, expected, op) == 0, (dtype, op, world)
        # no wrap-around: the exact result fits the dtype
        exact = bench_cases.reduce_values(
            op,
            [bench_cases.input_values(op, tdtype, r, world, 0, 600) for r in range(world)],
            world,
        )
        assert torch.equal(exact.to(torch.float64), expected.to(torch.float64))


def test_patterns_differ_between_ranks_and_positions() -> None:
    a = bench_cases.input_values("data", torch.float32, 0, 4, 0, 64)
    b = bench_cases.input_values("data", torch.float32, 1, 4, 0, 64)
    assert not torch.equal(a, b)
    assert len(set(a.tolist())) > 50
    prod = bench_cases.input_values("prod", torch.int8, 0, 4, 0, 30)
    assert set(prod.tolist()) <= {-2, -1, 1, 2} and {1, 2} <= set(prod.tolist())
    assert set(bench_cases.input_values("prod", torch.uint8, 2, 4, 0, 30).tolist()) == {1, 2}
    assert bench_cases.sum_modulus(torch.int8, 8) == 16  # 8 * 15 = 120 < 127
    assert bench_cases.sum_modulus(torch.bfloat16, 8) == 32  # 8 * 31 = 248 < 256
    assert bench_cases.sum_modulus(torch.float32, 8) == 101


@pytest.mark.parametrize("world", [2, 3])
def test_case_data_simulated(world: int) -> None:
    """Carry out each collective on the inputs by hand; it must equal the expected output."""
    dtype, op, root = torch.int32, "sum", world - 1
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
        layout = bench_sizes.layout_for(coll, 40, 4, world)
        data = [
            bench_cases.make_case_data(coll, layout, dtype, op, r, world, root)
            for r in range(world)
        ]
        sends = [d.send for d in data]
        c = layout.count
        for r, d in enumerate(data):
            assert d.expected is not None
            if coll == "all_reduce":
                got = sum(s.to(torch.int64) for s in sends)
            elif coll == "all_gather":
                got = torch.cat(sends)
            elif coll == "reduce_scatter":
                got = sum(s[r * c : (r + 1) * c].to(torch.int64) for s in sends)
            elif coll == "broadcast":
                got = sends[root]
            else:
                got = torch.cat([s[r * c : (r + 1) * c] for s in sends])
            assert bench_cases.count_wrong(got, d.expected, op) == 0, (coll, r)
    reduce = [
        bench_cases.make_case_data(
            "reduce", bench_sizes.layout_for("reduce", 40, 4, world), dtype, op, r, world, root
        )
        for r in range(world)
    ]
    assert [d.expected is not None for d in reduce] == [r == root for r in range(world)]
    # gather: only the root has an output, every rank's input in rank order
    gather = [
        bench_cases.make_case_data(
            "gather", bench_sizes.layout_for("gather", 40, 4, world), dtype, op, r, world, root
        )
        for r in range(world)
    ]
    for r, d in enumerate(gather):
        assert d.recv_numel == (10 // world * world if r == root else 0), (r, d.recv_numel)
        if r != root:
            assert d.expected is None
            continue
        assert d.expected is not None
        assert bench_cases.count_wrong(torch.cat([g.send for g in gather]), d.expected, op) == 0
        swapped = torch.cat([g.send for g in gather[::-1]])
        assert bench_cases.count_wrong(swapped, d.expected, op) > 0
    sr = [
        bench_cases.make_case_data(
            "sendrecv", bench_sizes.layout_for("sendrecv", 40, 4, world), dtype, op, r, world, 0
        )
        for r in range(world)
    ]
    for r, d in enumerate(sr):
        assert torch.equal(d.expected, sr[(r - 1) % world].send)
        assert d.recv_numel == 10


def test_count_wrong() -> None:
    exp = torch.arange(10, dtype=torch.float32)
    out = exp.clone()
    assert bench_cases.count_wrong(out, exp, "sum") == 0
    out[3] = bench_cases.poison_value(torch.float32)  # NaN
    out[4] += 1
    assert bench_cases.count_wrong(out, exp, "sum") == 2
    assert bench_cases.count_wrong(exp + 1e-8, exp, "avg") == 0
    assert bench_cases.count_wrong(out, exp, "avg") == 2
    ints = torch.arange(5, dtype=torch.uint8)
    assert (
        bench_cases.count_wrong(
            torch.full((5,), bench_cases.poison_value(torch.uint8), dtype=torch.uint8), ints, "max"
        )
        == 5
    )
    with pytest.raises(bench_common.BenchError, match="elements"):
        bench_cases.count_wrong(exp[:3], exp, "sum")


def _corrupted_small_all_reduce(out_json: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """all_reduce at 8, 64 and 512 bytes, 2 iterations, with the ucx outputs corrupted."""
    args = ["-b", "8", "-e", "512", "-f", "8", "-n", "2", "-w", "0", *extra]
    return run_bench(
        "all_reduce",
        *args,
        "--json",
        str(out_json),
        env=bench_env(**{bench_common.CORRUPT_ENV: "ucx"}),
    )


@needs_native
def test_corruption_hook_fails_the_check(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = _corrupted_small_all_reduce(out_json)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = parse_tables(proc.stdout)["all_reduce"]
    for row in table["rows"]:
        assert cell(table, row, "ucx", "wrong") == "1"
        assert cell(table, row, "gloo", "wrong") == "0"
    assert "# #wrong (all columns) : 3 FAILED" in table["footer"]
    doc = json.loads(out_json.read_text())
    assert doc["ok"] is False and doc["wrong_total"] == 3


@needs_native
def test_check_off_reports_nothing_checked(tmp_path: Path) -> None:
    """-c 0: no #wrong column, no #wrong footer, wrong_total null, and exit 0, even with the
    corruption hook set: nothing is checked, so nothing can be found wrong (the hook only
    corrupts outputs that are checked, and says so on stderr when it does)."""
    out_json = tmp_path / "r.json"
    proc = _corrupted_small_all_reduce(out_json, "-c", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " validation: 0 " in proc.stdout
    assert "corrupting" not in proc.stderr, proc.stderr
    table = parse_tables(proc.stdout)["all_reduce"]
    assert table["columns"] == ["ucx", "gloo"]
    assert "#wrong" not in proc.stdout
    assert not any("wrong" in line for line in table["footer"]), table["footer"]
    rows = table["rows"]
    assert [int(r[0]) for r in rows] == [8, 64, 512]
    for row in rows:
        # size count type redop root, then time algbw busbw per backend, then the ratio
        assert len(row) == 5 + 3 * 2 + 1, row
        for backend in ("ucx", "gloo"):
            assert float(cell(table, row, backend, "time")) > 0, row
    doc = json.loads(out_json.read_text())
    assert doc["options"]["check"] == 0
    assert doc["wrong_total"] is None and doc["ok"] is True
    assert len(doc["results"]) == 6
    assert all(r["wrong"] is None for r in doc["results"]), doc["results"]


@needs_native
def test_gather_is_checked_at_its_root(tmp_path: Path) -> None:
    """gather with root 1 of 3: the root's output is checked against the reference (one
    element corrupted on ucx is one wrong), the other ranks have none to check."""
    proc = run_bench(
        "gather", "-b", "12", "-e", "3K", "-f", "16", "-n", "2", "-w", "0", "--nproc", "3",
        "-r", "1", env=bench_env(**{bench_common.CORRUPT_ENV: "ucx"}),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = parse_tables(proc.stdout)["gather"]
    assert [(int(r[0]), int(r[1])) for r in table["rows"]] == [(12, 1), (192, 16), (3072, 256)]
    for row in table["rows"]:
        assert row[3:5] == ["none", "1"]
        assert cell(table, row, "ucx", "wrong") == "1"
        assert cell(table, row, "gloo", "wrong") == "0"
