"""``bench --trace DIR`` (ucxbackend/bench/trace.py): the JSON lines it writes per op, peer and
path and the time series within ops (connection and bottleneck-queue samples), checked against
hand-made statistics and samples and against a real 2-rank run with two paths behind an
emulated bottleneck; the plots drawn with a stand-in for matplotlib, with matplotlib itself
where it is installed, and skipped with a message without it."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from bench_harness import needs_native, run_bench

from ucxbackend.bench import trace as bench_trace


def _stats() -> dict[str, Any]:
    peer = {"rtt_smoothed_us": 90, "retransmitted_packets": 3, "declared_lost": 4,
            "path0_sent": 10, "path0_lost": 0, "path0_rtt_us": 80,
            "path1_sent": 5, "path1_lost": 4, "path1_rtt_us": 120, "path1_weight_permille": 62}
    return {
        "peers": {0: {"rtt_smoothed_us": 5}, 1: peer},
        "ops": [
            {"op": "allreduce", "seq": 6, "counters": {"retransmitted_packets": 9}},
            {"op": "allreduce", "seq": 7, "counters": {"retransmitted_packets": 3}},
        ],
    }


def test_trace_records_per_op_peer_and_path() -> None:
    lines = bench_trace.trace_records(_stats(), column="ad", collective="all_reduce",
                                      nbytes=1024, rank=0, since_seq=6, t_s=2.5)
    assert [r["kind"] for r in lines] == ["op", "peer", "path", "path"]  # not rank 0's own
    op, peer, p0, p1 = lines
    assert (op["seq"], op["retransmitted_packets"], op["declared_lost"]) == (7, 3, 0)
    assert (peer["peer"], peer["rtt_smoothed_us"], peer["declared_lost"]) == (1, 90, 4)
    assert (p0["path"], p0["sent"], p0["rtt_us"], p0["weight_permille"]) == (0, 10, 80, 0)
    assert (p1["path"], p1["sent"], p1["lost"], p1["weight_permille"]) == (1, 5, 4, 62)
    for r in lines:
        assert (r["column"], r["bytes"], r["rank"], r["t_s"]) == ("ad", 1024, 0, 2.5)


def test_trace_plots_skipped_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    with caplog.at_level(logging.WARNING):
        assert bench_trace.write_trace_plots(str(tmp_path)) == []
    assert "plots skipped, matplotlib is not installed" in caplog.text


class _Axes:
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def plot(self, xs: list[float], ys: list[float], **kw: Any) -> None:
        self.calls.append(("plot", (list(xs), list(ys), kw.get("label"))))

    def get_legend_handles_labels(self) -> tuple[list[Any], list[Any]]:
        return ([1], [1])

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _stand_in_matplotlib(
    monkeypatch: pytest.MonkeyPatch, axes: list[_Axes], saved: list[str]
) -> None:
    class _Figure:
        def tight_layout(self) -> None: ...

        def suptitle(self, text: str) -> None: ...

        def savefig(self, path: str) -> None:
            saved.append(path)

    class _Grid:
        flat = axes

    pyplot = types.SimpleNamespace(subplots=lambda *a, **k: (_Figure(), _Grid()),
                                   close=lambda fig: None)
    mpl = types.SimpleNamespace(use=lambda backend: None, pyplot=pyplot)
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)


def test_trace_plots_with_a_matplotlib_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for t, stats in ((10.0, _stats()), (11.0, _stats())):
        lines = bench_trace.trace_records(stats, column="ad", collective="all_reduce",
                                          nbytes=1024, rank=0, since_seq=7, t_s=t)
        with open(bench_trace.trace_path(str(tmp_path), 0), "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)
    axes = [_Axes([]) for _ in range(4)]  # path RTT, path sent, peer RTT, retransmissions
    saved: list[str] = []
    _stand_in_matplotlib(monkeypatch, axes, saved)
    assert bench_trace.write_trace_plots(str(tmp_path)) == [str(tmp_path / "trace-ad.png")]
    assert saved == [str(tmp_path / "trace-ad.png")]
    def series(panel: int) -> dict[str, tuple[list[float], list[float]]]:
        return {label: (xs, ys) for _, (xs, ys, label) in axes[panel].calls}

    # each path's RTT and packets sent over the two samples, times from the first one
    assert series(0) == {"rank 0 peer 1 path 0": ([0.0, 1.0], [80.0, 80.0]),
                         "rank 0 peer 1 path 1": ([0.0, 1.0], [120.0, 120.0])}
    assert series(1)["rank 0 peer 1 path 1"] == ([0.0, 1.0], [5.0, 5.0])
    assert series(3) == {"rank 0 peer 1": ([0.0, 1.0], [3.0, 3.0])}


def _samples() -> list[dict[str, Any]]:
    """What ucxbackend.trace_samples returns: two ops' connection samples on two paths and
    the queue of one path (op 7's window is cut at 300 us)."""
    out: list[dict[str, Any]] = []
    for seq, t0 in ((6, 1000), (7, 5000)):
        for i, cwnd in enumerate((32, 64, 32)):
            for path in (0, 1):
                out.append({"kind": "conn", "op": "allreduce", "seq": seq, "overwritten": 0,
                            "t_us": t0 + 150 * i, "peer": 1, "path": path,
                            "cwnd_packets": cwnd, "inflight_packets": cwnd - 1,
                            "inflight_bytes": 1000 * cwnd,
                            "path_inflight_packets": (cwnd - 1) // 2,
                            "path_inflight_bytes": 500 * cwnd, "rtt_smoothed_us": 80 + i,
                            "rtt_latest_us": 90 + i, "retransmitted": i, "lost": i,
                            "marks_echoed": 0, "trims_nacked": 0, "rto_expiries": 0})
        out.append({"kind": "queue", "op": "allreduce", "seq": seq, "overwritten": 0,
                    "t_us": t0 + 100, "peer": 1, "path": 0, "queue_packets": 64,
                    "queue_limit": 64, "queue_dropped": 3, "marked": 0, "trimmed": 0})
    return out


def test_traced_pg_options_turns_recording_on_unless_set() -> None:
    traced = bench_trace.traced_pg_options({"udp_config": "paths=2", "udp_faults": "drop=0.1"})
    assert traced == {"udp_config": f"paths=2,trace_samples={bench_trace.BENCH_TRACE_SAMPLES}",
                      "udp_faults": "drop=0.1"}
    assert bench_trace.traced_pg_options({"udp_config": ""})["udp_config"] == (
        f"trace_samples={bench_trace.BENCH_TRACE_SAMPLES}")
    own = {"udp_config": "trace_samples=10,trace_interval_us=0"}
    assert bench_trace.traced_pg_options(own) == own


def test_sample_records_and_the_last_traced_op() -> None:
    lines = bench_trace.sample_records([*_samples(), {"kind": "other"}], column="ad",
                                       collective="all_reduce", nbytes=1024, rank=0, t_s=2.5)
    assert [r["kind"] for r in lines] == ["conn"] * 6 + ["queue"] + ["conn"] * 6 + ["queue"]
    assert all((r["column"], r["bytes"], r["rank"], r["t_s"]) == ("ad", 1024, 0, 2.5)
               for r in lines)
    assert lines[3]["cwnd_packets"] == 64 and lines[3]["path"] == 1
    last = bench_trace.last_traced_ops(lines)
    assert list(last) == [("ad", "all_reduce", 1024)]
    assert {r["seq"] for r in last[("ad", "all_reduce", 1024)]} == {7}
    assert len(last[("ad", "all_reduce", 1024)]) == 7


def _write_samples(directory: Path) -> None:
    lines = bench_trace.sample_records(_samples(), column="ad", collective="all_reduce",
                                       nbytes=1024, rank=0, t_s=1.0)
    with open(bench_trace.trace_path(str(directory), 0), "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)


def test_op_plots_with_a_matplotlib_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_samples(tmp_path)
    axes = [_Axes([]) for _ in range(4)]  # cwnd, RTT, in flight, queue
    saved: list[str] = []
    _stand_in_matplotlib(monkeypatch, axes, saved)
    want = str(tmp_path / "trace-ad-all_reduce-1024B-op7.png")
    assert bench_trace.write_trace_plots(str(tmp_path)) == [want]
    assert saved == [want]
    cwnd = {label: (xs, ys) for _, (xs, ys, label) in axes[0].calls}
    # op 7 only, in ms from its first sample, one line per rank, peer and path
    assert cwnd == {"rank 0 peer 1 path 0": ([0.0, 0.15, 0.3], [32, 64, 32]),
                    "rank 0 peer 1 path 1": ([0.0, 0.15, 0.3], [32, 64, 32])}
    rtt = [ys for _, (xs, ys, label) in axes[1].calls]
    assert rtt[:2] == [[80, 81, 82], [90, 91, 92]]  # smoothed, then the latest samples
    assert [(xs, ys, label) for _, (xs, ys, label) in axes[3].calls] == [
        ([0.1], [64], "rank 0 path 0")]


def test_op_plots_with_matplotlib(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    _write_samples(tmp_path)
    written = bench_trace.write_trace_plots(str(tmp_path))
    assert written == [str(tmp_path / "trace-ad-all_reduce-1024B-op7.png")]
    assert Path(written[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_native
def test_bench_trace_writes_json_lines(tmp_path: Path) -> None:
    proc = run_bench(
        "all_reduce", "-b", "64K", "-e", "64K", "-n", "4", "-w", "1",
        "--udp-variant", "ad:paths=2,path_policy=adaptive,mtu_payload=1472,congestion=aimd,"
        "rate_mbps=4000,queue=100",
        "--trace", str(tmp_path), "--timeout", "60", timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    records = bench_trace.read_traces(str(tmp_path))
    for rank in (0, 1):
        mine = [r for r in records if r["rank"] == rank]
        assert {r["kind"] for r in mine} == {"op", "peer", "path", "conn", "queue"}, mine
        timed = {r["seq"] for r in mine if r["kind"] == "op"}
        conn = [r for r in mine if r["kind"] == "conn"]
        # every timed op was sampled, on both paths, towards the other rank only
        assert timed <= {r["seq"] for r in conn}, (timed, conn)
        assert {(r["peer"], r["path"]) for r in conn} == {(1 - rank, 0), (1 - rank, 1)}
        assert all(r["cwnd_packets"] > 0 and r["overwritten"] == 0 for r in conn)
        assert any(r["inflight_bytes"] > 0 for r in conn)
        # each path's own share of it (the two paths' samples are taken together)
        assert all(r["path_inflight_bytes"] <= r["inflight_bytes"] for r in conn)
        assert {r["path"] for r in conn if r["path_inflight_bytes"] > 0} == {0, 1}
        assert any(r["rtt_smoothed_us"] > 0 for r in conn)
        for seq in timed:
            times = [r["t_us"] for r in conn if r["seq"] == seq and r["path"] == 0]
            assert times == sorted(times)
        queue = [r for r in mine if r["kind"] == "queue"]
        assert all(r["queue_limit"] == 100 and r["queue_packets"] <= 100 for r in queue), queue
        assert any(r["queue_packets"] > 0 for r in queue)
        paths = [r for r in mine if r["kind"] == "path"]
        assert sorted({r["path"] for r in paths}) == [0, 1]
        assert all(r["peer"] == 1 - rank and r["sent"] > 0 for r in paths), paths
        ops = [r for r in mine if r["kind"] == "op"]
        assert sum(r["op"] == "allreduce" for r in ops) >= 4  # the timed iterations at least
        assert all(r["column"] == "ad" and r["bytes"] == 65536 for r in mine)


@needs_native
def test_bench_trace_records_credit_state(tmp_path: Path) -> None:
    """congestion=credit's state in the conn lines (the window is 0 there): the sender's grant
    past its unsolicited window, its demand, the receiver's view of both, CREDIT packets."""
    proc = run_bench(
        "all_reduce", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1",
        "--udp-variant", "cr:congestion=credit,mtu_payload=8972,rate_mbps=4000,queue=100",
        "--trace", str(tmp_path), "--timeout", "60", timeout=90,
    )
    assert proc.returncode == 0, proc.stderr
    records = bench_trace.read_traces(str(tmp_path))
    window = 32 << 10  # cc_credit_initial_bytes
    for rank in (0, 1):
        conn = [r for r in records if r["rank"] == rank and r["kind"] == "conn"]
        assert conn, records
        assert all(r["cwnd_packets"] == 0 for r in conn)
        assert all(r["credit_granted"] >= window for r in conn), conn
        assert all(r["credit_available"] <= r["credit_granted"] for r in conn)
        assert max(r["credit_granted"] for r in conn) > window
        assert max(r["credit_wanted"] for r in conn) >= 1 << 20
        assert max(r["grant_to_peer"] for r in conn) > window
        assert max(r["peer_wanted"] for r in conn) >= 1 << 20
        assert max(r["credit_packets_sent"] for r in conn) > 0
        assert max(r["credit_packets_received"] for r in conn) > 0
        assert all(r["credit_timeouts"] >= 0 for r in conn)
