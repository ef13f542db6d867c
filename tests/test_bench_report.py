"""``ucxbackend.bench.report``, ``.progress`` and ``.plot``: the table (header, rows, footer,
udp transport statistics, wait statistics), the ``--json`` document, the progress line, the plot.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from bench_harness import cell, options, parse_tables

from ucxbackend.bench import plot as bench_plot
from ucxbackend.bench import progress as bench_progress
from ucxbackend.bench import report as bench_report
from ucxbackend.bench import sizes as bench_sizes
from ucxbackend.bench import timing as bench_timing
from ucxbackend.bench import udp as bench_udp
from ucxbackend.bench import waits as bench_waits


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
        "waits",
        "host_staged",
        "round_spans",
    }
    assert rec["round_spans"] is None  # measured columns only: when each round ran
    assert rec["transport"] is None  # udp columns only
    assert rec["waits"] is None  # ucx and udp columns only
    assert rec["host_staged"] is False and doc["limits"] == []  # --device cuda only
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
        "qdrops/op",
        "marks/op",
        "trims/op",
        "spur/op",
        "data/op",
        "qcuts/op",
        "atbdp/op",
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
        "0.00",
        "0.00",
        "0.00",
        "0.00",
        "0.0",
        "0.00",
        "0.00",
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


def test_wait_block() -> None:
    opts = options("--backends", "ucx,gloo")
    row = bench_report.row_for(bench_sizes.Layout("all_reduce", 8, 2), opts)
    ucx = _m(6.0)
    per_op = dict.fromkeys(bench_waits.WAIT_COUNTERS, 0.0)
    per_op.update(inline=1.9, handed_over=0.1, core_moves=0.004, yields=26.25, sleeps=0.15,
                  transport_wait_us=812.5, device_wait_us=41.0)
    ucx.waits = {"iters": 1000, "per_op": per_op}
    row.results.update({"ucx": ucx, "gloo": _m(80.0)})
    block = bench_report.format_wait_block("all_reduce", [row], ("ucx", "gloo"))
    assert all(line.startswith("#") for line in block)  # data lines stay the main table's
    assert block[0].startswith("# wait statistics (all_reduce): per op")
    assert block[1].split()[1:] == [
        "size", "column", "inline", "handed", "moves", "yields", "sleeps", "tw_us", "dw_us",
        "vcsw", "icsw",
    ]
    assert block[2].split()[1:] == [
        "8", "ucx", "1.900", "0.100", "0.004", "26.250", "0.150", "812.500", "41.000", "0.000",
        "0.000",
    ]
    assert len(block) == 4 and block[-1] == "#"  # no gloo line
    assert bench_report.format_wait_block("all_reduce", [row], ("gloo",)) == []
    (rec,) = [r for r in bench_report.row_records([row], "mean", 2) if r["backend"] == "ucx"]
    assert rec["waits"]["per_op"]["handed_over"] == 0.1
