"""Multi-process harness for the torch.distributed tests.

``run_world(fn, world_size)`` starts ``world_size`` fresh processes,
initialises a process group in each, calls ``fn(rank, world_size, *args)`` and
returns the per-rank results in rank order.  ``fn`` must be a module-level
function and its result must be picklable.

The ranks are forked from a fork server that has imported torch, numpy,
ucxbackend and pytest once (``PRELOAD``): importing torch costs a rank ~2 s of CPU, and the
suite starts well over a thousand ranks on two cores.  A rank whose environment
differs from the server's in a variable read at import time (``IMPORT_TIME_ENV``,
e.g. ``TORCH_DISTRIBUTED_DEBUG`` or ``UCX_*``) is spawned from scratch instead,
so that it sees the variable exactly as a real job would.

The parent never waits forever: past ``timeout`` every child still alive is
SIGKILLed and ``TimeoutError`` names the ranks that had not reported.  When a
rank fails, the other ranks get ``FAIL_GRACE`` seconds to report before they
are killed, then ``AssertionError`` carries every failing rank's traceback.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

BACKEND: str = os.environ.get("UCXB_TEST_BACKEND", "ucx")

# After the first failure, how long the other ranks get to report.
FAIL_GRACE = 10.0
# A dead child's report is never in flight: _child exits only after its queue's feeder thread
# has written the whole report into the pipe (join_thread), so a child seen dead whose report a
# later poll of the queue still does not find died without reporting. (A fixed 2 s grace here
# cost every test that kills a rank 2 s of wall.)

# What ranks import; the fork server imports it once for all of them. Functional collectives
# and FSDP pull in torch._dynamo (~2 s of CPU a rank, lazily, at the first such call). A rank
# imports its fn's module, a test file, and with it pytest: about 0.09 s of CPU, more than a
# small world's rank spends on its group and ops (docs/testing.md).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "numpy",
    "ucxbackend",
    "pytest",
)
# Variables that torch, UCX (global options, read when libucs loads) or ucxbackend (the log
# level) read when they are imported: a rank that needs other values than the fork server had
# must import them itself.
IMPORT_TIME_ENV = ("TORCH_", "PYTORCH_", "UCX_", "UCXBACKEND_LOG_LEVEL", "OMP_", "MKL_", "KMP_")
# Variables under those prefixes that are read on first use, not at import: a forked rank that
# has them before its first group sees them as a real job does. TORCH_FR_BUFFER_SIZE sizes
# torch's Flight Recorder and ours (csrc/flight_recorder.cpp), each built at its first use;
# tests/test_flight_recorder.py fails if either was built without it. UCX_TLS is read when a
# group makes its UCX context (transports/ucx/ucx_context.cpp, and UCX's ucp_config_read
# there), not when libucs loads; tests/test_fold_receive.py (no folded receive without
# tcp,self) and tests/test_shared_memory.py (staging on without ^sm) fail if a rank's context
# was made without it.
FIRST_USE_ENV = ("TORCH_FR_BUFFER_SIZE", "UCX_TLS")

_forkserver_env: dict[str, str] | None = None  # the import-time variables the server started with


def _import_time_env(env: dict[str, str]) -> dict[str, str]:
    # OMP_NUM_THREADS is left out: every rank applies it with torch.set_num_threads().
    return {
        k: v
        for k, v in env.items()
        if k.startswith(IMPORT_TIME_ENV) and k not in ("OMP_NUM_THREADS", *FIRST_USE_ENV)
    }


def _context_for(env: dict[str, str]) -> Any:
    """The fork server when ``env`` agrees with it on every import-time variable, else spawn."""
    global _forkserver_env
    if _forkserver_env is None:
        # The server starts on the first Process.start() and keeps the environment of then.
        mp.set_forkserver_preload(list(PRELOAD))
        _forkserver_env = _import_time_env(dict(os.environ))
    if _import_time_env(env) == _forkserver_env:
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def timed_failure(call: Callable[[], object]) -> tuple[float, str | None]:
    """Runs ``call`` and returns (seconds it took, its error message or None if it returned).

    For tests that expect an op to fail, and to fail well before the group's timeout.
    """
    start = time.monotonic()
    try:
        call()
    except RuntimeError as exc:
        return time.monotonic() - start, str(exc)
    return time.monotonic() - start, None


def error_of(create: Callable[[], object]) -> str:
    """``create()``'s error as "<type>: <message>", or "created" when it returned: for tests
    that check what creating a group raises on each rank."""
    try:
        create()
    except Exception as exc:  # any error is the answer here
        return f"{type(exc).__name__}: {exc}"
    return "created"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(
    fn_ref: tuple[str, str],
    rank: int,
    world_size: int,
    backend: str,
    init_method: str,
    env: dict[str, str],
    args: tuple[Any, ...],
    pg_timeout: float,
    results: Any,
) -> None:
    try:
        # The whole environment, not an update: a forked rank starts with the fork server's.
        os.environ.clear()
        os.environ.update(env)
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        # fn is imported only now, so that in a spawned rank the environment above is in
        # place before its module (and torch) is imported.
        fn = getattr(importlib.import_module(fn_ref[0]), fn_ref[1])
        import torch
        import torch.distributed as dist

        # torch may have been imported before the environment was set (e.g. by
        # the parent's __main__ being re-imported): apply the thread count anyway.
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

        if "ucx" in backend or "udp" in backend:
            import ucxbackend  # noqa: F401  (registers the ucx and udp backends)

        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout),
        )
        result = fn(rank, world_size, *args)
        dist.destroy_process_group()
        # Pickled here, as bytes: a failure shows up in this rank, not silently in the queue's
        # feeder thread, and tensors travel by value (torch would otherwise share their memory
        # with this process, which exits right after reporting).
        msg: tuple[int, str, Any] = (rank, "ok", pickle.dumps(result))
    except BaseException:  # everything goes back to the parent
        msg = (rank, "err", traceback.format_exc())
    results.put(msg)
    results.close()
    results.join_thread()
    # Skip interpreter teardown: a broken backend must not hang the exit.
    os._exit(0)


def run_world(
    fn: Callable[..., Any],
    world_size: int,
    *,
    backend: str | None = None,
    timeout: float = 120.0,
    init: str = "file",
    env: dict[str, str] | None = None,
    args: tuple[Any, ...] = (),
    pg_timeout: float = 60.0,
    expect_fail_ranks: set[int] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return results by rank.

    ``init`` is "file", "tcp" or "env".  Ranks in ``expect_fail_ranks`` may die
    without reporting; their result is then ``None``.
    """
    if "." in fn.__qualname__:
        raise ValueError(f"fn must be a module-level function, got {fn.__qualname__}")
    fn_ref = (fn.__module__, fn.__qualname__)
    backend = backend or BACKEND
    expect_fail = expect_fail_ranks or set()
    with tempfile.TemporaryDirectory(prefix="ucxb_test_") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        if init == "file":
            init_method = "file://" + os.path.join(tmp, "store")
        elif init == "tcp":
            init_method = f"tcp://127.0.0.1:{free_port()}"
        elif init == "env":
            init_method = "env://"
            env["MASTER_PORT"] = str(free_port())
            env["WORLD_SIZE"] = str(world_size)
        else:
            raise ValueError(f"unknown init {init!r}")

        ctx = _context_for(env)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_child,
                args=(fn_ref, r, world_size, backend, init_method, env, args, pg_timeout, results),
                name=f"rank{r}",
                daemon=True,
            )
            for r in range(world_size)
        ]
        reports: dict[int, tuple[str, Any]] = {}
        died: dict[int, int] = {}  # rank -> exit code, for ranks gone without a report
        seen_dead: set[int] = set()  # exited, not yet confirmed by an empty poll since
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + timeout
            while len(reports) + len(died) < world_size:
                now = time.monotonic()
                if now >= deadline:
                    break
                try:
                    rank, status, value = results.get(timeout=min(0.1, deadline - now))
                    reports[rank] = (status, value)
                    if status == "err":
                        deadline = min(deadline, time.monotonic() + FAIL_GRACE)
                    continue
                except queue_mod.Empty:
                    pass
                # Here the last poll found the queue empty: a rank already seen dead before
                # it would have had its report there.
                now = time.monotonic()
                for r, p in enumerate(procs):
                    if r in reports or r in died or p.exitcode is None:
                        continue
                    if r not in seen_dead:
                        seen_dead.add(r)
                        continue
                    died[r] = p.exitcode
                    if r not in expect_fail:
                        deadline = min(deadline, now + FAIL_GRACE)
        finally:
            started = [p for p in procs if p.pid is not None]  # start() may have failed
            for p in started:
                if p.is_alive():
                    p.kill()
            for p in started:
                p.join()
            results.close()

    missing = [r for r in range(world_size) if r not in reports and r not in died]
    errors = [f"[rank {r}] {v}" for r, (s, v) in sorted(reports.items()) if s == "err"]
    errors += [
        f"[rank {r}] died without reporting (exit code {code})"
        for r, code in sorted(died.items())
        if r not in expect_fail
    ]
    if errors:
        if missing:
            errors.append(f"ranks {missing} had not reported and were killed")
        raise AssertionError("\n".join(errors))
    if missing:
        raise TimeoutError(
            f"ranks {missing} had not reported after {timeout:.0f}s; killed "
            f"(world_size={world_size}, backend={backend})"
        )
    return [pickle.loads(reports[r][1]) if r in reports else None for r in range(world_size)]
