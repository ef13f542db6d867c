"""One rank of the multi-node tests (``tests/test_multinode_*.py``), launched by torchrun.

Every collective runs on the backend under test (the default group, ``--backend``) and on a
Gloo group over the same ranks with the same inputs; results must agree with each other and
with a reference computed locally (torch for the first ops, numpy for the rest). Inputs are
small integers (exact in float32 and int64; the int64 all_reduce also carries values beyond
2**53 so that a float detour would show, and PRODUCT wraps around 2**64), so every comparison
is exact. Covered: all_reduce (SUM on int64 and float32; MAX, MIN, PRODUCT on int64),
all_gather, all_gather_into_tensor, reduce_scatter (list and tensor), broadcast, reduce,
gather, scatter, all_to_all (list; with uneven sizes on the backend under test only, since
Gloo rejects them: checked against Gloo's uneven all_to_all_single), all_to_all_single (equal
and uneven splits, empty blocks), isend/irecv, batch_isend_irecv, recv from any source,
barrier.

Prints ``MULTINODE_OK rank=<r> world=<n> host=<hostname> ... send_lane_messages=<k>
group_threads=<t> transports=<names> any_host=<bool>`` (how many sends took ucx's send lane,
``none`` without one; the threads its host's ranks run that a lost yield counts as the group's
own, ucxbackend.wait_stats; the transports below the world group's, ucxbackend.startup_profile,
comma-separated; and whether its creation needed the second round for a group that spans hosts)
when everything matched, and exits non-zero (with the mismatch) otherwise.
``MULTINODE_CORRUPT=1`` (tests only) also compares a corrupted copy of every non-empty result
with its reference, which must be reported as a mismatch, and then fails the rank with
``corrupted results caught: <k> of <n>`` and the kinds of check they came from, to show that
every comparison can fail.

``--backend ucx,udp`` runs all of that once per backend, in that order, in one process (torch
imported once: most of a job's cost), each phase between ``MULTINODE_BEGIN backend=<b>`` and
``MULTINODE_END backend=<b> rc=<status>`` with every rank past the END line before any starts
the next phase; the exit status is non-zero when any phase failed
(``multinode_harness.start_jobs`` splits the output per phase). A phase named
``<backend>+hide_launcher`` runs with torchrun's LOCAL_WORLD_SIZE removed for its world's
creation, so that a ucx rank cannot tell from it that the job spans hosts
(csrc/launcher_hosts.hpp).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from multinode_phases import PHASE_BEGIN, PHASE_END

import ucxbackend  # registers the ucx backend, and udp when built

# Test-only: every comparison must also reject a corrupted copy of the result.
CORRUPT = os.environ.get("MULTINODE_CORRUPT") == "1"
# Read before a +hide_launcher phase removes it.
LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
_corrupt_caught: list[str] = []  # the kind of check of each corrupted copy that was rejected
_corrupt_missed: list[str] = []  # the names of those that were not


class Mismatch(AssertionError):
    pass


# torch 2.13 deprecates the *_tensor spellings in favour of *_single.
_all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _differs(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want)


def _expect(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if CORRUPT and got.numel() > 0:
        bad = got.clone()
        bad.view(-1)[0] += 1
        if _differs(bad, want):
            kind = re.match(r"[a-z_/]+(?: [A-Z]+| list| uneven| any source)?", name)
            _corrupt_caught.append(kind[0] if kind else name)
        else:
            _corrupt_missed.append(name)
    if _differs(got, want):
        diff = (got != want).nonzero()[:5].flatten().tolist() if got.shape == want.shape else []
        raise Mismatch(
            f"{name}: wrong result (first bad indices {diff}); got {got[:8].tolist()}"
            f" want {want[:8].tolist()}"
        )


def _input(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Element i is ``(i % 97 + 3 * rank + salt) % 101``, built as one period of 97 repeated:
    torch's int64 ``%`` over the whole range cost 28 ms per 1.5M elements, and the ranks
    build their inputs and references about 400 times a job (most of each rank's CPU)."""
    period = ((torch.arange(97, dtype=torch.int64) + 3 * rank + salt) % 101).to(dtype)
    return period.repeat(-(-numel // 97))[:numel]


def run_all(rank: int, world: int, sizes: list[int], gloo: dist.ProcessGroup) -> int:
    """Run every collective at every size on both groups; return the number of checks."""
    checks = 0
    for numel in sizes:
        per = max(1, numel // world)
        # all_reduce: int64 bit-exact (with a large offset), float32.
        for dtype in (torch.int64, torch.float32):
            big = (1 << 60) if dtype == torch.int64 else 0
            want = sum(_input(r, numel, dtype) for r in range(world)) + big * world
            for group, label in ((None, "test"), (gloo, "gloo")):
                t = _input(rank, numel, dtype) + big
                dist.all_reduce(t, group=group)
                _expect(f"all_reduce {dtype} n={numel} [{label}]", t, want)
                checks += 1
        # all_gather (list) and all_gather_into_tensor
        want_parts = [_input(r, numel, torch.float32) for r in range(world)]
        for group, label in ((None, "test"), (gloo, "gloo")):
            outs = [torch.empty(numel) for _ in range(world)]
            dist.all_gather(outs, _input(rank, numel, torch.float32), group=group)
            for r in range(world):
                _expect(f"all_gather n={numel} part {r} [{label}]", outs[r], want_parts[r])
            flat = torch.empty(numel * world)
            _all_gather_single(flat, _input(rank, numel, torch.float32), group=group)
            _expect(f"all_gather_into_tensor n={numel} [{label}]", flat, torch.cat(want_parts))
            checks += 2
        # reduce_scatter_tensor
        full = sum(_input(r, per * world, torch.int64) for r in range(world))
        for group, label in ((None, "test"), (gloo, "gloo")):
            out = torch.empty(per, dtype=torch.int64)
            _reduce_scatter_single(out, _input(rank, per * world, torch.int64), group=group)
            _expect(
                f"reduce_scatter n={per * world} [{label}]",
                out,
                full[rank * per : (rank + 1) * per],
            )
            checks += 1
        # broadcast and reduce from every root
        for root in range(world):
            for group, label in ((None, "test"), (gloo, "gloo")):
                t = _input(rank, numel, torch.float32, salt=root)
                dist.broadcast(t, src=root, group=group)
                _expect(
                    f"broadcast root={root} n={numel} [{label}]",
                    t,
                    _input(root, numel, torch.float32, salt=root),
                )
                t = _input(rank, numel, torch.int64, salt=root)
                dist.reduce(t, dst=root, group=group)
                if rank == root:
                    want = sum(_input(r, numel, torch.int64, salt=root) for r in range(world))
                    _expect(f"reduce root={root} n={numel} [{label}]", t, want)
                checks += 2
        # all_to_all_single: block j of rank i goes to rank j
        for group, label in ((None, "test"), (gloo, "gloo")):
            send = _input(rank, per * world, torch.int64, salt=7)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=group)
            want = torch.cat(
                [
                    _input(r, per * world, torch.int64, salt=7)[rank * per : (rank + 1) * per]
                    for r in range(world)
                ]
            )
            _expect(f"all_to_all n={per * world} [{label}]", recv, want)
            checks += 1
        # send/recv around the ring
        if world > 1:
            for group, label in ((None, "test"), (gloo, "gloo")):
                nxt, prv = (rank + 1) % world, (rank - 1) % world
                out = torch.empty(numel, dtype=torch.int64)
                reqs = [
                    dist.isend(_input(rank, numel, torch.int64, salt=11), nxt, group=group),
                    dist.irecv(out, prv, group=group),
                ]
                for req in reqs:
                    req.wait()
                _expect(
                    f"send/recv n={numel} [{label}]", out, _input(prv, numel, torch.int64, salt=11)
                )
                checks += 1
        checks += run_more(rank, world, numel, gloo)
        dist.barrier()
        dist.barrier(group=gloo)
    return checks


# -- the rest of the API: numpy references, built from the inputs' formula alone -----------


def _np_input(rank: int, numel: int, salt: int = 0) -> np.ndarray:
    """``_input`` in numpy (int64), written out again so that a bug in one shows in the other."""
    return (np.arange(numel, dtype=np.int64) % 97 + 3 * rank + salt) % 101


def _expect_np(name: str, got: torch.Tensor, want: np.ndarray) -> None:
    _expect(name, got, torch.from_numpy(np.ascontiguousarray(want)))


def _split(src: int, dst: int, unit: int) -> int:
    """Elements rank ``src`` sends to rank ``dst`` in the uneven all-to-alls: 0, 1 or 2 units
    (so some blocks are empty, and the sizes differ in both directions)."""
    return ((src + 2 * dst) % 3) * unit


def _uneven_send(src: int, world: int, unit: int, salt: int) -> np.ndarray:
    return _np_input(src, sum(_split(src, j, unit) for j in range(world)), salt)


def _uneven_block(src: int, dst: int, world: int, unit: int, salt: int) -> np.ndarray:
    start = sum(_split(src, j, unit) for j in range(dst))
    return _uneven_send(src, world, unit, salt)[start : start + _split(src, dst, unit)]


# int64 operands for MAX/MIN (beyond 2**53 and of both signs: a float detour would show) and
# for PRODUCT (the product of two ranks' operands already wraps around 2**64).
def _minmax_operand(rank: int, numel: int) -> np.ndarray:
    return (_np_input(rank, numel, 5) - 50) * (1 << 54) + rank


def _product_operand(rank: int, numel: int) -> np.ndarray:
    return (_np_input(rank, numel, 9) + 1) * (1 << 33) + 2 * rank + 1


_REDUCE_OPS = (
    ("MAX", dist.ReduceOp.MAX, _minmax_operand, np.maximum),
    ("MIN", dist.ReduceOp.MIN, _minmax_operand, np.minimum),
    ("PRODUCT", dist.ReduceOp.PRODUCT, _product_operand, np.multiply),
)


def run_more(rank: int, world: int, numel: int, gloo: dist.ProcessGroup) -> int:
    """gather, scatter, list all_to_all (also with uneven sizes on the backend under test), list
    reduce_scatter, uneven all_to_all_single, batch_isend_irecv, recv from any source and
    all_reduce MAX/MIN/PRODUCT, on both groups, against numpy references. Returns the number
    of checks."""
    checks = 0
    per = max(1, numel // world)
    unit = max(1, numel // (2 * world))
    groups = ((None, "test"), (gloo, "gloo"))
    # all_reduce with MAX, MIN, PRODUCT on int64, bit-exact (numpy wraps like the backends)
    for opname, op, operand, ufunc in _REDUCE_OPS:
        with np.errstate(over="ignore"):
            want = ufunc.reduce(np.stack([operand(r, numel) for r in range(world)]), axis=0)
        for group, label in groups:
            t = torch.from_numpy(operand(rank, numel))
            dist.all_reduce(t, op=op, group=group)
            _expect_np(f"all_reduce {opname} int64 n={numel} [{label}]", t, want)
            checks += 1
    # gather and scatter, first and last rank as root
    for root in sorted({0, world - 1}):
        for group, label in groups:
            mine = _input(rank, numel, torch.float32, salt=20 + root)
            parts = [torch.empty(numel) for _ in range(world)] if rank == root else None
            dist.gather(mine, parts, dst=root, group=group)
            if parts is not None:
                for r in range(world):
                    want_g = _np_input(r, numel, 20 + root).astype(np.float32)
                    _expect_np(f"gather root={root} n={numel} part {r} [{label}]", parts[r], want_g)
            out = torch.empty(numel, dtype=torch.int64)
            pieces = None
            if rank == root:
                pieces = [_input(r, numel, torch.int64, salt=30 + root) for r in range(world)]
            dist.scatter(out, pieces, src=root, group=group)
            _expect_np(
                f"scatter root={root} n={numel} [{label}]", out, _np_input(rank, numel, 30 + root)
            )
            checks += 2
    # reduce_scatter with a list of inputs: input j of every rank is summed into rank j
    big = 1 << 60
    want_rs = sum(_np_input(r, per, 40 + rank) + big for r in range(world))
    for group, label in groups:
        out = torch.empty(per, dtype=torch.int64)
        ins = [_input(rank, per, torch.int64, salt=40 + j) + big for j in range(world)]
        dist.reduce_scatter(out, ins, group=group)
        _expect_np(f"reduce_scatter list n={per} [{label}]", out, want_rs)
        checks += 1
    # all_to_all with lists: block j of rank i (salt 45 + j) goes to rank j
    for group, label in groups:
        outs = [torch.full((per,), -1, dtype=torch.int64) for _ in range(world)]
        ins = [_input(rank, per, torch.int64, salt=45 + j) for j in range(world)]
        dist.all_to_all(outs, ins, group=group)
        for i in range(world):
            want_a = _np_input(i, per, 45 + rank)
            _expect_np(f"all_to_all list n={per} from {i} [{label}]", outs[i], want_a)
        checks += 1
    # all_to_all_single with uneven splits (empty blocks included) on both groups; the same
    # blocks as a list all_to_all of tensors of different sizes, which Gloo rejects: on the
    # backend under test only, checked against numpy and against Gloo's all_to_all_single.
    in_splits = [_split(rank, j, unit) for j in range(world)]
    out_splits = [_split(i, rank, unit) for i in range(world)]
    want_blocks = [_uneven_block(i, rank, world, unit, 50) for i in range(world)]
    send = torch.from_numpy(_uneven_send(rank, world, unit, 50))
    singles = {}
    for group, label in groups:
        recv = torch.full((sum(out_splits),), -1, dtype=torch.int64)
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=group)
        _expect_np(
            f"all_to_all_single uneven splits {in_splits} n={numel} [{label}]",
            recv,
            np.concatenate(want_blocks),
        )
        singles[label] = recv
        checks += 1
    outs = [torch.full((n,), -1, dtype=torch.int64) for n in out_splits]
    dist.all_to_all(outs, list(send.split(in_splits)))
    for i, got_gloo in enumerate(singles["gloo"].split(out_splits)):
        name = f"all_to_all uneven list n={numel} from {i}"
        _expect_np(f"{name} [test]", outs[i], want_blocks[i])
        _expect(f"{name} [test vs gloo]", outs[i], got_gloo)
    checks += 1
    if world == 1:
        return checks
    # batch_isend_irecv: one batch that sends both ways around the ring
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for group, label in groups:
        from_prv = torch.full((numel,), -1, dtype=torch.int64)
        from_nxt = torch.full((numel,), -1, dtype=torch.int64)
        ops = [
            dist.P2POp(dist.isend, _input(rank, numel, torch.int64, salt=60), nxt, group=group),
            dist.P2POp(dist.irecv, from_prv, prv, group=group),
            dist.P2POp(dist.isend, _input(rank, numel, torch.int64, salt=61), prv, group=group),
            dist.P2POp(dist.irecv, from_nxt, nxt, group=group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        _expect_np(
            f"batch_isend_irecv from prev n={numel} [{label}]", from_prv, _np_input(prv, numel, 60)
        )
        _expect_np(
            f"batch_isend_irecv from next n={numel} [{label}]", from_nxt, _np_input(nxt, numel, 61)
        )
        checks += 2
    # recv from any source: rank 0 takes one message from every other rank, in arrival order
    for group, label in groups:
        if rank != 0:
            dist.send(_input(rank, numel, torch.int64, salt=70), 0, group=group)
            continue
        senders = []
        for _ in range(world - 1):
            out = torch.full((numel,), -1, dtype=torch.int64)
            src = dist.recv(out, group=group)
            if not 0 < src < world or src in senders:
                raise Mismatch(f"recv any source [{label}]: sender {src} after {senders}")
            senders.append(src)
            _expect_np(
                f"recv any source from {src} n={numel} [{label}]", out, _np_input(src, numel, 70)
            )
            checks += 1
    return checks


def check_host_group(rank: int, sizes: list[int]) -> bool | None:
    """With several ranks per host: all_reduce within each host's group (which may stage
    through shared memory, unlike the world), checked against the sum of the known inputs.
    Returns whether this host's group staged; None with one rank per host."""
    local = LOCAL_WORLD_SIZE
    if local < 2:
        return None
    group, _ = dist.new_subgroups(group_size=local)  # torchrun numbers ranks host by host
    first = rank - rank % local
    for numel in sizes:
        got = _input(rank, numel, torch.int64)
        dist.all_reduce(got, group=group)
        want = sum(_input(r, numel, torch.int64) for r in range(first, first + local))
        _expect(f"host group all_reduce numel={numel}", got, want)
    return ucxbackend.shared_memory(group)


FAILED_KEY = "multinode_worker/creation_failed"
FAILED_WAIT_S = 45.0


def _wait_for_every_rank_to_fail() -> None:
    """Group creation failed here: count this rank as failed in the launcher's Store and wait,
    up to FAILED_WAIT_S, until every rank has. The Store lives as long as host a's launcher,
    which exits when its ranks do: without this wait, a rank of host b that is still connecting
    (a slow reverse lookup of its address can take seconds) would retry a Store that is gone
    until its own timeout, instead of reaching the error the test expects from it."""
    world = int(os.environ["WORLD_SIZE"])
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=FAILED_WAIT_S),
        )
        store.add(FAILED_KEY, 1)
        deadline = time.monotonic() + FAILED_WAIT_S
        while store.add(FAILED_KEY, 0) < world and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception as exc:  # the Store is gone too: nothing more to wait for
        print(f"multinode_worker: could not report the failure to the Store: {exc}", flush=True)


HIDE_LAUNCHER = "+hide_launcher"


def run_phase(phase: str, timeout: float, sizes: list[int], store: dist.Store | None) -> int:
    """Create the world on the phase's backend (through ``store`` when given: a later phase of
    the same job needs keys of its own), run every check, report, destroy the world; return
    the exit status this phase alone would have had."""
    backend = phase.removesuffix(HIDE_LAUNCHER)
    _corrupt_caught.clear()
    _corrupt_missed.clear()
    launcher_hint = os.environ.get("LOCAL_WORLD_SIZE")
    if phase.endswith(HIDE_LAUNCHER):
        os.environ.pop("LOCAL_WORLD_SIZE", None)
    try:
        if store is None:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
        else:
            dist.init_process_group(
                backend,
                store=dist.PrefixStore(f"multinode/{phase}", store),
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
                timeout=timedelta(seconds=timeout),
            )
    except Exception:
        _wait_for_every_rank_to_fail()
        raise
    finally:
        if launcher_hint is not None:  # back for a later phase
            os.environ["LOCAL_WORLD_SIZE"] = launcher_hint
    profile = ucxbackend.startup_profile()
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    try:
        checks = run_all(rank, world, sizes, gloo)
        host_staged = check_host_group(rank, sizes)
    except Mismatch as exc:
        print(f"MULTINODE_FAIL rank={rank}: {exc}", flush=True)
        dist.destroy_process_group()  # a later phase makes a world of its own
        return 1
    if CORRUPT:  # the results were right; what matters is whether the corruption was seen
        total = len(_corrupt_caught) + len(_corrupt_missed)
        print(
            f"MULTINODE_FAIL rank={rank}: corrupted results caught: {len(_corrupt_caught)} of "
            f"{total}; kinds: {','.join(sorted(set(_corrupt_caught)))}; "
            f"missed: {_corrupt_missed[:5]}",
            flush=True,
        )
        dist.destroy_process_group()
        return 1
    staged = ucxbackend.shared_memory()
    # How many sends took the ucx send lane ("none": the group has no lane, as on one host).
    dist.barrier()  # published after each op by the progress thread: the last one's now too
    lane = ucxbackend.stats()["transport"].get("send_lane_messages", "none")
    # Read before the world goes: the threads of this phase's groups, not of a later one's.
    group_threads = ucxbackend.wait_stats()["group_threads_on_host"]
    dist.destroy_process_group()
    print(
        f"MULTINODE_OK rank={rank} world={world} host={socket.gethostname()} "
        f"checks={checks} local_rank={os.environ.get('LOCAL_RANK')} staged={staged} "
        f"host_group_staged={host_staged} send_lane_messages={lane} "
        f"group_threads={group_threads} "
        f"transports={','.join(profile['transports']) or 'none'} "
        f"any_host={'any_host' in profile['phases']}",
        flush=True,
    )
    return 0


def _phase_barrier(store: dist.Store, phase: str, timeout: float) -> None:
    """Wait until every rank has ended ``phase`` (its world destroyed, its END line written),
    so that no line of a later phase lands inside this one's part of the output."""
    world = int(os.environ["WORLD_SIZE"])
    key = f"multinode/phase_done/{phase}"
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while store.add(key, 0) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key}: not every rank of {world} ended the phase in {timeout} s")
        time.sleep(0.02)


def _marker(line: str) -> None:
    """A phase marker as one write of its own: the ranks of a host share torchrun's output
    pipe with UCX's C stdio (UCX_PROTO_INFO tables, flushed in blocks that cut lines), and a
    marker split across two writes by Python's buffer could get another process's bytes in
    its middle, which multinode_harness then cannot find."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--backend",
        required=True,
        help="phases, comma-separated (a backend, +hide_launcher after it to hide"
        " LOCAL_WORLD_SIZE): one after the other, in this order, in this process",
    )
    parser.add_argument("--sizes", default="1,1000,300000", help="element counts, comma-separated")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    phases = args.backend.split(",")
    # One phase: the world made the plain way (env://). Several: one torch import for all
    # (the job's cost), each phase's world on keys of its own in torchrun's Store.
    store = None
    if len(phases) > 1:
        store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=args.timeout)))
    code = 0
    for phase in phases:
        _marker(f"{PHASE_BEGIN}{phase}")
        rc = run_phase(phase, args.timeout, sizes, store)
        _marker(f"{PHASE_END}{phase} rc={rc}")
        code = code or rc
        if store is not None:
            _phase_barrier(store, phase, args.timeout)
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: Gloo's threads can abort a finalizing interpreter
    # (docs/known-issues.md).
    os._exit(code)
