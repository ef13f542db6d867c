"""The soak's verdict: do a rank's resources stay flat or grow over the run?

The first quarter of the samples (at least one) is warm-up: UCX opens its endpoints, torch and
the allocator size their pools, and threads that start on first use start. The rest is cut in
thirds, and for every metric and rank the floor (the minimum) of the last third is compared with
the floor of the first: growing when it exceeds it by more than the metric's tolerance. A leak
raises the floor; a transient does not (a sample taken in a busy moment, memory that is given
back a few steps later). Thirds, not the two ends, so that a leak has two thirds of the run to
show and a short run can still fail.

The tolerances (:data:`TOLERANCES`), and why:

- ``fds``, ``threads``: integers that must come back to the same value between two steps, as
  every group the soak makes during a step is destroyed before it ends. A slack of 2 fds and
  1 thread lets one late-starting helper (UCX's async thread, a lazily opened device) appear
  once; a leak of one per create/destroy cycle grows by one per step, hundreds per minute.
- ``shm_files``, ``shm_maps``: the ``/dev/shm/ucxb-*`` names this rank created (they exist only
  during a group's creation) and the segments it maps (one per live staging group): 0 and 1.
- ``rss_mib``: 64 MiB plus 10 %. Ops of up to 4 MiB per rank move a rank's resident memory by
  a few times that from one sample to the next, and each group created leaves a few KiB behind
  (docs/operations.md#soak: ~2-4 KiB a group on 2026-11-26, partly torch's own bookkeeping);
  this is above both for a soak of up to about an hour. The tolerance is absolute, so a
  longer soak finds a smaller leak per step: 64 MiB over ten minutes is 100 KiB a second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

METRICS: Final = ("fds", "threads", "rss_mib", "shm_files", "shm_maps")
# Samples needed for a verdict: one of warm-up, then two for each third.
MIN_SAMPLES: Final = 7


@dataclass(frozen=True)
class Tolerance:
    absolute: float
    relative: float = 0.0

    def limit(self, base: float) -> float:
        return base + self.absolute + self.relative * base

    def describe(self) -> str:
        text = f"+{self.absolute:g}"
        return text + (f" +{self.relative:.0%}" if self.relative else "")


TOLERANCES: Final[Mapping[str, Tolerance]] = {
    "fds": Tolerance(2),
    "threads": Tolerance(1),
    "rss_mib": Tolerance(64, 0.10),
    "shm_files": Tolerance(0),
    "shm_maps": Tolerance(1),
}


@dataclass(frozen=True)
class Finding:
    """One metric of one rank: the floors compared and whether it grew past its tolerance."""

    metric: str
    rank: int
    first: float
    last: float
    limit: float

    @property
    def growing(self) -> bool:
        return self.last > self.limit

    def describe(self) -> str:
        return (
            f"{self.metric} on rank {self.rank}: {self.first:g} -> {self.last:g} "
            f"(limit {self.limit:g}, tolerance {TOLERANCES[self.metric].describe()})"
        )


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    warmup: int
    compared: int  # samples in each third compared

    @property
    def growing(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.growing)

    @property
    def flat(self) -> bool:
        return not self.growing

    def describe(self) -> str:
        head = (
            f"(floor of the last {self.compared} samples vs the first {self.compared} after "
            f"{self.warmup} of warm-up)"
        )
        if self.flat:
            worst = {
                m: max(f.last - f.first for f in self.findings if f.metric == m) for m in METRICS
            }
            change = ", ".join(f"{m} {worst[m]:+g}" for m in METRICS)
            return f"verdict: flat {head}; largest change: {change}"
        return (
            "verdict: GROWING " + head + "\n" + "\n".join("  " + f.describe() for f in self.growing)
        )


def warmup_count(samples: int) -> int:
    return max(1, samples // 4)


def judge(series: Mapping[int, Sequence[Mapping[str, float]]]) -> Verdict:
    """The verdict over ``series``: per rank, its samples in time order (each a mapping with
    every metric of :data:`METRICS`). Raises ValueError with fewer than :data:`MIN_SAMPLES`."""
    lengths = {len(s) for s in series.values()}
    if len(lengths) != 1:
        raise ValueError(f"the ranks have different numbers of samples: {sorted(lengths)}")
    (n,) = lengths
    if n < MIN_SAMPLES:
        raise ValueError(f"{n} samples, fewer than the {MIN_SAMPLES} a verdict needs")
    warmup = warmup_count(n)
    third = (n - warmup) // 3
    findings = []
    for rank, samples in sorted(series.items()):
        kept = samples[warmup:]
        for metric in METRICS:
            first = min(float(s[metric]) for s in kept[:third])
            last = min(float(s[metric]) for s in kept[-third:])
            limit = TOLERANCES[metric].limit(first)
            findings.append(Finding(metric, rank, first, last, limit))
    return Verdict(tuple(findings), warmup, third)
