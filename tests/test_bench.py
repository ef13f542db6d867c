"""``python -m ucxbackend bench``.

Pure unit tests (sizes, sweeps, bus-bandwidth factors, check data, table, JSON) run without
processes; the subprocess tests run the real bench on tiny sweeps and skip with a reason when
``ucxbackend._C`` is not built. Every subprocess has a timeout and is killed past it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import ucxbackend
from ucxbackend import cli
from ucxbackend.bench import cases as bench_cases
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import launcher as bench_launcher
from ucxbackend.bench import mpi as bench_mpi
from ucxbackend.bench import options as bench_options
from ucxbackend.bench import plot as bench_plot
from ucxbackend.bench import progress as bench_progress
from ucxbackend.bench import report as bench_report
from ucxbackend.bench import runner as bench_runner
from ucxbackend.bench import sizes as bench_sizes
from ucxbackend.bench import timing as bench_timing
from ucxbackend.bench import udp as bench_udp

REPO = Path(__file__).resolve().parent.parent
TINY = ("-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1")
RUN_TIMEOUT = 120

needs_native = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)


def _env(**extra: str) -> dict[str, str]:
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "ucxbackend", "bench", *args],
        env=_env() if env is None else env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"bench did not finish within {timeout}s\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def parse_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["bench", *argv])


def options(*argv: str) -> bench_options.BenchOptions:
    return bench_options.BenchOptions.from_args(parse_args(*argv))


# --------------------------------------------------------------------------- table parsing


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


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("16M", 16 << 20),
        ("1G", 1 << 30),
        (" 2 M ", 2 << 20),
        ("0", 0),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert bench_sizes.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12X", "1.5M", "-8", "M", "8KB", "0x10"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        bench_sizes.parse_size(text)


def test_format_size() -> None:
    assert [bench_sizes.format_size(n) for n in (8, 1024, 1536, 16 << 20, 3 << 30)] == [
        "8",
        "1K",
        "1536",
        "16M",
        "3G",
    ]


def test_size_sweep() -> None:
    sweep = bench_sizes.size_sweep(8, 64 << 20, 2)  # nccl-tests' defaults: -b 8 -e 64M -f 2
    assert len(sweep) == 24
    assert sweep[0] == 8 and sweep[-1] == 64 << 20
    assert sweep == [8 << k for k in range(24)]
    assert bench_sizes.size_sweep(8, 64 << 10, 8) == [8, 64, 512, 4096, 32768]
    assert bench_sizes.size_sweep(100, 100, 2) == [100]
    assert bench_sizes.size_sweep(3, 100, 4) == [3, 12, 48]
    for bad in ((0, 8, 2), (16, 8, 2), (8, 64, 1)):
        with pytest.raises(ValueError):
            bench_sizes.size_sweep(*bad)


def test_layouts_follow_nccl_tests() -> None:
    # all_reduce: the tensor; count = elements
    assert bench_sizes.layout_for("all_reduce", 1000, 4, 3) == bench_sizes.Layout(
        "all_reduce", 1000, 250
    )
    assert bench_sizes.layout_for("all_reduce", 10, 4, 2) == bench_sizes.Layout("all_reduce", 8, 2)
    assert bench_sizes.layout_for("sendrecv", 1, 8, 2) == bench_sizes.Layout(
        "sendrecv", 8, 1
    )  # >= 1 elt
    # total-buffer collectives: size = whole buffer, rounded to whole per-rank chunks;
    # count = per rank (all_gather, reduce_scatter) or per peer (all_to_all)
    for coll in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bench_sizes.layout_for(coll, 1000, 4, 3) == bench_sizes.Layout(coll, 996, 83)
        assert bench_sizes.layout_for(coll, 8, 4, 3) == bench_sizes.Layout(coll, 12, 1)
    assert bench_sizes.layout_for("barrier", 1 << 20, 4, 2) == bench_sizes.Layout("barrier", 0, 0)
    # sizes that round onto an earlier one are measured once
    sizes = bench_sizes.size_sweep(8, 64, 2)  # 8, 16, 32, 64
    assert [lay.nbytes for lay in bench_sizes.layouts_for("all_gather", sizes, 4, 3)] == [
        12,
        24,
        60,
    ]
    assert bench_sizes.layouts_for("barrier", sizes, 4, 3) == [bench_sizes.Layout("barrier", 0, 0)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16])
def test_bus_factors_are_nccl_tests(n: int) -> None:
    # PERFORMANCE.md of nccl-tests
    assert bench_sizes.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for coll in ("reduce_scatter", "all_gather", "all_to_all"):
        assert bench_sizes.bus_factor(coll, n) == pytest.approx((n - 1) / n)
    for coll in ("broadcast", "reduce", "sendrecv"):
        assert bench_sizes.bus_factor(coll, n) == 1.0
    assert bench_sizes.bus_factor("barrier", n) == 0.0
    with pytest.raises(ValueError):
        bench_sizes.bus_factor("gather", n)


def test_bandwidths() -> None:
    algbw, busbw = bench_sizes.bandwidths("all_reduce", 1_000_000_000, 0.5, 4)
    assert algbw == pytest.approx(2.0)  # GB/s = 1e9 bytes / s, size / time
    assert busbw == pytest.approx(2.0 * 2 * 3 / 4)
    assert bench_sizes.bandwidths("all_gather", 3_000, 1e-6, 3) == pytest.approx((3.0, 2.0))
    assert bench_sizes.bandwidths("barrier", 0, 1e-5, 2) == (0.0, 0.0)


# --------------------------------------------------------------------------- options


def test_options_defaults_are_nccl_tests() -> None:
    opts = options()
    assert opts.collectives == ("all_reduce",)
    assert (opts.minbytes, opts.maxbytes, opts.stepfactor) == (8, 64 << 20, 2)
    assert (opts.iters, opts.warmup_iters) == (20, 5)
    assert (opts.op, opts.datatype, opts.check, opts.root) == ("sum", "float", True, 0)
    assert opts.backends == ("ucx", "gloo") and not opts.mpi
    assert opts.stat == "mean" and opts.device == "cpu"
    assert opts.rounds == 1  # each backend's iterations in one block, as nccl-tests


def test_collectives_positional() -> None:
    assert options("all_reduce,all_gather", "barrier").collectives == (
        "all_reduce",
        "all_gather",
        "barrier",
    )
    assert options("all").collectives == bench_common.COLLECTIVES
    assert options("alltoall", "allreduce", "all_reduce").collectives == (
        "all_to_all",
        "all_reduce",
    )
    assert options("all_gather_into_tensor").collectives == ("all_gather",)


def test_options_round_trip() -> None:
    opts = options(
        "broadcast,sendrecv",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "4",
        "-n",
        "7",
        "-w",
        "0",
        "-o",
        "max",
        "-d",
        "float16",
        "-c",
        "0",
        "-r",
        "1",
        "--backends",
        "gloo,mpi,ucx",
        "--stat",
        "min",
        "--rounds",
        "3",
        "--nproc",
        "3",
        "--timeout",
        "30",
        "--json",
        "out.json",
        "-v",
    )
    assert opts.datatype == "half"  # the nccl-tests name
    assert opts.backends == ("gloo", "ucx") and opts.mpi
    assert opts.columns(True) == ("gloo", "mpi", "ucx")
    assert opts.columns(False) == ("gloo", "ucx")
    assert opts.json == os.path.abspath("out.json")
    assert opts.rounds == 3
    again = bench_options.BenchOptions.from_args(parse_args(*opts.to_argv()))
    assert again == opts


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("-b", "12X"), "invalid size '12X'"),
        (("-n", "0"), "expected an integer >= 1"),
        (("-d", "complex64"), "invalid choice"),
        (("-o", "band"), "invalid choice"),
        (("-c", "2"), "invalid choice"),
        (("gather",), "unknown collective 'gather'"),
        (("--backends", "ucx,ucx"), "listed twice"),
        (("--timeout", "0"), "positive number"),
        (("--rounds", "0"), "expected an integer >= 1"),
    ],
)
def test_bad_options_are_argparse_errors(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(*argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("-b", "1M", "-e", "1K"), "smaller than minbytes"),
        (("-f", "1"), "stepfactor must be at least 2"),
        (("--backends", "mpi"), "at least one torch.distributed backend"),
        (("--backends", "mpi,ucx"), "list mpi after"),
        (("-n", "3", "--rounds", "4"), r"--rounds 4: more rounds than timed iterations \(-n 3\)"),
    ],
)
def test_bad_option_values(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(bench_common.UsageError, match=message):
        options(*argv)


def test_environment_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(bench_common.UsageError, match=r"unknown backend 'nope'; known: .*gloo"):
        bench_options.validate_environment(options("--backends", "ucx,nope"), 2)
    with pytest.raises(bench_common.UsageError, match="--root 2 is not a rank"):
        bench_options.validate_environment(options("-r", "2"), 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(bench_common.UsageError, match="CUDA is not available"):
        bench_options.validate_environment(options("--device", "cuda"), 2)
    with pytest.raises(bench_common.UsageError, match="not found"):
        bench_options.validate_environment(options("--json", "/nonexistent/dir/r.json"), 2)
    monkeypatch.setattr(ucxbackend, "_C", None)
    with pytest.raises(bench_common.UsageError, match="make build"):
        bench_options.validate_environment(options(), 2)


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    real = bench_options.importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(bench_options.importlib.util, "find_spec", find_spec)
    with pytest.raises(bench_common.UsageError, match="pip install matplotlib"):
        bench_options.validate_environment(options("--backends", "gloo", "--plot", "x.png"), 2)


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


# --------------------------------------------------------------------------- check data


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


# --------------------------------------------------------------------------- table and JSON


def _m(
    us: float | None, wrong: int | None = 0, error: str | None = None
) -> bench_timing.Measurement:
    if us is None:
        return bench_timing.Measurement(False, error)
    return bench_timing.Measurement(
        True, None, {"mean": us, "median": us, "min": us / 2, "max": us * 2}, wrong
    )


def _rows() -> list[bench_report.Row]:
    opts = options()
    r1 = bench_report.row_for(bench_sizes.Layout("all_reduce", 8, 2), opts)
    r1.results.update(ucx=_m(10.0), gloo=_m(100.0))
    r2 = bench_report.row_for(bench_sizes.Layout("all_reduce", 1 << 20, 1 << 18), opts)
    r2.results.update(ucx=_m(500.0, wrong=3), gloo=_m(None, error="RuntimeError: nope"))
    return [r1, r2]


def test_table_formatting() -> None:
    rows, cols = _rows(), ("ucx", "gloo")
    header = bench_report.format_header("all_reduce", cols, True, "mean")
    lines = [*header, *(bench_report.format_row(r, cols, True, "mean", 2) for r in rows)]
    lines += bench_report.format_footer(rows, cols, True, "mean", 2)
    text = "\n".join(lines)
    tables = parse_tables(text)
    table = tables["all_reduce"]
    assert table["columns"] == ["ucx", "gloo"]
    assert table["ratios"] == ["ucx/gloo"]
    assert header[2].split()[1:6] == ["size", "count", "type", "redop", "root"]
    assert len(header[2]) == len(lines[len(header)])  # header and rows line up
    first, second = table["rows"]
    assert first[:5] == ["8", "2", "float", "sum", "-1"]
    assert cell(table, first, "ucx", "time") == "10.00"
    assert cell(table, first, "gloo", "time") == "100.00"
    assert cell(table, first, "ucx", "wrong") == "0"
    assert first[-1] == "10.00"  # ucx/gloo busbw = gloo time / ucx time
    # 1 MiB in 500 us: algbw 2.10 GB/s, busbw x 2(n-1)/n = 1
    assert cell(table, second, "ucx", "algbw") == "2.10"
    assert cell(table, second, "ucx", "busbw") == "2.10"
    assert cell(table, second, "ucx", "wrong") == "3"
    assert [cell(table, second, "gloo", w) for w in ("time", "busbw", "wrong")] == ["n/a"] * 3
    assert second[-1] == "n/a"
    assert "# Avg bus bandwidth    : ucx 1.049  gloo 8e-05" in text
    assert "# #wrong (all columns) : 3 FAILED" in text
    assert "# n/a gloo: RuntimeError: nope" in text
    # --stat min: the min time is used; no #wrong column with -c 0
    row_min = bench_report.format_row(rows[0], cols, False, "min", 2).split()
    assert row_min[5] == "5.00" and len(row_min) == 5 + 3 * 2 + 1


def test_json_report_schema() -> None:
    opts = options("--backends", "ucx,gloo,mpi")
    rows = _rows()
    report = bench_report.build_report(
        opts=opts,
        world=2,
        rows_by_collective={"all_reduce": rows},
        columns=("ucx", "gloo"),
        versions={"ucxbackend": "0", "torch": "t", "ucx": "u", "python": "p", "mpi": None},
        command=["python", "-m", "ucxbackend", "bench"],
        mpi={"status": "skipped", "reason": "mpirun not found"},
    )
    doc = json.loads(json.dumps(report))
    assert doc["schema"] == "ucxbackend-bench/1"
    assert set(doc) >= {"command", "world_size", "versions", "options", "results", "summary"}
    assert doc["world_size"] == 2 and doc["stat"] == "mean"
    assert doc["versions"]["torch"] == "t"
    assert doc["options"]["backends"] == ["ucx", "gloo", "mpi"]
    assert doc["ok"] is False and doc["wrong_total"] == 3
    assert len(doc["results"]) == 4
    rec = doc["results"][0]
    assert set(rec) == {
        "collective",
        "backend",
        "bytes",
        "count",
        "dtype",
        "op",
        "root",
        "supported",
        "error",
        "time_us",
        "algbw",
        "busbw",
        "wrong",
        "transport",
    }
    assert rec["transport"] is None  # udp columns only
    assert doc["udp_variants"] == [] and doc["options"]["udp_variants"] == []
    assert rec["time_us"] == {"mean": 10.0, "median": 10.0, "min": 5.0, "max": 20.0}
    assert rec["algbw"] == pytest.approx(8 / 1e9 / 10e-6)
    na = doc["results"][-1]
    assert na["supported"] is False and na["busbw"] is None and na["error"] == "RuntimeError: nope"
    assert {s["backend"] for s in doc["summary"]} == {"ucx", "gloo"}


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = bench_report.build_report(
        opts=options("all_reduce,barrier"),
        world=2,
        rows_by_collective={"all_reduce": _rows(), "barrier": []},
        columns=("ucx", "gloo"),
        versions={},
        command=[],
        mpi={},
    )
    path = tmp_path / "bw.png"
    bench_plot.write_plot(report, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress() -> None:
    tty = _Tty()
    p = bench_progress.Progress(tty, enabled=True, verbose=False)
    p.update("all_reduce ucx 16M (1/4)")
    p.update("all_reduce gloo 16M (2/4)")
    p.clear()
    assert tty.getvalue().startswith("\r[bench] all_reduce ucx 16M (1/4)\r[bench] all_reduce gloo")
    assert tty.getvalue().endswith("\r")
    assert "\n" not in tty.getvalue()
    piped = io.StringIO()
    bench_progress.Progress(piped, enabled=True, verbose=False).update("x")
    assert piped.getvalue() == ""  # logs stay clean
    bench_progress.Progress(piped, enabled=True, verbose=True).update("x")
    assert piped.getvalue() == "[bench] x\n"
    quiet = _Tty()
    bench_progress.Progress(quiet, enabled=False, verbose=True).update("x")  # ranks other than 0
    assert quiet.getvalue() == ""


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


def test_cli_lists_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert "bench" in [c.name for c in cli.COMMANDS]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    for flag in ("--minbytes", "--maxbytes", "--stepfactor", "--iters", "--warmup_iters"):
        assert flag in out
    for flag in ("--op", "--datatype", "--check", "--root", "--backends", "--stat", "--json"):
        assert flag in out


# --------------------------------------------------------------------------- subprocess


def _assert_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


@needs_native
def test_all_reduce_ucx_vs_gloo(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = run_bench(
        "all_reduce", *TINY, "--backends", "ucx,gloo", "-c", "1", "--json", str(out_json)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_clean(proc)
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
        assert float(row[-1]) > 0
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


@needs_native
def test_other_collectives() -> None:
    others = [c for c in bench_common.COLLECTIVES if c != "all_reduce"]
    # in 3 rounds: the backends take turns, each round re-warmed, results still checked
    proc = run_bench(",".join(others), *TINY, "--rounds", "3", "--verbose")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_clean(proc)
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


def _corrupted_small_all_reduce(out_json: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """all_reduce at 8, 64 and 512 bytes, 2 iterations, with the ucx outputs corrupted."""
    args = ["-b", "8", "-e", "512", "-f", "8", "-n", "2", "-w", "0", *extra]
    return run_bench(
        "all_reduce", *args, "--json", str(out_json), env=_env(**{bench_common.CORRUPT_ENV: "ucx"})
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


def test_bad_option_is_a_clean_error() -> None:
    proc = run_bench("all_reduce", "-b", "12X", timeout=60)
    assert proc.returncode == 2
    assert "invalid size '12X'" in proc.stderr
    _assert_clean(proc)
    proc = run_bench("--backends", "ucx,nope", timeout=60)
    assert proc.returncode == 2
    assert "bench: error: unknown backend 'nope'" in proc.stderr
    _assert_clean(proc)


@needs_native
def test_timeout_kills_the_run() -> None:
    start = time.monotonic()
    proc = run_bench(
        "all_reduce", "-b", "8", "-e", "8", "-n", "10000000", "-w", "0", "--timeout", "2"
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "timed out after 2s" in proc.stderr
    assert time.monotonic() - start < 30


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
    env = _env(PATH=str(bindir))
    proc = run_bench(
        "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--backends", "ucx,mpi", env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# mpi column skipped: mpirun not found on PATH" in proc.stdout
    assert parse_tables(proc.stdout)["all_reduce"]["columns"] == ["ucx"]


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
    proc = subprocess.run(
        cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("# all_gather") == 1  # only rank 0 prints
    assert json.loads(out_json.read_text())["world_size"] == 2


def test_round_lengths() -> None:
    assert bench_timing.round_lengths(20, 1) == [20]
    assert bench_timing.round_lengths(20, 4) == [5, 5, 5, 5]
    assert bench_timing.round_lengths(7, 3) == [3, 2, 2]
    assert bench_timing.round_lengths(3, 3) == [1, 1, 1]


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
    mpi = bench_mpi.MpiOutcome("not requested")
    sweep = bench_runner._Sweep(ctx, io.StringIO(), io.StringIO(), mpi)  # type: ignore[arg-type]
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


def test_time_stats() -> None:
    assert bench_timing.time_stats([3.0, 1.0, 2.0]) == (2.0, 2.0, 1.0, 3.0)
    assert bench_timing.time_stats([4.0, 1.0, 2.0, 100.0]) == (26.75, 3.0, 1.0, 100.0)


# --------------------------------------------------------------------------- udp variants


@pytest.mark.parametrize(
    ("text", "label", "config", "faults"),
    [
        ("lossless:", "lossless", "", ""),
        (" lossless : ", "lossless", "", ""),
        ("sr1:drop=0.01", "sr1", "", "drop=0.01,seed=1"),
        ("gbn5:drop=5%,loss_recovery=gbn", "gbn5", "loss_recovery=go_back_n", "drop=0.05,seed=1"),
        (
            "mix:loss_recovery=go_back_n,drop=0.1,seed=9,congestion=aimd,dup=0.001,",
            "mix",
            "loss_recovery=go_back_n,congestion=aimd",
            "drop=0.1,seed=9,dup=0.001",
        ),
        ("drop=0.1", "udp:sr@10%", "", "drop=0.1,seed=1"),
        (
            "loss_recovery=go_back_n,drop=0.01",
            "udp:gbn@1%",
            "loss_recovery=go_back_n",
            "drop=0.01,seed=1",
        ),
        ("loss_recovery=sr", "udp:sr@0%", "loss_recovery=selective_repeat", ""),
        ("udp:sr@1%:drop=0.01", "udp:sr@1%", "", "drop=0.01,seed=1"),  # ':' inside a label
        ("udp:sr@0%:", "udp:sr@0%", "", ""),
    ],
)
def test_udp_variant_parse(text: str, label: str, config: str, faults: str) -> None:
    v = bench_udp.parse_udp_variant(text)
    assert (v.label, v.udp_config, v.udp_faults) == (label, config, faults)
    assert v.pg_options() == {"udp_config": config, "udp_faults": faults}
    assert bench_udp.parse_udp_variant(v.spec()) == v  # what the ranks we start are given


def test_udp_variants_list_and_seed() -> None:
    got = bench_udp.parse_udp_variants(
        "lossless:;sr1:drop=0.01; ;gbn:drop=0.01,loss_recovery=gbn", 7
    )
    assert [v.label for v in got] == ["lossless", "sr1", "gbn"]
    assert got[1].udp_faults == "drop=0.01,seed=7"  # --udp-seed, the same for every variant
    assert got[2].udp_faults == "drop=0.01,seed=7"
    assert got[0].udp_faults == ""  # no faults, no seed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty --udp-variant: expected LABEL:KEY=VALUE,... or LABEL:"),
        (" ; ", "empty --udp-variant"),
        (
            "lossless",
            "'lossless' is not KEY=VALUE (a variant named 'lossless' with the defaults is "
            "'lossless:')",
        ),
        ("sr:drop", "'sr:drop': 'drop' is not KEY=VALUE"),
        (":drop=0.1", "empty label before ':'"),
        ("a b:drop=0.1", "bad label 'a b'"),
        ("a/b:", "bad label 'a/b'"),
        ("sr:drop=0.1,bogus=1", "unknown key 'bogus'; udp_config keys: mtu_payload"),
        ("sr:drop=", "drop= has no value"),
        ("sr:drop=0.1,drop=0.2", "key 'drop' given twice"),
        ("sr:drop=x%", "drop=x% is not a percentage"),
        ("drop=0.1,congestion=aimd", "give it a label (LABEL:drop=0.1,congestion=aimd)"),
    ],
)
def test_udp_variant_parse_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        bench_udp.parse_udp_variants(text)


@needs_native
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sr:drop=2", "udp variant 'sr:drop=2': udp faults: drop='2' is invalid"),
        ("x:loss_recovery=fast", "udp config: loss_recovery='fast' is invalid (allowed: "),
        ("x:rto_min_us=abc", "rto_min_us='abc' is invalid"),
    ],
)
def test_udp_variant_values_checked_by_the_native_parser(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        bench_udp.parse_udp_variant(text)


def test_udp_policies_match_the_transport() -> None:
    # a variant routes each key by name: the two key sets must not overlap
    assert not set(ucxbackend.config.UDP_CONFIG_KEYS) & set(ucxbackend.config.UDP_FAULT_KEYS)
    source = (REPO / "transports" / "udp" / "loss_recovery.cpp").read_text()
    # the short names (sr, gbn) refer to policies the registry has
    assert set(bench_udp.UDP_POLICIES) <= set(re.findall(r'\{"(\w+)", \[\]', source))
    if ucxbackend.is_available():
        default = ucxbackend._C.udp.describe_config("")
        assert f"loss_recovery={bench_udp.DEFAULT_UDP_POLICY}" in default


def test_udp_variant_options() -> None:
    opts = options(
        "--udp-variant",
        "lossless:",
        "--udp-variants",
        "gbn5:drop=0.05,loss_recovery=go_back_n",
        "--udp-drop",
        "0.01,10%",
        "--udp-policy",
        "sr,go_back_n",
        "--backends",
        "ucx,mpi,gloo",
        "--udp-seed",
        "3",
    )
    labels = ("lossless", "gbn5", "udp:sr@1%", "udp:sr@10%", "udp:gbn@1%", "udp:gbn@10%")
    assert opts.variant_labels == labels
    assert opts.columns(True) == (*labels, "ucx", "mpi", "gloo")  # the first is the reference
    assert opts.columns(False) == (*labels, "ucx", "gloo")
    assert bench_report.ratio_columns(opts.columns(False))[0] == "lossless/gbn5"
    assert opts.measured() == (*labels, "ucx", "gloo")
    assert opts.udp_columns() == frozenset(labels)
    sweep = {v.label: v for v in opts.udp_variants}
    assert sweep["udp:gbn@10%"].pg_options() == {
        "udp_config": "loss_recovery=go_back_n",
        "udp_faults": "drop=0.1,seed=3",
    }
    assert sweep["gbn5"].udp_faults == "drop=0.05,seed=3"
    again = bench_options.BenchOptions.from_args(parse_args(*opts.to_argv()))
    assert again == opts
    assert opts.describe()["udp_variants"][0] == {
        "label": "lossless",
        "backend": "udp",
        "udp_config": "",
        "udp_faults": "",
    }
    # without --backends: the variants only; a plain udp backend column has statistics too
    only = options("--udp-drop", "0,1%")
    assert only.columns(True) == ("udp:sr@0%", "udp:sr@1%") and only.backends == ()
    assert [v.udp_faults for v in only.udp_variants] == ["", "drop=0.01,seed=1"]
    assert bench_options.BenchOptions.from_args(parse_args(*only.to_argv())) == only
    assert options("--udp-policy", "gbn").variant_labels == ("udp:gbn@0%",)
    assert options("--backends", "udp,gloo").udp_columns() == frozenset({"udp"})
    assert options().udp_columns() == frozenset()


def test_udp_common_settings() -> None:
    opts = options(
        "--udp-variant",
        "lossless:;gbn:loss_recovery=gbn,max_rto_expiries=5",
        "--udp-drop",
        "1%",
        "--udp-common",
        "max_rto_expiries=50,congestion=aimd",
    )
    got = {v.label: (v.udp_config, v.udp_faults) for v in opts.udp_variants}
    assert got == {
        "lossless": ("max_rto_expiries=50,congestion=aimd", ""),
        "gbn": ("loss_recovery=go_back_n,max_rto_expiries=5,congestion=aimd", ""),  # own wins
        "udp:sr@1%": (
            "loss_recovery=selective_repeat,max_rto_expiries=50,congestion=aimd",
            "drop=0.01,seed=1",
        ),
    }
    # the ranks we start get the variants as resolved, without --udp-common
    assert not any(a.startswith("--udp-common") for a in opts.to_argv())
    assert bench_options.BenchOptions.from_args(parse_args(*opts.to_argv())) == opts
    dup = options("--udp-variant", "lossless:", "--udp-common", "dup=0.5%", "--udp-seed", "4")
    assert dup.udp_variants[0].udp_faults == "dup=0.005,seed=4"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--udp-variant", "a:;a:drop=0.1"), "label(s) used twice: a"),
        (("--udp-variant", "ucx:", "--backends", "ucx"), "label(s) ucx also in --backends"),
        (("--udp-variant", "sr:drop=0.1,bogus=1"), "unknown key 'bogus'"),
        (("--udp-drop", "0,abc"), "--udp-drop: 'abc' is not a probability"),
        (("--udp-drop", "1.5"), "--udp-drop: '1.5' is outside 0..1"),
        (("--udp-drop", ","), "--udp-drop: expected a comma-separated list"),
        (("--udp-policy", "sr,fast"), "--udp-policy: unknown policy 'fast' ("),
        (("--udp-drop", "0", "--udp-variant", "udp:sr@0%:"), "used twice: udp:sr@0%"),
        (("--udp-drop", "0", "--udp-common", "bogus=1"), "--udp-common: unknown key 'bogus'"),
        (("--udp-common", "max_rto_expiries=50"), "--udp-common: no udp variant to apply it to"),
    ],
)
def test_bad_udp_variant_options(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(bench_common.UsageError, match=re.escape(message)):
        options(*argv)


def _udp_m(us: float, retrans: float, dropped: float, srtt: float) -> bench_timing.Measurement:
    m = _m(us)
    per_op = dict.fromkeys(bench_udp.UDP_COUNTERS, 0.0)
    per_op.update(retransmitted_packets=retrans, declared_lost=retrans, faults_dropped=dropped)
    m.transport = {"iters": 5, "per_op": per_op, "rtt_smoothed_us": srtt, "rtt_min_us": 10.0}
    return m


def test_transport_block() -> None:
    opts = options("--udp-variant", "lossless:;udp:gbn@10%:drop=0.1,loss_recovery=gbn")
    row = bench_report.row_for(bench_sizes.Layout("all_reduce", 1 << 20, 1 << 18), opts)
    row.results.update(
        {
            "lossless": _udp_m(100.0, 0.0, 0.0, 50.0),
            "udp:gbn@10%": _udp_m(400.0, 12.4, 9.2, 123.0),
            "gloo": _m(200.0),
        }
    )
    cols = ("lossless", "udp:gbn@10%", "gloo")
    block = bench_report.format_transport_block("all_reduce", [row], cols)
    assert all(line.startswith("#") for line in block)  # data lines stay the main table's
    assert block[0].startswith("# udp transport statistics (all_reduce): per op")
    assert block[1].split()[1:] == [
        "size",
        "column",
        "retrans/op",
        "lost/op",
        "rto/op",
        "drops/op",
        "data/op",
        "srtt(us)",
    ]
    assert block[2].split()[1:3] == ["1048576", "lossless"]
    assert block[3].split()[1:] == [
        "1048576",
        "udp:gbn@10%",
        "12.40",
        "12.40",
        "0.00",
        "9.20",
        "0.0",
        "123",
    ]
    assert len(block) == 5 and block[-1] == "#"  # no gloo line
    assert bench_report.format_transport_block("all_reduce", [row], ("gloo",)) == []
    # long labels widen the ratio columns; header and rows still line up
    header = bench_report.format_header("all_reduce", cols, True, "mean")
    line = bench_report.format_row(row, cols, True, "mean", 2)
    assert len(header[2]) == len(line)
    assert line.split()[-2:] == ["4.00", "2.00"]  # lossless/udp:gbn@10%, lossless/gloo
    (rec,) = [
        r for r in bench_report.row_records([row], "mean", 2) if r["backend"] == "udp:gbn@10%"
    ]
    assert rec["transport"]["per_op"]["retransmitted_packets"] == 12.4


def _block_lines(stdout: str, collective: str) -> list[list[str]]:
    """The data lines of the udp transport statistics block, split (without the '#')."""
    lines = stdout.splitlines()
    start = lines.index(
        next(x for x in lines if x.startswith(f"# udp transport statistics ({collective})"))
    )
    out = []
    for line in lines[start + 2 :]:
        if line.strip() == "#":
            break
        out.append(line[1:].split())
    return out


@needs_native
def test_udp_variants_lossless_vs_lossy(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    started = time.monotonic()
    proc = run_bench(
        "all_reduce",
        "-b",
        "256K",
        "-e",
        "1M",
        "-f",
        "4",
        "-n",
        "6",
        "-w",
        "1",
        "--rounds",
        "2",  # the udp counters sum over rounds, count only timed iterations
        "--udp-variant",
        "lossless:;lossy:drop=0.1",
        "--backends",
        "udp,gloo",
        "--json",
        str(out_json),
        "--timeout",
        "60",
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_clean(proc)
    assert time.monotonic() - started < 60
    assert "# udp variant lossy: udp_config='' udp_faults='drop=0.1,seed=1'" in proc.stdout
    table = parse_tables(proc.stdout)["all_reduce"]
    assert table["columns"] == ["lossless", "lossy", "udp", "gloo"]
    assert table["ratios"] == ["lossless/lossy", "lossless/udp", "lossless/gloo"]
    assert len(table["rows"]) == 2  # the statistics block adds no data lines
    for row in table["rows"]:
        for col in table["columns"]:
            assert cell(table, row, col, "wrong") == "0", (col, row)
    assert "# #wrong (all columns) : 0 OK" in table["footer"]
    block = _block_lines(proc.stdout, "all_reduce")
    assert [(b[0], b[1]) for b in block] == [
        (size, col) for size in ("262144", "1048576") for col in ("lossless", "lossy", "udp")
    ]

    doc = json.loads(out_json.read_text())
    assert doc["ok"] is True
    assert [v["label"] for v in doc["udp_variants"]] == ["lossless", "lossy"]
    recs = {(r["backend"], r["bytes"]): r for r in doc["results"]}
    totals: dict[str, dict[str, float]] = {}
    for (col, nbytes), rec in recs.items():
        if col == "gloo":
            assert rec["transport"] is None
            continue
        st = rec["transport"]
        assert st["iters"] == 6 and set(st["per_op"]) == set(bench_udp.UDP_COUNTERS)
        assert st["rtt_smoothed_us"] > 0 and st["per_op"]["data_packets_sent"] > 0
        for key, value in st["per_op"].items():
            totals.setdefault(col, {}).setdefault(key, 0.0)
            totals[col][key] += value
        # the block shows what the JSON holds
        (line,) = [b for b in block if b[:2] == [str(nbytes), col]]
        assert line[2] == f"{st['per_op']['retransmitted_packets']:.2f}"
        assert line[5] == f"{st['per_op']['faults_dropped']:.2f}"
    assert totals["lossy"]["faults_dropped"] > 0
    assert totals["lossy"]["retransmitted_packets"] > 0
    assert totals["lossy"]["declared_lost"] > 0
    for col in ("lossless", "udp"):  # no faults injected; retransmissions only from stalls
        assert totals[col]["faults_dropped"] == 0
        assert totals[col]["retransmitted_packets"] < totals["lossy"]["retransmitted_packets"]


# --------------------------------------------------------------------------- cross-core probe


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cross_core_copy_probe(tmp_path: Path) -> None:
    """scripts/cross_core_copy.cpp (the README's check for a machine whose shared-memory
    speed drifts): one line per second, both store modes; bad arguments exit 2."""
    exe = tmp_path / "cross_core_copy"
    subprocess.run(
        [
            "g++",
            "-O2",
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(exe),
            str(REPO / "scripts" / "cross_core_copy.cpp"),
        ],
        check=True,
        timeout=120,
    )
    for args, seconds in ((("2", "262144", "cached"), 2), (("1", "65536", "streaming"), 1)):
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert [int(line.split()[0]) for line in lines] == list(range(1, seconds + 1))
        for line in lines:
            m = re.fullmatch(r"\d+ (\d+\.\d\d) GB/s", line)
            assert m is not None and float(m.group(1)) > 0, line
    for bad in (("0",), ("1", "1000"), ("1", "1048576", "fast")):
        proc = subprocess.run([str(exe), *bad], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "usage:" in proc.stderr, bad
