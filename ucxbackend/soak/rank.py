"""One rank of a soak, under torchrun or the bench's launcher: the loop.

Call order (:func:`run_rank`): a Gloo default group for control (the samples and the stop
decision travel on it, never on the groups under test); per backend, one group over every rank
and one over each set of all ranks but one, all kept for the whole run; then steps until the
time is up. A step, per backend: one op on the whole group and one on a subgroup
(:mod:`.workload`, each checked against numpy), then a create/destroy cycle: a new group (over
every rank, or all but one, in turn), one all_reduce on it, destroyed. After each step the ranks
agree (an all_reduce of flags on the control group) on whether to sample, whether to stop, and
whether a rank saw a wrong result; a sample (:mod:`.probes`) is gathered to rank 0, which prints
a row (:mod:`.report`) and in the end the verdict (:mod:`.verdict`).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import time
from datetime import timedelta
from typing import Final, TextIO

import torch
import torch.distributed as dist

from ..bench.common import EXIT_FAILED, EXIT_OK, EXIT_WRONG
from ..bench.launcher import start_watchdog
from . import probes, report, verdict, workload
from .options import SoakOptions
from .testhook import Leak

logger = logging.getLogger(__name__)

_FIELDS: Final = ("fds", "threads", "rss_mib", "shm_files", "shm_maps", "ops")
# The sample travels as int64: RSS in KiB.
_KIB_PER_MIB: Final = 1024


class _Soak:
    def __init__(self, opts: SoakOptions, out: TextIO, err: TextIO) -> None:
        self.opts = opts
        self.out = out
        self.err = err
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.timeout = timedelta(seconds=opts.op_timeout)
        self.leak = Leak()
        self.ops = 0
        everyone = list(range(self.world))
        self.whole = {
            b: workload.Step(dist.new_group(backend=b, timeout=self.timeout), everyone, b, "whole")
            for b in opts.backends
        }
        # Every set of all ranks but one, per backend; each rank is in world - 1 of them.
        self.subgroups: dict[tuple[str, int], workload.Step | None] = {}
        for b in opts.backends:
            for left_out in everyone:
                members = [r for r in everyone if r != left_out]
                group = dist.new_group(members, backend=b, timeout=self.timeout)
                label = f"without rank {left_out}"
                self.subgroups[(b, left_out)] = (
                    workload.Step(group, members, b, label) if self.rank in members else None
                )

    def step(self, n: int) -> None:
        for b in self.opts.backends:
            op, count, dtype = workload.plan(n)
            self.ops += self.whole[b].run(op, n, count, dtype)
            sub = self.subgroups[(b, n % self.world)]
            if sub is not None:
                op, count, dtype = workload.plan(n + 3)  # another op than the whole group's
                self.ops += sub.run(op, n, count, dtype)
            self._cycle(b, n)

    def _cycle(self, backend: str, n: int) -> None:
        """A group created, used once and destroyed: every rank, or all but one, in turn."""
        everyone = list(range(self.world))
        members = everyone if n % 2 == 0 else [r for r in everyone if r != (n // 2) % self.world]
        group = dist.new_group(members, backend=backend, timeout=self.timeout)
        if self.rank not in members:
            return
        step = workload.Step(group, members, backend, f"cycle {n}")
        self.ops += step.run("all_reduce", n, 64, torch.int64)
        if not self.leak.keeps_group(group):
            dist.destroy_process_group(group)

    def agree(self, stop: bool, sample: bool, wrong: bool) -> tuple[bool, bool, bool]:
        """Rank 0's stop/sample decision and whether any rank saw a wrong result."""
        flags = torch.tensor(
            [int(stop and self.rank == 0), int(sample and self.rank == 0), int(wrong)],
            dtype=torch.int64,
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        s, m, w = (bool(x) for x in flags.tolist())
        return s, m, w

    def gather(self) -> list[dict[str, float]]:
        # Groups and Works the soak dropped can sit in reference cycles (with their tensors)
        # until Python's cycle collector runs, which makes RSS a saw-tooth of tens of MB: a
        # sample counts what is still reachable only.
        gc.collect()
        _trim_heap()
        s = probes.sample()
        mine = torch.tensor(
            [s.fds, s.threads, round(s.rss_mib * _KIB_PER_MIB), s.shm_files, s.shm_maps, self.ops],
            dtype=torch.int64,
        )
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        rows = []
        for t in every:
            d = dict(zip(_FIELDS, (float(v) for v in t.tolist()), strict=True))
            d["rss_mib"] /= _KIB_PER_MIB
            rows.append(d)
        return rows

    def run(self) -> int:
        lead = self.rank == 0
        if lead:
            self.out.write(
                report.header(self.opts.backends, self.world, self.opts.seconds, self.opts.interval)
            )
            self.out.flush()
        series: dict[int, list[dict[str, float]]] = {r: [] for r in range(self.world)}
        start = time.monotonic()
        next_sample = start + self.opts.interval
        n = 0
        while True:
            wrong = False
            try:
                self.step(n)
            except workload.WrongResult as exc:
                self.err.write(f"{exc}\n")
                self.err.flush()
                wrong = True
            n += 1
            now = time.monotonic()
            stop, sample, wrong_anywhere = self.agree(
                now - start >= self.opts.seconds, now >= next_sample, wrong
            )
            if wrong_anywhere:
                if lead:
                    self.out.write("verdict: WRONG RESULT (see the rank's error above)\n")
                return EXIT_WRONG
            if sample:
                next_sample += self.opts.interval
                rows = self.gather()
                for r, d in enumerate(rows):
                    series[r].append(d)
                if lead:
                    self.out.write(report.row(now - start, n, rows))
                    self.out.flush()
            if stop:
                break
        code = EXIT_OK
        if lead:
            result = verdict.judge(series)
            self.out.write(result.describe() + "\n")
            code = EXIT_OK if result.flat else EXIT_WRONG
        decided = torch.tensor([code], dtype=torch.int64)
        dist.broadcast(decided, src=0)
        return int(decided.item())


def _fix_mmap_threshold() -> None:
    """Serve every allocation of 128 KiB or more with its own mmap, returned to the kernel when
    freed (glibc's mallopt M_MMAP_THRESHOLD, which also stops glibc from raising the threshold
    as it does by default after each large free). Otherwise the heap keeps the soak's freed
    multi-MB buffers, and RSS climbs for tens of seconds to the allocator's high-water mark
    before it levels off: growth a short soak cannot tell from a leak. A leaked buffer stays
    resident either way. A no-op off glibc."""
    m_mmap_threshold = -3  # malloc.h
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(ctypes.c_int(m_mmap_threshold), ctypes.c_int(128 << 10))
    except (OSError, AttributeError) as exc:
        logger.debug("mallopt unavailable: %s", exc)


def _trim_heap() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(ctypes.c_size_t(0))
    except (OSError, AttributeError) as exc:
        logger.debug("malloc_trim unavailable: %s", exc)


def run_rank(opts: SoakOptions, out: TextIO, err: TextIO) -> int:
    """The soak on one rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the environment)."""
    import ucxbackend  # noqa: F401  (registers ucx and udp)

    rank = int(os.environ["RANK"])
    _fix_mmap_threshold()
    start_watchdog(opts.timeout, rank, err, "soak")
    dist.init_process_group("gloo", timeout=timedelta(seconds=opts.op_timeout))
    try:
        return _Soak(opts, out, err).run()
    except Exception as exc:  # an op or a group creation raised: the soak failed
        logger.debug("soak failed", exc_info=True)
        err.write(f"soak: rank {rank}: {type(exc).__name__}: {exc}\n")
        return EXIT_FAILED
