"""The Flight Recorder of ``ucx`` and ``udp`` groups: what each rank's recent ops were, and
which one it is stuck in.

With ``TORCH_FR_BUFFER_SIZE=N`` (N > 0; or ``TORCH_NCCL_TRACE_BUFFER_SIZE``) in the environment
before the first group is created, the backend records the last N ops of all its groups in
this process, each marked as its Work progresses: ``scheduled`` when issued, ``started`` when the
progress thread began it, ``completed`` when it ended well; an op that failed or timed out is
``retired`` without being completed. :func:`dump` returns them in the layout of torch's own
dump (``pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False))``: the same
keys, version and states), and :func:`write_dump` pickles it to one file per rank, named as
torch names its own dumps. torch 2.13's analyzer (``torch.distributed.flight_recorder.fr_trace``)
does not read them: it accepts only its own backends' names (nccl, gloo, xccl, ...) in
``profiling_name``.

These are not in torch's dump: torch's recorder, which ProcessGroupGloo and NCCL record into,
is a hidden symbol of libtorch_cpu.so in torch 2.13 (docs/operations.md#flight-recorder).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Final

import torch.distributed as dist

__all__ = ["capacity", "dump", "write_dump"]

# The layout version of torch 2.13's dump (FlightRecorder.hpp, version_val), which ours follows;
# tests/test_flight_recorder.py checks it against torch's own dump.
LAYOUT_VERSION: Final = "2.10"
_DUMP_PREFIX_ENV: Final = "TORCH_FR_DUMP_TEMP_FILE"  # torch's: where its dumps go
_DEFAULT_PREFIX: Final = "/tmp/ucxbackend_fr_rank_"


def _native() -> Any:
    from . import _C, _native_missing_error

    if _C is None:
        raise _native_missing_error()
    return _C


def capacity() -> int:
    """Entries kept (0: the recorder is off; ``TORCH_FR_BUFFER_SIZE`` was not set)."""
    return int(_native().flight_recorder_capacity())


def _state(raw: dict[str, Any]) -> str:
    if raw["time_completed_ns"]:
        return "completed"
    return "started" if raw["time_started_ns"] else "scheduled"


def _entry(raw: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "frames": [],  # no stacks are captured: an op pays for no traceback
        "record_id": raw["record_id"],
        "pg_id": raw["pg_id"],
        "process_group": (raw["pg_name"], raw["pg_desc"]),
        "thread_name": raw["thread_name"],
        "thread_id": raw["thread_id"],
        "collective_seq_id": raw["collective_seq_id"],
        "p2p_seq_id": raw["p2p_seq_id"],
        "op_id": raw["op_id"],
        "profiling_name": raw["profiling_name"],
        "time_created_ns": raw["time_created_ns"],
    }
    if raw["time_completed_ns"]:
        entry["duration_ms"] = (raw["time_completed_ns"] - raw["time_started_ns"]) / 1e6
    entry.update(
        input_sizes=raw["input_sizes"],
        input_dtypes=raw["input_dtypes"],
        output_sizes=raw["output_sizes"],
        output_dtypes=raw["output_dtypes"],
        state=_state(raw),
        time_discovered_started_ns=raw["time_started_ns"] or None,
        time_discovered_completed_ns=raw["time_completed_ns"] or None,
        retired=raw["retired"],
        timeout_ms=raw["timeout_ms"],
        is_p2p=raw["is_p2p"],
    )
    return entry


def dump(only_active: bool = False) -> dict[str, Any]:
    """The recorded ops of this process's ucx/udp groups, oldest first, as torch lays out its
    dump (``version``, ``pg_config``, ``pg_status``, ``entries``); ``only_active``: leave out
    the completed ones. Empty entries when the recorder is off."""
    native = _native()
    raws = native.flight_recorder_entries()
    pg_config: dict[str, dict[str, str]] = {}
    pg_status: dict[str, dict[str, int]] = {}
    for raw in raws:  # the newest entry of a group has its latest status
        ranks = ", ".join(str(r) for r in raw["pg_ranks"])
        pg_config[raw["pg_name"]] = {
            "name": raw["pg_name"],
            "desc": raw["pg_desc"],
            "ranks": f"[{ranks}]",
        }
        pg_status[str(raw["pg_id"])] = {
            key: raw[key]
            for key in (
                "last_enqueued_collective",
                "last_started_collective",
                "last_completed_collective",
            )
        }
    entries = [_entry(r) for r in raws if not (only_active and r["time_completed_ns"])]
    return {
        "version": LAYOUT_VERSION,
        "pg_config": pg_config,
        "comm_lib_version": f"ucx {native.ucx_version()}",
        "pg_status": pg_status,
        "entries": entries,
    }


def write_dump(prefix: str | None = None, rank: int | None = None) -> Path:
    """Pickles :func:`dump` to ``<prefix><rank>``, as torch names its own dumps.

    ``prefix``: ``TORCH_FR_DUMP_TEMP_FILE`` if set (as torch's own dumps), else
    ``/tmp/ucxbackend_fr_rank_``; ``rank``: this process's global rank."""
    if prefix is None:
        prefix = os.environ.get(_DUMP_PREFIX_ENV, _DEFAULT_PREFIX)
    if rank is None:
        rank = dist.get_rank()
    path = Path(f"{prefix}{rank}")
    path.write_bytes(pickle.dumps(dump()))
    return path
