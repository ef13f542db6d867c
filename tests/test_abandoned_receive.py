"""A receive that a failed op gave up, and that UCX could not stop, writes on into its buffer
after the op has ended: that buffer must still be there.

UCX cannot cancel a receive already matched to an eager message whose last fragments are still
arriving, and closing the sender's endpoint (abortPeer) does not stop it either: a tag receive
belongs to the worker. Rank 0 broadcasts into a strided tensor, so the backend receives into a
contiguous copy of its own (csrc/collective_ops.cpp), which the op's body frees as it ends.
Rank 1, the root, sends eager (``UCX_RNDV_THRESH=inf``) through UCX's shared memory, while
rank 0's progress thread is held in a Future callback: only the fragments its FIFO holds get
through before the callback stops rank 1 (SIGSTOP). Rank 0's receive then matches that part,
its op times out with the receive matched, and once the op has failed rank 0 lets rank 1 go on
(SIGCONT): the rest arrives in rank 0's idle progress. Until 2026-11-27 the copy was freed as
the op ended (unmapped, at this size) and rank 0 died there of SIGSEGV; now the request holds
it (Comm::keep). The mechanism alone, with a transport of held receives in place of UCX:
``abandoned_receive`` in tests/cpp/algorithms/abandoned_wire_groups.cpp.

The same with a contiguous tensor, received into in place, which the caller grows with
``resize_()`` once the op has failed: until 2026-11-27 the failed Work made its storage
resizable again, the resize freed the memory the receive writes into, and rank 0 died of
SIGSEGV; now the storage stays pinned while such a request holds the Work, and the resize
raises (docs/failure-model.md#a-pending-ops-tensors).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world
from world_pool import pooled

# float32 elements: a 36 MiB message, whose copy is larger than glibc's largest mmap threshold
# (32 MiB), so that freeing it unmaps it and a late write faults at once.
ELEMENTS = 9 << 20
# How long rank 0's progress thread is held: rank 1 fills rank 0's FIFO well within it.
HOLD_S = 2.0
# Rank 0's op timeout (rank 1's is the world's): it fails while rank 1 is stopped.
OP_TIMEOUT_S = 3.0
# How long rank 0 drives its transport after letting rank 1 go on, for the late fragments.
LATE_S = 2.0
ENV = {
    # Every fragment eager, and no shared-memory slots of the backend's own (the broadcast
    # then goes through UCX's shared memory, whose FIFO holds a few hundred KiB).
    "UCX_RNDV_THRESH": "inf",
    "UCXBACKEND_SHARED_MEMORY": "off",
    # UCX's behaviour is what this reproduces (the shm transport settles a receive it gave up
    # at once, and reads a message this long by reference, in one call).
    "UCXBACKEND_ONE_HOST_TRANSPORT": "ucx",
}


def _late_fragments(rank: int, ws: int, strided: bool) -> Any:
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid{rank}", str(os.getpid()))
    peer = int(store.get(f"pid{1 - rank}"))
    timeout = OP_TIMEOUT_S if rank == 0 else 60.0
    group = dist.new_group([0, 1], timeout=timedelta(seconds=timeout))
    if rank == 1:
        store.get("armed")  # rank 0's callback is in place: its thread is held at this send
        dist.send(torch.ones(1), 0, group=group, tag=7)
        work = dist.broadcast(torch.ones(ELEMENTS), src=1, group=group, async_op=True)
        try:
            work.wait()
        except RuntimeError as exc:
            return f"failed: {exc}"
        return "sent"

    held = threading.Event()

    def hold(_: Any) -> None:  # on rank 0's progress thread, which UCX then waits for
        held.set()
        time.sleep(HOLD_S)
        os.kill(peer, signal.SIGSTOP)

    marker = dist.irecv(torch.zeros(1), 1, group=group, tag=7)
    marker.get_future().then(hold)
    store.set("armed", "1")
    assert held.wait(timeout=60), "rank 1's first message never came"
    into = torch.zeros(ELEMENTS, 2)[:, 0] if strided else torch.zeros(ELEMENTS)
    resize = "not tried"
    try:
        dist.broadcast(into, src=1, group=group)
        error = "no error"
    except RuntimeError as exc:
        error = str(exc)
        if not strided:
            try:
                into.resize_(2 * ELEMENTS)
                resize = "grown"
            except RuntimeError as refused:
                resize = str(refused)
    finally:
        os.kill(peer, signal.SIGCONT)
    time.sleep(LATE_S)  # rank 0's idle progress takes the rest of the message in
    return error, resize


UCX_ONLY = "UCX's cancel semantics (udp stops at once)"


# The two worlds run side by side (tests/world_pool.py): each is mostly rank 0 held, stopped or
# waiting out its op timeout and the late fragments, about 6 s of sleeps.
def _world(strided: bool) -> Any:
    if BACKEND != "ucx":
        return None  # the test skips
    return run_world(_late_fragments, 2, env=ENV, args=(strided,), timeout=120)


@pytest.mark.skipif(BACKEND != "ucx", reason=UCX_ONLY)
@pooled(functools.partial(_world, True))
def test_a_receive_given_up_writes_into_a_copy_it_still_holds(
    pooled_result: Callable[[], Any],
) -> None:
    error, _ = pooled_result()[0]
    assert "no progress before the timeout" in error, error


@pytest.mark.skipif(BACKEND != "ucx", reason=UCX_ONLY)
@pooled(functools.partial(_world, False))
def test_a_failed_ops_tensor_stays_pinned_while_a_receive_writes_into_it(
    pooled_result: Callable[[], Any],
) -> None:
    error, resize = pooled_result()[0]
    assert "no progress before the timeout" in error, error
    assert "not resizable" in resize, resize
