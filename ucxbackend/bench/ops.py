"""The op under test: a case's tensors on the device (:func:`make_buffers`, once per size and
backend) and :func:`make_op`, one blocking call of the collective on them, which the timing
loop calls over and over. With ``--device cuda``, Gloo runs on the CUDA tensors where torch's
Gloo has a CUDA path (:data:`GLOO_CUDA_NATIVE`); elsewhere :func:`host_staged` says so and
:func:`make_staged_op` copies to host tensors, runs Gloo on them and copies back.
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


# Collectives whose CUDA tensors torch's ProcessGroupGloo takes itself (its own CUDA work
# classes, which stage through pinned host memory on a side stream). Its send/recv pass the
# raw data pointer to Gloo's TCP transport, and its reduce, reduce_scatter_tensor and
# all_gather_into_tensor have no CUDA path in every torch 2.x, so those are staged here.
GLOO_CUDA_NATIVE: Final = frozenset({"all_reduce", "broadcast", "barrier"})
HOST_STAGED_SUFFIX: Final = "(host-staged)"


def host_staged(backend: str, collective: str, device: str) -> bool:
    """Whether the bench itself stages ``backend``'s tensors through the host."""
    return device == "cuda" and backend == "gloo" and collective not in GLOO_CUDA_NATIVE


def column_label(backend: str, collective: str, device: str) -> str:
    """The name a column is shown under: ``gloo(host-staged)`` where the bench stages it."""
    staged = host_staged(backend, collective, device)
    return backend + HOST_STAGED_SUFFIX if staged else backend


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


def make_staged_op(
    collective: str,
    bufs: Buffers,
    group: dist.ProcessGroup,
    op: str,
    root: int,
    rank: int,
    world: int,
) -> Callable[[], None]:
    """:func:`make_op` on pinned host copies of ``bufs``: each call copies the input to the
    host, runs the collective there and copies the output back (all timed)."""
    send, recv = bufs.send, bufs.recv
    if send is None or recv is None:
        return make_op(collective, bufs, group, op, root, rank, world)
    pin = send.is_cuda

    def host_like(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)

    host_send = host_like(send)
    host_recv = host_send if recv is send else host_like(recv).copy_(recv)  # the poison
    inner = make_op(collective, Buffers(host_send, host_recv), group, op, root, rank, world)

    def staged() -> None:
        host_send.copy_(send)
        inner()
        recv.copy_(host_recv)

    return staged


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
    if collective == "gather":
        # The root's output as one chunk per rank: views of one tensor, so the check reads
        # what every rank's chunk landed in. The other ranks have no output.
        chunks = list(recv.chunk(world)) if rank == root else None
        return lambda: dist.gather(send, chunks, dst=root, group=group)
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
