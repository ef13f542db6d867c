"""The soak's ops: one step of mixed collectives, sizes and dtypes on a group, each result
checked against a numpy reference computed from every member's input.

Every rank's input is a function of its global rank, the step and the op (:func:`reference_input`),
so each rank computes what every other rank sent without asking. Values are small integers, so
float32 sums are exact in any order and every comparison is bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import torch
import torch.distributed as dist

OPS: Final = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "sendrecv",
    "barrier",
)
# Elements per rank, from one to 1 Mi: 4 B to 4 MiB in float32 (an op's buffer is capped at
# MAX_BYTES, see _elements). Eight counts, prime to the seven ops: every count comes every
# eight steps, and every op meets every count within 56.
COUNTS: Final = (1, 3, 64, 1000, 16_384, 131_072, 524_288, 1 << 20)
DTYPES: Final = (torch.float32, torch.int64)
MAX_BYTES: Final = 4 << 20


class WrongResult(Exception):
    """A soak op returned data that differs from the numpy reference."""


def reference_input(rank: int, step: int, op: str, count: int, dtype: torch.dtype) -> np.ndarray:
    """Rank ``rank``'s input of op ``op`` at ``step``: integers in [-500, 500)."""
    salt = OPS.index(op) * 131 + step * 7 + rank * 1009
    values = (np.arange(count, dtype=np.int64) * 31 + salt) % 1000 - 500
    return values.astype(torch.empty(0, dtype=dtype).numpy().dtype)


def _elements(count: int, dtype: torch.dtype, size: int) -> int:
    """``count`` capped so that the largest buffer of the op (size x count) fits MAX_BYTES."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return max(1, min(count, MAX_BYTES // (itemsize * size)))


class Step:
    """One op on ``group`` (whose members, by global rank, are ``members``)."""

    def __init__(
        self, group: dist.ProcessGroup, members: Sequence[int], backend: str, label: str
    ) -> None:
        self.group = group
        self.members = list(members)
        self.backend = backend
        self.label = label
        self.me = dist.get_rank()
        self.index = self.members.index(self.me)
        self.size = len(self.members)

    def run(self, op: str, step: int, count: int, dtype: torch.dtype) -> int:
        """Runs ``op`` and checks it; returns the ops issued (WrongResult on a mismatch)."""
        n = _elements(count, dtype, self.size)
        handlers: dict[str, Callable[[int, int, torch.dtype], int]] = {
            "all_reduce": self._all_reduce,
            "broadcast": self._broadcast,
            "all_gather": self._all_gather,
            "reduce_scatter": self._reduce_scatter,
            "all_to_all": self._all_to_all,
            "sendrecv": self._sendrecv,
            "barrier": self._barrier,
        }
        self._op = op
        return handlers[op](step, n, dtype)

    def _input(self, rank: int, step: int, n: int, dtype: torch.dtype) -> np.ndarray:
        return reference_input(rank, step, self._op, n, dtype)

    def _tensor(self, step: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(self._input(self.me, step, n, dtype).copy())

    def _check(self, got: torch.Tensor, want: np.ndarray, n: int, dtype: torch.dtype) -> None:
        have = got.numpy()
        if have.shape == want.shape and np.array_equal(have, want):
            return
        bad = np.flatnonzero(have.reshape(-1) != want.reshape(-1))
        first = int(bad[0]) if bad.size else -1
        detail = (
            f"{bad.size} of {want.size} elements differ, first at {first}: "
            f"got {have.reshape(-1)[first]}, want {want.reshape(-1)[first]}"
            if bad.size and have.shape == want.shape
            else f"shape {tuple(have.shape)}, want {tuple(want.shape)}"
        )
        raise WrongResult(
            f"soak: wrong result of {self._op} on {self.backend} group {self.label} "
            f"(ranks {self.members}), {n} x {dtype}, on rank {self.me}: {detail}"
        )

    def _all_reduce(self, step: int, n: int, dtype: torch.dtype) -> int:
        t = self._tensor(step, n, dtype)
        dist.all_reduce(t, group=self.group)
        want = sum(self._input(r, step, n, dtype) for r in self.members)
        self._check(t, np.asarray(want), n, dtype)
        return 1

    def _broadcast(self, step: int, n: int, dtype: torch.dtype) -> int:
        root = self.members[step % self.size]
        t = self._tensor(step, n, dtype) if root == self.me else torch.zeros(n, dtype=dtype)
        dist.broadcast(t, src=root, group=self.group)
        self._check(t, self._input(root, step, n, dtype), n, dtype)
        return 1

    def _all_gather(self, step: int, n: int, dtype: torch.dtype) -> int:
        out = torch.empty(n * self.size, dtype=dtype)
        dist.all_gather_single(out, self._tensor(step, n, dtype), group=self.group)
        want = np.concatenate([self._input(r, step, n, dtype) for r in self.members])
        self._check(out, want, n, dtype)
        return 1

    def _reduce_scatter(self, step: int, n: int, dtype: torch.dtype) -> int:
        out = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_single(out, self._tensor(step, n * self.size, dtype), group=self.group)
        total = sum(self._input(r, step, n * self.size, dtype) for r in self.members)
        want = np.asarray(total)[self.index * n : (self.index + 1) * n]
        self._check(out, want, n, dtype)
        return 1

    def _all_to_all(self, step: int, n: int, dtype: torch.dtype) -> int:
        out = torch.empty(n * self.size, dtype=dtype)
        dist.all_to_all_single(out, self._tensor(step, n * self.size, dtype), group=self.group)
        chunk = slice(self.index * n, (self.index + 1) * n)
        want = np.concatenate(
            [self._input(r, step, n * self.size, dtype)[chunk] for r in self.members]
        )
        self._check(out, want, n, dtype)
        return 1

    def _sendrecv(self, step: int, n: int, dtype: torch.dtype) -> int:
        if self.size < 2:
            return 0
        nxt = self.members[(self.index + 1) % self.size]
        prev = self.members[(self.index - 1) % self.size]
        got = torch.empty(n, dtype=dtype)
        recv = dist.irecv(got, src=prev, group=self.group)
        send = dist.isend(self._tensor(step, n, dtype), dst=nxt, group=self.group)
        assert recv is not None and send is not None
        send.wait()
        recv.wait()
        self._check(got, self._input(prev, step, n, dtype), n, dtype)
        return 2

    def _barrier(self, step: int, n: int, dtype: torch.dtype) -> int:
        dist.barrier(group=self.group)
        return 1


def plan(step: int) -> tuple[str, int, torch.dtype]:
    """The op, element count and dtype of ``step``: within 56 steps every op meets every
    count, and the dtype changes every 56 steps."""
    op = OPS[step % len(OPS)]
    count = COUNTS[step % len(COUNTS)]
    dtype = DTYPES[(step // (len(OPS) * len(COUNTS))) % len(DTYPES)]
    return op, count, dtype
