"""The soak's table on rank 0's stdout: one row per sample, the max over ranks of each
resource (ops: the sum), then the verdict (:mod:`.verdict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

_COLUMNS: Final = (
    ("time_s", 8),
    ("steps", 7),
    ("ops", 9),
    ("fds", 5),
    ("threads", 8),
    ("rss_mib", 9),
    ("shm_files", 10),
    ("shm_maps", 9),
)


def header(backends: Sequence[str], world: int, seconds: float, interval: float) -> str:
    names = "  ".join(name.rjust(width) for name, width in _COLUMNS)
    return (
        f"# soak: {', '.join(backends)} on {world} ranks for {seconds:g} s, a sample every "
        f"{interval:g} s; each column the max over ranks (ops: the sum)\n{names}\n"
    )


def row(elapsed: float, steps: int, per_rank: Sequence[Mapping[str, float]]) -> str:
    values = {
        "time_s": f"{elapsed:.1f}",
        "steps": str(steps),
        "ops": str(int(sum(r["ops"] for r in per_rank))),
    }
    for name in ("fds", "threads", "shm_files", "shm_maps"):
        values[name] = str(int(max(r[name] for r in per_rank)))
    values["rss_mib"] = f"{max(r['rss_mib'] for r in per_rank):.1f}"
    return "  ".join(values[name].rjust(width) for name, width in _COLUMNS) + "\n"
