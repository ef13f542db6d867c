"""``--trace DIR``: time series of the udp columns as JSON lines, and PNG plots of them.

After each timed round of a udp column every rank appends to ``DIR/trace-rank<R>.jsonl``:
one ``"kind": "op"`` line per op of the round (what that op changed, summed over peers: the
``ops`` records of ``ucxbackend.stats``), then one ``"kind": "peer"`` line per peer with its
connection's counters so far (RTT, retransmissions, losses, ECN echoes, NACKed trims) and,
with several paths, one ``"kind": "path"`` line per peer and path (packets sent, lost,
retransmitted, RTT, adaptive weight). Within each op the transport samples its state
(``ucxbackend.trace_samples``; the bench turns recording on with ``trace_samples`` in every
udp column's ``udp_config`` unless the column sets it): ``"kind": "conn"`` lines per peer and
path (window, in flight, RTT, retransmissions, losses, marks, trims) and ``"kind": "queue"``
lines per path (the emulated bottleneck's queue), each with the transport's ``t_us`` and the
``seq`` of its op. Every line carries the column, collective, size, rank and the wall time
``t_s``. Nothing is sampled or written without ``--trace``.

:func:`write_trace_plots` draws them on rank 0 at the end (matplotlib, optional: without it
the plots are skipped with a message and the JSON lines stay).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

logger = logging.getLogger(__name__)

# The connection counters a "peer" line carries (ucxbackend.stats peer keys).
PEER_FIELDS: Final = (
    "rtt_smoothed_us",
    "rtt_min_us",
    "retransmitted_packets",
    "declared_lost",
    "spurious_retransmissions",
    "rto_expiries",
    "ce_echoed",
    "packets_nacked",
    "data_packets_sent",
)
# The per-path counters a "path" line carries, without their "path<i>_" prefix.
PATH_FIELDS: Final = ("sent", "retransmitted", "acked", "lost", "rtt_us", "weight_permille")
# What an "op" line carries of the op's own change.
OP_FIELDS: Final = ("retransmitted_packets", "declared_lost", "rto_expiries", "packets_nacked")
_PATH_KEY: Final = re.compile(r"path([0-9]+)_sent")
# The sample kinds of ucxbackend.trace_samples, as the JSON lines name them too.
SAMPLE_KINDS: Final = ("conn", "queue")
# Samples of each kind a rank keeps between two reads (after every timed round) when a udp
# column does not set trace_samples itself: 64Ki x ~100 bytes per kind and rank.
BENCH_TRACE_SAMPLES: Final = 65536


def traced_pg_options(pg_options: Mapping[str, str]) -> dict[str, str]:
    """A udp column's ``pg_options`` with recording on (``trace_samples``) unless it is set."""
    config = pg_options.get("udp_config", "")
    if re.search(r"(^|,)\s*trace_samples\s*=", config):
        return dict(pg_options)
    extra = f"trace_samples={BENCH_TRACE_SAMPLES}"
    return {**pg_options, "udp_config": f"{config},{extra}" if config else extra}


def trace_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"trace-rank{rank}.jsonl")


def trace_records(
    stats: Mapping[str, Any], *, column: str, collective: str, nbytes: int, rank: int,
    since_seq: int, t_s: float,
) -> list[dict[str, Any]]:
    """The lines for one sample of ``stats`` (``ucxbackend.stats(group)``): ops after
    ``since_seq``, then each peer and each of its paths."""
    base = {"t_s": t_s, "column": column, "collective": collective, "bytes": nbytes, "rank": rank}
    out: list[dict[str, Any]] = []
    for op in stats.get("ops", []):
        if int(op["seq"]) > since_seq:
            counters = op["counters"]
            out.append({**base, "kind": "op", "op": op["op"], "seq": int(op["seq"]),
                        **{f: int(counters.get(f, 0)) for f in OP_FIELDS}})
    for peer, counters in sorted(stats.get("peers", {}).items(), key=lambda kv: int(kv[0])):
        if int(peer) == rank:
            continue  # the loopback connection to itself
        out.append({**base, "kind": "peer", "peer": int(peer),
                    **{f: int(counters.get(f, 0)) for f in PEER_FIELDS}})
        paths = sorted(int(m.group(1)) for k in counters if (m := _PATH_KEY.fullmatch(k)))
        for p in paths:
            out.append({**base, "kind": "path", "peer": int(peer), "path": p,
                        **{f: int(counters.get(f"path{p}_{f}", 0)) for f in PATH_FIELDS}})
    return out


def sample_records(
    samples: Iterable[Mapping[str, Any]], *, column: str, collective: str, nbytes: int,
    rank: int, t_s: float,
) -> list[dict[str, Any]]:
    """The lines for the time-series samples ``ucxbackend.trace_samples`` returned."""
    base = {"t_s": t_s, "column": column, "collective": collective, "bytes": nbytes, "rank": rank}
    return [{**base, **s} for s in samples if s["kind"] in SAMPLE_KINDS]


class TraceWriter:
    """Appends one rank's samples to its JSON-lines file."""

    def __init__(self, directory: str, rank: int) -> None:
        self.path = trace_path(directory, rank)
        self.rank = rank
        self._last_seq = -1

    def sample(self, group: Any, *, column: str, collective: str, nbytes: int) -> None:
        import ucxbackend

        stats = ucxbackend.stats(group)
        now = time.time()
        records = trace_records(stats, column=column, collective=collective, nbytes=nbytes,
                                rank=self.rank, since_seq=self._last_seq, t_s=now)
        records += sample_records(ucxbackend.trace_samples(group), column=column,
                                  collective=collective, nbytes=nbytes, rank=self.rank, t_s=now)
        if stats.get("ops"):
            self._last_seq = int(stats["ops"][-1]["seq"])
        with open(self.path, "a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")


def read_traces(directory: str) -> list[dict[str, Any]]:
    """Every line of every ``trace-rank*.jsonl`` in ``directory``."""
    records: list[dict[str, Any]] = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("trace-rank") and name.endswith(".jsonl"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                records += [json.loads(line) for line in f if line.strip()]
    return records


def _series(records: Iterable[Mapping[str, Any]], kind: str, key: tuple[str, ...],
            field: str) -> dict[tuple[Any, ...], tuple[list[float], list[float]]]:
    series: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}
    for r in records:
        if r["kind"] == kind:
            xs, ys = series.setdefault(tuple(r[k] for k in key), ([], []))
            xs.append(float(r["t_s"]))
            ys.append(float(r[field]))
    return series


def _file_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@%+-]", "_", text)


def write_trace_plots(directory: str) -> list[str]:
    """One PNG per column in ``directory`` (per-path RTT and packets sent, the peers' RTT and
    retransmissions, over the rounds) and, where the transport sampled within ops, one per
    column, collective and size for its last traced op (window, RTT, in flight and bottleneck
    queue against time within the op). Returns the files written; without matplotlib, none
    (logged)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        logger.warning("bench --trace: plots skipped, matplotlib is not installed (%s); the JSON "
                    "lines are in %s (pip install matplotlib to draw them)", exc, directory)
        return []
    records = read_traces(directory)
    written: list[str] = []
    totals = [r for r in records if r["kind"] not in SAMPLE_KINDS]
    for column in sorted({r["column"] for r in totals}):
        mine = [r for r in totals if r["column"] == column]
        t0 = min(float(r["t_s"]) for r in mine)
        panels = [
            ("path", ("rank", "peer", "path"), "rtt_us", "path RTT (us)"),
            ("path", ("rank", "peer", "path"), "sent", "packets sent per path"),
            ("peer", ("rank", "peer"), "rtt_smoothed_us", "smoothed RTT (us)"),
            ("peer", ("rank", "peer"), "retransmitted_packets", "retransmitted packets"),
        ]
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
        for ax, (kind, key, field, title) in zip(axes.flat, panels, strict=True):
            for label, (xs, ys) in sorted(_series(mine, kind, key, field).items()):
                ax.plot([x - t0 for x in xs], ys, marker=".",
                        label=" ".join(f"{k} {v}" for k, v in zip(key, label, strict=True)))
            ax.set_title(f"{column}: {title}")
            ax.set_xlabel("time (s)")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
        fig.tight_layout()
        path = os.path.join(directory, f"trace-{_file_part(column)}.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    written += _write_op_plots(directory, [r for r in records if r["kind"] in SAMPLE_KINDS], plt)
    return written


# The panels of an op's plot: (kind, field, title); the RTT panel draws the latest sample
# dotted over the smoothed one.
_OP_PANELS: Final = (
    ("conn", "cwnd_packets", "congestion window (packets; 0: none)"),
    ("conn", "rtt_smoothed_us", "RTT (us): smoothed, latest dotted"),
    ("conn", "path_inflight_packets", "packets in flight on the path"),
    ("queue", "queue_packets", "bottleneck queue (packets; dashed: its limit)"),
)


def last_traced_ops(
    samples: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, str, int], list[Mapping[str, Any]]]:
    """The samples of the last traced op (highest ``seq`` with connection samples) of each
    (column, collective, bytes)."""
    by_key: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for s in samples:
        by_key.setdefault((s["column"], s["collective"], int(s["bytes"])), []).append(s)
    out: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for key, mine in by_key.items():
        seqs = [int(s["seq"]) for s in mine if s["kind"] == "conn"]
        if seqs:
            out[key] = [s for s in mine if int(s["seq"]) == max(seqs)]
    return out


def _write_op_plots(directory: str, samples: list[dict[str, Any]], plt: Any) -> list[str]:
    written: list[str] = []
    for (column, collective, nbytes), mine in sorted(last_traced_ops(samples).items()):
        t0 = min(int(s["t_us"]) for s in mine)
        seq = int(mine[0]["seq"])
        fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
        for ax, (kind, field, title) in zip(axes.flat, _OP_PANELS, strict=True):
            key = ("rank", "peer", "path") if kind == "conn" else ("rank", "path")
            lines: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
            for s in mine:
                if s["kind"] == kind:
                    lines.setdefault(tuple(s[k] for k in key), []).append(s)
            for label, points in sorted(lines.items()):
                xs = [(int(p["t_us"]) - t0) / 1000 for p in points]
                name = " ".join(f"{k} {v}" for k, v in zip(key, label, strict=True))
                drawn = ax.plot(xs, [p[field] for p in points], drawstyle="steps-post",
                                label=name)
                if field == "rtt_smoothed_us":
                    ax.plot(xs, [p["rtt_latest_us"] for p in points], linestyle=":",
                            color=drawn[0].get_color() if drawn else None)
            if kind == "queue":
                for limit in sorted({s["queue_limit"] for s in mine if s["kind"] == "queue"}):
                    ax.axhline(limit, linestyle="--", color="grey", linewidth=0.8)
            ax.set_title(title)
            ax.set_xlabel("time within the op (ms)")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
        fig.suptitle(f"{column}: {collective} of {nbytes} B, op {seq}")
        fig.tight_layout()
        name = f"trace-{_file_part(column)}-{_file_part(collective)}-{nbytes}B-op{seq}.png"
        path = os.path.join(directory, name)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
