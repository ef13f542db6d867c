"""CUDA tensors take none of the CPU path's host-only shortcuts, in groups that offer them all.

The CPU path has shortcuts that read and write an op's bytes on the host: the inline run of a
small all_reduce on the caller's thread (no stream, no ready event), the shared-memory slots
and the pair slots of two ranks on one host (memcpy and the host kernels), the folding receive
for peers reached over TCP alone, and ucx's send lane (a second worker that posts host memory).
One rule decides them from the memory type (``takesHostPaths`` in transports/transport.h), and
``tests/cpp/algorithms`` checks it on stand-ins; this checks it where a CUDA tensor that took
one would crash the rank or come back wrong.

Two worlds of 2 ranks on GPU 0:

* ``shm``: ucx as it runs on one host (shared-memory staging on, checked; inline on, checked
  with a CPU all_reduce that does run inline), and a second group with ``send_lane=on``.
* ``tcp``: ``UCX_TLS=tcp,cuda_copy,self``, so that the peer is reached over TCP alone and the
  CPU path folds receives (cuda_copy moves the device memory).

In each group, all_reduce (int32 SUM, float32 MAX) at the sizes each shortcut takes on the CPU
(16 B, 8 KiB, 128 KiB, 1 MiB), each input written by a kernel queued behind a GPU sleep with no
host sync (so an op that does not wait for the caller's stream reads the old values), then
reduce_scatter_tensor, all_gather_into_tensor, broadcast, reduce and all_to_all_single at
128 KiB a rank: every result against values computed on the host, bit for bit, and the
group's inline counters unchanged by the CUDA ops.

Without a GPU the rank code can be dry-run on CPU tensors (``DEVICE = "cpu"``, ``gpu_sleep`` and
``use_gpu0`` made no-ops, ``UCX_TLS=tcp,self`` for the tcp world): every result check passes
and every "no CUDA op ran inline" check fails, as it must for host tensors, which do run inline
(done on 2026-11-27 when this file was written).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu.cuda_harness import Outcomes, WorldCache, cuda_world, evaluate, gpu_sleep, use_gpu0

# Elements of 4 bytes: 16 B (the 2-rank exchange), 8 KiB (the pair slots), 128 KiB (the staged
# slots), 1 MiB and 4 B (the staged ring, uneven halves).
ALLREDUCE_COUNTS = (4, 2048, 32768, 262145)
BLOCK = 32768  # elements a rank of the other ops: 128 KiB
OTHER_OPS = ("reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "reduce", "all_to_all")
WORLDS = {"shm": ("default", "send_lane=on"), "tcp": ("default",)}
TCP_ENV = {"UCX_TLS": "tcp,cuda_copy,self"}
DEVICE = "cuda:0"  # the ranks' tensors ("cpu" dry-runs the checks themselves without a GPU)


def _allreduce_checks(group: str) -> list[str]:
    return [
        f"{group}: all_reduce {kind} of {count} elements"
        for count in ALLREDUCE_COUNTS
        for kind in ("int32 SUM", "float32 MAX")
    ]


def checks(world: str) -> list[str]:
    names = [f"{world}: the CPU path's shortcuts are on"]
    for group in WORLDS[world]:
        names += _allreduce_checks(f"{world}/{group}")
        names += [f"{world}/{group}: {op}" for op in OTHER_OPS]
        names.append(f"{world}/{group}: no CUDA op ran inline")
    return names


def _value(rank: int, n: int, salt: int) -> Any:
    """Rank ``rank``'s int64 values for a case (small: every sum is exact in int32/float32)."""
    import torch

    i = torch.arange(n, dtype=torch.int64)
    return (i * 7 + rank * 3 + salt * 11) % 1000


def _run_group(out: Outcomes, name: str, group: Any, rank: int, ws: int) -> None:
    import torch
    import torch.distributed as dist

    import ucxbackend

    dev = torch.device(DEVICE)
    before = ucxbackend.inline_stats(group)
    salt = 0
    for count in ALLREDUCE_COUNTS:
        for kind, dtype, op in (
            ("int32 SUM", torch.int32, dist.ReduceOp.SUM),
            ("float32 MAX", torch.float32, dist.ReduceOp.MAX),
        ):
            salt += 1
            check = f"{name}: all_reduce {kind} of {count} elements"
            mine = [_value(r, count, salt) for r in range(ws)]
            want = sum(mine) if op == dist.ReduceOp.SUM else torch.stack(mine).amax(0)
            t = torch.zeros(count, dtype=dtype, device=dev)
            # The input is written on the caller's stream behind a sleep, with no host sync:
            # the op must wait for it on the device (an inline run on this thread would not).
            gpu_sleep(20)
            src = mine[rank].to(dtype)
            t.copy_(src.pin_memory() if t.is_cuda else src, non_blocking=True)
            dist.all_reduce(t, op=op, group=group)
            got = t.cpu()
            out.check(
                check,
                torch.equal(got, want.to(dtype)),
                f"{int((got != want.to(dtype)).sum())} of {count} elements differ, "
                f"first {got[:4].tolist()} want {want[:4].tolist()}",
            )
    n = BLOCK
    salt += 1
    inputs = [_value(r, n * ws, salt).to(torch.int32) for r in range(ws)]
    total = sum(inputs)
    x = inputs[rank].to(dev)
    y = torch.empty(n, dtype=torch.int32, device=dev)
    dist.reduce_scatter_tensor(y, x, group=group)
    want = total[rank * n : (rank + 1) * n]
    out.check(f"{name}: reduce_scatter_tensor", torch.equal(y.cpu(), want), f"{y[:4].tolist()}")

    gathered = torch.empty(n * ws, dtype=torch.int32, device=dev)
    dist.all_gather_into_tensor(gathered, x[:n].contiguous(), group=group)
    want = torch.cat([inputs[r][:n] for r in range(ws)])
    out.check(
        f"{name}: all_gather_into_tensor", torch.equal(gathered.cpu(), want), f"{gathered[:4]}"
    )

    root = ws - 1
    b = x[:n].clone()
    dist.broadcast(b, src=dist.get_global_rank(group, root), group=group)
    out.check(f"{name}: broadcast", torch.equal(b.cpu(), inputs[root][:n]), f"{b[:4].tolist()}")

    r = x[:n].clone()
    dist.reduce(r, dst=dist.get_global_rank(group, 0), group=group)
    ok = rank != 0 or torch.equal(r.cpu(), total[:n])
    out.check(f"{name}: reduce", ok, f"{r[:4].tolist()}")

    a = torch.empty(n * ws, dtype=torch.int32, device=dev)
    dist.all_to_all_single(a, x, group=group)
    want = torch.cat([inputs[p][rank * n : (rank + 1) * n] for p in range(ws)])
    out.check(f"{name}: all_to_all", torch.equal(a.cpu(), want), f"{a[:4].tolist()}")

    after = ucxbackend.inline_stats(group)
    out.check(
        f"{name}: no CUDA op ran inline",
        after["inline"] == before["inline"] and after["handed_over"] == before["handed_over"],
        f"inline stats before {before}, after {after}",
    )


def host_paths_main(rank: int, ws: int, world: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import ucxbackend

    out = Outcomes(rank)
    use_gpu0()
    groups = {"default": dist.group.WORLD}
    if "send_lane=on" in WORLDS[world]:
        groups["send_lane=on"] = dist.new_group(backend="ucx", pg_options={"send_lane": "on"})

    def shortcuts_on() -> None:
        # A small CPU all_reduce runs inline (so the CUDA ones below could have); on one host
        # the group stages through shared memory (so the CUDA ones could have used the slots).
        # (Several: an op finds the progress thread busy now and then, and is queued.)
        pg = groups["default"]
        before = ucxbackend.inline_stats(pg)
        right = True
        for _ in range(20):
            t = torch.ones(4)
            dist.all_reduce(t, group=pg)
            right = right and bool((t == ws).all())
        after = ucxbackend.inline_stats(pg)
        started = sum(after[k] - before[k] for k in ("inline", "handed_over"))
        staged = ucxbackend.shared_memory(pg)
        out.check(
            f"{world}: the CPU path's shortcuts are on",
            right and started > 0 and (staged or world != "shm"),
            f"CPU all_reduces started inline: {started} of 20 (right: {right}), "
            f"shared memory: {staged}",
        )

    out.run(f"{world}: the CPU path's shortcuts are on", shortcuts_on)
    for group in WORLDS[world]:
        name = f"{world}/{group}"
        first = _allreduce_checks(name)[0]  # a raise fails it; the later checks never ran
        out.run(
            first, lambda name=name, group=group: _run_group(out, name, groups[group], rank, ws)
        )
    if torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()
    return out.results


_worlds = {
    "shm": WorldCache(lambda: cuda_world(host_paths_main, args=("shm",))),
    "tcp": WorldCache(lambda: cuda_world(host_paths_main, args=("tcp",), env=TCP_ENV)),
}


@pytest.mark.parametrize(("world", "check"), [(w, c) for w in WORLDS for c in checks(w)])
def test_cuda_takes_no_host_path(world: str, check: str) -> None:
    evaluate(_worlds[world].get(), check)
