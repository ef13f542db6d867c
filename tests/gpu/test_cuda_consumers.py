"""DDP and FSDP2 on CUDA over the ucx backend, and random floats against Gloo.

Each rank also holds a Gloo group (``dist.new_group(backend="gloo")``) and computes the
reference itself on CPU copies:

* DDP (``device_ids=[0]``, float64, several buckets, a BatchNorm buffer that DDP broadcasts)
  with no hook, with ``default_hooks.allreduce_hook`` and with a hook that chains ``.then()`` on
  the Work's future (the future must be CUDA-aware), trained a few steps; the same model and
  batches trained with DDP on CPU over the Gloo group must end with the same parameters.
* FSDP2 (``fully_shard`` per layer and on the root, a mesh over the default group, uneven
  shards) trained a few steps on CUDA; a single-process CPU model that sums every rank's loss
  and averages the gradients must end with the same parameters.
* all_reduce (SUM, AVG, MAX, MIN), reduce_scatter_tensor and all_gather_into_tensor of random
  (not integer) floats in every floating dtype, against references computed in float64 from
  every rank's inputs gathered over Gloo as CPU copies: a tolerance for the sums, exact for the
  gather.

float64 keeps the CUDA-against-CPU comparisons tight; the tolerance covers the different
order of summation.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from gpu.cuda_harness import Outcomes, WorldCache, cuda_world, evaluate, use_gpu0

STEPS = 3
TOL = {"rtol": 1e-9, "atol": 1e-11}  # float64, CUDA vs CPU, a few SGD steps
DDP_VARIANTS = ("default", "allreduce_hook", "then_hook")
# (rtol, atol) per dtype: a sum of two values of the dtype, rounded once (or a few times, by
# a chunked reduction) against the exact float64 sum.
FLOAT_TOL = {
    "float16": (2e-3, 1e-4),
    "bfloat16": (1.6e-2, 1e-3),
    "float32": (1e-6, 1e-7),
    "float64": (1e-12, 1e-14),
}


def _ddp_model(seed: int) -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(12, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 33),
        nn.Tanh(),
        nn.Linear(33, 3),
    ).double()


def _batch(rank: int, step: int, features: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    return (
        torch.randn(8, features, generator=g, dtype=torch.float64),
        torch.randn(8, 3, generator=g, dtype=torch.float64),
    )


_HOOK_CALLS = {"then_hook": 0}


def _then_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """all_reduce through the Work's future, divided in a ``.then()`` callback. (DDP checks a
    hook's annotations against its own types: none here.)"""
    import torch.distributed as dist

    _HOOK_CALLS["then_hook"] += 1
    ws = dist.get_world_size(process_group)
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0].div_(ws))


def _train_ddp(
    model: Any, rank: int, device: Any, hook: str, group: Any
) -> tuple[list[Any], list[Any]]:
    """Trains ``model`` with DDP; returns (its state, its parameters), on the CPU."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
    ddp = DDP(model.to(device), process_group=group, bucket_cap_mb=0.004, **kwargs)
    if hook == "allreduce_hook":
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    elif hook == "then_hook":
        ddp.register_comm_hook(group, _then_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        x, y = _batch(rank, step, 12)
        opt.zero_grad()
        F.mse_loss(ddp(x.to(device)), y.to(device)).backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    state = [t.detach().cpu() for t in ddp.module.state_dict().values()]
    return state, [p.detach().cpu() for p in ddp.module.parameters()]


def _fsdp_model() -> Any:
    import torch
    import torch.nn as nn

    torch.manual_seed(11)
    return nn.Sequential(
        nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 5), nn.ReLU(), nn.Linear(5, 3)
    ).double()


def consumers_main(rank: int, ws: int) -> dict[str, dict[str, Any]]:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's new name
    dev = use_gpu0()
    gloo = dist.new_group(backend="gloo")
    out = Outcomes(rank)

    def close(name: str, got: list[Any], want: list[Any]) -> None:
        bad = [
            f"tensor {i}: max abs diff {(g - w).abs().max().item():.3e}"
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            if not torch.allclose(g, w, **TOL)
        ]
        out.check(name, not bad, "; ".join(bad[:5]))

    def ddp() -> None:
        for hook in DDP_VARIANTS:
            _HOOK_CALLS["then_hook"] = 0
            # different initial weights per rank: DDP must broadcast rank 0's
            cuda, params = _train_ddp(_ddp_model(7 + rank), rank, dev, hook, None)
            calls = _HOOK_CALLS["then_hook"]
            cpu, _ = _train_ddp(_ddp_model(7 + rank), rank, torch.device("cpu"), "default", gloo)
            close(f"DDP {hook} on CUDA equals DDP on Gloo/CPU", cuda, cpu)
            if hook == "then_hook":
                out.check("the then_hook ran", calls >= STEPS, f"{calls} calls in {STEPS} steps")
            # the replicas' parameters agree across ranks (BatchNorm's running statistics are
            # each rank's own): gather them over Gloo
            flat = torch.cat([t.reshape(-1) for t in params])
            both = [torch.empty_like(flat) for _ in range(ws)]
            dist.all_gather(both, flat, group=gloo)
            out.check(
                f"DDP {hook} replicas are identical",
                all(torch.equal(both[0], b) for b in both),
                "the ranks' parameters differ after training",
            )

    def fsdp() -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(dist.group.WORLD, dev.type)
        model = _fsdp_model().to(dev)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        shapes = {k: list(p.to_local().shape) for k, p in model.named_parameters()}
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(STEPS):
            x, y = _batch(rank, step, 16)
            F.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
            opt.zero_grad()
        got = [v.full_tensor().detach().cpu() for v in model.state_dict().values()]

        ref = _fsdp_model()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for step in range(STEPS):
            ref_opt.zero_grad()
            for r in range(ws):
                x, y = _batch(r, step, 16)
                F.mse_loss(ref(x), y).backward()
            for p in ref.parameters():
                p.grad /= ws
            ref_opt.step()
        out.check(
            "FSDP2 shards the parameters",
            shapes["0.weight"] == [24 // ws, 16]
            and shapes["2.weight"] == ([3, 24] if rank == 0 else [2, 24]),
            f"local shard shapes {shapes}",
        )
        close(
            "FSDP2 on CUDA equals the single-process reference",
            got,
            list(ref.state_dict().values()),
        )

    def random_floats() -> None:
        bad = []
        for name, (rtol, atol) in FLOAT_TOL.items():
            dtype = getattr(torch, name)
            g = torch.Generator().manual_seed(31 + rank)
            x = torch.randn(4099, generator=g, dtype=torch.float64).to(dtype)
            big = torch.randn(ws * 1031, generator=g, dtype=torch.float64).to(dtype)
            # Every rank's inputs, as float64 CPU copies gathered over Gloo: the reference.
            xs = [torch.empty(4099, dtype=torch.float64) for _ in range(ws)]
            dist.all_gather(xs, x.double(), group=gloo)
            bigs = [torch.empty(ws * 1031, dtype=torch.float64) for _ in range(ws)]
            dist.all_gather(bigs, big.double(), group=gloo)
            stack = torch.stack(xs)
            refs = {
                dist.ReduceOp.SUM: stack.sum(0),
                dist.ReduceOp.AVG: stack.sum(0) / ws,
                dist.ReduceOp.MAX: stack.max(0).values,
                dist.ReduceOp.MIN: stack.min(0).values,
            }
            pairs = []
            for op, ref in refs.items():
                c = x.to(dev, copy=True)
                dist.all_reduce(c, op=op)
                pairs.append((f"all_reduce {op}", c, ref, rtol, atol))
            c_out = torch.empty(1031, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(c_out, big.to(dev, copy=True))
            ref = torch.stack(bigs).sum(0).chunk(ws)[rank]
            pairs.append(("reduce_scatter_tensor", c_out, ref, rtol, atol))
            c_all = torch.empty(ws * 4099, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(c_all, x.to(dev, copy=True))
            pairs.append(("all_gather_into_tensor", c_all, torch.cat(xs), 0.0, 0.0))
            torch.cuda.synchronize()
            for what, c, want, rt, at in pairs:
                got = c.cpu().double()
                if not torch.allclose(got, want, rtol=rt, atol=at):
                    diff = (got - want).abs().max().item()
                    bad.append(f"{what} {name}: max abs diff {diff:.3e}")
        out.check("random floats match Gloo-gathered CPU copies", not bad, "; ".join(bad))

    out.run("DDP default on CUDA equals DDP on Gloo/CPU", ddp)
    out.run("FSDP2 on CUDA equals the single-process reference", fsdp)
    out.run("random floats match Gloo-gathered CPU copies", random_floats)
    dist.barrier(group=gloo)
    return out.results


CHECKS = (
    *[f"DDP {h} on CUDA equals DDP on Gloo/CPU" for h in DDP_VARIANTS],
    *[f"DDP {h} replicas are identical" for h in DDP_VARIANTS],
    "the then_hook ran",
    "FSDP2 shards the parameters",
    "FSDP2 on CUDA equals the single-process reference",
    "random floats match Gloo-gathered CPU copies",
)

_world = WorldCache(lambda: cuda_world(consumers_main))


@pytest.mark.parametrize("check", CHECKS)
def test_consumers_on_cuda(check: str) -> None:
    evaluate(_world.get(), check)
