"""One rank of the multi-node test (``tests/test_multinode.py``), launched by torchrun.

Every collective runs on the backend under test (the default group, ``--backend``) and on a
Gloo group over the same ranks with the same inputs; results must agree with each other and
with a reference computed locally. Inputs are small integers (exact in float32 and int64; the
int64 all_reduce also carries values beyond 2**53 so that a float detour would show), so every
comparison is exact.

Prints ``MULTINODE_OK rank=<r> world=<n> host=<hostname>`` when everything matched, and exits
non-zero (with the mismatch) otherwise. ``MULTINODE_CORRUPT=1`` (tests only) corrupts one
element of a result on the last rank, to show that the check fails.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import ucxbackend  # registers the ucx backend, and udp when built

# Test-only: corrupt one element of the backend's all_reduce output on the last rank.
CORRUPT = os.environ.get("MULTINODE_CORRUPT") == "1"


class Mismatch(AssertionError):
    pass


# torch 2.13 deprecates the *_tensor spellings in favour of *_single.
_all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _expect(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        diff = (got != want).nonzero()[:5].flatten().tolist() if got.shape == want.shape else []
        raise Mismatch(
            f"{name}: wrong result (first bad indices {diff}); got {got[:8].tolist()}"
            f" want {want[:8].tolist()}"
        )


def _input(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    base = torch.arange(numel, dtype=torch.int64) % 97
    return ((base + 3 * rank + salt) % 101).to(dtype)


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
                if CORRUPT and group is None and rank == world - 1:
                    t.view(-1)[0] += 1  # test hook: proves the comparison can fail
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
        dist.barrier()
        dist.barrier(group=gloo)
    return checks


def check_host_group(rank: int, sizes: list[int]) -> bool | None:
    """With several ranks per host: all_reduce within each host's group (which may stage
    through shared memory, unlike the world), checked against the sum of the known inputs.
    Returns whether this host's group staged; None with one rank per host."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True)
    parser.add_argument("--sizes", default="1,1000,300000", help="element counts, comma-separated")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    try:
        checks = run_all(rank, world, sizes, gloo)
        host_staged = check_host_group(rank, sizes)
    except Mismatch as exc:
        print(f"MULTINODE_FAIL rank={rank}: {exc}", flush=True)
        return 1
    staged = ucxbackend.shared_memory()
    dist.destroy_process_group()
    print(
        f"MULTINODE_OK rank={rank} world={world} host={socket.gethostname()} "
        f"checks={checks} local_rank={os.environ.get('LOCAL_RANK')} staged={staged} "
        f"host_group_staged={host_staged}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: Gloo's threads can abort a finalizing interpreter (README).
    os._exit(code)
