"""ucxbackend: a ``torch.distributed`` backend named ``ucx`` over UCX tag messaging.

Importing this package registers the backend::

    import torch.distributed as dist
    import ucxbackend  # noqa: F401  (registers "ucx")

    dist.init_process_group("ucx")                # cpu tensors over UCX
    dist.init_process_group("udp")                # the same collectives over our UDP transport

Per-group options go in ``pg_options`` (:class:`Options` or a dict); process-wide defaults come
from ``UCXBACKEND_*`` environment variables (see :mod:`ucxbackend.config`).

If the native extension ``ucxbackend._C`` cannot be loaded, the import still succeeds (so that
the configuration and ``python -m ucxbackend info`` work), :func:`is_available` returns False,
and creating a ``ucx`` process group raises a RuntimeError that carries the original error.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import logging
import os
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from . import _transport_options
from .config import Config, Options, coerce_options

if TYPE_CHECKING:
    from datetime import timedelta

    from torch._C._distributed_c10d import Backend as C10dBackend
    from torch._C._distributed_c10d import ErrorType

__version__ = "0.1.0"

__all__ = [
    "BACKEND_NAME",
    "Config",
    "Options",
    "__version__",
    "get_config",
    "get_error",
    "inline_stats",
    "is_available",
    "load_error",
    "shared_memory",
    "startup_profile",
    "stats",
    "trace_samples",
    "wait_stats",
]

BACKEND_NAME = "ucx"
UDP_BACKEND_NAME = "udp"
# The backends this package registers, each a transport under the same collectives.
BACKEND_NAMES = (BACKEND_NAME, UDP_BACKEND_NAME)
DEVICES = ("cpu", "cuda")

logger = logging.getLogger(__name__)

_C: ModuleType | None = None
_C_error: BaseException | None = None


def _load_native() -> None:
    """Import ``ucxbackend._C``; remember the error instead of raising.

    The extension finds its UCX through the RUNPATH recorded at build time and nothing else:
    if that UCX has moved, loading fails with a clear error rather than picking up another copy.
    """
    global _C, _C_error
    # Not `from . import _C`: that would find the module-level `_C = None` placeholder.
    try:
        _C = importlib.import_module(f"{__name__}._C")
        _C_error = None
    except ImportError as exc:
        _C_error = exc


def is_available() -> bool:
    """Whether the native extension is loaded, i.e. ``ucx`` process groups can be created."""
    return _C is not None


def load_error() -> str | None:
    """Why the native extension could not be loaded (``None`` when it was)."""
    if _C_error is None:
        return None
    return f"{type(_C_error).__name__}: {_C_error}"


def get_config(
    pg_options: Options | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """The configuration a process group created now with ``pg_options`` would get.

    With no arguments: the process-wide configuration (defaults overridden by the
    ``UCXBACKEND_*`` variables of ``os.environ``). Raises ValueError on a bad value.
    """
    return coerce_options(pg_options).resolve(env)


def _native_missing_error() -> RuntimeError:
    return RuntimeError(
        "the ucx backend's native extension ucxbackend._C could not be loaded "
        f"({load_error()}); run `make build` (or `pip install --no-build-isolation .`) "
        "and see `python -m ucxbackend info`"
    )


def _create_ucx_backend(dist_backend_opts: Any, backend_options: object) -> C10dBackend:
    """Creator of ``ucx`` groups, registered with ``extended_api=True``.

    ``dist_backend_opts`` is a ``c10d::DistributedBackendOptions``; ``backend_options`` is
    what the user passed as ``pg_options``.
    """
    return _create_backend(dist_backend_opts, backend_options, BACKEND_NAME)


def _create_udp_backend(dist_backend_opts: Any, backend_options: object) -> C10dBackend:
    """Creator of ``udp`` groups: the same collectives over UDP and our reliability layer."""
    return _create_backend(dist_backend_opts, backend_options, UDP_BACKEND_NAME)


def _create_backend(
    dist_backend_opts: Any, backend_options: object, transport: str
) -> C10dBackend:
    config = coerce_options(backend_options).resolve()  # TypeError / ValueError first
    if _C is None:
        raise _native_missing_error()
    rank: int = dist_backend_opts.group_rank
    size: int = dist_backend_opts.group_size
    timeout: timedelta = dist_backend_opts.timeout
    group_id: str = str(dist_backend_opts.group_id)
    # torch passes [] for the default group; the native side always gets the real list.
    global_ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(size))
    if config.sources["log_level"] == "pg_options":
        # The Python logger is process-wide: an explicit per-group level wins from now on.
        logger.setLevel(config.logging_level)
    native = config.to_native()
    native["transport"] = transport
    if transport == UDP_BACKEND_NAME:
        native.update(_transport_options.native_options(config, dist_backend_opts.store))
        _warn_small_udp_buffer(native, size)
    else:
        _leave_unused_ucx_modules_out()
        # The group's own UCX context takes the devices; the process environment is left alone.
        native["ucx_net_devices"] = _transport_options.ucx_net_devices(
            config, dist_backend_opts.store
        )
    logger.debug(
        "creating %s process group %r: rank %d/%d, global ranks %s, timeout %s, options %s",
        transport,
        group_id,
        rank,
        size,
        global_ranks,
        timeout,
        native,
    )
    backend: C10dBackend = _C.create_backend(
        dist_backend_opts.store,
        rank,
        size,
        timeout,
        group_id,
        global_ranks,
        native,
    )
    return backend


def _torch_holds_device_memory() -> bool:
    """Whether this torch can make the device tensors a ucx group may carry: built with CUDA
    or ROCm (HIP, whose tensors are torch's "cuda" device). Only then does UCX need its device
    modules (``kDeviceModules`` in transports/ucx/ucx_context.h)."""
    return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None


@functools.cache
def _leave_unused_ucx_modules_out() -> None:
    """Before the first ucx group's UCX context: a torch without device memory keeps UCX from
    loading its GPU modules, which would only cost start-up (docs/performance.md#start-up).
    Once per process: UCX loads its modules once, and a UCX_MODULES of the user's wins."""
    if not _torch_holds_device_memory():
        assert _C is not None
        _C.ucx_leave_device_modules_out()


def _warn_small_udp_buffer(native: dict[str, str], size: int) -> None:
    """Logs a warning when the kernel caps a udp group's receive buffer below its window."""
    assert _C is not None
    try:
        udp_config = native.get("udp_config", "")
        receive, _ = _C.udp.socket_buffers(native.get("udp_host", "127.0.0.1"), udp_config)
        described = _C.udp.describe_config(udp_config)
        knobs = dict(kv.split("=", 1) for kv in described.split(","))
        window = int(knobs["send_window_bytes"])
        requested = int(knobs["socket_buffer_bytes"])
    except (RuntimeError, ValueError, KeyError) as exc:  # the group itself will say more
        logger.debug("udp: could not check the socket buffer: %s", exc)
        return
    message = _transport_options.socket_buffer_warning(receive, requested, window, size - 1)
    if message is not None:
        logger.warning(message)


def _register() -> None:
    """Register ``ucx`` and ``udp`` with torch.distributed; a no-op for those already done."""
    plugins = getattr(dist.Backend, "_plugins", {})
    creators = ((BACKEND_NAME, _create_ucx_backend), (UDP_BACKEND_NAME, _create_udp_backend))
    for name, creator in creators:
        current = plugins.get(name.upper())
        if current is not None:
            fn = current.creator_fn
            if (
                getattr(fn, "__module__", None) == __name__
                and getattr(fn, "__qualname__", None) == creator.__qualname__
                and current.extended_api
            ):
                continue
            logger.warning("replacing the %r backend registered by %r", name, fn)
        dist.Backend.register_backend(name, creator, extended_api=True, devices=list(DEVICES))


def _stop_groups_at_exit() -> None:
    """Stop the progress thread of every ucx/udp group still alive at interpreter exit.

    A program that exits without ``destroy_process_group`` leaves the groups to Python's
    finalization, which ends any thread that then takes the GIL with ``pthread_exit``. A
    progress thread that dropped the last reference to an op's tensors there (their Python
    objects need the GIL) was unwound through a noexcept destructor, and the process died
    with "terminate called without an active exception". atexit handlers run before that,
    while threads may still take the GIL: the groups are shut down here (the binding releases
    the GIL while the thread ends), as ``destroy_process_group`` would.
    """
    world = getattr(dist.distributed_c10d, "_world", None)
    for pg in list(getattr(world, "pg_map", None) or {}):
        try:
            _native_backend(pg, "exit").shutdown()
        except (ValueError, RuntimeError) as exc:  # not ours, or already gone
            logger.debug("at exit: group %r not shut down: %s", pg, exc)


def _allow_nocolor_split() -> None:
    """Give torch's Backend binding a no-op ``perform_nocolor_split`` where it has none.

    With a default group bound to a device (``init_process_group(device_id=...)``) whose backend
    supports splitting, torch 2.13's ``new_group`` calls ``perform_nocolor_split`` on the ranks
    left out of the new group: NCCL's split is collective over the parent, ours is not, and the
    Backend binding that a ucx/udp group comes as lacks the method (an AttributeError on those
    ranks). ProcessGroupNCCL keeps its own.
    """
    backend_cls = getattr(torch._C._distributed_c10d, "Backend", None)
    if backend_cls is not None and not hasattr(backend_cls, "perform_nocolor_split"):

        def perform_nocolor_split(self: Any, device: torch.device) -> None:
            """Nothing to do: a ucx/udp split involves the child's members only."""

        backend_cls.perform_nocolor_split = perform_nocolor_split


def shrink_group(
    ranks_to_exclude: list[int], group: dist.ProcessGroup | None = None, shrink_flags: int = 0
) -> dist.ProcessGroup:
    """``torch.distributed.distributed_c10d.shrink_group``, with the new group's backend type fixed.

    torch 2.13 registers the shrunk group's backend as GLOO on the CPU (NCCL on CUDA) whatever
    it is; code that trusts the type, such as DDP's logger, then treats a ucx/udp backend as a
    ProcessGroupGloo and crashes. This re-registers it as the custom backend it is.
    """
    from torch.distributed import distributed_c10d as c10d

    shrunk: dist.ProcessGroup = c10d.shrink_group(ranks_to_exclude, group, shrink_flags)
    device = shrunk.bound_device_id or torch.device("cpu")
    backend = shrunk._get_backend(device)
    custom = dist.ProcessGroup.BackendType.CUSTOM
    shrunk._register_backend(device, custom, backend)
    shrunk._set_default_backend(custom)
    return shrunk


def stats(group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Traffic statistics of a ``udp`` (or ``ucx``) process group, as last published.

    Returns ``{"backend", "peers": {rank: counters}, "total": counters, "transport":
    counters, "ops": [{"op", "seq", "counters"}, ...]}``; ``total`` sums the peers (RTTs and
    high-water marks are maxed), ``ops`` holds the change each recent collective made (up to
    1024, the newest last). The counters are published after every op and whenever the
    group's progress thread goes idle. A ``ucx`` group keeps no per-peer counters (UCX keeps
    its own); where it may use a send lane (``send_lane``), ``transport`` holds
    ``send_lane_peers``, ``send_lane_messages`` and ``send_lane_bytes``.
    """
    backend = _native_backend(group, "stats")
    assert _C is not None
    raw = _C.traffic(backend)
    return {
        "backend": raw["backend"],
        "peers": dict(enumerate(raw["peers"])),
        "total": raw["total"],
        "transport": raw["transport"],
        "ops": raw["ops"],
    }


def trace_samples(group: dist.ProcessGroup | None = None) -> list[dict[str, Any]]:
    """The time series a ``udp`` group recorded since the last call (each sample read once).

    Recording is off unless the group's ``udp_config`` sets ``trace_samples=N`` (samples of
    each kind kept until read, the oldest overwritten; ``trace_interval_us`` spaces them).
    Returns one dict per sample, oldest first within its kind: ``kind`` ``"conn"`` (per peer
    and path, at the sender: ``cwnd_packets``, ``inflight_packets``, ``inflight_bytes``,
    the path's own ``path_inflight_packets`` and ``path_inflight_bytes``,
    ``rtt_smoothed_us``, ``rtt_latest_us`` and running counts) or ``"queue"`` (per path, the
    emulated bottleneck in front of this rank: ``queue_packets``, ``queue_limit``, ...), with
    ``t_us`` (the transport's monotonic clock, shared by processes on one host), ``peer``,
    ``path``, and the ``op`` and ``seq`` of the collective it was taken in (or, for what
    follows an op until the next one starts, that op). Field names: docs/udp-protocol.md#traces.
    ``overwritten`` counts the samples of that kind lost so far because they were not read in
    time. An empty list for a ``ucx`` group or with recording off.
    """
    backend = _native_backend(group, "trace_samples")
    assert _C is not None
    out: list[dict[str, Any]] = []
    for batch in _C.trace_series(backend):
        fields = list(batch["fields"])
        values = list(batch["values"])
        base = {"kind": batch["kind"], "op": batch["op"], "seq": int(batch["seq"]),
                "overwritten": int(batch["overwritten"])}
        for i in range(0, len(values), len(fields)):
            out.append({**base, **dict(zip(fields, values[i : i + len(fields)], strict=True))})
    return out


def shared_memory(group: dist.ProcessGroup | None = None) -> bool:
    """Whether a ``ucx`` group moves large collective messages through shared memory.

    The ring all_reduce and all_gather, the binomial broadcast and all_to_all stage.

    True when every rank of the group runs on this host (same boot, mount and network
    namespace), ``shared_memory`` is ``"auto"`` and ``UCX_TLS`` (if set) allows UCX's own
    shared-memory transports; see docs/algorithms.md#shared-memory-staging.
    """
    backend = _native_backend(group, "shared_memory")
    assert _C is not None
    return bool(_C.shared_memory(backend))


def inline_stats(group: dist.ProcessGroup | None = None) -> dict[str, int]:
    """How many ops of a ``ucx`` or ``udp`` group ran on the caller's thread.

    Returns ``{"inline": n, "handed_over": m, "core_moves": k}``: ``inline`` ops were posted
    and completed on the thread that issued them, ``handed_over`` ones were posted there but
    a peer was late, so the progress thread finished them; ``core_moves`` counts the times
    such a thread, or the progress thread in a queued op, moved itself off a core that a
    lower rank of the group was waiting on
    (docs/architecture.md#inline-ops, the ``inline_bytes`` knob).
    """
    backend = _native_backend(group, "inline_stats")
    assert _C is not None
    raw = _C.inline_stats(backend)
    return {key: int(raw[key]) for key in ("inline", "handed_over", "core_moves")}


def wait_stats() -> dict[str, int]:
    """How this process's polling waits went, every ``ucx`` and ``udp`` group together.

    Returns ``{"yields", "lost_yields", "crowded_spells", "start_spells",
    "yields_when_crowded", "sleeps", "sleep_timeouts", "group_threads_on_host"}`` counts: the
    ``sched_yield`` calls of the waits that poll (the progress thread within and after an op,
    ``Work.wait()``, an inline caller), those that lost the core for over a millisecond, the
    crowded spells lost yields began (at once when the host ran more threads than this host's
    ranks do, else once they added up to more than 6 ms beyond a fifth of the time: a thread
    that keeps the core, not the turns of the group's own busy ranks; waits then sleep instead
    of polling for 100 ms), the spells begun by a group's creation where more of its ranks run
    on this host than this process has cores (its ranks reach the first op one by one, and a
    polling wait takes the core a late one needs), yields begun in
    such a spell anyway (none but a race), the sleeps of waits and of idle progress threads, the
    sleeps that ended by their timeout rather than by an event, and the threads that a lost
    yield counts as the group's own (two per rank of the largest group on this host, three with
    ucx's send lane; more runnable means an outsider, and a spell at once). Differences over a
    run, divided by its ops, say why ops were slow (docs/performance.md#issue-23-stalls).

    Where an op's time went, summed over this process's threads: ``transport_waits`` and
    ``transport_wait_us``, the waits of ops for their transport requests (the progress
    thread's, an inline caller's) and their time; ``device_waits`` and ``device_wait_us``, the
    waits for a CUDA stream or event (the caller's stream reaching the op, the op's own copies
    and reductions: docs/cuda.md), with ``device_polls``, the queries that found the device not
    there yet, and ``device_sleeps``, the sleeps between them (in neither ``yields`` nor
    ``sleeps``). Zero device waits for CPU tensors.
    """
    if _C is None:
        raise _native_missing_error()
    raw = _C.wait_stats()
    keys = (
        "yields",
        "lost_yields",
        "crowded_spells",
        "start_spells",
        "yields_when_crowded",
        "sleeps",
        "sleep_timeouts",
        "group_threads_on_host",
        "transport_waits",
        "transport_wait_us",
        "device_waits",
        "device_wait_us",
        "device_polls",
        "device_sleeps",
    )
    return {key: int(raw[key]) for key in keys}


def startup_profile(group: dist.ProcessGroup | None = None) -> dict[str, Any]:
    """Where this rank's creation of a ``ucx`` or ``udp`` group spent its time.

    Returns ``{"phases": {name: seconds}, "store_calls": n, "store_bytes": n,
    "store_calls_by_phase": {name: n}, "store_watch_calls": n, "transports": [name, ...]}``:
    the phases of the backend's constructor in order (they sum to its time; torch's own part
    of ``init_process_group`` is not in them, nor is the first op, where ucx connects each
    peer on first use; ``any_host`` appears where a ucx group that guessed it shares one host
    turned out to span hosts), the c10d Store calls it made (a multi-key read is one call),
    the bytes of keys and values they carried, those calls by phase (a rank's role changes
    two: ``join`` for a rank that came before rank 0 opened the creation, ``cleanup`` for
    the last rank, which deletes the creation's keys), the Store calls of its liveness watch
    (on a connection of its own, only in a wait longer than a normal creation's:
    docs/failure-model.md), and the transports below the group's (ucx: those its UCP context
    may use, e.g. ``posix``, ``tcp``; ``["shm"]`` for one on the one-host transport,
    ``one_host_transport=shm``; empty for udp). See docs/bench.md (``bench startup``,
    which prints it per phase) and
    docs/performance.md#start-up.
    """
    backend = _native_backend(group, "startup_profile")
    assert _C is not None
    profile: dict[str, Any] = _C.startup_profile(backend)
    return profile


def get_error(group: dist.ProcessGroup | None = None) -> ErrorType:
    """``c10d::Backend::getError`` of a ``ucx`` or ``udp`` group (torch has no binding for it).

    Returns a ``torch._C._distributed_c10d.ErrorType``: ``SUCCESS`` while the group is
    healthy; once it has failed, the kind of its first failure: ``TIMEOUT`` (an op timed out),
    ``REMOTE_ERROR`` (a peer failed: gone, connection reset or closed) or ``COMM_ERROR``
    (anything else, ``abort()`` included). See docs/failure-model.md#abort-and-geterror.
    """
    backend = _native_backend(group, "get_error")
    assert _C is not None
    error: ErrorType = _C.get_error(backend)
    return error


def _native_backend(group: dist.ProcessGroup | None, caller: str) -> Any:
    """The ucx or udp backend object of ``group`` (the default group when None)."""
    if _C is None:
        raise _native_missing_error()
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    last_error: Exception | None = None
    for device in DEVICES:
        try:
            backend = pg._get_backend(torch.device(device))
        except (RuntimeError, ValueError) as exc:
            last_error = exc
            continue
        # Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the backend in its
        # ProcessGroupWrapper, whose name() is the wrapped backend's.
        backend = getattr(backend, "wrapped_pg", backend)
        if backend.name() in BACKEND_NAMES:
            return backend
    raise ValueError(
        f"{caller}(): the group has no ucx or udp backend (backends: "
        f"{pg._get_backend_name()!r}" + (f"; {last_error}" if last_error else "") + ")"
    )


def _setup_logging() -> None:
    """Set the ``ucxbackend`` logger's level from ``UCXBACKEND_LOG_LEVEL``.

    When the variable is set explicitly and the application has configured no logging at
    all, a stderr handler is attached so that the requested messages are actually shown.
    """
    try:
        config = get_config()
    except (ValueError, RuntimeError) as exc:
        # Surface the problem where it matters (group creation, `info`), not at import; a
        # RuntimeError: the extension that declares the knobs is missing.
        logger.debug("no UCXBACKEND_* configuration at import: %s", exc)
        return
    logger.setLevel(config.logging_level)
    if (
        config.sources["log_level"] == "env"
        and not logger.handlers
        and not logging.getLogger().handlers
    ):
        handler = logging.StreamHandler()
        handler.setFormatter(
            logging.Formatter(f"[ucxbackend pid {os.getpid()}] %(levelname)s %(message)s")
        )
        logger.addHandler(handler)


def _check_torch_version() -> None:
    if _C is None:
        return
    try:
        built = _C.build_info().get("torch_version", "")
    except Exception as exc:  # a broken build_info should not make the import fail
        logger.debug("build_info() failed: %s", exc)
        return

    def base(version: str) -> str:
        return version.split("+", 1)[0]

    if built and base(built) != base(torch.__version__):
        logger.warning(
            "ucxbackend._C was built against torch %s but torch %s is running; "
            "rebuild with `make build`",
            built,
            torch.__version__,
        )


_setup_logging()
_load_native()
if _C is None:
    logger.debug("ucxbackend._C not loaded: %s", load_error())
_check_torch_version()
if dist.is_available():
    _register()
    _allow_nocolor_split()
    atexit.register(_stop_groups_at_exit)
