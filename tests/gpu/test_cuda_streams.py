"""CUDA stream semantics of the ucx backend, under both ``cuda_wait`` modes.

* An op is ordered after the work already queued on the caller's current stream: a long kernel
  and then an in-place write of the input, then the op with no host synchronisation; the result
  must include the write. The same under ``with torch.cuda.stream(side)``, and for send/recv.
* ``Work.wait()`` (and a blocking call) makes the caller's current stream wait for the op: a
  copy of the output queued right after it must see the result (the op's input is written
  after a long kernel, so without that wait the copy would run while the op moves data).
* ``cuda_wait=host`` (the default, Gloo's semantics): ``Work.wait()`` returns only once the op
  has ended (the kernel before it has finished and ``is_completed()`` is True), and the outputs
  are then final on every stream (a copy on a fresh side stream, ordered after nothing, sees
  the result).
* ``cuda_wait=stream`` (NCCL's semantics): ``Work.wait()`` on a side stream does not block the
  host: it returns before a kernel queued after the op has finished (it did not synchronise the
  stream or the device), and before the op itself could have finished (its input is still
  being written by a long kernel). On the legacy default stream (PyTorch's default), which the
  gate never holds, it waits on the host as with ``cuda_wait=host``.
* The Work's Future is CUDA-aware: a ``.then()`` callback that reads the result on the
  current stream sees it.
* ``wait()`` under each of the stream pool's streams returns with the result: one of them is
  the group's internal stream, which the gate must not hold (the op queues its own work there).

Long kernels are ``torch.cuda._sleep``; "not finished yet" is an event recorded after the
kernel whose ``query()`` is still False. One world of two ranks on GPU 0 per mode
(``UCXBACKEND_CUDA_WAIT=host`` and ``=stream``) runs every check of that mode; each check is an
item.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from gpu.cuda_harness import Outcomes, WorldCache, cuda_world, evaluate, gpu_sleep, use_gpu0

# Long enough that the host checks right after issuing are surely inside the kernel, even with
# two ranks (and other tests) time-slicing the GPU.
LONG_MS = 400.0
N = 1 << 24  # 64 MiB of float32: moving it takes a while, so a missing wait shows


def _value(rank: int, step: int) -> float:
    return float(100 * step + rank + 1)


def _expected(ws: int, step: int) -> float:
    return sum(_value(r, step) for r in range(ws))


def _summary(t: Any) -> str:
    return f"min {t.min().item()}, max {t.max().item()}"


def _all_equal(t: Any, want: float) -> bool:
    return bool((t == want).all().item())


MODES = ("host", "stream")
# Streams per priority in c10's CUDA stream pool (c10/cuda/CUDAStream.cpp, kStreamsPerPool).
POOL_STREAMS = 32
POOL_CHECK = "wait() under each of the pool's streams, the group's own among them, ends right"
# The checks of wait_after_long_kernel that differ between the modes: with cuda_wait=host, and
# on the default stream with cuda_wait=stream, wait() waits on the host; on a side stream with
# cuda_wait=stream it holds the stream instead.
HOST_WAIT = (
    "wait() on the default stream returns only once the op has ended",
    "wait() on the default stream leaves the outputs final on every stream",
)
STREAM_ONLY = (
    "wait() on a side stream does not synchronise the stream",
    "wait() on a side stream does not wait for the op on the host",
)


def streams_main(rank: int, ws: int, mode: str) -> dict[str, dict[str, Any]]:
    import os

    import torch
    import torch.distributed as dist

    dev = use_gpu0()
    out = Outcomes(rank)
    out.check(
        f"the ranks run with UCXBACKEND_CUDA_WAIT={mode}",
        os.environ.get("UCXBACKEND_CUDA_WAIT") == mode,
        f"UCXBACKEND_CUDA_WAIT is {os.environ.get('UCXBACKEND_CUDA_WAIT')!r}",
    )

    def ordered_after_current_stream() -> None:
        step = 1
        x = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        gpu_sleep(LONG_MS)
        x.fill_(_value(rank, step))  # in place, after the long kernel, on the current stream
        dist.all_reduce(x)  # no host synchronisation before it
        y = x.clone()  # queued right after: the blocking call made the stream wait
        torch.cuda.synchronize()
        want = _expected(ws, step)
        out.check(
            "all_reduce ordered after the current stream's work",
            _all_equal(x, want),
            f"result {_summary(x)}, want {want} (the write before it was "
            f"{_value(rank, step)}; {ws * -1.0} means it read the input before the write)",
        )
        out.check(
            "blocking all_reduce makes the current stream wait",
            _all_equal(y, want),
            f"a clone queued right after the call saw {_summary(y)}, want {want}",
        )

    def wait_after_long_kernel(on_side: bool) -> None:
        # cuda_wait=stream holds only streams other than the legacy default one (PyTorch's
        # default): there wait() waits on the host, as with cuda_wait=host (docs/cuda.md).
        held = mode == "stream" and on_side
        step = 2 if not on_side else 8
        x = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        # A high-priority stream: never a group's internal stream (those are low-priority).
        side_stream = torch.cuda.Stream(priority=-1)
        scope: Any = torch.cuda.stream(side_stream) if on_side else contextlib.nullcontext()
        with scope:
            gpu_sleep(LONG_MS)
            x.fill_(_value(rank, step))
            before = torch.cuda.Event()
            before.record()  # done once the op's input is written: the op cannot finish earlier
            work = dist.all_reduce(x, async_op=True)
            issued_early = not before.query()
            completed_early = work.is_completed()
            gpu_sleep(LONG_MS)  # queued after the op
            after = torch.cuda.Event()
            after.record()
            t0 = time.monotonic()
            work.wait()
            waited = time.monotonic() - t0
            after_running = not after.query()
            before_running = not before.query()
            completed = work.is_completed()
            if not held:
                # Ordered after nothing on this rank's streams: sees the result only if the op's
                # writes are final on the device when wait() returns.
                side = torch.cuda.Stream()
                with torch.cuda.stream(side):
                    side_copy = x.clone()
            y = x.clone()  # on the current stream, after wait()
        torch.cuda.synchronize()
        want = _expected(ws, step)
        where = "a side stream" if on_side else "the default stream"
        out.check(
            "async all_reduce returns before its input is ready",
            issued_early,
            "all_reduce(async_op=True) returned only after the kernel before it had finished: "
            "it synchronised with the stream instead of queueing behind it",
        )
        out.check(
            "is_completed() is False before the op can have run",
            not completed_early,
            "is_completed() was True while the op's input was still being written",
        )
        if held:
            out.check(
                STREAM_ONLY[0],
                after_running,
                f"wait() returned after {waited:.3f} s, when a kernel queued after the op had "
                "finished: it synchronised the stream or the device",
            )
            out.check(
                STREAM_ONLY[1],
                before_running,
                f"wait() returned after {waited:.3f} s, when the op's input was ready: it "
                "blocked the host until the op could run instead of making the stream wait",
            )
        else:
            out.check(
                HOST_WAIT[0],
                not before_running and completed,
                f"wait() on {where} returned after {waited:.3f} s with the kernel before the op "
                f"{'still running' if before_running else 'finished'} and is_completed() "
                f"{completed}: it must block the host until the op has ended",
            )
            out.check(
                HOST_WAIT[1],
                _all_equal(side_copy, want),
                f"a clone on a fresh side stream right after wait() saw {_summary(side_copy)}, "
                f"want {want}: the op's writes were not final when wait() returned",
            )
        out.check(
            "async all_reduce's result is right after synchronize",
            _all_equal(y, want) and _all_equal(x, want),
            f"a clone queued after wait() saw {_summary(y)}; the output is {_summary(x)}; "
            f"want {want}",
        )

    def wait_orders_stream() -> None:
        # Nothing between wait() and the clone: without the stream waiting for the op, the
        # clone runs right after the write, while the op is still moving data.
        step = 7
        x = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        gpu_sleep(LONG_MS)
        x.fill_(_value(rank, step))
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        y = x.clone()
        torch.cuda.synchronize()
        want = _expected(ws, step)
        out.check(
            "wait() makes the current stream wait for the op",
            _all_equal(y, want),
            f"a clone queued right after wait() saw {_summary(y)}; want {want}",
        )

    def side_stream() -> None:
        step = 3
        side = torch.cuda.Stream()
        x = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            gpu_sleep(LONG_MS)
            x.fill_(_value(rank, step))
            dist.all_reduce(x)
            y = x.clone()  # on the side stream
        torch.cuda.synchronize()
        want = _expected(ws, step)
        out.check(
            "an op under torch.cuda.stream(s) is ordered after s's work",
            _all_equal(x, want),
            f"result {_summary(x)}, want {want}",
        )
        out.check(
            "a blocking op under torch.cuda.stream(s) makes s wait",
            _all_equal(y, want),
            f"a clone queued on s right after saw {_summary(y)}, want {want}",
        )

        # Issued on the side stream, waited for on the default stream.
        step = 4
        x = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            gpu_sleep(LONG_MS)
            x.fill_(_value(rank, step))
            work = dist.all_reduce(x, async_op=True)
        work.wait()  # the current stream is the default one again
        z = x.clone()
        torch.cuda.synchronize()
        want = _expected(ws, step)
        out.check(
            "wait() on another stream than the op's makes that stream wait",
            _all_equal(z, want),
            f"a clone on the default stream after wait() saw {_summary(z)}, want {want}",
        )

    def future_then() -> None:
        step = 5
        x = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        gpu_sleep(LONG_MS)
        x.fill_(_value(rank, step))
        fut = dist.all_reduce(x, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2).wait()
        torch.cuda.synchronize()
        want = 2 * _expected(ws, step)
        out.check(
            "the Work's future orders .then() after the op",
            _all_equal(doubled, want),
            f"the callback's result is {_summary(doubled)}, want {want}",
        )

    def send_recv() -> None:
        step = 6
        peer = 1 - rank
        buf = torch.full((N,), -1.0, device=dev)
        torch.cuda.synchronize()
        if rank == 0:
            gpu_sleep(LONG_MS)
            buf.fill_(_value(rank, step))
            dist.send(buf, peer)
            torch.cuda.synchronize()
            return
        work = dist.irecv(buf, peer)
        work.wait()
        copy = buf.clone()
        torch.cuda.synchronize()
        want = _value(peer, step)
        out.check(
            "send is ordered after the current stream's work; irecv's wait() orders the stream",
            _all_equal(copy, want) and _all_equal(buf, want),
            f"received {_summary(buf)}, a clone after wait() {_summary(copy)}, want {want}",
        )

    def every_pool_stream() -> None:
        # c10's stream pool hands out the same POOL_STREAMS streams round-robin, to the group
        # (its internal stream, taken at its first CUDA op, above) and to torch.cuda.Stream():
        # one of that many new streams in a row is the group's own. A wait() that held it at
        # the gate (cuda_wait=stream) would leave the op waiting for itself until its timeout.
        step = 9
        want = _expected(ws, step)
        wrong = []
        for i in range(POOL_STREAMS + 1):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x = torch.full((1024,), _value(rank, step), device=dev)
                work = dist.all_reduce(x, async_op=True)
                work.wait()
                y = x.clone()
            s.synchronize()
            if not _all_equal(y, want):
                wrong.append(f"stream {i}: {_summary(y)}")
        out.check(POOL_CHECK, not wrong, f"want {want}; " + "; ".join(wrong[:4]))

    out.run("all_reduce ordered after the current stream's work", ordered_after_current_stream)
    out.run(HOST_WAIT[0], lambda: wait_after_long_kernel(on_side=False))
    if mode == "stream":
        out.run(STREAM_ONLY[0], lambda: wait_after_long_kernel(on_side=True))
    out.run("wait() makes the current stream wait for the op", wait_orders_stream)
    out.run("an op under torch.cuda.stream(s) is ordered after s's work", side_stream)
    out.run("the Work's future orders .then() after the op", future_then)
    if ws == 2:
        out.run(
            "send is ordered after the current stream's work; irecv's wait() orders the stream",
            send_recv,
        )
        if rank == 0:  # only the receiver checks
            out.check(
                "send is ordered after the current stream's work; irecv's wait() orders the stream",
                True,
            )
    # Last: where it fails, the op times out and fails the group.
    out.run(POOL_CHECK, every_pool_stream)
    dist.barrier()
    return out.results


# Every mode's checks; HOST_WAIT and STREAM_ONLY are added per mode.
COMMON = (
    "all_reduce ordered after the current stream's work",
    "blocking all_reduce makes the current stream wait",
    "async all_reduce returns before its input is ready",
    "is_completed() is False before the op can have run",
    "async all_reduce's result is right after synchronize",
    "wait() makes the current stream wait for the op",
    "an op under torch.cuda.stream(s) is ordered after s's work",
    "a blocking op under torch.cuda.stream(s) makes s wait",
    "wait() on another stream than the op's makes that stream wait",
    "the Work's future orders .then() after the op",
    "send is ordered after the current stream's work; irecv's wait() orders the stream",
    POOL_CHECK,
)


def checks(mode: str) -> tuple[str, ...]:
    return (
        f"the ranks run with UCXBACKEND_CUDA_WAIT={mode}",
        *COMMON,
        *HOST_WAIT,
        *(STREAM_ONLY if mode == "stream" else ()),
    )


def _mode_world(mode: str) -> WorldCache:
    return WorldCache(
        lambda: cuda_world(streams_main, env={"UCXBACKEND_CUDA_WAIT": mode}, args=(mode,))
    )


_worlds = {mode: _mode_world(mode) for mode in MODES}


@pytest.mark.parametrize(
    ("mode", "check"), [(mode, check) for mode in MODES for check in checks(mode)]
)
def test_stream_semantics(mode: str, check: str) -> None:
    evaluate(_worlds[mode].get(), check)
