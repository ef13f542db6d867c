"""A quick CUDA smoke test of the ucx backend: two ranks on GPU 0, stage by stage.

    python scripts/gpu_smoke.py [--timeout 55]

Two ranks, started with multiprocessing's "spawn" (fresh interpreters: nothing of this
process's CUDA state reaches them), share GPU 0 with the backend's defaults and rendezvous over
``tcp://`` on a port picked at run time. Each rank prints every stage as it ends, with the
stage's time and the time since the rank started, so the last line of a rank that hangs or
crashes says where it stopped: ``init_process_group("ucx")``, a CPU all_reduce, a CUDA
all_reduce of 4 MiB (values checked), broadcast, all_gather_into_tensor, send/recv both ways,
all_reduce timed at 1, 16 and 64 MiB (bus bandwidth as nccl-tests counts it), and an async
all_reduce queued behind a long kernel (``torch.cuda._sleep``) on the default group and on a
group with ``pg_options={"cuda_wait": "stream"}`` (on the default stream and on a side stream),
with how long ``wait()`` blocked the host (about the kernel's length where wait() waits on the
host: ``cuda_wait=host``, and the default stream, which the gate never holds; about nothing
where it makes the stream wait: ``cuda_wait=stream`` on a side stream).

Deadlines: a rank still running ``--timeout`` - 5 seconds after this script started prints
every Python thread's stack (``faulthandler``) and exits; this process kills whatever is left
at ``--timeout``, and the other rank 10 s after one has failed. A crash (SIGSEGV) prints the
Python stack of the crashing thread.

What settles how UCX moves device memory, printed before the first op: the CUDA init stage
names torch's allocator backend (``native``; ``cudaMallocAsync`` pools, and
``expandable_segments`` in ``PYTORCH_CUDA_ALLOC_CONF``, are memory that cuda_ipc may fail to
export) and the UCX variables set; the init stage names the transports below the group (UCX's
list, ``cuda_ipc`` among them, or ``shm``: not UCX). UCX prints every protocol it selects
(``UCX_PROTO_INFO=y``, unless set otherwise): a CUDA send must read "from cuda/GPU0" (with
"from host memory" UCX took the tensor for host memory: a crash or a hang in a host copy) and
its rendezvous rows name the transport (``cuda_ipc`` zero-copy, or staging through host
buffers). The ranks' C ``stdout`` is line-buffered so that those lines survive a rank killed
at the deadline.

Exit status: 0 every stage passed on both ranks; 1 a stage failed, a rank crashed or hung;
77 (SKIP) no CUDA here (torch without CUDA, or no device): nothing ran. The environment passes
to the ranks: ``UCXBACKEND_PROGRESS_MODE=poll``, ``UCXBACKEND_CUDA_WAIT``, ``UCX_TLS=^cuda_ipc``
and the like apply to both.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The in-place build, importable in this process and in the spawned ranks (which run this file
# again as __mp_main__ with this process's sys.path).
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SKIP = 77
WORLD = 2
MIB = 1 << 20
SLEEP_MS = 500.0
# torch.cuda._sleep spins this many GPU clock cycles per millisecond asked for (as the tests'
# tests/gpu/cuda_harness.py): at least as long as asked on an H100/H200.
CYCLES_PER_MS = 2_000_000
PG_TIMEOUT_S = 20.0
DEVICE = "cuda:0"
# What the ranks get unless the caller set it: UCX prints each protocol it selects, with the
# memory type it detected (module docstring).
RANK_ENV_DEFAULTS = {"UCX_PROTO_INFO": "y"}
# The UCX variables worth naming in the log when set (the ranks inherit them).
UCX_FACTS = ("UCX_TLS", "UCX_MEMTYPE_CACHE", "UCX_RNDV_SCHEME", "UCX_PROTO_ENABLE", "UCX_MODULES")


class StageFailed(Exception):
    pass


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise StageFailed(what)


def line_buffer_c_stdout() -> None:
    """Make this process's C ``stdout`` line-buffered. UCX prints with C stdio, which buffers
    fully into a pipe or a file; a rank that ends in ``os._exit`` (a failed stage, the hang
    deadline) would lose what UCX printed. Must run before anything writes to C ``stdout``
    (Python's own ``sys.stdout`` does not go through it)."""
    try:
        libc = ctypes.CDLL(None)
        stream = ctypes.c_void_p.in_dll(libc, "stdout")
        libc.setvbuf(stream, None, 1, 0)  # _IOLBF
    except (OSError, ValueError, AttributeError):
        pass  # not glibc: UCX's lines may then come late or not at all


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, port: int, deadline_at: float) -> None:
    # A crash prints the crashing thread's Python stack; a hang prints every thread's at the
    # deadline, then exits (status 1).
    faulthandler.enable(all_threads=True)
    faulthandler.dump_traceback_later(max(1.0, deadline_at - time.monotonic()), exit=True)
    line_buffer_c_stdout()
    # all_gather_into_tensor is the name torch 2.11 has; newer ones call it deprecated.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.* is deprecated")
    started = time.monotonic()

    def say(line: str) -> None:
        # One write per line: the two ranks' lines do not interleave.
        sys.stdout.write(f"[rank {rank}] {line}\n")
        sys.stdout.flush()

    def stage(name: str, fn: Callable[[], str | None]) -> None:
        t0 = time.monotonic()
        try:
            detail = fn()
        except Exception as exc:
            dt = time.monotonic() - t0
            say(f"FAIL {name} after {dt:.2f} s: {type(exc).__name__}: {exc}")
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            os._exit(1)  # no teardown: the peer may be stuck in the op
        dt = time.monotonic() - t0
        tail = f"  {detail}" if detail else ""
        say(f"ok   {name:<44} {dt:7.2f} s  (t={time.monotonic() - started:.1f} s){tail}")

    mods: dict[str, Any] = {}

    def imports() -> str:
        import torch
        import torch.distributed as dist

        import ucxbackend

        mods.update(torch=torch, dist=dist)
        return f"torch {torch.__version__}, ucxbackend {ucxbackend.__version__}"

    stage("import torch, ucxbackend", imports)
    torch, dist = mods["torch"], mods["dist"]
    from datetime import timedelta

    dev = torch.device(DEVICE)

    def cuda_init() -> str:
        torch.cuda.set_device(0)
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
        ucx = [f"{k}={os.environ[k]}" for k in (*UCX_FACTS, *RANK_ENV_DEFAULTS) if k in os.environ]
        return (
            f"{torch.cuda.get_device_name(0)}; allocator {torch.cuda.get_allocator_backend()}, "
            f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}; "
            f"{' '.join(ucx) or 'no UCX variables set'}"
        )

    stage("CUDA init (GPU 0)", cuda_init)

    def init() -> str:
        import ucxbackend

        dist.init_process_group(
            "ucx",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=PG_TIMEOUT_S),
        )
        # cuda_ipc must be among them, and not "shm" (the one-host transport, host memory only).
        return f"transports {ucxbackend.startup_profile()['transports']}"

    stage('init_process_group("ucx")', init)
    total = float(sum(range(1, WORLD + 1)))  # rank r contributes r + 1

    def cpu_all_reduce() -> None:
        t = torch.full((1024,), float(rank + 1))
        dist.all_reduce(t)
        expect(bool((t == total).all()), f"got {t.min().item()}..{t.max().item()}, want {total}")

    stage("CPU all_reduce", cpu_all_reduce)

    def cuda_all_reduce() -> None:
        t = torch.full((4 * MIB // 4,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        got = t.cpu()
        expect(
            bool((got == total).all()), f"got {got.min().item()}..{got.max().item()}, want {total}"
        )

    stage("CUDA all_reduce 4 MiB", cuda_all_reduce)

    def broadcast() -> None:
        t = torch.full((4 * MIB // 4,), 7.0 if rank == 0 else -1.0, device=dev)
        dist.broadcast(t, src=0)
        got = t.cpu()
        expect(bool((got == 7.0).all()), f"got {got.min().item()}..{got.max().item()}, want 7")

    stage("CUDA broadcast 4 MiB from rank 0", broadcast)

    def all_gather() -> None:
        n = MIB // 4
        out = torch.empty(WORLD * n, device=dev)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank + 1), device=dev))
        got = out.cpu()
        for r in range(WORLD):
            part = got[r * n : (r + 1) * n]
            expect(
                bool((part == r + 1).all()),
                f"rank {r}'s part is {part.min().item()}.., want {r + 1}",
            )

    stage("CUDA all_gather_into_tensor 1 MiB per rank", all_gather)

    def send_recv() -> None:
        n = 4 * MIB // 4
        for src in range(WORLD):
            dst = (src + 1) % WORLD
            value = float(10 + src)
            if rank == src:
                dist.send(torch.full((n,), value, device=dev), dst)
            elif rank == dst:
                buf = torch.full((n,), -1.0, device=dev)
                dist.recv(buf, src)
                got = buf.cpu()
                expect(
                    bool((got == value).all()), f"from {src}: {got.min().item()}.., want {value}"
                )

    stage("CUDA send/recv 4 MiB, both ways", send_recv)

    def timed(mib: int) -> str:
        n = mib * MIB // 4
        x = torch.ones(n, device=dev)
        warmup, iters = 3, 10
        for _ in range(warmup):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        want = float(WORLD ** (warmup + iters))
        got = x[:1].item(), x[-1:].item()
        expect(got == (want, want), f"got {got}, want {want}")
        algbw = mib * MIB / dt / 1e9
        busbw = algbw * 2 * (WORLD - 1) / WORLD
        return f"{dt * 1e6:9.0f} us/op  algbw {algbw:6.2f} GB/s  busbw {busbw:6.2f} GB/s"

    for mib in (1, 16, 64):
        stage(f"CUDA all_reduce {mib} MiB, timed", lambda mib=mib: timed(mib))

    def wait_after_kernel(group: Any, side: bool = False) -> str:
        x = torch.full((16 * MIB // 4,), float(rank + 1), device=dev)
        torch.cuda.synchronize()
        # cuda_wait=stream holds a side stream only, never the legacy default one nor a group's
        # internal stream (a low-priority pool stream: a high-priority one never is).
        stream = torch.cuda.Stream(priority=-1) if side else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(SLEEP_MS * CYCLES_PER_MS))  # the op's input is ready after it
            work = dist.all_reduce(x, group=group, async_op=True)
            t0 = time.monotonic()
            work.wait()
            blocked = time.monotonic() - t0
            y = x.clone()  # on the current stream, right after wait()
        torch.cuda.synchronize()
        total_s = time.monotonic() - t0
        got = y.cpu()
        expect(
            bool((got == total).all()),
            f"a clone after wait() saw {got.min().item()}.., want {total}",
        )
        return (
            f"wait() blocked the host {blocked:.3f} s (the kernel before the op: "
            f"{SLEEP_MS / 1000:.1f} s or more; wait() to synchronize: {total_s:.3f} s)"
        )

    mode = os.environ.get("UCXBACKEND_CUDA_WAIT") or "unset: host"
    stage(
        f"wait() after a kernel, default group (UCXBACKEND_CUDA_WAIT={mode})",
        lambda: wait_after_kernel(None),
    )
    groups: dict[str, Any] = {}

    def stream_group() -> None:
        groups["stream"] = dist.new_group(backend="ucx", pg_options={"cuda_wait": "stream"})

    stage('new_group(pg_options={"cuda_wait": "stream"})', stream_group)
    stage(
        "wait() after a kernel, cuda_wait=stream, default stream",
        lambda: wait_after_kernel(groups["stream"]),
    )
    stage(
        "wait() after a kernel, cuda_wait=stream, side stream",
        lambda: wait_after_kernel(groups["stream"], side=True),
    )

    def teardown() -> None:
        dist.barrier()
        dist.destroy_process_group()

    stage("barrier, destroy_process_group", teardown)
    faulthandler.cancel_dump_traceback_later()


def _status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--timeout", type=float, default=55.0, help="seconds before every rank is killed (55)"
    )
    args = parser.parse_args()
    start = time.monotonic()
    faulthandler.enable()

    import torch

    if not torch.backends.cuda.is_built():
        print(f"gpu_smoke: skipped: no CUDA: torch {torch.__version__} is built without CUDA")
        return SKIP
    if not torch.cuda.is_available():
        print(
            "gpu_smoke: skipped: no CUDA: torch.cuda.is_available() is False "
            f"(torch {torch.__version__})"
        )
        return SKIP

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name, value in RANK_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    port = free_port()
    # CLOCK_MONOTONIC is one clock for every process of the machine: the ranks read this deadline.
    rank_deadline = start + max(5.0, args.timeout - 5.0)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=rank_main, args=(r, port, rank_deadline), name=f"rank{r}")
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    print(
        f"gpu_smoke: {WORLD} ranks on GPU 0, tcp://127.0.0.1:{port}, deadline {args.timeout:.0f} s",
        flush=True,
    )

    failed_at: float | None = None
    while True:
        codes = [p.exitcode for p in procs]
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if now - start > args.timeout or (failed_at is not None and now - failed_at > 10.0):
            why = "deadline" if now - start > args.timeout else "a rank failed 10 s ago"
            for p in procs:
                if p.exitcode is None:
                    print(f"gpu_smoke: killing {p.name} ({why})", flush=True)
                    p.kill()
            for p in procs:
                p.join(5.0)
            break
        time.sleep(0.1)

    elapsed = time.monotonic() - start
    bad = [f"{p.name} {_status(p.exitcode)}" for p in procs if p.exitcode != 0]
    if bad:
        print(f"gpu_smoke: FAILED after {elapsed:.1f} s: {'; '.join(bad)}", flush=True)
        return 1
    print(f"gpu_smoke: passed in {elapsed:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
