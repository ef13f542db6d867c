"""``cuda_wait=stream`` cannot hang on torch's caching allocator (docs/cuda.md, "Stream semantics").

A ``Work.wait()`` that holds the caller's stream until the op ends makes every device-wide
synchronisation wait for that op; torch's caching allocator, short of memory, frees its cached
blocks (``cudaFree``, which synchronises the device) while holding its lock. Before the op's
scratch was allocated at issue, the op's run on the progress thread allocated it there: with
the stream held, a ``cudaFree`` on either thread waited for an op that could not end. This
world makes exactly that happen, every round:

* each rank caps its caching allocator (``set_per_process_memory_fraction``) and fills it up to
  the cap with freed 1 MiB blocks (the small pool: no larger request can be served from
  them), so that the op's scratch, and the caller's next large allocation, can only be served
  by freeing cached blocks;
* one rank issues its op late (``LATE_S``), so the other's op is still running when that rank,
  on a side stream with ``cuda_wait=stream``, calls ``wait()`` (which must hold the stream and
  return at once: ``is_completed()`` still False) and then queues more work that allocates
  (the cache full again): its ``cudaFree`` waits for the held stream, which waits for the op;
* the op must end, and its result be bit-exact against a CPU reference (int32 SUM), within
  the world's deadline (a hang fails the world at ``WORLD_TIMEOUT``).

The ops: all_reduce (recursive doubling at two ranks: the peer's 16 MiB vector in scratch,
from the large pool), reduce_scatter (recursive halving, forced: a slot and the whole
input), reduce to the waiting rank (the root folds through scratch), and an all_reduce of a
strided tensor, whose staging copy is allocated on the progress thread: its ``wait()`` must
wait on the host instead (``is_completed()`` True when it returns), and must not hang either;
so must an all_reduce issued behind a CPU all_reduce still pending whose Future was taken (a
callback chained on it runs on the progress thread and may allocate CUDA memory).
Each rank plays the late rank in one round of each op and the waiting rank in the other.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import pytest

from gpu.cuda_harness import Outcomes, WorldCache, cuda_world, evaluate, use_gpu0

# Each rank's cap on its caching allocator: room for the ops' tensors, their scratch and the
# allocation after wait(), and little enough that filling it takes well under a second.
CAP_BYTES = 768 << 20
FILL_BLOCK = 1 << 20  # from the small pool (<= 1 MiB): useless to any larger request
LATE_S = 0.5  # how late the other rank issues: the waiting rank's op runs at least this long
N = 4 << 20  # int32 elements: 16 MiB, over a 4 MiB chunk (the ring at two ranks)
AFTER_BYTES = 64 << 20  # what the waiting rank allocates after wait(), its op still running

OPS = (
    "all_reduce",
    "reduce_scatter",
    "reduce",
    "all_reduce of a strided tensor",
    "all_reduce behind a CPU op whose Future was taken",
)
HELD = ("wait() held the stream", "the op ended and its result is exact")
HOST = ("wait() waited on the host", "the op ended and its result is exact")


def _on_host(op: str) -> bool:
    """The ops whose wait() must wait on the host: a staging copy on the progress thread, or
    an earlier CPU op whose Future's callbacks run there and may allocate CUDA memory."""
    return "strided" in op or "CPU op" in op


def _checks(op: str) -> tuple[str, ...]:
    return tuple(f"{op}: {c}" for c in (HOST if _on_host(op) else HELD))


def _fill_cache(torch: Any, dev: Any) -> int:
    """Allocate FILL_BLOCK tensors up to the cap, then free them: the allocator keeps them all
    cached. Returns how many it took."""
    blocks = []
    try:
        while True:
            blocks.append(torch.empty(FILL_BLOCK, dtype=torch.uint8, device=dev))
    except torch.cuda.OutOfMemoryError:
        pass
    count = len(blocks)
    del blocks
    return count


def hold_main(rank: int, ws: int) -> dict[str, dict[str, Any]]:
    import os

    import torch
    import torch.distributed as dist

    dev = use_gpu0()
    out = Outcomes(rank)
    out.check(
        "the ranks run with UCXBACKEND_CUDA_WAIT=stream",
        os.environ.get("UCXBACKEND_CUDA_WAIT") == "stream",
        f"UCXBACKEND_CUDA_WAIT is {os.environ.get('UCXBACKEND_CUDA_WAIT')!r}",
    )
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP_BYTES / total, 0)
    # High priority: never a group's internal stream (those come from the low-priority pool),
    # which the gate would not hold.
    side = torch.cuda.Stream(priority=-1)

    def inputs(r: int, salt: int) -> Any:
        # Distinct per rank and round, small enough that an int32 sum cannot overflow.
        return (torch.arange(N, dtype=torch.int32) % 9973) * (r + 1) + salt

    def run(op: str, salt: int, late: int) -> None:
        want_held = not _on_host(op)
        root = (late + 1) % ws  # reduce: the waiting rank, which folds through scratch
        mine = inputs(rank, salt)
        total_in = sum(inputs(r, salt) for r in range(ws))
        with torch.cuda.stream(side):
            x = mine.to(dev)
            result: Any
            if op == "reduce_scatter":
                result = torch.empty(N // ws, dtype=torch.int32, device=dev)
            elif op == "all_reduce of a strided tensor":
                x = x.view(ws, N // ws).t()  # strided: the body stages a contiguous copy
                result = x
            else:
                result = x
            side.synchronize()
            filled = _fill_cache(torch, dev)  # the op's scratch must free cached blocks
            if rank == late:
                time.sleep(LATE_S)
            cpu_work = None
            if "CPU op" in op:
                # Pending until the late rank joins: its Future's mark stands before the op.
                cpu_work = dist.all_reduce(torch.ones(4), async_op=True)
                cpu_work.get_future()
            began = time.monotonic()
            if op == "reduce_scatter":
                work = dist.reduce_scatter_tensor(result, x, async_op=True)
            elif op == "reduce":
                work = dist.reduce(x, dst=root, async_op=True)
            else:
                work = dist.all_reduce(x, async_op=True)
            if rank != late:
                _fill_cache(torch, dev)  # and so must the allocation after wait()
            work.wait()
            waited = time.monotonic() - began
            ended_at_wait = work.is_completed()
            if rank != late:
                # Queued behind the op on the held stream; its cudaFree waits for the op.
                after = torch.empty(AFTER_BYTES, dtype=torch.uint8, device=dev)
                after.fill_(1)
            copy = result.clone()
        deadline = time.monotonic() + 60
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)
        if cpu_work is not None:
            cpu_work.wait()
        torch.cuda.synchronize()
        if op == "reduce_scatter":
            want = total_in.view(ws, N // ws)[rank]
        elif op == "reduce" and rank != root:
            want = mine  # only the root's tensor receives the result
        elif op == "all_reduce of a strided tensor":
            want = total_in.view(ws, N // ws).t()
        else:
            want = total_in
        got = copy.cpu()
        if rank != late:
            name = "wait() held the stream" if want_held else "wait() waited on the host"
            ok = (not ended_at_wait) if want_held else ended_at_wait
            out.check(
                f"{op}: {name}",
                ok,
                f"is_completed() right after wait() was {ended_at_wait}, wait() took "
                f"{waited:.3f} s with the peer {LATE_S} s late ({filled} blocks cached)",
            )
        out.check(
            f"{op}: the op ended and its result is exact",
            work.is_completed() and torch.equal(got, want),
            f"completed {work.is_completed()}, "
            f"{int((got != want).sum().item())} of {want.numel()} elements differ",
        )

    salt = 0
    for op in OPS:
        for late in range(ws):
            salt += 1
            out.run(
                f"{op}: the op ended and its result is exact",
                functools.partial(run, op, salt, late),
            )
    return out.results


# Recursive halving: a reduce_scatter of two ranks by the ring asks for no scratch.
_ENV = {"UCXBACKEND_CUDA_WAIT": "stream", "UCXBACKEND_ALGO_REDUCE_SCATTER": "recursive_halving"}
_world = WorldCache(lambda: cuda_world(hold_main, env=_ENV))


@pytest.mark.parametrize(
    "check",
    ["the ranks run with UCXBACKEND_CUDA_WAIT=stream", *(c for op in OPS for c in _checks(op))],
)
def test_stream_hold_survives_cache_frees(check: str) -> None:
    evaluate(_world.get(), check)
