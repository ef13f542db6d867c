"""Which backend gets a CUDA tensor, and when a CUDA tensor is refused.

* ``"cpu:gloo,cuda:ucx"``: in the same group a CPU tensor goes to Gloo and a CUDA tensor to ucx,
  and both reduce right; ``"cuda:ucx"`` alone serves CUDA tensors (``"ucx"`` itself: the matrix
  worlds, ``test_cuda_reductions.py`` / ``test_cuda_movement.py``).
* ``udp`` on CUDA tensors (staged through pinned host memory): test_collectives' all_reduce,
  broadcast, all_gather and p2p families, every dtype, against numpy.
* By default a one-host ucx group of a rank that sees a GPU runs on UCX (its ``cuda_ipc``), and
  with ``cuda=0`` on the shm rings (``_C.one_host_transport``).
* With ``UCXBACKEND_CUDA=0`` a CUDA tensor raises ValueError naming the op and the variable,
  on ucx and on udp, and the group still works for CPU tensors afterwards; a group created with
  ``pg_options={"cuda": "1"}`` takes CUDA tensors all the same; one op mixing CPU and CUDA
  tensors is a ValueError.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu import cuda_matrix
from gpu.cuda_harness import (
    Outcomes,
    WorldCache,
    cuda_world,
    evaluate,
    use_gpu0,
)

N = 1000


def _reduce_both(rank: int, ws: int, out: Outcomes, prefix: str, cpu_backend: str) -> None:
    """A CPU and a CUDA all_reduce in the default group: the right backend and the right sums."""
    import torch
    import torch.distributed as dist

    dev = use_gpu0()
    pg = dist.group.WORLD
    names = {d: pg._get_backend(torch.device(d)).name() for d in ("cpu", "cuda")}
    out.check(
        f"{prefix}: cpu -> {cpu_backend}, cuda -> ucx",
        names == {"cpu": cpu_backend, "cuda": "ucx"},
        f"backends by device: {names}",
    )
    want = sum(range(1, ws + 1)) * torch.arange(N, dtype=torch.int64)
    cpu = (rank + 1) * torch.arange(N, dtype=torch.int64)
    gpu = cpu.to(dev, copy=True)
    dist.all_reduce(cpu)
    dist.all_reduce(gpu)
    out.check(f"{prefix}: a CPU tensor reduces", torch.equal(cpu, want), f"got {cpu[:5]}")
    got = gpu.cpu()
    out.check(
        f"{prefix}: a CUDA tensor reduces",
        gpu.device == dev and torch.equal(got, want),
        f"got {got[:5]} on {gpu.device}",
    )
    half = torch.full((N,), float(rank), dtype=torch.float16, device=dev)
    dist.broadcast(half, src=ws - 1)
    out.check(
        f"{prefix}: a CUDA broadcast",
        bool((half == ws - 1).all().item()),
        f"got {half[:5].tolist()}",
    )


def mixed_main(rank: int, ws: int) -> dict[str, Any]:
    out = Outcomes(rank)
    out.run(
        "cpu:gloo,cuda:ucx: cpu -> gloo, cuda -> ucx",
        lambda: _reduce_both(rank, ws, out, "cpu:gloo,cuda:ucx", "gloo"),
    )
    return out.results


def cuda_only_main(rank: int, ws: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out = Outcomes(rank)

    def one_host() -> None:
        import ucxbackend

        chosen = {
            knob: ucxbackend._C.one_host_transport({"cuda": knob} if knob else {})
            for knob in ("", "0")
        }
        out.check(
            "one host with a GPU: ucx by default, shm with cuda=0",
            chosen[""][0] == "ucx" and chosen["0"][0] == "shm",
            f"{chosen}",
        )

    def run() -> None:
        dev = use_gpu0()
        name = dist.group.WORLD._get_backend(torch.device("cuda")).name()
        t = torch.full((N,), rank + 1, dtype=torch.int32, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        out.check(
            "cuda:ucx: a CUDA tensor reduces on ucx",
            name == "ucx" and bool((t == ws).all().item()),
            f"backend {name!r}, got {t[:5].tolist()}",
        )

    out.run("cuda:ucx: a CUDA tensor reduces on ucx", run)
    out.run("one host with a GPU: ucx by default, shm with cuda=0", one_host)
    return out.results


# The torch call, and the words that may name it (torch's name, or the backend's).
OPS_NAMED = {
    "all_reduce": ("all_reduce", "allreduce"),
    "broadcast": ("broadcast",),
    "all_gather": ("all_gather", "allgather"),
    "all_gather_into_tensor": ("all_gather", "allgather", "_allgather_base"),
    "reduce_scatter_tensor": ("reduce_scatter",),
    "all_to_all_single": ("all_to_all", "alltoall"),
    "send/recv": ("send", "recv"),
}


def _cuda_ops(dev: Any, rank: int, ws: int, group: Any) -> dict[str, Any]:
    """Each op of OPS_NAMED on CUDA tensors in ``group``, as a thunk."""
    import torch
    import torch.distributed as dist

    def t(n: int = 8) -> Any:
        return torch.ones(n, device=dev)

    peer = 1 - rank

    def send_recv() -> None:
        if rank == 0:
            dist.send(t(), peer, group=group)
        else:
            dist.recv(t(), peer, group=group)

    return {
        "all_reduce": lambda: dist.all_reduce(t(), group=group),
        "broadcast": lambda: dist.broadcast(t(), src=0, group=group),
        "all_gather": lambda: dist.all_gather([t() for _ in range(ws)], t(), group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(t(8 * ws), t(), group=group),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(t(), t(8 * ws), group=group),
        "all_to_all_single": lambda: dist.all_to_all_single(t(8 * ws), t(8 * ws), group=group),
        "send/recv": send_recv,
    }


def _refused(fn: Any, words: tuple[str, ...], also: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(whether ``fn`` raised ValueError naming one of ``words`` and all of ``also``, why)."""
    try:
        fn()
    except ValueError as exc:
        text = str(exc)
        ok = any(w in text for w in words) and all(a in text for a in also)
        return ok, f"ValueError: {text.strip()[:400]}"
    except Exception as exc:
        return False, f"want ValueError, got {type(exc).__name__}: {str(exc).strip()[:400]}"
    return False, "no error"


def refusal_main(rank: int, ws: int) -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist

    out = Outcomes(rank)
    out.check(
        "the ranks run with UCXBACKEND_CUDA=0",
        os.environ.get("UCXBACKEND_CUDA") == "0",
        f"UCXBACKEND_CUDA={os.environ.get('UCXBACKEND_CUDA')!r}",
    )

    def refused() -> None:
        dev = use_gpu0()
        udp = dist.new_group(backend="udp")
        for backend, group in (("ucx", None), ("udp", udp)):
            for op, thunk in _cuda_ops(dev, rank, ws, group).items():
                ok, why = _refused(thunk, OPS_NAMED[op], ("UCXBACKEND_CUDA=0",))
                out.check(f"with cuda=0: {backend} refuses CUDA tensors", ok, f"{op}: {why}")
            # the group still works for CPU tensors
            cpu = torch.full((5,), rank + 1.0)
            dist.all_reduce(cpu, group=group)
            out.check(
                f"with cuda=0: {backend} still reduces CPU tensors",
                torch.equal(cpu, torch.full((5,), float(sum(range(1, ws + 1))))),
                f"got {cpu.tolist()}",
            )

    def pg_option() -> None:
        dev = use_gpu0()
        group = dist.new_group(backend="ucx", pg_options={"cuda": "1"})
        t = torch.full((N,), rank + 1.0, device=dev)
        dist.all_reduce(t, group=group)
        want = float(sum(range(1, ws + 1)))
        out.check(
            'pg_options={"cuda": "1"} takes CUDA tensors',
            bool((t == want).all().item()),
            f"got {t[:5].tolist()}, want {want}",
        )
        # One op, CPU and CUDA tensors: refused, on every rank alike (nothing hangs).
        mixed = {
            "all_gather": lambda: dist.all_gather(
                [torch.ones(4, device=dev) for _ in range(ws)], torch.ones(4), group=group
            ),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
                torch.ones(4 * ws, device=dev), torch.ones(4), group=group
            ),
            "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
                torch.ones(4, device=dev), torch.ones(4 * ws), group=group
            ),
            "all_to_all": lambda: dist.all_to_all(
                [torch.ones(4, device=dev) for _ in range(ws)],
                [torch.ones(4) for _ in range(ws)],
                group=group,
            ),
        }
        for op, thunk in mixed.items():
            ok, why = _refused(thunk, ("",))
            out.check("one op mixing CPU and CUDA tensors is a ValueError", ok, f"{op}: {why}")
        dist.barrier(group=group)

    out.run("with cuda=0: ucx refuses CUDA tensors", refused)
    out.run('pg_options={"cuda": "1"} takes CUDA tensors', pg_option)
    return out.results


# p2p: udp stages a point-to-point op's CUDA tensor itself (transport_backend.cpp,
# enqueueP2P: pinned host copies waited for by the op's deadline), apart from the collectives'
# staging (device_memory.cpp); the movement matrix runs p2p on ucx only.
UDP_FAMILIES = ("all_reduce", "broadcast", "all_gather", "p2p")


def _refusing() -> list[Any]:
    return cuda_world(refusal_main, env={"UCXBACKEND_CUDA": "0"})


_mixed = WorldCache(lambda: cuda_world(mixed_main, backend="cpu:gloo,cuda:ucx"))
_cuda_only = WorldCache(lambda: cuda_world(cuda_only_main, backend="cuda:ucx"))
_udp = WorldCache(
    lambda: cuda_world(cuda_matrix.matrix_main, backend="udp", args=(UDP_FAMILIES, "cuda:0", "udp"))
)
_refusal = WorldCache(_refusing)

MIXED_CHECKS = (
    "cpu:gloo,cuda:ucx: cpu -> gloo, cuda -> ucx",
    "cpu:gloo,cuda:ucx: a CPU tensor reduces",
    "cpu:gloo,cuda:ucx: a CUDA tensor reduces",
    "cpu:gloo,cuda:ucx: a CUDA broadcast",
)
REFUSAL_CHECKS = (
    "the ranks run with UCXBACKEND_CUDA=0",
    "with cuda=0: ucx refuses CUDA tensors",
    "with cuda=0: ucx still reduces CPU tensors",
    "with cuda=0: udp refuses CUDA tensors",
    "with cuda=0: udp still reduces CPU tensors",
    'pg_options={"cuda": "1"} takes CUDA tensors',
    "one op mixing CPU and CUDA tensors is a ValueError",
)


@pytest.mark.parametrize("check", MIXED_CHECKS)
def test_cpu_gloo_cuda_ucx(check: str) -> None:
    evaluate(_mixed.get(), check)


def test_cuda_ucx_alone() -> None:
    evaluate(_cuda_only.get(), "cuda:ucx: a CUDA tensor reduces on ucx")


def test_one_host_transport_follows_the_gpu() -> None:
    evaluate(_cuda_only.get(), "one host with a GPU: ucx by default, shm with cuda=0")


def test_udp_takes_cuda_tensors() -> None:
    cuda_matrix.check_facts(_udp.get(), "cuda:0", "udp")


@pytest.mark.parametrize(("family", "case"), list(cuda_matrix.params(UDP_FAMILIES)))
def test_udp_on_cuda(family: str, case: str) -> None:
    cuda_matrix.check_case(_udp.get(), family, case)


@pytest.mark.parametrize("check", REFUSAL_CHECKS)
def test_cuda_tensors_refused_with_cuda_0(check: str) -> None:
    evaluate(_refusal.get(), check)
