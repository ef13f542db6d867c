"""``ucxbackend.bench.sizes``: the size parser, the sweep, nccl-tests' layouts (the ``size``
and ``count`` columns) and bus-bandwidth factors. Pure functions, no processes.
"""

from __future__ import annotations

import pytest

from ucxbackend.bench import sizes as bench_sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("64K", 64 << 10),
        ("64k", 64 << 10),
        ("16M", 16 << 20),
        ("1G", 1 << 30),
        (" 2 M ", 2 << 20),
        ("0", 0),
        ("8KB", 8 << 10),
        ("8 KiB", 8 << 10),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert bench_sizes.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12X", "1.5M", "-8", "M", "8iB", "0x10"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        bench_sizes.parse_size(text)


def test_format_size() -> None:
    assert [bench_sizes.format_size(n) for n in (8, 1024, 1536, 16 << 20, 3 << 30)] == [
        "8",
        "1K",
        "1536",
        "16M",
        "3G",
    ]


def test_size_sweep() -> None:
    sweep = bench_sizes.size_sweep(8, 64 << 20, 2)  # nccl-tests' defaults: -b 8 -e 64M -f 2
    assert len(sweep) == 24
    assert sweep[0] == 8 and sweep[-1] == 64 << 20
    assert sweep == [8 << k for k in range(24)]
    assert bench_sizes.size_sweep(8, 64 << 10, 8) == [8, 64, 512, 4096, 32768]
    assert bench_sizes.size_sweep(100, 100, 2) == [100]
    assert bench_sizes.size_sweep(3, 100, 4) == [3, 12, 48]
    for bad in ((0, 8, 2), (16, 8, 2), (8, 64, 1)):
        with pytest.raises(ValueError):
            bench_sizes.size_sweep(*bad)


def test_layouts_follow_nccl_tests() -> None:
    # all_reduce: the tensor; count = elements
    assert bench_sizes.layout_for("all_reduce", 1000, 4, 3) == bench_sizes.Layout(
        "all_reduce", 1000, 250
    )
    assert bench_sizes.layout_for("all_reduce", 10, 4, 2) == bench_sizes.Layout("all_reduce", 8, 2)
    assert bench_sizes.layout_for("sendrecv", 1, 8, 2) == bench_sizes.Layout(
        "sendrecv", 8, 1
    )  # >= 1 elt
    # total-buffer collectives: size = whole buffer, rounded to whole per-rank chunks;
    # count = per rank (all_gather, reduce_scatter) or per peer (all_to_all)
    for coll in ("all_gather", "reduce_scatter", "all_to_all", "gather"):
        assert bench_sizes.layout_for(coll, 1000, 4, 3) == bench_sizes.Layout(coll, 996, 83)
        assert bench_sizes.layout_for(coll, 8, 4, 3) == bench_sizes.Layout(coll, 12, 1)
    assert bench_sizes.layout_for("barrier", 1 << 20, 4, 2) == bench_sizes.Layout("barrier", 0, 0)
    # sizes that round onto an earlier one are measured once
    sizes = bench_sizes.size_sweep(8, 64, 2)  # 8, 16, 32, 64
    assert [lay.nbytes for lay in bench_sizes.layouts_for("all_gather", sizes, 4, 3)] == [
        12,
        24,
        60,
    ]
    assert bench_sizes.layouts_for("barrier", sizes, 4, 3) == [bench_sizes.Layout("barrier", 0, 0)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16])
def test_bus_factors_are_nccl_tests(n: int) -> None:
    # PERFORMANCE.md of nccl-tests
    assert bench_sizes.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for coll in ("reduce_scatter", "all_gather", "all_to_all", "gather"):
        assert bench_sizes.bus_factor(coll, n) == pytest.approx((n - 1) / n)
    for coll in ("broadcast", "reduce", "sendrecv"):
        assert bench_sizes.bus_factor(coll, n) == 1.0
    assert bench_sizes.bus_factor("barrier", n) == 0.0
    with pytest.raises(ValueError):
        bench_sizes.bus_factor("scatter", n)


def test_bandwidths() -> None:
    algbw, busbw = bench_sizes.bandwidths("all_reduce", 1_000_000_000, 0.5, 4)
    assert algbw == pytest.approx(2.0)  # GB/s = 1e9 bytes / s, size / time
    assert busbw == pytest.approx(2.0 * 2 * 3 / 4)
    assert bench_sizes.bandwidths("all_gather", 3_000, 1e-6, 3) == pytest.approx((3.0, 2.0))
    assert bench_sizes.bandwidths("barrier", 0, 1e-5, 2) == (0.0, 0.0)
