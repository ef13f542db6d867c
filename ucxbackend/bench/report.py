"""The report: nccl-tests' table on stdout and the ``--json`` document.

Call order, per run: :func:`header_lines` (versions, options, ranks); per collective:
:func:`format_header`, then :func:`format_row` as each size is measured (a :class:`Row`
from :func:`row_for`), then :func:`format_footer` (average busbw, ``#wrong``, why cells are
n/a), :func:`format_transport_block` (udp columns) and :func:`format_wait_block` (ucx and
udp columns); at the end :func:`build_report` (the JSON document, ``schema``
``ucxbackend-bench/1``, also what :mod:`.plot` draws).

With ``--device cuda`` a column may be shown under another label (``gloo(host-staged)``:
``labels``, from :func:`.ops.column_label`), and each row ends with the limit column
(``limit``): the device-to-device copy of the message size, its time and bandwidth
(size / time), which the footer compares each column's busbw with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .common import REDUCING, ROOTED
from .mpi import MpiOutcome
from .options import BenchOptions
from .sizes import Layout, bandwidths
from .timing import Measurement


@dataclass
class Row:
    """One size of one collective: a measurement per backend column."""

    layout: Layout
    dtype: str
    op: str  # "none" for collectives that do not reduce
    root: int  # -1 for collectives without a root
    results: dict[str, Measurement] = field(default_factory=dict)
    limit: Measurement | None = None  # --device cuda: the d2d copy of the message size

    @property
    def collective(self) -> str:
        return self.layout.collective


def row_for(layout: Layout, opts: BenchOptions) -> Row:
    collective = layout.collective
    return Row(
        layout,
        opts.datatype,
        opts.op if collective in REDUCING else "none",
        opts.root if collective in ROOTED else -1,
    )


_FIXED = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}"
_BLOCK = "  {:>9}  {:>7}  {:>7}"
_WRONG = "  {:>6}"
_LIMIT = "  {:>9}  {:>8}"
LIMIT_NAME: Final = "d2d-copy"


def _block_width(check: bool) -> int:
    return len(_BLOCK.format("", "", "")) + (len(_WRONG.format("")) if check else 0)


def _labeller(labels: Mapping[str, str] | None) -> Callable[[str], str]:
    return lambda column: column if labels is None else labels.get(column, column)


def ratio_columns(columns: Sequence[str], labels: Mapping[str, str] | None = None) -> list[str]:
    label = _labeller(labels)
    return [f"{label(columns[0])}/{label(other)}" for other in columns[1:]]


def format_header(
    collective: str,
    columns: Sequence[str],
    check: bool,
    stat: str,
    labels: Mapping[str, str] | None = None,
    limit: bool = False,
) -> list[str]:
    """nccl-tests' three header lines, with one block of columns per backend (shown under
    its label), the ratio columns, then with ``limit`` the d2d copy's time and bandwidth."""
    width = _block_width(check)
    fixed = len(_FIXED.format(*[""] * 5))
    label = _labeller(labels)
    names = "#" + " " * (fixed - 1) + "".join(label(c).center(width) for c in columns)
    head = "#" + _FIXED.format("size", "count", "type", "redop", "root")[1:]
    unit = "#" + _FIXED.format("(B)", "(elements)", "", "", "")[1:]
    for _ in columns:
        head += _BLOCK.format("time", "algbw", "busbw") + (_WRONG.format("#wrong") if check else "")
        unit += _BLOCK.format(f"({stat} us)" if stat != "mean" else "(us)", "(GB/s)", "(GB/s)")
        unit += _WRONG.format("") if check else ""
    for ratio in ratio_columns(columns, labels):
        head += _ratio_cell(ratio, ratio)
        unit += _ratio_cell(ratio, "busbw")
    if limit:
        names += " " * (len(head) - len(names)) + LIMIT_NAME.center(len(_LIMIT.format("", "")))
        head += _LIMIT.format("time", "bw")
        unit += _LIMIT.format(f"({stat} us)" if stat != "mean" else "(us)", "(GB/s)")
    return [f"# {collective}", names.rstrip(), head, unit.rstrip()]


def _ratio_cell(name: str, text: str) -> str:
    """A ratio column's cell: 12 wide, wider for a long ``first/other`` name (labels)."""
    return f"  {text:>{max(12, len(name))}}"


def _fmt_time(us: float) -> str:
    return f"{us:.2f}" if us < 1e5 else f"{us:.0f}"


def ratio(first: Measurement, other: Measurement, stat: str) -> float | None:
    """first's busbw over other's, i.e. other's time over first's (same size)."""
    a, b = first.time(stat), other.time(stat)
    if a is None or b is None or a <= 0:
        return None
    return b / a


def limit_bandwidth(row: Row, stat: str) -> float | None:
    """The d2d copy's bandwidth in GB/s: size / time (a copy's algbw, and its busbw)."""
    t = None if row.limit is None else row.limit.time(stat)
    return None if t is None or t <= 0 else row.layout.nbytes / t / 1e3


def format_row(
    row: Row,
    columns: Sequence[str],
    check: bool,
    stat: str,
    world: int,
    labels: Mapping[str, str] | None = None,
    limit: bool = False,
) -> str:
    layout = row.layout
    line = _FIXED.format(layout.nbytes, layout.count, row.dtype, row.op, row.root)
    for name in columns:
        m = row.results.get(name)
        t = None if m is None else m.time(stat)
        if m is None or t is None:
            line += _BLOCK.format("n/a", "n/a", "n/a") + (_WRONG.format("n/a") if check else "")
            continue
        algbw, busbw = bandwidths(layout.collective, layout.nbytes, t / 1e6, world)
        line += _BLOCK.format(_fmt_time(t), f"{algbw:.2f}", f"{busbw:.2f}")
        if check:
            line += _WRONG.format("n/a" if m.wrong is None else m.wrong)
    first = row.results.get(columns[0])
    for name, other_name in zip(ratio_columns(columns, labels), columns[1:], strict=True):
        other = row.results.get(other_name)
        r = None if first is None or other is None else ratio(first, other, stat)
        line += _ratio_cell(name, "n/a" if r is None else f"{r:.2f}")
    if limit:
        t = None if row.limit is None else row.limit.time(stat)
        bw = limit_bandwidth(row, stat)
        line += _LIMIT.format(
            "n/a" if t is None else _fmt_time(t), "n/a" if bw is None else f"{bw:.2f}"
        )
    return line


def _transport(row: Row, column: str) -> dict[str, Any] | None:
    m = row.results.get(column)
    return None if m is None else m.transport


# The transport statistics block: (heading, UDP_COUNTERS key or gauge, format).
_UDP_BLOCK: Final = (
    ("retrans/op", "retransmitted_packets", "{:.2f}"),
    ("lost/op", "declared_lost", "{:.2f}"),
    ("rto/op", "rto_expiries", "{:.2f}"),
    ("drops/op", "faults_dropped", "{:.2f}"),
    ("qdrops/op", "faults_queue_dropped", "{:.2f}"),
    ("marks/op", "faults_marked", "{:.2f}"),
    ("trims/op", "faults_trimmed", "{:.2f}"),
    ("spur/op", "spurious_retransmissions", "{:.2f}"),
    ("data/op", "data_packets_sent", "{:.1f}"),
    ("qcuts/op", "queue_cuts", "{:.2f}"),
    ("atbdp/op", "queue_at_bdp", "{:.2f}"),
    ("srtt(us)", "rtt_smoothed_us", "{:.0f}"),
)


def _stats_block(
    title: str,
    headings: Sequence[str],
    cell_width: int,
    rows: Sequence[Row],
    columns: Sequence[str],
    stats: Callable[[Row, str], dict[str, Any] | None],
    cells: Callable[[dict[str, Any]], list[str]],
) -> list[str]:
    """A block of comment lines after a collective's table: ``title``, the headings, one line
    per size and column that has ``stats`` (``cells`` of them; n/a where a size has none), and
    a closing ``#``. Empty when no column has any."""
    cols = [c for c in columns if any(stats(row, c) for row in rows)]
    if not cols:
        return []
    width = max(8, *(len(c) for c in cols))
    fmt = "#{:>11}  {:<" + str(width) + "}" + "".join(f"  {{:>{cell_width}}}" for _ in headings)
    lines = [title, fmt.format("size", "column", *headings)]
    for row in rows:
        for col in cols:
            st = stats(row, col)
            shown = ["n/a"] * len(headings) if st is None else cells(st)
            lines.append(fmt.format(row.layout.nbytes, col, *shown))
    return [*lines, "#"]


def format_transport_block(
    collective: str, rows: Sequence[Row], columns: Sequence[str]
) -> list[str]:
    """The ``# udp transport statistics`` block: one line per size and udp column, every
    line a comment (the data lines of the file stay those of the main table). Empty when no
    column has statistics."""
    title = (
        f"# udp transport statistics ({collective}): per op over the timed iterations, summed "
        "over ranks (drops: injected; qdrops, marks, trims: at the emulated bottleneck; spur: "
        "spurious retransmissions; data: data packets, resends included; qcuts, atbdp: adaptive's "
        "path windows cut for a queue, queues met at a path's bandwidth-delay product); srtt: "
        "max over ranks"
    )

    def cells(st: dict[str, Any]) -> list[str]:
        return [
            f.format(st["per_op"][key] if key in st["per_op"] else st[key])
            for _, key, f in _UDP_BLOCK
        ]

    headings = [h for h, _, _ in _UDP_BLOCK]
    return _stats_block(title, headings, 10, rows, columns, _transport, cells)


# The wait statistics block: (heading, waits.WAIT_COUNTERS key).
_WAIT_BLOCK: Final = (
    ("inline", "inline"),
    ("handed", "handed_over"),
    ("moves", "core_moves"),
    ("yields", "yields"),
    ("sleeps", "sleeps"),
    ("tw_us", "transport_wait_us"),
    ("dw_us", "device_wait_us"),
    ("vcsw", "voluntary_ctxt_switches"),
    ("icsw", "nonvoluntary_ctxt_switches"),
)


def _waits(row: Row, column: str) -> dict[str, Any] | None:
    m = row.results.get(column)
    return None if m is None else m.waits


def format_wait_block(collective: str, rows: Sequence[Row], columns: Sequence[str]) -> list[str]:
    """The ``# wait statistics`` block: one line per size and ucx or udp column (how their
    ops waited: bench/waits.py), every line a comment. Empty when no column has them."""
    title = (
        f"# wait statistics ({collective}): per op over the timed iterations, summed over "
        "ranks (inline: ran on the caller's thread; handed: handed to the progress thread; "
        "moves: off a core the peer waited on; yields, sleeps: every thread's; tw_us, dw_us: "
        "microseconds every thread waited for the transport and for the device; vcsw, icsw: "
        "the caller's context switches, blocking and preempted)"
    )

    def cells(st: dict[str, Any]) -> list[str]:
        return [f"{st['per_op'][key]:.3f}" for _, key in _WAIT_BLOCK]

    headings = [h for h, _ in _WAIT_BLOCK]
    return _stats_block(title, headings, 8, rows, columns, _waits, cells)


def avg_busbw(rows: Sequence[Row], backend: str, stat: str, world: int) -> float | None:
    """nccl-tests' "Avg bus bandwidth": the mean busbw over the sizes measured."""
    values = []
    for row in rows:
        m = row.results.get(backend)
        t = None if m is None else m.time(stat)
        if t is not None and row.layout.nbytes:
            values.append(bandwidths(row.collective, row.layout.nbytes, t / 1e6, world)[1])
    return sum(values) / len(values) if values else None


def total_wrong(rows: Iterable[Row]) -> int:
    return sum(m.wrong or 0 for row in rows for m in row.results.values())


def limit_fractions(rows: Sequence[Row], backend: str, stat: str, world: int) -> float | None:
    """The mean over sizes of ``backend``'s busbw over the d2d copy's bandwidth."""
    values = []
    for row in rows:
        m, copy_bw = row.results.get(backend), limit_bandwidth(row, stat)
        t = None if m is None else m.time(stat)
        if t is not None and copy_bw and row.layout.nbytes:
            busbw = bandwidths(row.collective, row.layout.nbytes, t / 1e6, world)[1]
            values.append(busbw / copy_bw)
    return sum(values) / len(values) if values else None


def format_limit(
    rows: Sequence[Row],
    columns: Sequence[str],
    stat: str,
    world: int,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """The limit line under ``# Avg bus bandwidth`` (nothing without a limit column): the d2d
    copy's mean bandwidth over the sizes, and each column's busbw as a share of it."""
    copy_bws = [bw for bw in (limit_bandwidth(row, stat) for row in rows) if bw is not None]
    if not copy_bws:
        return []
    label = _labeller(labels)
    parts = []
    for name in columns:
        f = limit_fractions(rows, name, stat, world)
        parts.append(f"{label(name)} {'n/a' if f is None else f'{f:.3g}'}")
    return [
        f"# Avg d2d copy bw      : {sum(copy_bws) / len(copy_bws):.4g} GB/s (torch copy_ of the "
        "size on the rank's GPU, CUDA events, max over ranks)",
        f"# busbw / d2d copy bw  : {'  '.join(parts)}",
    ]


def format_footer(
    rows: Sequence[Row],
    columns: Sequence[str],
    check: bool,
    stat: str,
    world: int,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    label = _labeller(labels)
    parts = []
    for name in columns:
        bw = avg_busbw(rows, name, stat, world)
        parts.append(f"{label(name)} {'n/a' if bw is None else f'{bw:.4g}'}")
    lines = [f"# Avg bus bandwidth    : {'  '.join(parts)}"]
    lines += format_limit(rows, columns, stat, world, labels)
    if check:
        wrong = total_wrong(rows)
        lines.append(f"# #wrong (all columns) : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    reasons: dict[str, str] = {}  # the first reason per backend (they name tensor sizes)
    for row in rows:
        for name, m in row.results.items():
            if not m.supported and m.error:
                reasons.setdefault(name, m.error)
    lines += [f"# n/a {label(name)}: {error}" for name, error in reasons.items()]
    return [*lines, "#"]


def row_records(rows: Sequence[Row], stat: str, world: int) -> list[dict[str, Any]]:
    """The JSON records of ``rows``: one per collective, backend and size."""
    records = []
    for row in rows:
        for backend, m in row.results.items():
            t = m.time(stat)
            algbw, busbw = (
                bandwidths(row.collective, row.layout.nbytes, t / 1e6, world)
                if t is not None
                else (None, None)
            )
            records.append(
                {
                    "collective": row.collective,
                    "backend": backend,
                    "bytes": row.layout.nbytes,
                    "count": row.layout.count,
                    "dtype": row.dtype,
                    "op": row.op,
                    "root": row.root,
                    "supported": m.supported,
                    "error": m.error,
                    "time_us": m.time_us,
                    "algbw": algbw,
                    "busbw": busbw,
                    "wrong": m.wrong,
                    "transport": m.transport,
                    "waits": m.waits,
                    "host_staged": m.host_staged,
                    "round_spans": m.spans,
                }
            )
    return records


def limit_records(rows: Sequence[Row], stat: str) -> list[dict[str, Any]]:
    """The JSON records of the limit column: one per collective and size that has one."""
    return [
        {
            "collective": row.collective,
            "kind": "d2d_copy",
            "bytes": row.layout.nbytes,
            "time_us": row.limit.time_us,
            "bandwidth": limit_bandwidth(row, stat),
        }
        for row in rows
        if row.limit is not None
    ]


def build_report(
    *,
    opts: BenchOptions,
    world: int,
    rows_by_collective: Mapping[str, Sequence[Row]],
    columns: Sequence[str],
    versions: Mapping[str, Any],
    command: Sequence[str],
    mpi: Mapping[str, Any],
    mps: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``--json`` document; ``mps``: :func:`.runner.mps_state` (None off CUDA)."""
    summary = [
        {"collective": coll, "backend": name, "avg_busbw": avg_busbw(rows, name, opts.stat, world)}
        for coll, rows in rows_by_collective.items()
        for name in columns
    ]
    all_rows = [row for rows in rows_by_collective.values() for row in rows]
    wrong = total_wrong(all_rows)
    return {
        "schema": "ucxbackend-bench/1",
        "command": list(command),
        "world_size": world,
        "device": opts.device,
        "mps": None if mps is None else dict(mps),
        "stat": opts.stat,
        "units": {"time_us": "microseconds", "algbw": "GB/s (1e9 B/s)", "busbw": "GB/s (1e9 B/s)"},
        "versions": dict(versions),
        "options": opts.describe(),
        "columns": list(columns),
        "udp_variants": [v.describe() for v in opts.udp_variants],
        "mpi": dict(mpi),
        "results": row_records(all_rows, opts.stat, world),
        "limits": limit_records(all_rows, opts.stat),
        "summary": summary,
        "wrong_total": wrong if opts.check else None,
        "ok": wrong == 0,
    }


def header_lines(
    opts: BenchOptions,
    world: int,
    versions: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    mpi: MpiOutcome,
    skipped: Mapping[str, str] | None = None,
    mps: Mapping[str, Any] | None = None,
) -> list[str]:
    lines = [
        f"# ucxbackend bench {versions['ucxbackend']}: torch {versions['torch']}, "
        f"UCX {versions['ucx']}, Python {versions['python']}",
        f"# nRanks {world} device {opts.device} minBytes {opts.minbytes} maxBytes "
        f"{opts.maxbytes} step: {opts.stepfactor}(factor) warmup iters: {opts.warmup_iters} "
        f"iters: {opts.iters} rounds: {opts.rounds} validation: {int(opts.check)} "
        f"stat: {opts.stat}",
        f"# backends: {', '.join(opts.measured())} (new_group over all ranks, sizes "
        "interleaved; time: per iteration, max over ranks)",
    ]
    lines += [
        f"# udp variant {v.label}: udp_config={v.udp_config!r} udp_faults={v.udp_faults!r}"
        + (f" secret_file={v.secret_file!r}" if v.secret_file else "")
        for v in opts.udp_variants
    ]
    if mpi.status == "ok":
        lines.append(
            f"# mpi: {mpi.library} via mpi4py {mpi.mpi4py} (all_reduce only, {world} ranks "
            "on rank 0's host, timed in the rounds of the torch columns)"
        )
    elif mpi.status != "not requested":
        lines.append(f"# mpi column {mpi.status}: {mpi.reason}")
    lines += [f"# {name} column skipped: {why}" for name, why in (skipped or {}).items()]
    lines += mps_lines(mps)
    lines.append("#")
    lines += [
        f"#  Rank {r['rank']:>2} Pid {r['pid']:>7} on {r['host']} device {r['device']}"
        for r in ranks
    ]
    lines.append("#")
    return lines


def mps_lines(mps: Mapping[str, Any] | None) -> list[str]:
    """``--device cuda``: whether an MPS server was on (docs/cuda.md), and the note when ranks
    share a GPU without one; nothing off CUDA."""
    if mps is None:
        return []
    pipe = mps["control_pipe"]
    if mps["on"] and mps["private"]:
        line = f"# mps: on, a private server that --mps started (control pipe {pipe})"
    elif mps["on"]:
        line = f"# mps: on (an MPS server's control pipe at {pipe})"
    else:
        line = f"# mps: off (no control pipe at {pipe})"
    return [line] + ([f"# {mps['note']}"] if mps.get("note") else [])
