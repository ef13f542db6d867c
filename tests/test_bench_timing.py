"""``ucxbackend.bench.timing``: per-iteration statistics and how ``--rounds`` cuts the
timed iterations.
"""

from __future__ import annotations

from ucxbackend.bench import timing as bench_timing


def test_round_lengths() -> None:
    assert bench_timing.round_lengths(20, 1) == [20]
    assert bench_timing.round_lengths(20, 4) == [5, 5, 5, 5]
    assert bench_timing.round_lengths(7, 3) == [3, 2, 2]
    assert bench_timing.round_lengths(3, 3) == [1, 1, 1]


def test_time_stats() -> None:
    assert bench_timing.time_stats([3.0, 1.0, 2.0]) == (2.0, 2.0, 1.0, 3.0)
    assert bench_timing.time_stats([4.0, 1.0, 2.0, 100.0]) == (26.75, 3.0, 1.0, 100.0)
