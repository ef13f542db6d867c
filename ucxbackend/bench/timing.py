"""Timing: one backend at one size on this rank, from the untimed check to a
:class:`Measurement` (times in microseconds, max over ranks; ``#wrong`` summed over ranks).

Call order: :func:`prepare` runs the op once, checks it (:mod:`.cases`) and warms up, giving a
:class:`Timed`; :func:`time_round` times one round of iterations after a barrier (the runner
gives the backends their rounds in turn); :func:`finish` reduces every round over the ranks.
:func:`measure` is the three in one round. For udp columns the transport counters are read
around each round (:func:`settled_udp_counters`) so that they count only timed iterations,
and for the ucx and udp columns how the ops waited (:mod:`.waits`).
Everything collective goes through :class:`RankContext`'s Gloo control group.

With ``--device cuda``, :func:`measure_d2d_copy` times the limit column: a device-to-device
copy of the message size on this rank's GPU, with CUDA events.

The test-only hook of the package docstring (``UCXBACKEND_BENCH_CORRUPT``) lives here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
import torch.distributed as dist

from .cases import CaseData, count_wrong, poison_value
from .common import CORRUPT_ENV, FAKE
from .ops import Buffers, host_staged, make_buffers, make_op, make_staged_op
from .options import BenchOptions
from .sizes import Layout
from .trace import TraceWriter
from .udp import UDP, UDP_COUNTERS, UDP_GAUGES
from .waits import WAIT_COUNTERS, counted, wait_counters, wait_stats

logger = logging.getLogger(__name__)


@dataclass
class Measurement:
    """One backend at one size: times in microseconds (max over ranks), #wrong summed."""

    supported: bool
    error: str | None = None
    time_us: dict[str, float] | None = None  # mean, median, min, max
    wrong: int | None = None  # None: not checked
    transport: dict[str, Any] | None = None  # udp columns: see udp_transport_stats()
    waits: dict[str, Any] | None = None  # ucx and udp columns: see waits.wait_stats()
    host_staged: bool = False  # the bench copied the tensors to the host and back (ops)
    # When each round's timed calls ran, on rank 0's monotonic clock (seconds): that the
    # columns took turns shows in the JSON (round_spans).
    spans: list[tuple[float, float]] | None = None

    def time(self, stat: str) -> float | None:
        return None if self.time_us is None else self.time_us[stat]


def _short_error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _attempt(fn: Callable[[], None]) -> str | None:
    """None, or why ``fn`` was rejected (an unsupported dtype/op: shown as n/a). A failure
    of the communication itself (``DistError``: a dead peer, a timeout) is not that: it
    propagates and fails the run."""
    try:
        fn()
    except dist.DistError:
        raise
    except Exception as exc:
        return _short_error(exc)
    return None


@dataclass
class RankContext:
    """What every measurement on this rank needs."""

    opts: BenchOptions
    rank: int
    world: int
    device: torch.device
    ctrl: dist.ProcessGroup
    groups: Mapping[str, dist.ProcessGroup]
    sync: Callable[[], None]
    udp_columns: frozenset[str] = frozenset()  # columns whose transport statistics we take
    skipped: Mapping[str, str] = field(default_factory=dict)  # column -> why it has no group
    trace: TraceWriter | None = None  # --trace: udp columns sample after each round

    def all_ok(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.ctrl)
        return bool(flag.item())

    def sum(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.ctrl)
        return int(t.item())

    def max_stats(self, stats: Sequence[float]) -> list[float]:
        t = torch.tensor(list(stats), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return [float(x) for x in t.tolist()]

    def sum_stats(self, stats: Sequence[float]) -> list[float]:
        t = torch.tensor(list(stats), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.ctrl)
        return [float(x) for x in t.tolist()]


def udp_counters(group: dist.ProcessGroup) -> dict[str, int]:
    """This rank's UDP_COUNTERS and UDP_GAUGES of a udp group (``ucxbackend.stats``), and
    the sequence number of the last op whose counters were published."""
    import ucxbackend

    st = ucxbackend.stats(group)
    merged = {**st["transport"], **st["total"]}
    out = {name: int(merged.get(name, 0)) for name in (*UDP_COUNTERS, *UDP_GAUGES)}
    out["last_op_seq"] = int(st["ops"][-1]["seq"]) if st["ops"] else -1
    return out


_SETTLE_FIRST_S: Final = 0.002
_SETTLE_STEP_S: Final = 0.001
_SETTLE_MAX_S: Final = 0.05


def settled_udp_counters(group: dist.ProcessGroup) -> dict[str, int]:
    """:func:`udp_counters` once they stop changing (at most ``_SETTLE_MAX_S``).

    The progress thread publishes an op's counters just after completing its Work, and again
    when it goes idle (late ACKs and retransmissions of the op's tail), so a read right after
    ``wait()`` can miss the last op. Sleeping hands the core to that thread."""
    deadline = time.monotonic() + _SETTLE_MAX_S
    time.sleep(_SETTLE_FIRST_S)
    prev = udp_counters(group)
    while True:
        time.sleep(_SETTLE_STEP_S)
        cur = udp_counters(group)
        if cur == prev or time.monotonic() >= deadline:
            return cur
        prev = cur


def udp_transport_stats(
    ctx: RankContext, before: Mapping[str, int], after: Mapping[str, int], iters: int
) -> dict[str, Any]:
    """Per op over the timed iterations: each counter's change summed over ranks over
    ``iters``; the gauges after them, max over ranks. Collective over the control group."""
    sums = ctx.sum_stats([after[c] - before[c] for c in UDP_COUNTERS])
    gauges = ctx.max_stats([after[g] for g in UDP_GAUGES])
    return {
        "iters": iters,
        "per_op": {c: v / iters for c, v in zip(UDP_COUNTERS, sums, strict=True)},
        **dict(zip(UDP_GAUGES, gauges, strict=True)),
    }


def _corrupt_rank(collective: str, root: int) -> int:
    return root if collective in ("reduce", "gather") else 0


def _maybe_corrupt(
    ctx: RankContext, backend: str, collective: str, bufs: Buffers, data: CaseData
) -> None:
    """The test-only hook of the package docstring (``UCXBACKEND_BENCH_CORRUPT``)."""
    if os.environ.get(CORRUPT_ENV) != backend or data.expected is None or bufs.recv is None:
        return
    if ctx.rank != _corrupt_rank(collective, ctx.opts.root) or bufs.recv.numel() == 0:
        return
    logger.warning("%s=%s: corrupting one output element (test hook)", CORRUPT_ENV, backend)
    bufs.recv.view(-1)[:1].fill_(poison_value(bufs.recv.dtype))


def time_stats(times: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, median, min, max) of per-iteration times."""
    ordered = sorted(times)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return sum(ordered) / len(ordered), median, ordered[0], ordered[-1]


def _time_iterations(fn: Callable[[], None], sync: Callable[[], None], iters: int) -> list[float]:
    """Seconds of each of ``iters`` iterations, each op blocking like a training loop's."""
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def round_lengths(iters: int, rounds: int) -> list[int]:
    """``iters`` timed iterations cut into ``rounds`` rounds as even as can be, longer first."""
    base, extra = divmod(iters, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


@dataclass
class Timed:
    """One backend at one size, checked and warmed up, timed over one or more rounds."""

    backend: str
    group: Any
    fn: Callable[[], None]
    wrong: int | None
    udp: bool
    host_staged: bool = False
    native: bool = False  # a ucx or udp column: how its ops waited is counted (waits.py)
    layout: Layout | None = None  # what --trace labels its samples with
    times: list[float] = field(default_factory=list)
    counted: dict[str, int] = field(default_factory=dict)  # udp counters' change in rounds
    gauges: dict[str, int] = field(default_factory=dict)  # udp gauges after the last round
    waited: dict[str, int] = field(default_factory=dict)  # wait counters' change in rounds
    spans: list[tuple[float, float]] = field(default_factory=list)  # see Measurement.spans


def prepare(ctx: RankContext, backend: str, layout: Layout, data: CaseData) -> Measurement | Timed:
    """Check once (untimed) and warm up: a Timed ready for time_round(), or the
    Measurement of a backend that cannot run this case."""
    opts, collective = ctx.opts, layout.collective
    if backend in ctx.skipped:
        return Measurement(False, f"skipped: {ctx.skipped[backend]}")
    if collective == "sendrecv" and ctx.world < 2:
        return Measurement(False, "sendrecv needs at least 2 ranks")
    group = ctx.groups[backend]
    bufs = make_buffers(data, ctx.device)
    staged = host_staged(backend, collective, opts.device)
    make = make_staged_op if staged else make_op
    fn = make(collective, bufs, group, opts.op, opts.root, ctx.rank, ctx.world)

    def checked() -> None:
        fn()
        ctx.sync()

    error = _attempt(checked)
    if not ctx.all_ok(error is None):
        return Measurement(False, error or "failed on another rank")
    wrong = None
    if opts.check and backend != FAKE:  # fake moves nothing: its outputs are never right
        _maybe_corrupt(ctx, backend, collective, bufs, data)
        local = 0
        if data.expected is not None and bufs.recv is not None:
            local = count_wrong(bufs.recv, data.expected, opts.op)
        wrong = ctx.sum(local)
    if collective in ("all_reduce", "reduce") and bufs.send is not None:
        bufs.send.zero_()  # in place: keep repeated reductions from overflowing
    for _ in range(opts.warmup_iters):
        fn()
    ctx.sync()
    return Timed(
        backend, group, fn, wrong, udp=backend in ctx.udp_columns, host_staged=staged,
        native=backend == "ucx" or backend == UDP or backend in ctx.udp_columns, layout=layout,
    )


def time_round(ctx: RankContext, timed: Timed, iters: int, rewarm: bool) -> None:
    """Barrier, then time ``iters`` iterations; ``rewarm`` runs one untimed iteration first
    (another backend's round ran since this one's warm-up). The udp counters count only
    the timed iterations."""
    if rewarm:
        timed.fn()
        ctx.sync()
    dist.barrier(group=timed.group)
    before = settled_udp_counters(timed.group) if timed.udp else None
    waits_before = wait_counters(timed.group) if timed.native else None
    start = time.monotonic()
    timed.times += _time_iterations(timed.fn, ctx.sync, iters)
    timed.spans.append((start, time.monotonic()))
    if waits_before is not None:
        for c, v in counted(waits_before, wait_counters(timed.group)).items():
            timed.waited[c] = timed.waited.get(c, 0) + v
    if before is not None:
        after = settled_udp_counters(timed.group)
        for c in UDP_COUNTERS:
            timed.counted[c] = timed.counted.get(c, 0) + after[c] - before[c]
        timed.gauges = {g: after[g] for g in UDP_GAUGES}
        if ctx.trace is not None and timed.layout is not None:
            ctx.trace.sample(timed.group, column=timed.backend,
                             collective=timed.layout.collective, nbytes=timed.layout.nbytes)


def finish(ctx: RankContext, timed: Timed) -> Measurement:
    """The Measurement of every round together (times: max over ranks)."""
    time_us = _max_time_us(ctx, timed.times)
    transport = None
    if timed.udp:
        zero = dict.fromkeys(UDP_COUNTERS, 0)
        transport = udp_transport_stats(
            ctx, zero, {**timed.counted, **timed.gauges}, len(timed.times)
        )
    waits = None
    if timed.native:
        sums = ctx.sum_stats([timed.waited.get(c, 0) for c in WAIT_COUNTERS])
        waits = wait_stats(dict(zip(WAIT_COUNTERS, sums, strict=True)), len(timed.times))
    return Measurement(
        True, None, time_us, timed.wrong, transport, waits=waits, host_staged=timed.host_staged,
        spans=list(timed.spans),
    )


def _max_time_us(ctx: RankContext, times: Sequence[float]) -> dict[str, float]:
    """mean, median, min and max of ``times`` (seconds), each the max over ranks, in us."""
    stats = ctx.max_stats(time_stats(times))
    return dict(zip(("mean", "median", "min", "max"), (x * 1e6 for x in stats), strict=True))


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def measure_d2d_copy(ctx: RankContext, nbytes: int) -> Measurement | None:
    """The limit column: ``copy_`` of ``nbytes`` between two tensors on this rank's GPU,
    ``-w`` (at least one) warm-up copies, then ``-n`` copies each timed with a pair of CUDA
    events; every rank at once, so that ranks sharing a GPU share its memory bandwidth as
    they do in the collectives; times max over ranks. None off CUDA or at 0 bytes (every
    rank gets the same answer, so all or none take part). Collective over the control group."""
    if ctx.device.type != "cuda" or nbytes <= 0:
        return None
    src = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    for _ in range(max(1, ctx.opts.warmup_iters)):
        dst.copy_(src)
    ctx.sync()
    dist.barrier(group=ctx.ctrl)
    events = [(_timing_event(), _timing_event()) for _ in range(ctx.opts.iters)]
    for start, end in events:
        start.record()
        dst.copy_(src)
        end.record()
    ctx.sync()
    times = [start.elapsed_time(end) / 1e3 for start, end in events]  # ms -> s
    return Measurement(True, None, _max_time_us(ctx, times))


def measure(ctx: RankContext, backend: str, layout: Layout, data: CaseData) -> Measurement:
    """Check once (untimed), warm up, barrier, time ``iters`` iterations in one round."""
    timed = prepare(ctx, backend, layout, data)
    if isinstance(timed, Measurement):
        return timed
    time_round(ctx, timed, ctx.opts.iters, rewarm=False)
    return finish(ctx, timed)
