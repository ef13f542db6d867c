"""Ops that two threads issue on one group at once pair with the same ops on every rank.

Peers match ops by sequence number, which each op takes under the group's issue lock
(TransportBackend::enqueue). allgather_coalesced makes two Works, the gather and the one it
hands back, and so takes two numbers: both are taken under that lock, one after the other.
When the second was taken after the lock was let go, the other thread's op could take the
number between them on one rank and not on the other, so that its gather waited for a
message its peer sent under another number: a timeout (or, with other shapes, wrong data).

Here both threads issue the same allgather_coalesced, so any pairing of whole ops is right:
the lists must hold each rank's inputs, bit for bit, and no op may fail.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from dist_harness import run_world

OPS_PER_THREAD = 300
OP_TIMEOUT_S = 10.0


def _inputs(rank: int) -> list[torch.Tensor]:
    return [
        torch.arange(5, dtype=torch.int64) + 100 * rank,
        torch.full((3,), -rank, dtype=torch.int64),
    ]


def _two_threads_coalesced(rank: int, ws: int) -> dict[str, Any]:
    group = dist.new_group(backend="ucx", timeout=timedelta(seconds=OP_TIMEOUT_S))
    want = [_inputs(r) for r in range(ws)]
    wrong: list[str] = []
    errors: list[str] = []

    def run() -> None:
        for i in range(OPS_PER_THREAD):
            outs = [[torch.empty_like(t) for t in _inputs(rank)] for _ in range(ws)]
            try:
                dist.all_gather_coalesced(outs, _inputs(rank), group=group)
            except Exception as exc:  # any failure, reported to the parent
                errors.append(f"op {i}: {exc!r}")
                return
            for r in range(ws):
                for got, exp in zip(outs[r], want[r], strict=True):
                    if not torch.equal(got, exp):
                        wrong.append(f"op {i} from rank {r}: {got.tolist()} != {exp.tolist()}")

    threads = [threading.Thread(target=run) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(OPS_PER_THREAD * OP_TIMEOUT_S)
    return {"alive": sum(th.is_alive() for th in threads), "wrong": wrong[:3], "errors": errors[:3]}


def test_two_threads_issue_allgather_coalesced_on_one_group() -> None:
    results = run_world(_two_threads_coalesced, 2, timeout=300)
    for rank, out in enumerate(results):
        assert out["alive"] == 0 and not out["errors"] and not out["wrong"], (rank, out)
