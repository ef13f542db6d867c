"""Real consumers of a c10d backend, on the backend under test and on Gloo.

* DDP: default gradient reduction, ``default_hooks.allreduce_hook``,
  ``fp16_compress_hook`` and a custom comm hook chaining ``.then()`` on the
  ``Work`` future; compared with Gloo and with a single-process reference.
* FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU, uneven shards included;
  compared with Gloo and with a single-process reference.
* Functional collectives (``torch.distributed._functional_collectives``), the
  ``*_coalesced`` variants included (they call the backend's ``*_coalesced`` methods).
* Object collectives: ``all_gather_object``, ``broadcast_object_list``, ``gather_object``,
  ``scatter_object_list``, ``send_object_list`` / ``recv_object_list``.

Results come back from the ranks as plain Python / numpy values: tensors returned
through the harness queue would be pickled through shared memory that dies with the rank.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from dist_harness import run_world
from torch.testing import assert_close

WORLD_TIMEOUT = 120.0
# Same program on another backend: the summation order may differ.
TIGHT = {"rtol": 1e-5, "atol": 1e-6}
# Against a single-process reference (different accumulation order, several steps).
REF = {"rtol": 1e-4, "atol": 1e-5}


def _numpy_state(module: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().clone().numpy() for k, v in module.state_dict().items()}


def _numpy_params(module: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().clone().numpy() for k, v in module.named_parameters()}


# ======================================================================================
# DDP
# ======================================================================================

DDP_STEPS = 4
DDP_WORLD = 2
DDP_VARIANTS = ("default", "allreduce_hook", "then_hook", "fp16_compress_hook")
_HOOK_CALLS = {"then_hook": 0}


def _ddp_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(12, 64),
        nn.BatchNorm1d(64),  # a buffer: DDP broadcasts it from rank 0 before every forward
        nn.ReLU(),
        nn.Linear(64, 33),
        nn.Tanh(),
        nn.Linear(33, 3),
    )


def _ddp_batch(rank: int, step: int):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g)


def _then_hook(process_group, bucket):
    """all_reduce(SUM) through the Work's future, then two chained ``.then()`` callbacks."""
    _HOOK_CALLS["then_hook"] += 1
    world_size = dist.get_world_size(process_group)
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    fut = work.get_future()
    return fut.then(lambda f: f.value()[0].div_(world_size)).then(lambda f: f.value())


def _ddp_train(rank: int, world_size: int) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    out = {}
    for variant in DDP_VARIANTS:
        # Different initial weights per rank: DDP must broadcast rank 0's.
        model = DDP(_ddp_model(seed=7 + rank), bucket_cap_mb=0.004)  # several buckets
        if variant == "allreduce_hook":
            model.register_comm_hook(None, default_hooks.allreduce_hook)
        elif variant == "then_hook":
            _HOOK_CALLS["then_hook"] = 0
            model.register_comm_hook(None, _then_hook)
        elif variant == "fp16_compress_hook":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for step in range(DDP_STEPS):
            x, y = _ddp_batch(rank, step)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[variant] = {
            "losses": losses,
            "params": _numpy_params(model.module),
            "state": _numpy_state(model.module),
            "hook_calls": _HOOK_CALLS["then_hook"] if variant == "then_hook" else None,
        }
    return out


def _ddp_reference(world_size: int) -> dict:
    """Single process: every rank's loss on the same weights, gradients averaged."""
    model = _ddp_model(seed=7)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = [[] for _ in range(world_size)]
    for step in range(DDP_STEPS):
        opt.zero_grad()
        for r in range(world_size):
            x, y = _ddp_batch(r, step)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses[r].append(loss.item())
        for p in model.parameters():
            p.grad /= world_size
        opt.step()
    return {"losses": losses, "params": _numpy_params(model)}


@pytest.fixture(scope="module")
def ddp_runs():
    """One world per backend trains every DDP variant (one after the other)."""
    got = run_world(_ddp_train, DDP_WORLD, timeout=WORLD_TIMEOUT)
    gloo = run_world(_ddp_train, DDP_WORLD, backend="gloo", timeout=WORLD_TIMEOUT)
    return got, gloo, _ddp_reference(DDP_WORLD)


@pytest.mark.parametrize("variant", DDP_VARIANTS)
def test_ddp(ddp_runs, variant):
    got, gloo, ref = ddp_runs
    fp16 = variant == "fp16_compress_hook"
    vs_gloo = {"rtol": 2e-3, "atol": 1e-4} if fp16 else TIGHT
    vs_ref = {"rtol": 1e-2, "atol": 1e-3} if fp16 else REF
    for rank in range(DDP_WORLD):
        mine = got[rank][variant]
        assert_close(mine["losses"], gloo[rank][variant]["losses"], **vs_gloo)
        assert_close(mine["state"], gloo[rank][variant]["state"], **vs_gloo)
        assert_close(mine["losses"], ref["losses"][rank], **vs_ref)
        assert_close(mine["params"], ref["params"], **vs_ref)
        # The replicas stay identical (two ranks: a + b == b + a, so bit for bit).
        assert_close(mine["params"], got[0][variant]["params"], rtol=0, atol=0)
    if variant == "then_hook":
        calls = [got[r][variant]["hook_calls"] for r in range(DDP_WORLD)]
        # Once per bucket per step: one bucket in step 1, several once DDP rebuilt them.
        assert calls[0] > DDP_STEPS, f"custom hook ran {calls[0]} times in {DDP_STEPS} steps"
        assert calls == [gloo[r][variant]["hook_calls"] for r in range(DDP_WORLD)]


# ======================================================================================
# FSDP2
# ======================================================================================

FSDP_STEPS = 3
FSDP_WORLD = 2


def _fsdp_model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(
        nn.Linear(16, 24),
        nn.ReLU(),
        nn.Linear(24, 5),  # 5 rows over 2 ranks: uneven (padded) shards
        nn.ReLU(),
        nn.Linear(5, 3),
    )


def _fsdp_batch(rank: int, step: int):
    g = torch.Generator().manual_seed(500 + 100 * rank + step)
    return torch.randn(6, 16, generator=g), torch.randn(6, 3, generator=g)


def _fsdp_train(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size,))
    model = _fsdp_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local_shapes = {k: list(p.to_local().shape) for k, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(FSDP_STEPS):
        x, y = _fsdp_batch(rank, step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = {k: v.full_tensor().detach().numpy() for k, v in model.state_dict().items()}
    return {"losses": losses, "params": full, "local_shapes": local_shapes}


def _fsdp_reference(world_size: int) -> dict:
    model = _fsdp_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = [[] for _ in range(world_size)]
    for step in range(FSDP_STEPS):
        opt.zero_grad()
        for r in range(world_size):
            x, y = _fsdp_batch(r, step)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            losses[r].append(loss.item())
        for p in model.parameters():
            p.grad /= world_size
        opt.step()
    return {"losses": losses, "params": _numpy_params(model)}


def test_fsdp2_fully_shard():
    got = run_world(_fsdp_train, FSDP_WORLD, timeout=WORLD_TIMEOUT)
    gloo = run_world(_fsdp_train, FSDP_WORLD, backend="gloo", timeout=WORLD_TIMEOUT)
    ref = _fsdp_reference(FSDP_WORLD)
    for rank in range(FSDP_WORLD):
        # Really sharded: dim 0 split over the ranks (5 rows -> 3 + 2).
        shapes = got[rank]["local_shapes"]
        assert shapes["0.weight"] == [24 // FSDP_WORLD, 16]
        assert shapes["2.weight"] == ([3, 24] if rank == 0 else [2, 24])
        assert_close(got[rank]["losses"], gloo[rank]["losses"], **TIGHT)
        assert_close(got[rank]["params"], gloo[rank]["params"], **TIGHT)
        assert_close(got[rank]["losses"], ref["losses"][rank], **REF)
        assert_close(got[rank]["params"], ref["params"], **REF)
    assert_close(got[1]["params"], got[0]["params"], rtol=0, atol=0)


# ======================================================================================
# Functional collectives
# ======================================================================================

FUNCOL_WORLDS = (2, 3)


def _fc_inputs(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(77 + rank)
    n = 4 * world_size  # divisible by the world size, for the scatter ops
    return {
        "i64": torch.randint(-(10**6), 10**6, (n, 3), generator=g, dtype=torch.int64),
        "f32": torch.randint(-1000, 1000, (n, 5), generator=g).to(torch.float32),
        "f64": torch.randint(-(2**30), 2**30, (n,), generator=g).to(torch.float64),
    }


def _coalesced_inputs(inp: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """One dtype (Gloo's allreduce_coalesced requires it), several shapes; sums stay exact."""
    return [inp["f32"], inp["i64"].to(torch.float32), inp["f32"][:, 1:3].contiguous() * 3]


def _a2a_splits(rank: int, world_size: int) -> list[int]:
    """Uneven all_to_all split sizes: rank r sends (r + d + 1) rows to rank d."""
    return [rank + dst + 1 for dst in range(world_size)]


def _funcol(rank: int, world_size: int) -> dict:
    import torch.distributed._functional_collectives as fc

    warnings.simplefilter("ignore", FutureWarning)  # *_tensor names are deprecated aliases
    all_gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor
    reduce_scatter = getattr(fc, "reduce_scatter_single", None) or fc.reduce_scatter_tensor

    def done(t):
        return fc.wait_tensor(t).tolist()

    group = dist.group.WORLD
    inp = _fc_inputs(rank, world_size)
    out: dict = {}
    for name, t in inp.items():
        for op in ("sum", "max", "min"):
            out[f"all_reduce/{op}/{name}"] = done(fc.all_reduce(t, op, group))
        out[f"all_gather/dim0/{name}"] = done(all_gather(t, 0, group))
        if t.dim() > 1:
            out[f"all_gather/dim1/{name}"] = done(all_gather(t, 1, group))
        out[f"reduce_scatter/{name}"] = done(reduce_scatter(t, "sum", 0, group))
        out[f"broadcast/{name}"] = done(fc.broadcast(t, world_size - 1, group))
    tensors = _coalesced_inputs(inp)
    out["all_reduce_coalesced"] = [done(t) for t in fc.all_reduce_coalesced(tensors, "sum", group)]
    out["all_gather_into_tensor_coalesced"] = [
        done(t) for t in fc.all_gather_into_tensor_coalesced(tensors, group)
    ]
    out["reduce_scatter_tensor_coalesced"] = [
        done(t)
        for t in fc.reduce_scatter_tensor_coalesced(tensors, "sum", [0] * len(tensors), group)
    ]
    # all_to_all_single, uneven splits.
    send_splits = _a2a_splits(rank, world_size)
    recv_splits = [_a2a_splits(src, world_size)[rank] for src in range(world_size)]
    a2a_in = torch.arange(sum(send_splits), dtype=torch.int64) + 1000 * rank
    out["all_to_all_single"] = done(fc.all_to_all_single(a2a_in, recv_splits, send_splits, group))
    # The inputs must be left untouched by the out-of-place functional ops.
    out["inputs_unchanged"] = all(
        torch.equal(a, b)
        for a, b in zip(inp.values(), _fc_inputs(rank, world_size).values(), strict=True)
    )
    return out


def _funcol_expected(world_size: int) -> list[dict]:
    ins = [_fc_inputs(r, world_size) for r in range(world_size)]
    n = 4 * world_size
    chunk = n // world_size
    expected = []
    for rank in range(world_size):
        e: dict = {}
        for name in ins[0]:
            stack = torch.stack([i[name] for i in ins])
            total = stack.sum(0)
            e[f"all_reduce/sum/{name}"] = total.tolist()
            e[f"all_reduce/max/{name}"] = stack.max(0).values.tolist()
            e[f"all_reduce/min/{name}"] = stack.min(0).values.tolist()
            e[f"all_gather/dim0/{name}"] = torch.cat([i[name] for i in ins], 0).tolist()
            if ins[0][name].dim() > 1:
                e[f"all_gather/dim1/{name}"] = torch.cat([i[name] for i in ins], 1).tolist()
            e[f"reduce_scatter/{name}"] = total[rank * chunk : (rank + 1) * chunk].tolist()
            e[f"broadcast/{name}"] = ins[world_size - 1][name].tolist()
        co = [_coalesced_inputs(i) for i in ins]
        co_sums = [sum(c[j] for c in co) for j in range(len(co[0]))]
        e["all_reduce_coalesced"] = [t.tolist() for t in co_sums]
        e["all_gather_into_tensor_coalesced"] = [
            torch.cat([c[j] for c in co], 0).tolist() for j in range(len(co[0]))
        ]
        e["reduce_scatter_tensor_coalesced"] = [
            t[rank * chunk : (rank + 1) * chunk].tolist() for t in co_sums
        ]
        a2a = []
        for src in range(world_size):
            splits = _a2a_splits(src, world_size)
            start = sum(splits[:rank])
            a2a += [1000 * src + v for v in range(start, start + splits[rank])]
        e["all_to_all_single"] = a2a
        e["inputs_unchanged"] = True
        expected.append(e)
    return expected


@pytest.mark.parametrize("world_size", FUNCOL_WORLDS)
def test_functional_collectives(world_size):
    got = run_world(_funcol, world_size, timeout=WORLD_TIMEOUT)
    expected = _funcol_expected(world_size)
    for rank in range(world_size):
        assert set(got[rank]) == set(expected[rank])
        for key, value in expected[rank].items():
            assert got[rank][key] == value, f"rank {rank}: {key}"
    gloo = run_world(_funcol, world_size, backend="gloo", timeout=WORLD_TIMEOUT)
    assert got == gloo


# ======================================================================================
# Object collectives
# ======================================================================================

OBJ_WORLD = 3


def _obj(rank: int, tag: str):
    """A picklable object whose pickled size differs a lot from rank to rank."""
    return {
        "tag": tag,
        "rank": rank,
        "text": f"r{rank}-" + "x" * (1000 * rank),
        "nested": [1, 2.5, None, (rank, "t"), {"k": [rank] * rank}],
        "bytes": bytes(range(rank * 7 % 256)),
        "tensor": torch.arange(rank + 2, dtype=torch.float64) * 0.5,
        "big": "B" * (300_000 if rank == 1 else 0),
    }


def _plain(obj):
    """Tensors to tagged lists, recursively, so results compare with == and pickle by value."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", str(obj.dtype), obj.tolist())
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    return obj


def _object_collectives(rank: int, world_size: int) -> dict:
    out = {}

    gathered = [None] * world_size
    dist.all_gather_object(gathered, _obj(rank, "all_gather"))
    out["all_gather_object"] = _plain(gathered)

    src = 1 % world_size
    lst = [_obj(src, "bcast-a"), "second", 42] if rank == src else [None, None, None]
    dist.broadcast_object_list(lst, src=src)
    out["broadcast_object_list"] = _plain(lst)

    dst = world_size - 1
    glist = [None] * world_size if rank == dst else None
    dist.gather_object(_obj(rank, "gather"), glist, dst=dst)
    out["gather_object"] = _plain(glist)

    scatter_out = [None]
    scatter_in = [_obj(r, "scatter") for r in range(world_size)] if rank == 0 else None
    dist.scatter_object_list(scatter_out, scatter_in, src=0)
    out["scatter_object_list"] = _plain(scatter_out)

    # Rank 0 sends a list of objects to every other rank, which answers with its own.
    if rank == 0:
        for peer in range(1, world_size):
            dist.send_object_list([_obj(peer, "to-peer"), peer * 11], dst=peer)
        replies = {}
        for peer in range(1, world_size):
            buf = [None, None]
            dist.recv_object_list(buf, src=peer)
            replies[peer] = buf
        out["send_recv_object_list"] = _plain(replies)
    else:
        buf = [None, None]
        dist.recv_object_list(buf, src=0)
        dist.send_object_list([_obj(rank, "reply"), buf[1] + 1], dst=0)
        out["send_recv_object_list"] = _plain(buf)
    return out


def _objects_expected(world_size: int) -> list[dict]:
    src, dst = 1 % world_size, world_size - 1
    exp = []
    for rank in range(world_size):
        e = {
            "all_gather_object": _plain([_obj(r, "all_gather") for r in range(world_size)]),
            "broadcast_object_list": _plain([_obj(src, "bcast-a"), "second", 42]),
            "gather_object": (
                _plain([_obj(r, "gather") for r in range(world_size)]) if rank == dst else None
            ),
            "scatter_object_list": _plain([_obj(rank, "scatter")]),
        }
        if rank == 0:
            e["send_recv_object_list"] = _plain(
                {p: [_obj(p, "reply"), p * 11 + 1] for p in range(1, world_size)}
            )
        else:
            e["send_recv_object_list"] = _plain([_obj(rank, "to-peer"), rank * 11])
        exp.append(e)
    return exp


def test_object_collectives():
    got = run_world(_object_collectives, OBJ_WORLD, timeout=WORLD_TIMEOUT)
    expected = _objects_expected(OBJ_WORLD)
    for rank in range(OBJ_WORLD):
        assert set(got[rank]) == set(expected[rank])
        for key, value in expected[rank].items():
            assert got[rank][key] == value, f"rank {rank}: {key}"
    gloo = run_world(_object_collectives, OBJ_WORLD, backend="gloo", timeout=WORLD_TIMEOUT)
    assert got == gloo
