"""``--plot``: busbw against size, drawn from the ``--json`` document (:mod:`.report`) by
rank 0 at the end of the run, and for ``bench startup`` the start-up time against world size
(:mod:`.startup`'s document), with matplotlib (an optional dependency, checked before a
sweep by :func:`.options.validate_environment`; the start-up mode skips its plot without it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .common import BenchError, UsageError


def _pyplot() -> Any:
    """matplotlib.pyplot with the Agg backend; UsageError when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError(f"--plot needs matplotlib ({exc}): pip install matplotlib") from None
    return plt


def write_plot(report: Mapping[str, Any], path: str) -> None:
    """busbw vs size per backend, one subplot per collective (barrier, which moves no data,
    is left out), log2 x-axis; matplotlib with the Agg backend."""
    plt = _pyplot()
    collectives = [c for c in report["options"]["collectives"] if c != "barrier"]
    if not collectives:
        raise BenchError("--plot: nothing to plot (barrier moves no data)")
    ncols = min(3, len(collectives))
    nrows = -(-len(collectives) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), squeeze=False)
    for ax, coll in zip(axes.flat, collectives, strict=False):
        for backend in report["columns"]:
            points = [
                (r["bytes"], r["busbw"])
                for r in report["results"]
                if r["collective"] == coll and r["backend"] == backend and r["busbw"] is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=backend)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{coll} ({report['options']['datatype']}, {report['world_size']} ranks)")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(f"busbw (GB/s, {report['stat']} time)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[len(collectives) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_startup_plot(report: Mapping[str, Any], path: str) -> None:
    """Start-up time (median, with min-max bars) vs world size per backend, log2 x-axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for backend in report["backends"]:
        rows = sorted(
            (r for r in report["results"] if r["backend"] == backend),
            key=lambda r: r["world_size"],
        )
        xs = [r["world_size"] for r in rows]
        ys = [r["median_s"] for r in rows]
        spread = [
            [r["median_s"] - r["min_s"] for r in rows],
            [r["max_s"] - r["median_s"] for r in rows],
        ]
        ax.errorbar(xs, ys, yerr=spread, marker="o", capsize=3, label=backend)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("world size (ranks on one host)")
    ax.set_ylabel("init_process_group + first all_reduce (s)")
    ax.set_title(f"start-up, max over ranks, median of {report['repeats']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
