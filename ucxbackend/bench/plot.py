"""``--plot``: busbw against size, drawn from the ``--json`` document (:mod:`.report`) by
rank 0 at the end of the run, with matplotlib (an optional dependency, checked before the
run by :func:`.options.validate_environment`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .common import BenchError, UsageError


def write_plot(report: Mapping[str, Any], path: str) -> None:
    """busbw vs size per backend, one subplot per collective (barrier, which moves no data,
    is left out), log2 x-axis; matplotlib with the Agg backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError(f"--plot needs matplotlib ({exc}): pip install matplotlib") from None
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
