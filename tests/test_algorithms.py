"""Every collective algorithm (csrc/collectives/selection.h) through torch, against numpy.

The algorithms themselves are checked in one process by tests/cpp/algorithms_test.cpp
(tests/test_algorithms_inproc.py): every op x algorithm at world sizes 1-5 and 8, chunk sizes
that split messages unevenly or overflow the tag steps, staged and not, every dtype x reduce
op. What stays here is the layer a user goes through: ``pg_options`` and ``UCXBACKEND_*``
selecting algorithms and chunk sizes, every torch call of every op (tensor and list forms,
even, uneven and in-place all_to_all, inputs left unmodified), the dtype and reduce-op
dispatch, and the automatic choice around every threshold.

Unit tests (no processes) pin the automatic choice on both sides of every threshold, the
precedence of a forced algorithm and the validation of ``algo_<op>`` / ``chunk_bytes``.

The multi-rank tests spawn one world per world size.  Inside it every rank creates one
process group per (op, algorithm, chunk size) with ``pg_options`` forcing that algorithm,
runs every call of that op over several sizes, dtypes, reduce ops and roots, and compares
each result with a reference computed by numpy from the inputs, which every rank can rebuild
for any rank.  Results are compared exactly (int64 over the full 64-bit range; float32 holds
small integers for reductions, so every order of summation gives the same bits).

``TINY_CHUNK`` (20 bytes) cuts messages into uneven pieces, so the chunk size demonstrably
reaches the algorithms.  The counts (0, 1, 7, 389) give empty and single-element messages,
blocks smaller than the world, and blocks that neither the world size nor the chunk divides.

Quick (unmarked): the unit tests, the forced matrix at world size 3, "auto" around every
threshold at world sizes 2 and 3, and the ``UCXBACKEND_*`` environment path.  Slow: the
forced matrix at world size 1 (two counts), and "auto" around the thresholds at world sizes 4
and 5.

Under ``UCXB_TEST_BACKEND=gloo`` the same matrix runs on plain Gloo groups (no algorithm
choice there): a check of the references themselves.  Calls Gloo rejects are skipped with a
warning, and in-place all_to_all_single (silently wrong under Gloo) is left out.
"""

from __future__ import annotations

import datetime
import time
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import is_ucx, skip_unless_ucx
from dist_harness import run_world

import ucxbackend
from ucxbackend import config as cfg

needs_native = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)

# op -> the algorithms that can be forced (everything but "auto")
FORCED: dict[str, tuple[str, ...]] = {
    op: tuple(n for n in names if n != "auto") for op, names in cfg.ALGORITHMS.items()
}
DEFAULT_CHUNK = cfg.Config().chunk_bytes
TINY_CHUNK = 20
COUNTS = (0, 1, 7, 389)
REDUCTIONS = (
    ("int64", "SUM"),
    ("int64", "MAX"),
    ("int64", "MIN"),
    ("int64", "PRODUCT"),
    ("float32", "SUM"),
    ("float32", "MAX"),
)
MOVES = ("int64", "float32")  # dtypes of the ops that only move data
REDOPS = {
    "SUM": dist.ReduceOp.SUM,
    "MAX": dist.ReduceOp.MAX,
    "MIN": dist.ReduceOp.MIN,
    "PRODUCT": dist.ReduceOp.PRODUCT,
}
NP_REDUCE: dict[str, Callable[..., np.ndarray]] = {
    "SUM": np.sum,
    "MAX": np.max,
    "MIN": np.min,
    "PRODUCT": np.prod,
}

# threshold name -> the op whose automatic choice it splits
THRESHOLD_OPS = {
    "allreduce_recursive_doubling_max": "allreduce",
    "allreduce_rabenseifner_max": "allreduce",
    "allgather_bruck_max": "allgather",
    "reduce_scatter_halving_max": "reduce_scatter",
    "broadcast_binomial_max": "broadcast",
    "reduce_binomial_max": "reduce",
    "alltoall_linear_max": "alltoall",
}

Part = tuple[int, tuple[int, ...]]  # (chunk_bytes, counts)
# Which spawn runs what: world size -> (parts of the forced matrix, "auto" at thresholds?).
# Chunking and world sizes are the C++ test's; one world runs every torch call per algorithm.
PLANS: dict[int, tuple[tuple[Part, ...], bool]] = {
    1: (((TINY_CHUNK, (0, 7)),), False),
    2: ((), True),
    3: (((TINY_CHUNK, COUNTS),), True),
    4: ((), True),
    5: ((), True),
}
QUICK_WORLDS = (2, 3)
WORLD_TIMEOUT = 300.0
MAX_REPORTED = 40  # failures returned per rank


def _world_param(ws: int) -> Any:
    marks = () if ws in QUICK_WORLDS else (pytest.mark.slow,)
    return pytest.param(ws, id=f"world{ws}", marks=marks)


# --------------------------------------------------------------------------- unit tests


def _algos() -> Any:
    from ucxbackend import _C

    return _C.algorithms


@needs_native
def test_names_match_config() -> None:
    names = _algos().names()
    assert names == {op: list(algos) for op, algos in cfg.ALGORITHMS.items()}
    for op, algos in names.items():
        assert algos[0] == "auto", op
        assert len(set(algos)) == len(algos) >= 3, op


@needs_native
def test_thresholds_table() -> None:
    t = _algos().thresholds()
    # allreduce_pair_slots_min splits host-staged 2-rank groups only, not choose()'s answer.
    assert set(t) == {
        *THRESHOLD_OPS,
        "allreduce_pair_slots_min",
        "default_chunk_bytes",
        "default_device_chunk_bytes",
        "allreduce_peer_map_min",
        "ring_max_ranks",
    }
    assert all(v > 0 for v in t.values()), t
    # the Python knobs' defaults are the native defaults
    assert t["default_chunk_bytes"] == DEFAULT_CHUNK
    assert t["default_device_chunk_bytes"] == cfg.Config().device_chunk_bytes
    assert t["allreduce_recursive_doubling_max"] < t["allreduce_rabenseifner_max"]


@needs_native
def test_device_peer_map_reaches_the_device_tuning_only() -> None:
    """device_peer_map (csrc/backend_options.cpp) decides the 2-rank all_reduce of CUDA
    tensors: off by default; auto from allreduce_peer_map_min; on at every size; never for CPU
    tensors, other group sizes, or an all_reduce algorithm forced."""
    a = _algos()
    least = a.thresholds()["allreduce_peer_map_min"]
    auto = {"device_peer_map": "auto"}
    on = {"device_peer_map": "on"}
    assert not a.peer_map_applies(1 << 20, 2, {}, True)
    assert not a.peer_map_applies(1 << 20, 2, {"device_peer_map": "off"}, True)
    assert a.peer_map_applies(least, 2, auto, True)
    assert not a.peer_map_applies(least - 1, 2, auto, True)
    assert a.peer_map_applies(0, 2, on, True) and a.peer_map_applies(least - 1, 2, on, True)
    for options in (auto, on):
        assert not a.peer_map_applies(1 << 20, 2, options, False)
        assert not a.peer_map_applies(1 << 20, 3, options, True)
        assert not a.peer_map_applies(1 << 20, 2, {**options, "algo_allreduce": "ring"}, True)
    with pytest.raises(ValueError, match="device_peer_map"):
        a.peer_map_applies(1 << 20, 2, {"device_peer_map": "always"}, True)


def _auto_expectations(ws: int) -> list[tuple[str, int, str]]:
    """(op, bytes, algorithm) that choose() must return with "auto" at world size ws."""
    t = _algos().thresholds()
    rd = t["allreduce_recursive_doubling_max"]
    rab = t["allreduce_rabenseifner_max"]
    # Rabenseifner between the two thresholds, only for power-of-two worlds of more than 2.
    middle = "rabenseifner" if ws > 2 and ws & (ws - 1) == 0 else "ring"
    cases = [
        ("allreduce", 0, "recursive_doubling"),
        ("allreduce", 1, "recursive_doubling"),
        ("allreduce", rd, "recursive_doubling"),
        ("allreduce", rd + 1, middle),
        ("allreduce", rab, middle),
        ("allreduce", rab + 1, "ring"),
        ("allreduce", 1 << 34, "ring"),
    ]
    for op, key, small, large in (
        ("allgather", "allgather_bruck_max", "bruck", "ring"),
        ("reduce_scatter", "reduce_scatter_halving_max", "recursive_halving", "ring"),
        ("alltoall", "alltoall_linear_max", "linear", "pairwise"),
        # with one or two ranks the chain is the binomial tree: the tree is kept
        ("broadcast", "broadcast_binomial_max", "binomial", "chain" if ws > 2 else "binomial"),
        ("reduce", "reduce_binomial_max", "binomial", "chain" if ws > 2 else "binomial"),
    ):
        cases += [
            (op, 0, small),
            (op, t[key], small),
            (op, t[key] + 1, large),
            (op, 1 << 34, large),
        ]
    return cases


@needs_native
@pytest.mark.parametrize("ws", [1, 2, 3, 4, 5, 6, 7, 8, 16])
def test_auto_choice_around_thresholds(ws: int) -> None:
    a = _algos()
    wrong = []
    for op, nbytes, want in _auto_expectations(ws):
        for options in ({}, {f"algo_{op}": "auto"}):
            got = a.choose(op, nbytes, ws, options)
            if got != want:
                wrong.append(f"{op} bytes={nbytes} world={ws} options={options}: {got} != {want}")
    assert not wrong, "\n".join(wrong)


@needs_native
def test_auto_choice_spot_checks() -> None:
    a = _algos()
    rd = a.thresholds()["allreduce_recursive_doubling_max"]
    assert a.choose("allreduce", rd + 1, 4) == "rabenseifner"
    assert a.choose("allreduce", rd + 1, 8) == "rabenseifner"
    assert a.choose("allreduce", rd + 1, 2) == "ring"
    assert a.choose("allreduce", rd + 1, 3) == "ring"
    assert a.choose("allreduce", rd + 1, 6) == "ring"
    big = a.thresholds()["broadcast_binomial_max"] + 1
    assert a.choose("broadcast", big, 2) == "binomial"
    assert a.choose("broadcast", big, 3) == "chain"
    # Rings need n-1 tag steps per phase: very large groups get the log-step algorithms.
    huge = a.thresholds()["ring_max_ranks"] + 1
    assert a.choose("allreduce", 1 << 30, huge) == "rabenseifner"
    assert a.choose("allgather", 1 << 30, huge) == "bruck"
    assert a.choose("reduce_scatter", 1 << 30, huge) == "recursive_halving"
    assert a.choose("allreduce", 1 << 30, huge - 1) == "ring"
    # chunk_bytes does not take part in the choice
    assert a.choose("allreduce", rd + 1, 4, {"chunk_bytes": "24"}) == "rabenseifner"


@needs_native
def test_device_memory_takes_device_chunk_bytes() -> None:
    """A 2-rank all_reduce of CUDA tensors up to one chunk is one recursive-doubling exchange;
    the chunk is device_chunk_bytes (64 MiB by default), not the host's chunk_bytes."""
    a = _algos()
    device_chunk = a.thresholds()["default_device_chunk_bytes"]
    assert device_chunk > DEFAULT_CHUNK
    rd = a.thresholds()["allreduce_recursive_doubling_max"]
    for nbytes in (rd + 1, DEFAULT_CHUNK + 1, device_chunk):
        assert a.choose("allreduce", nbytes, 2, device=True) == "recursive_doubling", nbytes
        assert a.choose("allreduce", nbytes, 2) == "ring", nbytes  # host memory: its own rule
    assert a.choose("allreduce", device_chunk + 1, 2, device=True) == "ring"
    assert a.choose("allreduce", device_chunk, 3, device=True) == "ring"
    # each knob sizes its own memory's chunk only
    small = {"device_chunk_bytes": "1M"}
    assert a.choose("allreduce", (1 << 20) + 4, 2, small, device=True) == "ring"
    assert a.choose("allreduce", 1 << 20, 2, small, device=True) == "recursive_doubling"
    assert a.choose("allreduce", DEFAULT_CHUNK + 1, 2, {"chunk_bytes": "1G"}, device=True) == (
        "recursive_doubling"
    )
    assert a.choose("allreduce", device_chunk + 1, 2, {"chunk_bytes": "1G"}, device=True) == (
        "ring"
    )


@needs_native
@pytest.mark.parametrize("op", sorted(FORCED))
def test_forced_algorithm_wins(op: str) -> None:
    a = _algos()
    sizes = sorted(
        {0, 1, 1023, *a.thresholds().values(), *(v + 1 for v in a.thresholds().values()), 1 << 34}
    )
    others = [o for o in FORCED if o != op]
    for alg in FORCED[op]:
        for ws in (1, 2, 3, 4, 5, 8):
            for nbytes in sizes:
                got = a.choose(op, nbytes, ws, {f"algo_{op}": alg, "chunk_bytes": "24"})
                assert got == alg, (op, alg, ws, nbytes, got)
                # forcing this op leaves the others on auto
                for other in others:
                    assert a.choose(other, nbytes, ws, {f"algo_{op}": alg}) == a.choose(
                        other, nbytes, ws
                    ), (op, alg, other, ws, nbytes)


@needs_native
@pytest.mark.parametrize("op", sorted(FORCED))
def test_bad_algorithm_name(op: str) -> None:
    a = _algos()
    # a made-up name, an algorithm of another op, and nothing
    foreign = next(n for names in FORCED.values() for n in names if n not in cfg.ALGORITHMS[op])
    for bad in ("bogus", foreign, ""):
        with pytest.raises(ValueError) as info:
            a.choose(op, 1, 2, {f"algo_{op}": bad})
        msg = str(info.value)
        assert f"algo_{op}" in msg, msg
        for name in cfg.ALGORITHMS[op]:
            assert name in msg, (name, msg)
        # the Python layer rejects it too, naming the knob and the allowed names
        with pytest.raises(ValueError, match=f"algo_{op}") as info:
            ucxbackend.Options.from_mapping({f"algo_{op}": bad})
        for name in cfg.ALGORITHMS[op]:
            assert repr(name) in str(info.value), (name, str(info.value))
        with pytest.raises(ValueError, match=f"UCXBACKEND_ALGO_{op.upper()}"):
            ucxbackend.get_config(env={f"UCXBACKEND_ALGO_{op.upper()}": bad or "x"})


@needs_native
@pytest.mark.parametrize("bad", ["0", "-1", "-24", "abc", "", "1.5", "4X", "4 M B"])
def test_bad_chunk_bytes_native(bad: str) -> None:
    # The native side parses sizes with the same grammar as the Python layer (one parser).
    with pytest.raises(ValueError, match="chunk_bytes"):
        _algos().choose("allreduce", 1, 2, {"chunk_bytes": bad})


@needs_native
def test_chunk_bytes_native_takes_the_one_size_grammar() -> None:
    # every spelling of 4 MiB is accepted, as the Python layer accepts it, and chooses alike
    for same in ("4194304", "4M", "4 MiB", " 4mb "):
        assert _algos().choose("allreduce", 8 << 20, 2, {"chunk_bytes": same}) == _algos().choose(
            "allreduce", 8 << 20, 2, {}
        )


@pytest.mark.parametrize("bad", [0, -1, "0", "abc", "", "1.5", True])
def test_bad_chunk_bytes_python(bad: object) -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        ucxbackend.Options.from_mapping({"chunk_bytes": bad})


@needs_native
def test_bad_pg_options_in_new_group_in_process() -> None:
    """new_group with a bad algorithm (or chunk size) fails with ValueError naming the knob."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group(
        "ucx",
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        for bad, knob in (
            ({"algo_allreduce": "bogus"}, "algo_allreduce"),
            ({"algo_broadcast": "ring"}, "algo_broadcast"),
            ({"algo_alltoall": "bruck"}, "algo_alltoall"),
            ({"chunk_bytes": 0}, "chunk_bytes"),
        ):
            with pytest.raises(ValueError, match=knob):
                dist.new_group(backend="ucx", pg_options=bad)
        # the world still works, and a good group does too
        g = dist.new_group(
            backend="ucx", pg_options={"algo_allreduce": "rabenseifner", "chunk_bytes": 8}
        )
        t = torch.arange(5, dtype=torch.int64)
        dist.all_reduce(t, group=g)
        assert t.tolist() == [0, 1, 2, 3, 4]
        dist.destroy_process_group(g)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- inputs, references


def _values(dname: str, redop: str | None, n: int, *key: Any) -> np.ndarray:
    """Deterministic data of n elements; key names the call and the rank it belongs to."""
    rng = np.random.default_rng(zlib.crc32(repr((dname, redop, n, *key)).encode()))
    if dname == "int64":
        if redop == "PRODUCT":
            return rng.choice(np.array([-2, -1, 1, 2, 3], dtype=np.int64), size=n)
        if redop == "SUM":  # 41-bit values: no overflow in 5 ranks, far past 32 bits
            return rng.integers(-(2**40), 2**40, size=n, dtype=np.int64)
        info = np.iinfo(np.int64)
        return rng.integers(info.min, info.max, size=n, dtype=np.int64, endpoint=True)
    assert dname == "float32", dname
    if redop is None:  # data movement: arbitrary mantissas
        return rng.standard_normal(n).astype(np.float32)
    return rng.integers(-1000, 1001, size=n).astype(np.float32)  # exact in any order


def _reduce(arrays: list[np.ndarray], redop: str) -> np.ndarray:
    stacked = np.stack(arrays)
    return NP_REDUCE[redop](stacked, axis=0).astype(arrays[0].dtype)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def _a2a_split(src: int, dst: int, count: int) -> int:
    """Uneven all_to_all: rows rank src sends rank dst (count-2 .. count+1, never < 0)."""
    return max(0, count + (src * 3 + dst * 5) % 4 - 2)


class _Recorder:
    """Collects failures; an exception in a call becomes an AssertionError naming the case."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.skipped: list[str] = []
        self.checked: dict[str, int] = {}  # call (first word of the case) -> results checked

    def run(self, case: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Call fn(*args, **kwargs); False if the reference backend rejected it."""
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            if not is_ucx() and isinstance(exc, (RuntimeError, ValueError)):
                self.skipped.append(f"{case}: {type(exc).__name__}: {str(exc)[:200]}")
                return False
            raise AssertionError(f"{case}: raised {type(exc).__name__}: {exc}") from exc
        return True

    def check(self, case: str, got: torch.Tensor, want: np.ndarray) -> None:
        call = case.split(" ", 1)[0]
        self.checked[call] = self.checked.get(call, 0) + 1
        g = got.detach().contiguous().numpy()
        if g.dtype == want.dtype and g.shape == want.shape and np.array_equal(g, want):
            return
        if g.dtype != want.dtype or g.shape != want.shape:
            detail = f"got {g.dtype}{list(g.shape)}, want {want.dtype}{list(want.shape)}"
        else:
            bad = np.flatnonzero(g != want)
            i = int(bad[0])
            detail = f"{bad.size}/{g.size} wrong, first at [{i}]: got {g[i]!r}, want {want[i]!r}"
        self.failures.append(f"{case}: {detail}")

    def result(self) -> dict[str, Any]:
        return {
            "failures": self.failures[:MAX_REPORTED],
            "n_failures": len(self.failures),
            "skipped": self.skipped[:MAX_REPORTED],
            "checked": self.checked,
        }


def _roots(ws: int) -> list[int]:
    return sorted({0, ws // 2, ws - 1})


# --------------------------------------------------------------------------- per-op checks
# Each runs every call of its op on group g; `tag` names the group in failure messages.


def _check_allreduce(
    rec: _Recorder, g: Any, rank: int, ws: int, tag: str, counts: tuple[int, ...] = COUNTS
) -> None:
    for dname, redop in REDUCTIONS:
        for count in counts:
            inputs = [_values(dname, redop, count, "ar", r) for r in range(ws)]
            want = _reduce(inputs, redop)
            t = _tensor(inputs[rank])
            case = f"all_reduce {tag} count={count} dtype={dname} redop={redop}"
            if rec.run(case, dist.all_reduce, t, op=REDOPS[redop], group=g):
                rec.check(case, t, want)


def _check_allgather(
    rec: _Recorder, g: Any, rank: int, ws: int, tag: str, counts: tuple[int, ...] = COUNTS
) -> None:
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    for dname in MOVES:
        for count in counts:
            inputs = [_values(dname, None, count, "ag", r) for r in range(ws)]
            want = np.concatenate(inputs)
            mine = _tensor(inputs[rank])

            out = torch.full((count * ws,), -7, dtype=mine.dtype)
            case = f"all_gather_into_tensor {tag} count={count} dtype={dname}"
            if rec.run(case, gather_single, out, mine, group=g):
                rec.check(case, out, want)

            outs = [torch.full((count,), -7, dtype=mine.dtype) for _ in range(ws)]
            case = f"all_gather(list) {tag} count={count} dtype={dname}"
            if rec.run(case, dist.all_gather, outs, mine, group=g):
                rec.check(case, torch.cat(outs), want)


def _check_reduce_scatter(
    rec: _Recorder, g: Any, rank: int, ws: int, tag: str, counts: tuple[int, ...] = COUNTS
) -> None:
    rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    for dname, redop in REDUCTIONS:
        for count in counts:  # elements per rank
            inputs = [_values(dname, redop, count * ws, "rs", r) for r in range(ws)]
            want = _reduce(inputs, redop)[rank * count : (rank + 1) * count]
            op = REDOPS[redop]

            full = _tensor(inputs[rank])
            out = torch.full((count,), -7, dtype=full.dtype)
            case = f"reduce_scatter_tensor {tag} count={count} dtype={dname} redop={redop}"
            if rec.run(case, rs_single, out, full, op=op, group=g):
                rec.check(case, out, want)
                rec.check(f"{case} (input modified)", full, inputs[rank])

            parts = (
                [p.clone() for p in _tensor(inputs[rank]).split(count)]
                if count
                else [torch.empty(0, dtype=full.dtype) for _ in range(ws)]
            )
            out = torch.full((count,), -7, dtype=full.dtype)
            case = f"reduce_scatter(list) {tag} count={count} dtype={dname} redop={redop}"
            if rec.run(case, dist.reduce_scatter, out, parts, op=op, group=g):
                rec.check(case, out, want)


def _check_broadcast(
    rec: _Recorder, g: Any, rank: int, ws: int, tag: str, counts: tuple[int, ...] = COUNTS
) -> None:
    for dname in MOVES:
        for count in counts:
            for root in _roots(ws):
                want = _values(dname, None, count, "bc", root)
                # the other ranks start from different data, which must be overwritten
                t = _tensor(want if rank == root else _values(dname, None, count, "bcx", rank))
                case = f"broadcast {tag} count={count} dtype={dname} root={root}"
                if rec.run(case, dist.broadcast, t, root, group=g):
                    rec.check(case, t, want)


def _check_reduce(
    rec: _Recorder, g: Any, rank: int, ws: int, tag: str, counts: tuple[int, ...] = COUNTS
) -> None:
    for dname, redop in REDUCTIONS:
        for count in counts:
            inputs = [_values(dname, redop, count, "rd", r) for r in range(ws)]
            want = _reduce(inputs, redop)
            for root in _roots(ws):
                t = _tensor(inputs[rank])
                case = f"reduce {tag} count={count} dtype={dname} redop={redop} root={root}"
                if rec.run(case, dist.reduce, t, root, op=REDOPS[redop], group=g):
                    if rank == root:
                        rec.check(case, t, want)
                    elif is_ucx():  # ucx sends non-root inputs as they are (Gloo may not)
                        rec.check(f"{case} (input of rank {rank} kept)", t, inputs[rank])


def _check_alltoall(
    rec: _Recorder, g: Any, rank: int, ws: int, tag: str, counts: tuple[int, ...] = COUNTS
) -> None:
    for dname in MOVES:
        for count in counts:  # elements per peer (even splits)
            inputs = [_values(dname, None, count * ws, "a2a", r) for r in range(ws)]
            want = np.concatenate([inputs[p][rank * count : (rank + 1) * count] for p in range(ws)])

            inp = _tensor(inputs[rank])
            out = torch.full((count * ws,), -7, dtype=inp.dtype)
            case = f"all_to_all_single(even) {tag} count={count} dtype={dname}"
            if rec.run(case, dist.all_to_all_single, out, inp, group=g):
                rec.check(case, out, want)
                rec.check(f"{case} (input modified)", inp, inputs[rank])

            same = _tensor(inputs[rank])
            case = f"all_to_all_single(in_place) {tag} count={count} dtype={dname}"
            # (Gloo, the reference run, silently returns wrong data in place)
            if is_ucx() and rec.run(case, dist.all_to_all_single, same, same, group=g):
                rec.check(case, same, want)

            # Uneven: rank s sends rank d _a2a_split(s, d) elements (some of them zero).
            splits = [[_a2a_split(s, d, count) for d in range(ws)] for s in range(ws)]
            uneven = [_values(dname, None, sum(splits[s]), "a2av", s) for s in range(ws)]
            pieces = []
            for s in range(ws):
                at = sum(splits[s][:rank])
                pieces.append(uneven[s][at : at + splits[s][rank]])
            want_v = np.concatenate(pieces)
            in_splits = splits[rank]
            out_splits = [splits[s][rank] for s in range(ws)]
            inp = _tensor(uneven[rank])
            out = torch.full((int(sum(out_splits)),), -7, dtype=inp.dtype)
            case = (
                f"all_to_all_single(uneven) {tag} count={count} dtype={dname} "
                f"in_splits={in_splits} out_splits={out_splits}"
            )
            if rec.run(
                case,
                dist.all_to_all_single,
                out,
                inp,
                output_split_sizes=out_splits,
                input_split_sizes=in_splits,
                group=g,
            ):
                rec.check(case, out, want_v)

            ins = [p.clone() for p in _tensor(uneven[rank]).split(in_splits)]
            outs = [torch.full((n,), -7, dtype=inp.dtype) for n in out_splits]
            case = f"all_to_all(list) {tag} uneven count={count} dtype={dname}"
            if rec.run(case, dist.all_to_all, outs, ins, group=g):
                rec.check(case, torch.cat(outs), want_v)


CHECKS: dict[str, Callable[..., None]] = {
    "allreduce": _check_allreduce,
    "allgather": _check_allgather,
    "reduce_scatter": _check_reduce_scatter,
    "broadcast": _check_broadcast,
    "reduce": _check_reduce,
    "alltoall": _check_alltoall,
}


def _new_group(options: dict[str, Any]) -> Any:
    if is_ucx():
        return dist.new_group(backend="ucx", pg_options=options)
    return dist.new_group()  # the reference run: a plain group of the backend under test


# --------------------------------------------------------------------------- "auto" near thresholds


def _threshold_sizes(ws: int, op: str, limit: int, esz: int = 8) -> list[tuple[int, int]]:
    """(count, bytes as choose() counts them) one element below, at and one above `limit`.

    all_gather / reduce_scatter count the whole output / input, so there the count per rank
    changes by one element: where ws * esz does not divide the limit (world sizes 3 and 5),
    "at" is the largest size under it and the threshold lies between it and the next one.
    """
    sizes = []
    for delta in (-1, 0, 1):
        if op in ("allgather", "reduce_scatter"):
            count = limit // (ws * esz) + delta
            sizes.append((count, count * ws * esz))
        else:
            # all_reduce, reduce, broadcast: the tensor; all_to_all: the per-peer block
            count = limit // esz + delta
            sizes.append((count, count * esz))
    return sizes


@needs_native
@pytest.mark.parametrize("ws", [ws for ws, (_, thr) in PLANS.items() if thr])
def test_threshold_sizes_straddle_every_threshold(ws: int) -> None:
    """The multi-rank "auto" runs reach both sides of every threshold, by one element."""
    a = _algos()
    for key, op in THRESHOLD_OPS.items():
        limit = a.thresholds()[key]
        (_, below), (_, at), (_, above) = _threshold_sizes(ws, op, limit)
        step = ws * 8 if op in ("allgather", "reduce_scatter") else 8
        assert below < at <= limit < above == at + step, (key, ws, below, at, above)
        # Where the choice stays the same on both sides (see _auto_expectations): ring on
        # both sides of Rabenseifner's range outside power-of-two worlds of more than 2, and
        # the binomial tree kept for one or two ranks.
        same = (key == "allreduce_rabenseifner_max" and (ws <= 2 or ws & (ws - 1) != 0)) or (
            op in ("broadcast", "reduce") and ws <= 2
        )
        assert (a.choose(op, at, ws) == a.choose(op, above, ws)) == same, (key, ws, at, above)


def _check_thresholds(rec: _Recorder, g: Any, rank: int, ws: int) -> None:
    """Each op at byte sizes just below, at and just above each of its thresholds."""
    a = ucxbackend._C.algorithms  # type: ignore[union-attr]
    esz = 8  # int64
    root = ws - 1
    for key, op in THRESHOLD_OPS.items():
        limit = a.thresholds()[key]
        for count, nbytes in _threshold_sizes(ws, op, limit, esz):
            tag = (
                f"algo=auto[{a.choose(op, nbytes, ws)}] world={ws} chunk={DEFAULT_CHUNK} "
                f"{key}={limit} bytes={nbytes}"
            )
            _threshold_call(rec, g, rank, ws, op, count, root, tag)
    # all_to_all with ranks on both sides of the threshold: even ranks send blocks one
    # element under it (linear), odd ranks one element over it (pairwise).
    base = a.thresholds()["alltoall_linear_max"] // esz
    sizes = [base + (1 if s % 2 else -1) for s in range(ws)]
    inputs = [_values("int64", None, sizes[s] * ws, "a2at", s) for s in range(ws)]
    want = np.concatenate([inputs[s][rank * sizes[s] : (rank + 1) * sizes[s]] for s in range(ws)])
    inp = _tensor(inputs[rank])
    out = torch.full((sum(sizes),), -7, dtype=torch.int64)
    case = f"all_to_all_single(mixed_sides) of alltoall_linear_max algo=auto world={ws}"
    if rec.run(
        case,
        dist.all_to_all_single,
        out,
        inp,
        output_split_sizes=sizes,
        input_split_sizes=[sizes[rank]] * ws,
        group=g,
    ):
        rec.check(case, out, want)


def _threshold_call(
    rec: _Recorder, g: Any, rank: int, ws: int, op: str, count: int, root: int, tag: str
) -> None:
    key = ("thr", op, count)
    if op == "allreduce":
        inputs = [_values("int64", "SUM", count, *key, r) for r in range(ws)]
        t = _tensor(inputs[rank])
        case = f"all_reduce {tag}"
        if rec.run(case, dist.all_reduce, t, group=g):
            rec.check(case, t, _reduce(inputs, "SUM"))
    elif op == "reduce":
        inputs = [_values("int64", "SUM", count, *key, r) for r in range(ws)]
        t = _tensor(inputs[rank])
        case = f"reduce {tag} root={root}"
        if rec.run(case, dist.reduce, t, root, group=g) and rank == root:
            rec.check(case, t, _reduce(inputs, "SUM"))
    elif op == "broadcast":
        want = _values("int64", None, count, *key, root)
        t = _tensor(want) if rank == root else torch.zeros(count, dtype=torch.int64)
        case = f"broadcast {tag} root={root}"
        if rec.run(case, dist.broadcast, t, root, group=g):
            rec.check(case, t, want)
    elif op == "allgather":
        inputs = [_values("int64", None, count, *key, r) for r in range(ws)]
        out = torch.empty(count * ws, dtype=torch.int64)
        gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        case = f"all_gather_into_tensor {tag}"
        if rec.run(case, gather_single, out, _tensor(inputs[rank]), group=g):
            rec.check(case, out, np.concatenate(inputs))
    elif op == "reduce_scatter":
        inputs = [_values("int64", "SUM", count * ws, *key, r) for r in range(ws)]
        out = torch.empty(count, dtype=torch.int64)
        rs_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        case = f"reduce_scatter_tensor {tag}"
        if rec.run(case, rs_single, out, _tensor(inputs[rank]), group=g):
            rec.check(case, out, _reduce(inputs, "SUM")[rank * count : (rank + 1) * count])
    elif op == "alltoall":
        inputs = [_values("int64", None, count * ws, *key, r) for r in range(ws)]
        want = np.concatenate([inputs[p][rank * count : (rank + 1) * count] for p in range(ws)])
        out = torch.empty(count * ws, dtype=torch.int64)
        case = f"all_to_all_single {tag}"
        if rec.run(case, dist.all_to_all_single, out, _tensor(inputs[rank]), group=g):
            rec.check(case, out, want)
    else:
        raise AssertionError(op)


# --------------------------------------------------------------------------- the spawned worlds


# The rings stage through shared memory when all ranks share a host (here always): run them
# with it off too, so that the transport path stays covered.
STAGED = {("allreduce", "ring"), ("allgather", "ring")}
STAGING: dict[tuple[str, str], tuple[str, ...]] = {
    (op, alg): ("auto", "off") if (op, alg) in STAGED else ("auto",)
    for op, algos in FORCED.items()
    for alg in algos
}


def _algorithm_world(rank: int, ws: int, parts: tuple[Part, ...], thresholds: bool) -> Any:
    warnings.simplefilter("ignore", FutureWarning)  # *_tensor names are deprecated aliases
    forced = _Recorder()
    for op, algos in FORCED.items():
        for alg in algos:
            for chunk, counts in parts:
                for shm in STAGING[(op, alg)]:
                    g = _new_group({f"algo_{op}": alg, "chunk_bytes": chunk, "shared_memory": shm})
                    label = f"algo={alg} world={ws} chunk={chunk} shared_memory={shm}"
                    CHECKS[op](forced, g, rank, ws, label, counts)
                    dist.destroy_process_group(g)
    auto = _Recorder()
    if thresholds:
        g = _new_group({**{f"algo_{op}": "auto" for op in FORCED}, "chunk_bytes": DEFAULT_CHUNK})
        _check_thresholds(auto, g, rank, ws)
        dist.destroy_process_group(g)
    return {"forced": forced.result(), "auto": auto.result()}


_WORLDS: dict[int, list[Any] | BaseException] = {}


def _world_results(ws: int) -> list[Any]:
    """The per-rank results of world ws, spawned once for all the tests that read it.

    A failed world (an error, a hang) is remembered too: the next test re-raises at once
    instead of waiting for the same timeout again.
    """
    if ws not in _WORLDS:
        parts, thresholds = PLANS[ws]
        try:
            _WORLDS[ws] = run_world(
                _algorithm_world,
                ws,
                args=(parts, thresholds),
                timeout=WORLD_TIMEOUT,
                pg_timeout=120.0,
            )
        except (AssertionError, TimeoutError) as exc:
            _WORLDS[ws] = exc
    res = _WORLDS[ws]
    if isinstance(res, BaseException):
        raise res
    return res


# The calls each part must have checked (first word of their case names).
EXPECTED_CALLS = {
    "forced": {
        "all_reduce",
        "all_gather_into_tensor",
        "all_gather(list)",
        "reduce_scatter_tensor",
        "reduce_scatter(list)",
        "broadcast",
        "reduce",
        "all_to_all_single(even)",
        "all_to_all_single(uneven)",
        "all_to_all(list)",
        *(("all_to_all_single(in_place)",) if is_ucx() else ()),
    },
    "auto": {
        "all_reduce",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "broadcast",
        "reduce",
        "all_to_all_single",
        "all_to_all_single(mixed_sides)",
    },
}


def _assert_clean(results: list[Any], part: str) -> None:
    checked = {call for res in results for call in res[part]["checked"]}
    skipped = sorted({s for res in results for s in res[part]["skipped"]})
    if skipped:  # only under the reference backend: calls it rejects
        warnings.warn(
            f"{len(skipped)} calls rejected by the reference backend: " + "; ".join(skipped[:5]),
            stacklevel=2,
        )
        assert checked <= EXPECTED_CALLS[part], sorted(checked - EXPECTED_CALLS[part])
    else:
        assert checked == EXPECTED_CALLS[part], sorted(checked ^ EXPECTED_CALLS[part])
    for rank, res in enumerate(results):
        assert sum(res[part]["checked"].values()) > 0, f"rank {rank} checked nothing"
    lines = []
    for rank, res in enumerate(results):
        r = res[part]
        lines += [f"rank {rank}: {f}" for f in r["failures"]]
        if r["n_failures"] > len(r["failures"]):
            lines.append(f"rank {rank}: ... {r['n_failures'] - len(r['failures'])} more")
    assert not lines, f"{len(lines)} wrong results:\n" + "\n".join(lines)


@needs_native
@pytest.mark.parametrize("ws", [_world_param(ws) for ws, (parts, _) in PLANS.items() if parts])
def test_every_algorithm_matches_numpy(ws: int) -> None:
    _assert_clean(_world_results(ws), "forced")


@needs_native
@pytest.mark.parametrize("ws", [_world_param(ws) for ws, (_, thr) in PLANS.items() if thr])
def test_auto_around_thresholds(ws: int) -> None:
    _assert_clean(_world_results(ws), "auto")


# --------------------------------------------------------------------------- the environment path

ENV = {
    "UCXBACKEND_ALGO_ALLREDUCE": "rabenseifner",  # not a power of two below: never auto
    "UCXBACKEND_ALGO_BROADCAST": "chain",
    "UCXBACKEND_ALGO_ALLGATHER": "linear",
    "UCXBACKEND_CHUNK_BYTES": "40",
    "UCXBACKEND_ALGO_REDUCE": "",  # empty = unset, whatever the outer environment says
}


class _NativeSpy:
    """Wraps ucxbackend._C: records the options every backend is created with."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.options: list[dict[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)

    def create_backend(self, *args: Any, **kwargs: Any) -> Any:
        self.options.append(dict(kwargs["options"] if "options" in kwargs else args[6]))
        return self._native.create_backend(*args, **kwargs)


def _env_world(rank: int, ws: int) -> Any:
    warnings.simplefilter("ignore", FutureWarning)
    report: dict[str, Any] = {}
    conf = ucxbackend.get_config()
    report["config"] = {
        k: getattr(conf, k)
        for k in (
            "algo_allreduce",
            "algo_broadcast",
            "algo_allgather",
            "algo_reduce",
            "chunk_bytes",
        )
    }
    report["sources"] = {k: conf.sources[k] for k in report["config"]}

    spy = _NativeSpy(ucxbackend._C)
    ucxbackend._C = spy  # type: ignore[assignment]
    try:
        plain = dist.new_group(backend="ucx")  # env only
        override = dist.new_group(backend="ucx", pg_options={"algo_allreduce": "ring"})
        errors = {}
        for name, bad in (
            ("algo_allreduce", {"algo_allreduce": "bogus"}),
            ("algo_broadcast", {"algo_broadcast": "ring"}),
            ("chunk_bytes", {"chunk_bytes": "0"}),
        ):
            try:
                dist.new_group(backend="ucx", pg_options=bad)
                errors[name] = None
            except ValueError as exc:
                errors[name] = str(exc)
        report["errors"] = errors
    finally:
        ucxbackend._C = spy._native
    report["native_options"] = [
        {k: o[k] for k in ("algo_allreduce", "algo_broadcast", "algo_allgather", "chunk_bytes")}
        for o in spy.options
    ]

    rec = _Recorder()
    for g, tag in ((None, "default group"), (plain, "env group"), (override, "override group")):
        _check_allreduce(rec, g, rank, ws, f"{tag} world={ws}")
        _check_broadcast(rec, g, rank, ws, f"{tag} world={ws}")
        _check_allgather(rec, g, rank, ws, f"{tag} world={ws}")
    report["result"] = rec.result()
    return report


@needs_native
def test_env_selects_algorithm_and_chunk() -> None:
    skip_unless_ucx("UCXBACKEND_ALGO_* and UCXBACKEND_CHUNK_BYTES are ucx knobs")
    ws = 3
    results = run_world(_env_world, ws, env=ENV, timeout=WORLD_TIMEOUT, pg_timeout=120.0)
    env_native = {
        "algo_allreduce": "rabenseifner",
        "algo_broadcast": "chain",
        "algo_allgather": "linear",
        "chunk_bytes": "40",
    }
    for rank, rep in enumerate(results):
        assert rep["config"] == {
            "algo_allreduce": "rabenseifner",
            "algo_broadcast": "chain",
            "algo_allgather": "linear",
            "algo_reduce": "auto",
            "chunk_bytes": 40,
        }, (rank, rep["config"])
        assert rep["sources"] == {
            "algo_allreduce": "env",
            "algo_broadcast": "env",
            "algo_allgather": "env",
            "algo_reduce": "default",
            "chunk_bytes": "env",
        }, (rank, rep["sources"])
        # what reached the native constructor: the env group, then the override group
        # (pg_options beat the env knob by knob); the bad groups never got there
        assert rep["native_options"] == [
            env_native,
            {**env_native, "algo_allreduce": "ring"},
        ], (rank, rep["native_options"])
        for knob, msg in rep["errors"].items():
            assert msg is not None, f"rank {rank}: bad {knob} accepted by new_group"
            assert knob in msg, (rank, knob, msg)
        assert "'rabenseifner'" in rep["errors"]["algo_allreduce"], rep["errors"]
        res = rep["result"]
        assert set(res["checked"]) == {
            "all_reduce",
            "broadcast",
            "all_gather_into_tensor",
            "all_gather(list)",
        }, (rank, res["checked"])
        assert not res["failures"], f"rank {rank}:\n" + "\n".join(res["failures"])


# ------------------------------------------------------------- every op's environment knob

# One UCXBACKEND_ALGO_<OP> per op, each naming an algorithm that "auto" does not choose for
# the small messages below at world size 3, so that the knob visibly changes the choice.
ENV_EVERY_OP = {
    "UCXBACKEND_ALGO_ALLREDUCE": "ring",
    "UCXBACKEND_ALGO_ALLGATHER": "ring",
    "UCXBACKEND_ALGO_REDUCE_SCATTER": "ring",
    "UCXBACKEND_ALGO_BROADCAST": "chain",
    "UCXBACKEND_ALGO_REDUCE": "chain",
    "UCXBACKEND_ALGO_ALLTOALL": "pairwise",
}
ENV_WORLD = 3
PATTERN_COUNT = 16  # int64 elements per rank (per peer for all_to_all): one small message
# How long rank 0 waits for rank 1's all_to_all block before it joins (see _early_block).
EARLY_WAIT = 1.0


def _env_algo(op: str) -> str:
    return ENV_EVERY_OP[f"UCXBACKEND_ALGO_{op.upper()}"]


def _settled(g: Any) -> dict[str, Any]:
    """A barrier on udp group g, then its counters once the barrier's own are published.

    The progress thread publishes an op's counters after the op's Work has completed; by the
    time the barrier's record shows, everything this rank sent before it is counted.
    """
    ops = ucxbackend.stats(g)["ops"]
    last = ops[-1]["seq"] if ops else -1
    dist.barrier(group=g)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        snap = ucxbackend.stats(g)
        if snap["ops"] and snap["ops"][-1]["op"] == "barrier" and snap["ops"][-1]["seq"] > last:
            return snap
        time.sleep(0.001)
    raise TimeoutError("the barrier's counters were never published")


def _pattern_call(op: str, g: Any, rank: int, ws: int) -> None:
    n = PATTERN_COUNT
    x = torch.arange(n * ws, dtype=torch.int64) + rank
    if op == "allreduce":
        dist.all_reduce(x[:n].clone(), group=g)
    elif op == "allgather":
        dist.all_gather_into_tensor(torch.empty(n * ws, dtype=x.dtype), x[:n].clone(), group=g)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(torch.empty(n, dtype=x.dtype), x, group=g)
    elif op == "broadcast":
        dist.broadcast(x, 0, group=g)
    elif op == "reduce":
        dist.reduce(x, 0, group=g)
    else:
        raise AssertionError(op)


def _message_pattern(op: str, g: Any, rank: int, ws: int) -> list[int]:
    """Messages this rank sent each peer in one small `op` on udp group g (and a barrier).

    The udp transport counts messages per peer; the algorithms of an op differ in whom they
    send to and how often (all_to_all's excepted: see _early_block).
    """
    before = _settled(g)["peers"]
    _pattern_call(op, g, rank, ws)
    after = _settled(g)["peers"]
    return [after[p]["messages_sent"] - before[p]["messages_sent"] for p in range(ws)]


def _early_block(g: Any, rank: int, ws: int) -> bool | None:
    """all_to_all with rank 0 late: did rank 1's block reach rank 0 before rank 0 joined?

    linear and pairwise send each peer the same message, so counts cannot tell them apart;
    their order can. linear posts every send at once. pairwise sends to rank+i in step i,
    after step i-1 completed: rank 1's block for rank 0 (step 2 of 3 ranks) waits for rank
    0's own step-1 block, which rank 0 sends only once it joins. Rank 0 waits for rank 2's
    step-1 block (so the others have joined), then up to EARLY_WAIT for rank 1's.
    """
    _settled(g)
    n = PATTERN_COUNT

    def received(peer: int) -> int:
        return int(ucxbackend.stats(g)["peers"][peer]["payload_bytes_received"])

    # Rank 0 reads its counters before a barrier releases the others: read after it, they
    # could already count the blocks sent right after. A barrier's messages carry no payload.
    start = {p: received(p) for p in (1, 2)} if rank == 0 else {}
    dist.barrier(group=g)
    early = None
    if rank == 0:
        deadline = time.monotonic() + 30
        while received(2) == start[2]:
            assert time.monotonic() < deadline, "rank 2's block never came"
            time.sleep(0.002)
        deadline = time.monotonic() + EARLY_WAIT
        while received(1) == start[1] and time.monotonic() < deadline:
            time.sleep(0.002)
        early = received(1) != start[1]
    inp = torch.arange(n * ws, dtype=torch.int64) + 100 * rank
    out = torch.empty(n * ws, dtype=torch.int64)
    dist.all_to_all_single(out, inp, group=g)
    want = torch.cat([torch.arange(n, dtype=torch.int64) + n * rank + 100 * p for p in range(ws)])
    assert torch.equal(out, want), (out, want)
    return early


def _env_every_op_world(rank: int, ws: int) -> Any:
    warnings.simplefilter("ignore", FutureWarning)
    conf = ucxbackend.get_config()
    report: dict[str, Any] = {
        "config": {op: getattr(conf, f"algo_{op}") for op in FORCED},
        "sources": {op: conf.sources[f"algo_{op}"] for op in FORCED},
    }
    spy = _NativeSpy(ucxbackend._C)
    ucxbackend._C = spy  # type: ignore[assignment]
    try:
        plain = dist.new_group(backend="ucx")  # env only
    finally:
        ucxbackend._C = spy._native
    report["native_options"] = [{op: o.get(f"algo_{op}") for op in FORCED} for o in spy.options]

    # Results: every call of every op on the default group and on a new group, both built
    # from the environment alone.
    rec = _Recorder()
    for g, tag in ((None, "default group"), (plain, "env group")):
        for op in FORCED:
            CHECKS[op](rec, g, rank, ws, f"{tag} algo={_env_algo(op)} world={ws}")
    report["result"] = rec.result()

    # The algorithm that ran: the same small call of each op on udp groups (same collectives,
    # counted traffic), one from the environment alone and one forcing each algorithm.
    env_udp = dist.new_group(backend="udp")
    forced: dict[str, dict[str, Any]] = {op: {} for op in FORCED}
    for k in range(max(len(a) for a in FORCED.values())):
        opts = {f"algo_{op}": algos[k] for op, algos in FORCED.items() if k < len(algos)}
        g = dist.new_group(backend="udp", pg_options=opts)
        for op, algos in FORCED.items():
            if k < len(algos):
                forced[op][algos[k]] = (
                    _early_block(g, rank, ws)
                    if op == "alltoall"
                    else _message_pattern(op, g, rank, ws)
                )
        dist.destroy_process_group(g)
    report["forced"] = forced
    report["env"] = {
        op: _early_block(env_udp, rank, ws)
        if op == "alltoall"
        else _message_pattern(op, env_udp, rank, ws)
        for op in FORCED
    }
    dist.destroy_process_group(env_udp)
    dist.destroy_process_group(plain)
    return report


@needs_native
def test_env_selects_every_ops_algorithm() -> None:
    """UCXBACKEND_ALGO_<OP> for every op reaches the native group and decides what runs."""
    skip_unless_ucx("UCXBACKEND_ALGO_* are ucx/udp knobs")
    ws = ENV_WORLD
    assert {f"UCXBACKEND_ALGO_{op.upper()}" for op in FORCED} == set(ENV_EVERY_OP)
    a = _algos()
    for op in FORCED:  # the knob changes the choice at every size the test uses
        for count in (*COUNTS, PATTERN_COUNT):
            for nbytes in (count * 8, count * 8 * ws):  # an int64 block / the whole buffer
                assert a.choose(op, nbytes, ws) != _env_algo(op), (op, nbytes)
    results = run_world(
        _env_every_op_world, ws, env=ENV_EVERY_OP, timeout=WORLD_TIMEOUT, pg_timeout=120.0
    )
    want = {op: _env_algo(op) for op in FORCED}
    for rank, rep in enumerate(results):
        assert rep["config"] == want, (rank, rep["config"])
        assert rep["sources"] == dict.fromkeys(FORCED, "env"), (rank, rep["sources"])
        assert rep["native_options"] == [want], (rank, rep["native_options"])
        res = rep["result"]
        assert set(res["checked"]) == EXPECTED_CALLS["forced"], (rank, res["checked"])
        assert not res["failures"], f"rank {rank}:\n" + "\n".join(res["failures"])
    for op in FORCED:
        env_alg = _env_algo(op)
        ran = [rep["env"][op] for rep in results]
        patterns = {alg: [rep["forced"][op][alg] for rep in results] for alg in FORCED[op]}
        if op == "alltoall":
            assert patterns["linear"][0] is True, patterns  # the check can tell them apart
            assert patterns["pairwise"][0] is False, patterns
        else:
            others = {alg: p for alg, p in patterns.items() if alg != env_alg}
            # the env's algorithm leaves a pattern of its own (or this check proves nothing)
            assert all(p != patterns[env_alg] for p in others.values()), (op, patterns)
        assert ran == patterns[env_alg], f"{op}: env ran {ran}, {env_alg} is {patterns}"


# ------------------------------------------------------------------ in-place reduce_scatter


def _inplace_reduce_scatter(rank: int, world: int) -> list[str]:
    failures = []
    block = 50_000  # 200 KB of int32 per rank: the ring, not recursive halving, under auto
    full = [
        np.arange(block * world, dtype=np.int64).astype(np.int32) * (r + 1) + r
        for r in range(world)
    ]
    expected = sum(f.astype(np.int64) for f in full).astype(np.int32)[
        rank * block : (rank + 1) * block
    ]
    for algo in ("auto", "ring", "recursive_halving"):
        group = dist.new_group(backend=BACKEND_UNDER_TEST, pg_options=_opts(algo))
        # Tensor form: the output is this rank's block of the input (NCCL-style in place).
        inp = torch.from_numpy(full[rank].copy())
        out = inp.chunk(world)[rank]
        dist.reduce_scatter_tensor(out, inp, group=group)
        if not np.array_equal(out.numpy(), expected):
            failures.append(f"reduce_scatter_tensor in place, {algo}, world {world}")
        # List form: this rank's input block is the output tensor itself.
        parts = [
            torch.from_numpy(full[rank][p * block : (p + 1) * block].copy()) for p in range(world)
        ]
        dist.reduce_scatter(parts[rank], parts, group=group)
        if not np.array_equal(parts[rank].numpy(), expected):
            failures.append(f"reduce_scatter list in place, {algo}, world {world}")
        dist.destroy_process_group(group)
    return failures


def _opts(algo: str) -> dict[str, str] | None:
    return {"algo_reduce_scatter": algo} if is_ucx() else None


BACKEND_UNDER_TEST = "ucx" if is_ucx() else "gloo"


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_in_place(world: int) -> None:
    """An output that aliases this rank's input block must still get the full reduction."""
    skip_unless_ucx("forces ucx reduce_scatter algorithms")
    results = run_world(_inplace_reduce_scatter, world, timeout=300)
    assert [f for r in results for f in r] == []
