"""Shared-memory staging (csrc/engine/staging_area.h, collectives/staged_exchange.h,
transports/shm/).

When every rank of a ucx group runs on one host, the ring all_reduce, the ring all_gather, and
the binomial broadcast and pairwise all_to_all (messages from 64 KiB) move their bytes through
shared-memory slots instead of UCX. These tests check when a group
stages (``ucxbackend.shared_memory``), that results through the slots match numpy bit for bit
(many pieces, ragged last pieces, pieces smaller than a slot, world sizes 2 and 3), that the
same ops with staging off agree, that ranks passing different sizes get an error naming both
sizes, and that no segment name is left in /dev/shm once the groups exist. Around the 64 KiB
floor (one element under, on and over it, world sizes 2, 3 and 5) they also check, by watching
each rank's own slots, which calls staged and which went through UCX.
"""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import cpp_build
import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import skip_unless_ucx
from dist_harness import run_world, timed_failure

import ucxbackend

REPO = Path(__file__).resolve().parent.parent
# int64 / float32 elements: blocks of ~1.2 MB (several 256 KiB pieces, the last one ragged).
COUNT = 300_007
# chunk_bytes caps the slot: 40-byte slots hold 5 int64 or 10 float32 per piece.
TINY_SLOT_OPTIONS = {"chunk_bytes": 40}
TINY_COUNT = 1003
# int64: 80 KB, above the staged broadcast's 64 KiB floor; 2000 pieces in 40-byte slots.
BROADCAST_COUNT = 10_001
# int64: ~2.4 MB in ten 256 KiB broadcast pieces and ~16.8 MB in seventeen whole 1 MiB
# slots (one-way pieces grow with the message), the last piece ragged, every slot reused;
# only for groups with full-size slots (40-byte ones would need 420,000 pieces).
LARGE_BROADCAST_COUNTS = (300_007, 2_100_007)


def _input(rank: int, count: int, dtype: type) -> np.ndarray:
    # Small integers: float32 sums are exact in any order, so every rank must agree bitwise.
    return ((np.arange(count, dtype=np.int64) * (rank + 7)) % 201 - 100).astype(dtype)


def _check_group(
    rank: int,
    ws: int,
    group: Any,
    count: int,
    label: str,
    broadcast_counts: tuple[int, ...] = (BROADCAST_COUNT, *LARGE_BROADCAST_COUNTS),
) -> list[str]:
    failures = []
    for dtype in (np.int64, np.float32):
        inputs = [_input(r, count, dtype) for r in range(ws)]
        t = torch.from_numpy(inputs[rank].copy())
        dist.all_reduce(t, group=group)
        expected = np.sum(np.stack(inputs), axis=0, dtype=dtype)
        if not np.array_equal(t.numpy(), expected):
            bad = int(np.argmax(t.numpy() != expected))
            failures.append(f"{label} all_reduce {dtype.__name__}: first bad index {bad}")
        out = torch.empty(count * ws, dtype=t.dtype)
        dist.all_gather_into_tensor(out, torch.from_numpy(inputs[rank].copy()), group=group)
        if not np.array_equal(out.numpy(), np.concatenate(inputs)):
            failures.append(f"{label} all_gather_into_tensor {dtype.__name__}")
    failures += _check_all_to_all(rank, ws, group, label)
    # Broadcast stages from 64 KiB (kStagedMessageMin): every root, sizes above it.
    for bcast_count in broadcast_counts:
        for root in range(ws):
            data = _input(root, bcast_count, np.int64)
            t = torch.from_numpy(data.copy() if rank == root else np.zeros_like(data))
            dist.broadcast(t, src=root, group=group)
            if not np.array_equal(t.numpy(), data):
                failures.append(f"{label} broadcast of {bcast_count} from {root}")
    return failures


def _a2a_split(src: int, ws: int) -> list[int]:
    # int64 elements rank src sends to each rank: rank 0 sends 32 KB blocks (below the 64 KiB
    # floor: through UCX), the others 160 KB ones (staged), so pairs mix both paths.
    return [(4000 if src == 0 else 20000) + 7 * src + dst for dst in range(ws)]


def _check_all_to_all(rank: int, ws: int, group: Any, label: str) -> list[str]:
    inputs = [_input(src, sum(_a2a_split(src, ws)), np.int64) for src in range(ws)]
    blocks = [np.split(x, np.cumsum(_a2a_split(src, ws))[:-1]) for src, x in enumerate(inputs)]
    expected = np.concatenate([blocks[src][rank] for src in range(ws)])
    out = torch.empty(expected.size, dtype=torch.int64)
    dist.all_to_all_single(
        out,
        torch.from_numpy(inputs[rank].copy()),
        output_split_sizes=[_a2a_split(src, ws)[rank] for src in range(ws)],
        input_split_sizes=_a2a_split(rank, ws),
        group=group,
    )
    return [] if np.array_equal(out.numpy(), expected) else [f"{label} all_to_all_single"]


def _staging_world(rank: int, ws: int) -> dict[str, Any]:
    off = dist.new_group(backend="ucx", pg_options={"shared_memory": "off"})
    tiny = dist.new_group(backend="ucx", pg_options=TINY_SLOT_OPTIONS)
    streaming = dist.new_group(backend="ucx", pg_options={"staging_stores": "streaming"})
    groups = (
        ("default", None, COUNT),
        ("off", off, COUNT),
        ("tiny", tiny, TINY_COUNT),
        ("streaming", streaming, COUNT),
    )
    failures: list[str] = []
    for label, group, count in groups:
        bcasts = (BROADCAST_COUNT,) if group is tiny else (BROADCAST_COUNT, *LARGE_BROADCAST_COUNTS)
        failures += _check_group(rank, ws, group, count, label, bcasts)
    return {
        "staged": {label: ucxbackend.shared_memory(group) for label, group, _ in groups},
        "failures": failures,
        # This rank's own segments only (named by its pid): another test's group may be alive
        # on the host at the same time.
        "left_in_dev_shm": sorted(glob.glob(f"/dev/shm/ucxb-{os.getpid()}-*")),
    }


@pytest.mark.parametrize("ws", [2, 3])
def test_staged_results_match_numpy(ws: int) -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    results = run_world(_staging_world, ws, timeout=240)
    for rank, res in enumerate(results):
        assert res["staged"] == {
            "default": True,
            "off": False,
            "tiny": True,
            "streaming": True,
        }, (rank, res)
        assert res["failures"] == [], (rank, res["failures"])
        assert res["left_in_dev_shm"] == [], (rank, res["left_in_dev_shm"])


def _staged_and_sum(
    rank: int,
    ws: int,
    broadcast_counts: tuple[int, ...] = (BROADCAST_COUNT, *LARGE_BROADCAST_COUNTS),
) -> tuple[bool, list[str]]:
    staged = ucxbackend.shared_memory()
    return staged, _check_group(rank, ws, None, COUNT, "world", broadcast_counts)


@pytest.mark.parametrize("tls", ["tcp,self", "^sm"])
def test_ucx_tls_without_shared_memory_turns_staging_off(tls: str) -> None:
    """Answered by the ucx transport itself (Transport::permitsSharedMemory), from the UCX_TLS
    its UCX context was created with; the Python layer passes UCX_TLS on untouched.

    Broadcasts of BROADCAST_COUNT only: LARGE_BROADCAST_COUNTS are there to fill and reuse
    every staging slot, and this group has none (it is checked not to stage); through UCX's
    TCP they cost each run about 2 s (test_staged_results_match_numpy's "off" group sends
    them unstaged, through UCX with shared memory)."""
    skip_unless_ucx("UCX_TLS steers the ucx backend")
    # Over UCX whatever the environment asks: the one-host transport has no UCX_TLS to obey.
    env = {"UCX_TLS": tls, "UCXBACKEND_ONE_HOST_TRANSPORT": "ucx"}
    results = run_world(_staged_and_sum, 2, env=env, args=((BROADCAST_COUNT,),), timeout=180)
    assert results == [(False, [])] * 2, results


def test_udp_never_stages() -> None:
    results = run_world(_staged_and_sum, 2, backend="udp", timeout=180)
    assert results == [(False, [])] * 2, results


def _mismatched_sizes(rank: int, ws: int, unit: int) -> tuple[float, str | None]:
    # Both take the same staged path; the ranks disagree on every block's length.
    t = torch.ones((2 if rank == 0 else 3) * unit)
    return timed_failure(lambda: dist.all_reduce(t))


# 1 << 20 floats: the staged ring (8 and 12 MB). 1 << 14: one staged exchange of the whole
# vector (64 and 96 KB), inline.
@pytest.mark.parametrize("unit", [1 << 20, 1 << 14])
def test_staged_sizes_that_differ_fail_with_both_sizes(unit: int) -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    pg_timeout = 5.0
    res = run_world(_mismatched_sizes, 2, args=(unit,), pg_timeout=pg_timeout, timeout=90)
    messages = [msg for _, msg in res]
    assert all(msg is not None for msg in messages), messages
    assert any("different sizes" in msg for msg in messages if msg), messages
    for rank, (elapsed, msg) in enumerate(res):
        assert elapsed < pg_timeout + 10, (rank, elapsed, msg)


LATE_PG_TIMEOUT = 2.0
LATE_BY = LATE_PG_TIMEOUT + 10.0  # the longest either rank waits for the other's marker


def _wait_for(marker: Path) -> None:
    """Until the other rank creates `marker`, at most LATE_BY (then the test's asserts say what
    the other rank had done)."""
    deadline = time.monotonic() + LATE_BY
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _late_receiver(rank: int, ws: int, markers: Path) -> dict[str, Any]:
    # 1 MiB: four staged pieces, so rank 0 puts every piece in a slot and sends every notice
    # before it waits for a credit; rank 1 only arrives after rank 0's op timed out and the
    # next one was refused (rank 0 then creates `failed`), and rank 0 keeps its segment mapped
    # until rank 1 has read it (rank 1 then creates `read`).
    first = np.arange(1 << 17, dtype=np.int64)
    second = -first - 1
    if rank == 0:
        _, timed_out = timed_failure(lambda: dist.broadcast(torch.from_numpy(first.copy()), 0))
        elapsed, refused = timed_failure(lambda: dist.broadcast(torch.from_numpy(second), 0))
        (markers / "failed").touch()
        _wait_for(markers / "read")
        return {"timed_out": timed_out, "refused": refused, "refused_after": elapsed}
    _wait_for(markers / "failed")
    got = torch.zeros(first.size, dtype=torch.int64)
    _, error = timed_failure(lambda: dist.broadcast(got, 0))
    (markers / "read").touch()
    return {
        "error": error,
        "first": bool(np.array_equal(got.numpy(), first)),
        "second": bool(np.array_equal(got.numpy(), second)),
    }


def test_slots_a_late_peer_may_read_are_never_rewritten(tmp_path: Path) -> None:
    """A sender whose op failed before every piece was read must not refill its slots: a peer
    that enters that op late would take the next op's bytes for it."""
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    res = run_world(
        _late_receiver, 2, args=(tmp_path,), pg_timeout=LATE_PG_TIMEOUT, timeout=120
    )
    sender, receiver = res
    assert sender["timed_out"] is not None, res
    # A group whose op failed refuses every later op (docs/failure-model.md), before staging
    # could refuse it for its slots ("stopped using its shared-memory slots"), as it did
    # before that rule.
    refused = sender["refused"] or ""
    assert "earlier failure" in refused and "broadcast (op #1)" in refused, res
    assert sender["refused_after"] < 1.0, res
    assert not receiver["second"], res
    assert receiver["error"] is not None or receiver["first"], res


def _a2a_block_sizes_disagree(rank: int, ws: int) -> tuple[float, str | None]:
    # Rank 1 sends rank 0 an 80 KB block (staged) where rank 0 expects 16 bytes (through
    # UCX): the 16-byte notice must not pass for the data.
    out_splits = [4, 2] if rank == 0 else [4, 4]
    in_splits = [4, 4] if rank == 0 else [10_000, 4]
    out = torch.zeros(sum(out_splits), dtype=torch.int64)
    inp = torch.arange(sum(in_splits), dtype=torch.int64)
    return timed_failure(
        lambda: dist.all_to_all_single(
            out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits
        )
    )


def test_staged_block_never_matches_a_whole_message() -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    pg_timeout = 3.0
    res = run_world(_a2a_block_sizes_disagree, 2, pg_timeout=pg_timeout, timeout=90)
    for rank, (elapsed, msg) in enumerate(res):
        assert msg is not None, (rank, res)
        assert elapsed < pg_timeout + 10, (rank, res)


# UCX_TLS values and whether the ucx transport then permits staging (UcxTransport::
# permitsSharedMemory, from transports/ucx/shared_memory_tls.cpp; shared_memory "off" turns
# staging off whatever UCX_TLS says, checked on real groups above).
TLS_RULE = [
    ("", True),
    ("all", True),
    ("tcp", False),
    ("tcp,self", False),
    ("sm,tcp", True),
    ("posix,self", True),
    ("^sm", False),
    ("^posix", False),
    ("^cma", True),
    ("cma,tcp", False),
    ("^ib", True),
]


def _tls_probe(*args: str) -> list[bool]:
    probe = cpp_build.build(
        "shared_memory_tls_probe",
        "tests/cpp/shared_memory_tls_probe.cpp",
        flags=cpp_build.PLAIN,
        extra_sources=["transports/ucx/shared_memory_tls.cpp"],
    )
    run = subprocess.run([probe, *args], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return [line == "1" for line in run.stdout.split()]


def test_ucx_tls_rule() -> None:
    answers = _tls_probe(*(tls for tls, _ in TLS_RULE))
    assert answers == [allowed for _, allowed in TLS_RULE], TLS_RULE


# The transports a one-host context opened (ucx_context.cpp: kOneHostTls leaves posix out) and
# whether it must be made again with posix (lacksSysv): only where sysv is missing, and never
# on an empty list (UCX's account of its transports could not be read).
SYSV_RULE = [
    ("self,sysv,cma", False),
    ("sysv", False),
    ("self,cma", True),
    ("self,posix,cma", True),
    ("", False),
]


def test_one_host_context_without_sysv_takes_posix() -> None:
    answers = _tls_probe("--lacks-sysv", *(opened for opened, _ in SYSV_RULE))
    assert answers == [again for _, again in SYSV_RULE], SYSV_RULE


@pytest.mark.parametrize(
    ("unit", "sources"),
    [
        ("shared_segment_test", []),
        ("staging_area_test", []),
        ("staged_path_test", ["csrc/collectives/staged_path.cpp"]),
    ],
)
def test_torch_free_unit(unit: str, sources: list[str]) -> None:
    """The segment class, the slot layout and the slots' streaming stores, and the per-message
    staging decision, on their own (tests/cpp/<unit>.cpp; the one-host transport's program is
    tests/test_shm_transport_programs.py's)."""
    cpp_build.check_unit(unit, extra_sources=sources, groups=["shm"])


# ------------------------------------------------------------- the 64 KiB staging floor

# kStagedMessageMin in csrc/collectives/selection.h: the binomial broadcast and all_to_all
# (linear and pairwise) stage a message from this many bytes. Not exposed to Python (the
# thresholds() binding lists only the algorithm thresholds), so it is repeated here.
STAGED_MESSAGE_MIN = 64 << 10
# One element below, at and one element above it: int64 moves by 8 bytes, uint8 by 1.
FLOOR_DTYPES = (np.int64, np.uint8)
FLOOR_DELTAS = (-1, 0, 1)
# StagingLayout::kHeaderBytes (csrc/engine/staging_area.h): the cookie page before the slots.
SEGMENT_HEADER_BYTES = 4096
# kInboxMagic (transports/shm/inbox.h), the first word of a one-host transport's inbox.
INBOX_MAGIC = (0x75636B62696E6278).to_bytes(8, "little")


def _own_segments() -> set[tuple[int, int]]:
    """(start, end) of this process's own staging segments, from /proc/self/maps.

    A rank's segment is /dev/shm/ucxb-<pid>-<start time>-<pid namespace>-<random>-r<rank>
    (shm::segmentName; its name is unlinked once every peer mapped it, hence " (deleted)");
    peers' are mapped too,
    under their creators' pids.
    """
    prefix = f"/dev/shm/ucxb-{os.getpid()}-"
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith(prefix):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                # Not the one-host transport's inbox (one_host_transport=shm), named alike.
                if ctypes.string_at(start, len(INBOX_MAGIC)) != INBOX_MAGIC:
                    found.add((start, end))
    return found


class _SlotWatch:
    """Tells whether this rank wrote into its own staging slots during an op.

    Only the owner writes a segment's slots (a sender copies each piece into its own slot;
    receivers read it out of there), and ops here run one at a time, so a change between two
    snapshots taken around a blocking op means the op staged something from this rank. Every
    op sends data no earlier op sent, so a staged piece cannot leave the slot unchanged.
    """

    def __init__(self, segment: tuple[int, int]) -> None:
        self.start = segment[0] + SEGMENT_HEADER_BYTES
        self.size = segment[1] - self.start

    def snapshot(self) -> bytes:
        return ctypes.string_at(self.start, self.size)


def _group_with_segment(options: dict[str, str]) -> tuple[Any, _SlotWatch]:
    before = _own_segments()
    group = dist.new_group(backend="ucx", pg_options=options)
    dist.barrier(group=group)  # the backend exists (and has mapped its segment) by now
    new = _own_segments() - before
    assert len(new) == 1, f"expected one new staging segment for {options}, found {new}"
    return group, _SlotWatch(new.pop())


def _binomial_has_children(rank: int, root: int, ws: int) -> bool:
    """Whether rank forwards the binomial broadcast (csrc/collectives/rooted.cpp)."""
    vr = (rank - root) % ws
    mask = 1
    while mask < ws and not vr & mask:
        mask <<= 1
    # children at vr + m for every power of two m below vr's lowest set bit (all, for vr 0)
    return any(vr + m < ws for m in (1 << i for i in range(ws.bit_length())) if m < mask)


def _floor_values(case: str, rank: int, count: int, dtype: type) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{case} {rank} {count} {dtype.__name__}".encode()))
    if dtype is np.uint8:
        return rng.integers(0, 256, size=count, dtype=np.uint8)  # sums wrap alike in both
    return rng.integers(-(2**40), 2**40, size=count, dtype=np.int64)


def _staging_floor_world(rank: int, ws: int) -> dict[str, Any]:
    """all_reduce, all_gather, broadcast and all_to_all one element around 64 KiB.

    Every result is compared with numpy bit for bit; for every call, whether this rank
    staged is compared with what the algorithm should do: the rings stage at any size, the
    binomial broadcast and both all_to_alls only messages of at least STAGED_MESSAGE_MIN.
    """
    choose = ucxbackend._C.algorithms.choose  # type: ignore[union-attr]
    auto, auto_slots = _group_with_segment({})
    linear, linear_slots = _group_with_segment({"algo_alltoall": "linear"})
    a2a_groups = (("auto", auto, auto_slots), ("linear", linear, linear_slots))
    failures: list[str] = []
    staging: list[str] = []  # calls whose staging was not the expected one
    checked = 0

    def run(label: str, watch: _SlotWatch, want_staged: bool, op: Any) -> None:
        nonlocal checked
        before = watch.snapshot()
        op()
        staged = watch.snapshot() != before
        checked += 1
        if staged != want_staged:
            staging.append(f"{label}: staged={staged}, expected {want_staged}")

    def compare(label: str, got: torch.Tensor, want: np.ndarray) -> None:
        g = got.numpy()
        if g.dtype != want.dtype or not np.array_equal(g, want):
            bad = np.flatnonzero(g != want) if g.shape == want.shape else [-1]
            failures.append(f"{label}: {len(bad)} wrong, first at {int(bad[0])}")

    for dtype in FLOOR_DTYPES:
        esz = np.dtype(dtype).itemsize
        for delta in FLOOR_DELTAS:
            count = STAGED_MESSAGE_MIN // esz + delta
            nbytes = count * esz
            tag = f"{dtype.__name__} {nbytes} bytes (64 KiB {delta:+d} element) world={ws}"

            # all_reduce: the tensor's bytes choose; only the ring stages
            inputs = [_floor_values("ar", r, count, dtype) for r in range(ws)]
            t = torch.from_numpy(inputs[rank].copy())
            alg = choose("allreduce", nbytes, ws)
            run(
                f"all_reduce[{alg}] {tag}",
                auto_slots,
                alg == "ring",
                lambda t=t: dist.all_reduce(t, group=auto),
            )
            compare(f"all_reduce {tag}", t, np.sum(np.stack(inputs), axis=0, dtype=dtype))

            # all_gather: blocks of nbytes per rank; the whole output chooses
            inputs = [_floor_values("ag", r, count, dtype) for r in range(ws)]
            out = torch.empty(count * ws, dtype=t.dtype)
            alg = choose("allgather", nbytes * ws, ws)
            mine = torch.from_numpy(inputs[rank].copy())
            run(
                f"all_gather[{alg}] {tag}",
                auto_slots,
                alg == "ring",
                lambda out=out, mine=mine: dist.all_gather_into_tensor(out, mine, group=auto),
            )
            compare(f"all_gather {tag}", out, np.concatenate(inputs))

            # broadcast from every root: binomial here; a rank stages what it forwards
            assert choose("broadcast", nbytes, ws) == "binomial"
            for root in range(ws):
                data = _floor_values(f"bc{root}", root, count, dtype)
                t = torch.from_numpy(data.copy() if rank == root else np.zeros_like(data))
                sends = _binomial_has_children(rank, root, ws)
                run(
                    f"broadcast root={root} {tag}",
                    auto_slots,
                    sends and nbytes >= STAGED_MESSAGE_MIN,
                    lambda t=t, root=root: dist.broadcast(t, root, group=auto),
                )
                compare(f"broadcast root={root} {tag}", t, data)

            # all_to_all, blocks of nbytes to every peer: pairwise (auto) and linear
            for name, group, watch in a2a_groups:
                inputs = [_floor_values(f"a2a{name}", r, count * ws, dtype) for r in range(ws)]
                out = torch.empty(count * ws, dtype=t.dtype)
                inp = torch.from_numpy(inputs[rank].copy())
                alg = choose("alltoall", nbytes, ws, {"algo_alltoall": name})
                run(
                    f"all_to_all_single[{alg}] {tag}",
                    watch,
                    nbytes >= STAGED_MESSAGE_MIN,
                    lambda out=out, inp=inp, group=group: dist.all_to_all_single(
                        out, inp, group=group
                    ),
                )
                want = np.concatenate([x[rank * count : (rank + 1) * count] for x in inputs])
                compare(f"all_to_all_single[{alg}] {tag}", out, want)

        # Uneven all_to_all: the blocks between ranks lie one element under the floor, on it
        # or one over it, so each pair decides for itself (sender and receiver alike) and one
        # op mixes staged and unstaged messages; with two ranks, rank 0 sends one element
        # over it and rank 1 one under it.
        base = STAGED_MESSAGE_MIN // esz
        splits = [[base + (2 * s + d + 1) % 3 - 1 for d in range(ws)] for s in range(ws)]
        for name, group, watch in a2a_groups:
            inputs = [_floor_values(f"a2av{name}", s, sum(splits[s]), dtype) for s in range(ws)]
            blocks = [np.split(x, np.cumsum(splits[s])[:-1]) for s, x in enumerate(inputs)]
            want = np.concatenate([blocks[s][rank] for s in range(ws)])
            inp = torch.from_numpy(inputs[rank].copy())
            out = torch.empty(want.size, dtype=inp.dtype)
            staged = any(
                splits[rank][d] * esz >= STAGED_MESSAGE_MIN for d in range(ws) if d != rank
            )
            label = f"all_to_all_single(uneven, {name}) {dtype.__name__} splits={splits}"
            run(
                label,
                watch,
                staged,
                lambda out=out, inp=inp, group=group, splits=splits: dist.all_to_all_single(
                    out,
                    inp,
                    output_split_sizes=[splits[s][rank] for s in range(ws)],
                    input_split_sizes=splits[rank],
                    group=group,
                ),
            )
            compare(label, out, want)

    # the mixed 32 KB / 160 KB blocks of the tests above, at this world size
    failures += _check_all_to_all(rank, ws, auto, "auto")
    return {
        "staged": [ucxbackend.shared_memory(g) for g in (auto, linear)],
        "failures": failures,
        "staging": staging,
        "checked": checked,
    }


@pytest.mark.parametrize("ws", [2, 3, pytest.param(5, marks=pytest.mark.slow)])
def test_staging_floor_one_element_either_side(ws: int) -> None:
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    results = run_world(_staging_floor_world, ws, timeout=240)
    for rank, res in enumerate(results):
        assert res["staged"] == [True, True], (rank, res["staged"])
        assert res["failures"] == [], (rank, res["failures"])
        assert res["staging"] == [], (rank, "\n".join(res["staging"]))
        assert res["checked"] == len(FLOOR_DTYPES) * (len(FLOOR_DELTAS) * (4 + ws) + 2)


# ------------------------------------------- segments left behind by a crash, and their sweep


def _start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: the process's start time, in clock ticks since boot."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _segment_name(pid: int, start: int, ns: int, tag: str) -> str:
    """/dev/shm path of a segment named as csrc/staging_setup.cpp names one
    (shm::segmentName): ucxb-<pid>-<start time>-<pid namespace>-<random>-r<rank>."""
    return f"/dev/shm/ucxb-{pid}-{start}-{ns}-{zlib.crc32(tag.encode()) + 1}-r0"


def _segments_of(pids: list[int]) -> list[str]:
    return sorted(p for pid in pids for p in glob.glob(f"/dev/shm/ucxb-{pid}-*"))


def _just_create_a_group(rank: int, ws: int) -> bool:
    return bool(ucxbackend.shared_memory())


def test_group_creation_removes_segments_whose_owner_is_dead() -> None:
    """A staging group's creation removes segments of this user whose owner is provably dead
    (no such pid, or a pid reused by a process that started at another time), and nothing
    else: a live owner's, one from another pid namespace, another user's, unparseable names."""
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    dead = subprocess.Popen(["sleep", "30"])
    dead_start = _start_time(dead.pid)
    dead.kill()
    dead.wait()
    me, my_start, ns = os.getpid(), _start_time(os.getpid()), _pid_namespace()
    removed = [
        _segment_name(dead.pid, dead_start, ns, "dead"),
        _segment_name(me, my_start + 1, ns, "reused"),  # this pid, another process's start
    ]
    kept = [
        _segment_name(me, my_start, ns, "alive"),
        _segment_name(dead.pid, dead_start, ns + 1, "other-ns"),
        f"/dev/shm/ucxb-{dead.pid}-{dead_start}-{ns}-garbage-r0",
        f"/dev/shm/ucxb-{dead.pid}-{me}-r0",  # the name before the owner's start time
    ]
    foreign = _segment_name(dead.pid, dead_start, ns, "foreign")
    try:
        for path in removed + kept + [foreign]:
            with open(path, "xb") as f:
                f.write(b"\0" * 4096)
        if os.geteuid() == 0:
            os.chown(foreign, 65534, 65534)
            kept.append(foreign)
        else:
            removed.append(foreign)  # our own, named after a dead owner
        assert run_world(_just_create_a_group, 2, timeout=60) == [True, True]
        assert [p for p in removed if os.path.exists(p)] == []
        assert [p for p in kept if not os.path.exists(p)] == []
    finally:
        for path in removed + kept + [foreign]:
            if os.path.exists(path):
                os.unlink(path)


def _killed_while_staging(rank: int, ws: int, pid_dir: str, point: str) -> str | None:
    """Rank 1 dies by SIGKILL at `point` of a new group's staging set-up (the test-only hook
    UCXBACKEND_TEST_KILL_AT); rank 0 finds its process gone and gives up on the creation."""
    Path(pid_dir, str(rank)).write_text(str(os.getpid()))
    if rank == 1:
        os.environ["UCXBACKEND_TEST_KILL_AT"] = point
    try:
        dist.new_group(backend="ucx")
    except RuntimeError as exc:
        return str(exc)
    return None


def _crash_during_staging(tmp_path: Path, point: str) -> tuple[list[int], list[str]]:
    res = run_world(
        _killed_while_staging,
        2,
        args=(str(tmp_path), point),
        pg_timeout=2.0,
        expect_fail_ranks={1},
        timeout=60,
    )
    assert res[1] is None and res[0] is not None, res  # rank 1 died, rank 0 gave up on it
    # Rank 0 names the dead rank (tests/test_creation_kill.py checks how soon).
    assert "rank 1 (pid " in res[0] and "died during this creation" in res[0], res[0]
    pids = [int((tmp_path / str(r)).read_text()) for r in range(2)]
    return pids, _segments_of(pids)


def test_segment_of_a_rank_killed_after_its_offer_is_gone_at_once(tmp_path: Path) -> None:
    """Killed once its offer is out: the peer that maps its segment last removes the name, and
    the survivor's own goes when its creation fails; nothing is left, with no later group."""
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    _, left = _crash_during_staging(tmp_path, "shm_offered")
    assert left == [], left


def test_segment_of_a_rank_killed_before_its_offer_goes_with_the_next_group(
    tmp_path: Path,
) -> None:
    """Killed between creating its segment and publishing it: nobody else knows the name, so it
    stays, until the next staging group's creation on the host finds its owner dead."""
    skip_unless_ucx("shared-memory staging is part of the ucx backend")
    pids, left = _crash_during_staging(tmp_path, "shm_created")
    # At most the dead rank's staging segment, and over the one-host transport its inbox too
    # (made with the transport, before the offer: transports/shm/inbox.h): a staging group
    # created meanwhile by a test in the other pytest worker (make test runs two) may have
    # swept them already, as the next group on this host is meant to.
    ucx_only = (
        os.environ.get("UCXBACKEND_ONE_HOST_TRANSPORT") == "ucx" or "UCX_TLS" in os.environ
    )
    most = 1 if ucx_only else 2
    assert len(left) <= most, left
    assert all(n.startswith(f"/dev/shm/ucxb-{pids[1]}-") for n in left), left
    assert run_world(_just_create_a_group, 2, timeout=60) == [True, True]
    assert _segments_of(pids) == []
