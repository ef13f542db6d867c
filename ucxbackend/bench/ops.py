"""The op under test: a case's tensors on the device (:func:`make_buffers`, once per size and
backend) and :func:`make_op`, one blocking call of the collective on them, which the timing
loop calls over and over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
import torch.distributed as dist

from .cases import CaseData, poison_value

_REDUCE_OPS: Final[Mapping[str, Any]] = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}


@dataclass
class Buffers:
    send: torch.Tensor | None
    recv: torch.Tensor | None  # the checked output (``send`` itself for in-place collectives)


def make_buffers(data: CaseData, device: torch.device) -> Buffers:
    """Fresh tensors on ``device`` (once per size and backend, reused by every iteration)."""
    if data.send is None:
        return Buffers(None, None)
    send = data.send.to(device, copy=True)
    if not data.recv_numel:
        return Buffers(send, send)
    recv = torch.empty(data.recv_numel, dtype=send.dtype, device=device)
    recv.fill_(poison_value(send.dtype))
    return Buffers(send, recv)


def _all_gather_fn() -> Callable[..., Any]:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_fn() -> Callable[..., Any]:
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def make_op(
    collective: str,
    bufs: Buffers,
    group: dist.ProcessGroup,
    op: str,
    root: int,
    rank: int,
    world: int,
) -> Callable[[], None]:
    """One blocking call of ``collective`` on ``bufs`` (the groups span all ranks, so group
    ranks are global ranks)."""
    send, recv = bufs.send, bufs.recv
    reduce_op = _REDUCE_OPS[op]
    if collective == "barrier":
        return lambda: dist.barrier(group=group)
    assert send is not None and recv is not None
    if collective == "all_reduce":
        return lambda: dist.all_reduce(send, op=reduce_op, group=group)
    if collective == "reduce":
        return lambda: dist.reduce(send, dst=root, op=reduce_op, group=group)
    if collective == "broadcast":
        return lambda: dist.broadcast(send, src=root, group=group)
    if collective == "all_gather":
        all_gather = _all_gather_fn()
        return lambda: all_gather(recv, send, group=group)
    if collective == "reduce_scatter":
        reduce_scatter = _reduce_scatter_fn()
        return lambda: reduce_scatter(recv, send, op=reduce_op, group=group)
    if collective == "all_to_all":
        return lambda: dist.all_to_all_single(recv, send, group=group)
    if collective == "sendrecv":
        # isend/irecv rather than batch_isend_irecv: a batch whose op fails validation leaves
        # torch's coalescing state open on a group that supports coalescing, and later
        # collectives on that group would then be queued instead of run.
        nxt, prev = (rank + 1) % world, (rank - 1) % world

        def sendrecv() -> None:
            sent = dist.isend(send, nxt, group=group)
            received = dist.irecv(recv, prev, group=group)
            for work in (sent, received):
                if work is not None:
                    work.wait()

        return sendrecv
    raise ValueError(f"unknown collective {collective!r}")
