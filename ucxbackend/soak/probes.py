"""What the soak measures of one rank, read from ``/proc/self`` and ``/dev/shm``.

Only this process's own: the shared-memory columns count the ``/dev/shm/ucxb-<pid>-...`` names
whose pid is this process's (transports/shm/shared_segment.h names them so) and the
``ucxb-*`` segments it maps, so that another job's segments on the host do not count.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

SHM_DIR: Final = Path("/dev/shm")
SEGMENT_PREFIX: Final = "ucxb-"  # transports/shm/shared_segment.cpp, kSegmentPrefix


@dataclass(frozen=True)
class Sample:
    fds: int
    threads: int
    rss_mib: float
    shm_files: int
    shm_maps: int

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def _rss_mib() -> float:
    # statm's second field: resident pages.
    resident = int(Path("/proc/self/statm").read_text().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def _own_shm_files(pid: int) -> int:
    prefix = f"{SEGMENT_PREFIX}{pid}-"
    try:
        return sum(1 for name in os.listdir(SHM_DIR) if name.startswith(prefix))
    except OSError:
        return 0


def _mapped_segments() -> int:
    """Distinct ucxb-* segments in this process's memory map, named or already unlinked."""
    marker = f"{SHM_DIR}/{SEGMENT_PREFIX}"
    seen = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(marker):
                seen.add(fields[4])  # the inode: one segment may be mapped more than once
    return len(seen)


def sample() -> Sample:
    """This process's resources now."""
    return Sample(
        fds=len(os.listdir("/proc/self/fd")),
        threads=len(os.listdir("/proc/self/task")),
        rss_mib=_rss_mib(),
        shm_files=_own_shm_files(os.getpid()),
        shm_maps=_mapped_segments(),
    )
