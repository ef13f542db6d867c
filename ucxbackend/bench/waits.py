"""How the ops of a ``ucx`` or ``udp`` column waited: the counters behind the bench's
``# wait statistics`` block, per op over the timed iterations, summed over ranks.

A small op's time depends on how it waits as much as on what it moves: whether it ran on the
caller's thread (``inline``) or was handed to the progress thread after ``spin_us``
(``handed``), whether a rank moved off a core its peer was waiting on (``moves``), how many
times the waits yielded the core or slept (process-wide: the progress thread's too), how
long ops waited for their transport's requests and for the device (a CUDA op: docs/cuda.md), and
how often the calling thread itself was switched out, by blocking (``vcsw``) or by the
scheduler (``icsw``). Two runs of one command whose medians differ show here whether they
waited differently (docs/performance.md, the 4 KB floor in both host modes).

Read with :func:`wait_counters` before and after each timed round (:mod:`.timing`), turned
into per-op figures by :func:`wait_stats` and printed by :mod:`.report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch.distributed as dist

# The counters: inline_stats(group)'s three, wait_stats()'s yields and sleeps and the time
# ops waited for their transport and for the device, and the calling thread's context
# switches from its /proc status.
WAIT_COUNTERS: Final = (
    "inline",
    "handed_over",
    "core_moves",
    "yields",
    "sleeps",
    "transport_wait_us",
    "device_wait_us",
    "voluntary_ctxt_switches",
    "nonvoluntary_ctxt_switches",
)
_THREAD_STATUS: Final = "/proc/thread-self/status"


def _thread_switches() -> dict[str, int]:
    """The calling thread's context switches so far (zeros where /proc has no such file)."""
    keys = ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
    out = dict.fromkeys(keys, 0)
    try:
        with open(_THREAD_STATUS, encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in out:
                    out[name] = int(value)
    except OSError:
        pass
    return out


def _wait_stats_subset() -> dict[str, int]:
    import ucxbackend

    st = ucxbackend.wait_stats()
    keys = ("yields", "sleeps", "transport_wait_us", "device_wait_us")
    return {key: st[key] for key in keys}


def wait_counters(group: dist.ProcessGroup) -> dict[str, int]:
    """This rank's WAIT_COUNTERS now, for a ``ucx`` or ``udp`` group, read on the thread that
    issues its ops."""
    import ucxbackend

    return {**ucxbackend.inline_stats(group), **_wait_stats_subset(), **_thread_switches()}


def counted(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Each counter's change from ``before`` to ``after``."""
    return {c: after[c] - before[c] for c in WAIT_COUNTERS}


def wait_stats(sums: Mapping[str, float], iters: int) -> dict[str, Any]:
    """Per op over ``iters`` timed iterations, from the counters' changes summed over ranks."""
    return {"iters": iters, "per_op": {c: sums[c] / iters for c in WAIT_COUNTERS}}
