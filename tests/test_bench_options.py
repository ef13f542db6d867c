"""``ucxbackend.bench.options``: the ``bench`` command line, BenchOptions (defaults, round trip
through the ranks' argv, bad values) and the environment checks; ``python -m ucxbackend
bench`` with a bad option exits 2 without a traceback.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from bench_harness import assert_clean, options, parse_args, run_bench

import ucxbackend
from ucxbackend import cli
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import options as bench_options


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
    assert options("gather").collectives == ("gather",)


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
        (("-b", "12X"), "'12X' is not a size"),
        (("-n", "0"), "expected an integer >= 1"),
        (("-d", "complex64"), "invalid choice"),
        (("-o", "band"), "invalid choice"),
        (("-c", "2"), "invalid choice"),
        (("scatter",), "unknown collective 'scatter'"),
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
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
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


def test_cli_lists_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert "bench" in [c.name for c in cli.COMMANDS]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    for flag in ("--minbytes", "--maxbytes", "--stepfactor", "--iters", "--warmup_iters"):
        assert flag in out
    for flag in ("--op", "--datatype", "--check", "--root", "--backends", "--stat", "--json"):
        assert flag in out


def test_bad_option_is_a_clean_error() -> None:
    proc = run_bench("all_reduce", "-b", "12X", timeout=60)
    assert proc.returncode == 2
    assert "'12X' is not a size" in proc.stderr
    assert_clean(proc)
    proc = run_bench("--backends", "ucx,nope", timeout=60)
    assert proc.returncode == 2
    assert "bench: error: unknown backend 'nope'" in proc.stderr
    assert_clean(proc)
