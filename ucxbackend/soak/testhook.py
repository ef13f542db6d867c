"""Test-only: ``UCXBACKEND_SOAK_TEST_LEAK`` makes the soak leak on purpose, once per
create/destroy cycle, to prove that its verdict turns to "growing" (tests/test_soak.py).

``fd``: an open file descriptor of ``/dev/null`` is kept. ``group``: the cycle's group is kept
alive instead of destroyed (its transport, progress thread and fds stay). Nothing else reads the
variable; never set it for a real soak.
"""

from __future__ import annotations

import os
from typing import Final

import torch.distributed as dist

LEAK_ENV: Final = "UCXBACKEND_SOAK_TEST_LEAK"
KINDS: Final = ("fd", "group")


class Leak:
    """What the cycles keep, when the variable asks for it."""

    def __init__(self, value: str | None = None) -> None:
        kind = os.environ.get(LEAK_ENV, "") if value is None else value
        if kind not in ("", *KINDS):
            raise ValueError(f"{LEAK_ENV}={kind!r}: expected one of {', '.join(KINDS)}")
        self.kind = kind
        self._fds: list[int] = []
        self._groups: list[dist.ProcessGroup] = []

    def keeps_group(self, group: dist.ProcessGroup) -> bool:
        """Called at the end of a cycle instead of destroying ``group``: True when kept."""
        if self.kind == "fd":
            self._fds.append(os.open(os.devnull, os.O_RDONLY))
        elif self.kind == "group":
            self._groups.append(group)
            return True
        return False
