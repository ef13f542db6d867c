"""``--device cuda`` of the bench, on the CPU: the options (default columns, validation that
leaves CUDA uninitialised for the launcher's fork), the rank's GPU, the nccl skip decision,
Gloo's host staging, and the table and JSON with the ``gloo(host-staged)`` label, a skipped
nccl column and the d2d copy limit column, from fake measurements. What needs a GPU (the copy
timed with CUDA events, real CUDA runs) is not here.
"""

from __future__ import annotations

import dataclasses
import io
import types
from typing import Any

import pytest
import torch
import torch.distributed as dist
from bench_harness import cell, options, parse_args, parse_tables

from ucxbackend.bench import cases as bench_cases
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import mpi as bench_mpi
from ucxbackend.bench import ops as bench_ops
from ucxbackend.bench import options as bench_options
from ucxbackend.bench import report as bench_report
from ucxbackend.bench import runner as bench_runner
from ucxbackend.bench import sizes as bench_sizes
from ucxbackend.bench import timing as bench_timing

MiB = 1 << 20


def _m(us: float) -> bench_timing.Measurement:
    return bench_timing.Measurement(True, None, dict.fromkeys(("mean", "median", "min", "max"), us))


def test_cuda_default_columns() -> None:
    opts = options("--device", "cuda")
    assert opts.backends == ("ucx", "gloo", "nccl")
    assert opts.columns(False) == ("ucx", "gloo", "nccl")
    assert bench_options.BenchOptions.from_args(parse_args(*opts.to_argv())) == opts
    assert options().backends == ("ucx", "gloo")  # cpu: unchanged
    assert options("--device", "cuda", "--backends", "ucx,gloo").backends == ("ucx", "gloo")
    assert options("--device", "cuda", "--udp-variant", "lossless:").backends == ()


def test_cuda_environment_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    def poisons_fork() -> bool:
        raise AssertionError("is_available() initialises CUDA before the launcher forks")

    monkeypatch.setattr(torch.cuda, "is_available", poisons_fork)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(bench_common.UsageError, match="CUDA is not available"):
        bench_options.validate_environment(options("--device", "cuda"), 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    # nccl without NCCL is a skipped column on cuda (the runner says why), not an error
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    bench_options.validate_environment(options("--device", "cuda"), 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    with pytest.raises(bench_common.UsageError, match="'nccl' needs --device cuda"):
        bench_options.validate_environment(options("--backends", "ucx,nccl"), 2)


def test_rank_gpu() -> None:
    assert [bench_runner.cuda_index(r, 1) for r in range(3)] == [0, 0, 0]
    assert [bench_runner.cuda_index(r, 2) for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(bench_common.UsageError, match="no GPU"):
        bench_runner.cuda_index(0, 0)


def _rank(rank: int, gpu: str, host: str = "h", device: str = "cuda:0") -> dict[str, Any]:
    return {"rank": rank, "host": host, "gpu": gpu, "device": device}


def test_nccl_skip_reason() -> None:
    shared = [_rank(0, "GPU-a"), _rank(1, "GPU-a")]
    reason = bench_runner.nccl_skip_reason(True, shared)
    assert reason is not None
    assert "ranks 0 and 1 share cuda:0 on h" in reason
    assert "NCCL cannot run two ranks on one GPU" in reason
    three = [_rank(0, "GPU-a"), _rank(1, "GPU-b", device="cuda:1"), _rank(2, "GPU-b")]
    assert "ranks 1 and 2 share" in (bench_runner.nccl_skip_reason(True, three) or "")
    own = [_rank(0, "GPU-a"), _rank(1, "GPU-b", device="cuda:1")]
    assert bench_runner.nccl_skip_reason(True, own) is None
    hosts = [_rank(0, "GPU-a", host="x"), _rank(1, "GPU-a", host="y")]
    assert bench_runner.nccl_skip_reason(True, hosts) is None
    assert "without NCCL" in (bench_runner.nccl_skip_reason(False, own) or "")


def test_skipped_column_is_measured_as_skipped() -> None:
    ctx = types.SimpleNamespace(opts=options("--device", "cuda"), skipped={"nccl": "why"})
    layout = bench_sizes.Layout("all_reduce", MiB, MiB // 4)
    m = bench_timing.prepare(ctx, "nccl", layout, None)  # type: ignore[arg-type]
    assert isinstance(m, bench_timing.Measurement)
    assert not m.supported and m.error == "skipped: why"
    # a host-staged column's Measurement says so (the JSON's host_staged)
    ctx = types.SimpleNamespace(max_stats=list)
    timed = bench_timing.Timed("gloo", None, lambda: None, 0, udp=False, host_staged=True)
    timed.times = [1e-6, 3e-6]
    assert bench_timing.finish(ctx, timed).host_staged  # type: ignore[arg-type]


def test_gloo_host_staging_decision() -> None:
    assert not bench_ops.host_staged("gloo", "all_reduce", "cuda")  # torch's Gloo takes CUDA
    assert not bench_ops.host_staged("gloo", "broadcast", "cuda")
    for coll in ("all_gather", "reduce_scatter", "reduce", "all_to_all", "sendrecv"):
        assert bench_ops.host_staged("gloo", coll, "cuda")
        assert bench_ops.column_label("gloo", coll, "cuda") == "gloo(host-staged)"
        assert not bench_ops.host_staged("gloo", coll, "cpu")
        assert not bench_ops.host_staged("ucx", coll, "cuda")
    assert bench_ops.column_label("gloo", "all_reduce", "cuda") == "gloo"
    assert bench_ops.column_label("nccl", "all_gather", "cuda") == "nccl"


def test_staged_op_runs_on_host_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bench_ops.Buffers] = []

    def fake_make_op(collective: str, bufs: bench_ops.Buffers, *args: Any) -> Any:
        seen.append(bufs)
        send, recv = bufs.send, bufs.recv
        assert send is not None and recv is not None
        return lambda: recv.copy_(torch.cat([send, send + 100]))  # an all_gather of 2 ranks

    monkeypatch.setattr(bench_ops, "make_op", fake_make_op)
    send = torch.arange(4, dtype=torch.float32)
    recv = torch.full((8,), float("nan"))
    staged = bench_ops.make_staged_op(
        "all_gather", bench_ops.Buffers(send, recv), None, "sum", 0, 0, 2
    )  # type: ignore[arg-type]
    (host,) = seen
    assert host.send is not send and host.recv is not recv
    assert host.recv is not None and bool(host.recv.isnan().all())  # the poison, copied once
    staged()
    assert recv.tolist() == [0, 1, 2, 3, 100, 101, 102, 103]
    send += 10  # each call copies the input to the host again
    staged()
    assert recv.tolist() == [10, 11, 12, 13, 110, 111, 112, 113]
    # in place (all_reduce): one host tensor is both input and output
    seen.clear()
    t = torch.ones(4)
    bench_ops.make_staged_op("all_reduce", bench_ops.Buffers(t, t), None, "sum", 0, 0, 2)  # type: ignore[arg-type]
    assert seen[0].send is seen[0].recv and seen[0].send is not t


def test_prepare_stages_gloo_where_it_must(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def maker(kind: str) -> Any:
        return lambda *args: made.append(kind) or (lambda: None)

    monkeypatch.setattr(bench_timing, "make_op", maker("direct"))
    monkeypatch.setattr(bench_timing, "make_staged_op", maker("staged"))
    opts = options("--device", "cuda", "-c", "0", "-w", "0")
    ctx = types.SimpleNamespace(
        opts=opts,
        skipped={},
        rank=0,
        world=2,
        device=torch.device("cpu"),
        groups={"ucx": None, "gloo": None},
        sync=lambda: None,
        all_ok=lambda ok: ok,
        udp_columns=frozenset(),
    )
    for coll, backend, staged in (
        ("all_gather", "gloo", True),
        ("all_reduce", "gloo", False),
        ("all_gather", "ucx", False),
    ):
        layout = bench_sizes.layouts_for(coll, [64], 4, 2)[0]
        data = bench_cases.make_case_data(coll, layout, torch.float32, "sum", 0, 2, 0)
        timed = bench_timing.prepare(ctx, backend, layout, data)  # type: ignore[arg-type]
        assert isinstance(timed, bench_timing.Timed) and timed.host_staged is staged
        assert made[-1] == ("staged" if staged else "direct")


def _cuda_rows() -> tuple[list[bench_report.Row], tuple[str, ...], dict[str, str]]:
    opts = options("all_gather", "--device", "cuda")
    cols = opts.columns(False)
    labels = {c: bench_ops.column_label(c, "all_gather", "cuda") for c in cols}
    skipped = bench_timing.Measurement(False, "skipped: ranks 0 and 1 share cuda:0 on h")
    rows = []
    for nbytes, ucx_us, gloo_us, copy_us in (
        (MiB, 100.0, 1000.0, 10.0),
        (2 * MiB, 50.0, 500.0, 5.0),
    ):
        row = bench_report.row_for(bench_sizes.Layout("all_gather", nbytes, nbytes // 8), opts)
        row.results.update(ucx=_m(ucx_us), gloo=_m(gloo_us), nccl=skipped)
        row.results["gloo"].host_staged = True
        row.limit = _m(copy_us)
        rows.append(row)
    return rows, cols, labels


def test_cuda_table_labels_skip_and_limit() -> None:
    rows, cols, labels = _cuda_rows()
    header = bench_report.format_header("all_gather", cols, True, "mean", labels, limit=True)
    lines = [bench_report.format_row(r, cols, True, "mean", 2, labels, limit=True) for r in rows]
    footer = bench_report.format_footer(rows, cols, True, "mean", 2, labels)
    assert all(len(header[2]) == len(line) for line in lines)  # header and rows line up
    assert len(header[1]) <= len(header[2])
    table = parse_tables("\n".join([*header, *lines, *footer]))["all_gather"]
    assert table["columns"] == ["ucx", "gloo(host-staged)", "nccl", "d2d-copy"]
    assert table["ratios"] == ["ucx/gloo(host-staged)", "ucx/nccl"]
    first = table["rows"][0]
    # all_gather of 1 MiB over 2 ranks in 100 us: algbw 10.49, busbw x (n-1)/n = 5.24
    assert cell(table, first, "ucx", "busbw") == "5.24"
    assert cell(table, first, "gloo(host-staged)", "time") == "1000.00"
    assert [cell(table, first, "nccl", w) for w in ("time", "busbw", "wrong")] == ["n/a"] * 3
    assert first[-4:] == ["10.00", "n/a", "10.00", "104.86"]  # ratios, then the d2d copy
    text = "\n".join(footer)
    assert "# Avg bus bandwidth    : ucx 13.11  gloo(host-staged) 1.311  nccl n/a" in text
    assert "# Avg d2d copy bw      : 262.1 GB/s (torch copy_" in text
    assert "# busbw / d2d copy bw  : ucx 0.05  gloo(host-staged) 0.005  nccl n/a" in text
    assert "# n/a nccl: skipped: ranks 0 and 1 share cuda:0 on h" in text
    # without a limit column (cpu, barrier) nothing of it shows
    plain = bench_report.format_row(rows[0], cols, True, "mean", 2, labels)
    assert plain.split()[-2:] == ["10.00", "n/a"]
    rows[1].results["gloo"] = bench_timing.Measurement(False, "ValueError: x")
    text = "\n".join(bench_report.format_footer(rows, cols, True, "mean", 2, labels))
    assert "# n/a gloo(host-staged): ValueError: x" in text
    rows[0].limit = rows[1].limit = None
    assert not any(
        "d2d" in line for line in bench_report.format_footer(rows, cols, True, "mean", 2)
    )


def test_cuda_json_limits_and_staging() -> None:
    rows, cols, _ = _cuda_rows()
    report = bench_report.build_report(
        opts=options("all_gather", "--device", "cuda"),
        world=2,
        rows_by_collective={"all_gather": rows},
        columns=cols,
        versions={},
        command=[],
        mpi={},
    )
    assert report["device"] == "cuda"
    staged = {r["backend"]: r["host_staged"] for r in report["results"] if r["bytes"] == MiB}
    assert staged == {"ucx": False, "gloo": True, "nccl": False}
    lim = report["limits"][0]
    assert (lim["collective"], lim["kind"], lim["bytes"]) == ("all_gather", "d2d_copy", MiB)
    assert lim["time_us"]["mean"] == 10.0 and lim["bandwidth"] == pytest.approx(MiB / 10e-6 / 1e9)
    assert len(report["limits"]) == 2


def test_header_names_a_skipped_column() -> None:
    versions = {"ucxbackend": "0", "torch": "t", "ucx": "u", "python": "p"}
    lines = bench_report.header_lines(
        options("--device", "cuda"),
        2,
        versions,
        [],
        bench_mpi.MpiOutcome("not requested"),
        {"nccl": "ranks 0 and 1 share cuda:0 on h, and NCCL cannot run two ranks on one GPU"},
    )
    assert "# nccl column skipped: ranks 0 and 1 share cuda:0 on h, and NCCL cannot" in "\n".join(
        lines
    )


def test_sweep_on_cuda_labels_and_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's wiring: per-collective labels, one d2d copy per size (not for barrier)."""
    copies: list[int] = []

    def prepare(ctx: Any, backend: str, layout: Any, data: Any) -> Any:
        if backend in ctx.skipped:
            return bench_timing.Measurement(False, f"skipped: {ctx.skipped[backend]}")
        return bench_timing.Timed(backend, None, lambda: None, 0, udp=False)

    def finish(ctx: Any, timed: bench_timing.Timed) -> bench_timing.Measurement:
        return _m(100.0)

    def measure_d2d_copy(ctx: Any, nbytes: int) -> bench_timing.Measurement:
        copies.append(nbytes)
        return _m(10.0)

    monkeypatch.setattr(bench_runner, "prepare", prepare)
    monkeypatch.setattr(bench_runner, "time_round", lambda *args, **kwargs: None)
    monkeypatch.setattr(bench_runner, "finish", finish)
    monkeypatch.setattr(bench_runner, "measure_d2d_copy", measure_d2d_copy)
    opts = options("all_reduce,all_gather,barrier", "--device", "cuda", "-b", "1M", "-e", "2M")
    out = io.StringIO()
    ctx = types.SimpleNamespace(
        opts=opts, rank=0, world=2, device=torch.device("cpu"), skipped={"nccl": "shared"}
    )
    sweep = bench_runner._Sweep(ctx, out, io.StringIO(), False, None)  # type: ignore[arg-type]
    sweep.run()
    tables = parse_tables(out.getvalue())
    assert tables["all_reduce"]["columns"] == ["ucx", "gloo", "nccl", "d2d-copy"]
    assert tables["all_gather"]["columns"] == ["ucx", "gloo(host-staged)", "nccl", "d2d-copy"]
    assert tables["barrier"]["columns"] == ["ucx", "gloo", "nccl"]
    assert copies == [MiB, 2 * MiB, MiB, 2 * MiB]  # the message sizes, no barrier
    assert tables["all_reduce"]["rows"][0][-1] == "104.86"
    assert "# n/a nccl: skipped: shared" in tables["all_reduce"]["footer"]
    cpu = dataclasses.replace(opts, device="cpu", backends=("ucx", "gloo"))
    cpu_ctx = types.SimpleNamespace(**{**vars(ctx), "opts": cpu})
    sweep = bench_runner._Sweep(cpu_ctx, out, io.StringIO(), False, None)  # type: ignore[arg-type]
    copies.clear()
    sweep.collective("all_gather")
    assert copies == []
