"""The Flight Recorder of ucx and udp groups (ucxbackend.flight_recorder,
docs/operations.md#flight-recorder): with TORCH_FR_BUFFER_SIZE set, a dump shows the ops that
ended as completed and the op a rank is stuck in (one its peer never joins) as started and
not completed, then, once it timed out, retired without completing; in torch's own layout,
checked against the dump torch makes of a Gloo group in the same process.

Slow: the backends' hung ops wait out their timeout (both at once, OP_TIMEOUT_S). The ranks
come from the harness's fork server: the recorders read TORCH_FR_BUFFER_SIZE on first use
(dist_harness.FIRST_USE_ENV)."""

from __future__ import annotations

import pickle
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world

BACKENDS = ("ucx", "udp")
OP_TIMEOUT_S = 3.0
_FIELDS = ("profiling_name", "state", "retired", "collective_seq_id", "p2p_seq_id")


def _mine(dump: dict[str, Any], group: dist.ProcessGroup) -> list[dict[str, Any]]:
    return [e for e in dump["entries"] if e["process_group"][0] == group.group_name]


def _summary(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(e[k] for k in _FIELDS) for e in entries]


def _hang_and_dump(rank: int, world: int) -> dict[str, Any]:
    from ucxbackend import flight_recorder

    out: dict[str, Any] = {"capacity": flight_recorder.capacity()}
    gloo = dist.new_group(backend="gloo")
    dist.all_reduce(torch.ones(2), group=gloo)
    torch_dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, True, False))
    out["torch_version"] = torch_dump["version"]
    out["torch_keys"] = sorted(_mine(torch_dump, gloo)[-1])
    groups = {
        b: dist.new_group(backend=b, timeout=timedelta(seconds=OP_TIMEOUT_S)) for b in BACKENDS
    }
    t = torch.arange(4, dtype=torch.int64)
    for group in groups.values():
        dist.all_reduce(t, group=group)
        dist.broadcast(t, src=0, group=group)
        gathered = torch.empty(4 * world, dtype=torch.int64)
        dist.all_gather_into_tensor(gathered, t, group=group)
        if rank == 0:
            dist.send(t, dst=1, group=group)
        else:
            dist.recv(t, src=0, group=group)
    if rank == 0:  # rank 1 never joins these: both backends' ops hang, and time out, at once
        works = {b: dist.all_reduce(t, group=g, async_op=True) for b, g in groups.items()}
        time.sleep(0.5)
        hung = flight_recorder.dump()
        for work in works.values():
            with pytest.raises(RuntimeError, match="timed out"):
                work.wait()
        deadline = time.monotonic() + 2 * OP_TIMEOUT_S
        while not all(_mine(flight_recorder.dump(), g)[-1]["retired"] for g in groups.values()):
            assert time.monotonic() < deadline, "a timed-out op was never retired"
            time.sleep(0.05)
        timed_out = flight_recorder.dump()
        for backend, group in groups.items():
            out[backend] = {
                "hung": _summary(_mine(hung, group)),
                "hung_status": hung["pg_status"][str(_mine(hung, group)[-1]["pg_id"])],
                "timed_out": _summary(_mine(timed_out, group)),
            }
    else:
        done = flight_recorder.dump()
        for backend, group in groups.items():
            out[backend] = {"done": _summary(_mine(done, group))}
    final = flight_recorder.dump()
    for backend, group in groups.items():
        entries = _mine(final, group)
        out[backend]["first"] = {
            k: entries[0][k]
            for k in ("input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "timeout_ms")
        }
        out[backend]["gather"] = (entries[2]["input_sizes"], entries[2]["output_sizes"])
        out[backend]["keys"] = sorted(entries[0])
        out[backend]["config"] = final["pg_config"][group.group_name]
    out["version"] = final["version"]
    dist.barrier(group=gloo)
    if rank == 1:
        # Rank 0 is done with the groups; an aborted group closes at once. (Closing the udp
        # group here lingered its longest, EndpointOptions::lingerMaxUs, 5 s, over rank 0's
        # hung all_reduce until 2026-11-28: tests/test_group_lifecycle.py.)
        groups["udp"].abort()
    return out


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    if BACKEND not in ("ucx", "udp"):
        pytest.skip(f"ucx/udp behaviour ({BACKEND} under test)")
    return run_world(_hang_and_dump, 2, env={"TORCH_FR_BUFFER_SIZE": "64"}, timeout=120)


def _expected(backend: str) -> list[tuple[Any, ...]]:
    return [
        (f"{backend}:allreduce", "completed", True, 1, 0),
        (f"{backend}:broadcast", "completed", True, 2, 0),
        (f"{backend}:_allgather_base", "completed", True, 3, 0),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_completed_ops_are_completed_and_the_hung_one_is_in_flight(
    world: list[dict[str, Any]], backend: str
) -> None:
    r0, r1 = world[0][backend], world[1][backend]
    done = _expected(backend)
    hung = (f"{backend}:allreduce", "started", False, 4, 0)
    assert r0["hung"] == [*done, (f"{backend}:send", "completed", True, 0, 1), hung]
    assert r0["hung_status"] == {
        "last_enqueued_collective": 4,
        "last_started_collective": 4,
        "last_completed_collective": 3,
    }
    # Once timed out: retired, never completed (torch's reading: it timed out).
    assert r0["timed_out"][-1] == (f"{backend}:allreduce", "started", True, 4, 0)
    assert r1["done"] == [*done, (f"{backend}:recv", "completed", True, 0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_entries_carry_sizes_dtypes_group_and_torch_layout(
    world: list[dict[str, Any]], backend: str
) -> None:
    rank0 = world[0]
    assert rank0["capacity"] == 64
    first = rank0[backend]["first"]
    assert first == {
        "input_sizes": [[4]],
        "input_dtypes": ["Long"],
        "output_sizes": [[4]],
        "output_dtypes": ["Long"],
        "timeout_ms": int(OP_TIMEOUT_S * 1000),
    }
    assert rank0[backend]["gather"] == ([[4]], [[8]])
    assert rank0[backend]["config"]["ranks"] == "[0, 1]"
    # The same keys as torch's own entries (ours add the duration torch's Gloo entries lack).
    assert sorted(set(rank0[backend]["keys"]) - {"duration_ms"}) == rank0["torch_keys"]
    assert rank0["version"] == rank0["torch_version"]


def test_dump_of_this_process_pickles_to_one_file_per_rank(tmp_path: Any) -> None:
    """In the test process (no ucx/udp group, TORCH_FR_BUFFER_SIZE as the suite left it): the
    layout is there, and write_dump pickles exactly what dump() returns to <prefix><rank>."""
    import ucxbackend
    from ucxbackend import flight_recorder

    if not ucxbackend.is_available():
        pytest.skip("ucxbackend._C not built")
    dump = flight_recorder.dump()
    assert set(dump) == {"version", "pg_config", "comm_lib_version", "pg_status", "entries"}
    assert dump["version"] == flight_recorder.LAYOUT_VERSION
    path = flight_recorder.write_dump(prefix=str(tmp_path / "fr_rank_"), rank=3)
    assert path == tmp_path / "fr_rank_3"
    assert pickle.loads(path.read_bytes()) == flight_recorder.dump()
