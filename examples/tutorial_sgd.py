"""Synchronous data-parallel SGD, after PyTorch's "Writing Distributed Applications" tutorial.

The tutorial trains on MNIST; this version uses a synthetic classification data set
(fixed seed) so that it needs no download. Each rank trains the same small MLP on its
partition of the data and, after every backward pass, averages the gradients with
``dist.all_reduce(SUM) / world_size``, exactly like the tutorial's ``average_gradients``.

``reference_sgd`` computes the same training in a single process (the gradients of
every rank's batch, accumulated and divided by the world size), which the tests
use as an independent reference.

Run::

    torchrun --nproc-per-node 2 examples/tutorial_sgd.py --backend ucx
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tutorial_common import emit_result, parse_args

GLOBAL_BATCH = 32
NUM_SAMPLES = 256
EPOCHS = 3
IN_FEATURES = 20
NUM_CLASSES = 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN_FEATURES, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.log_softmax(self.fc3(x), dim=1)


def synthetic_dataset(num_samples: int = NUM_SAMPLES, seed: int = 0):
    """A learnable classification problem: labels from a fixed random linear map."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, IN_FEATURES, generator=g)
    w = torch.randn(IN_FEATURES, NUM_CLASSES, generator=g)
    y = (x @ w + 0.1 * torch.randn(num_samples, NUM_CLASSES, generator=g)).argmax(dim=1)
    return x, y


class DataPartitioner:
    """The tutorial's partitioner: a fixed shuffle, then contiguous equal slices."""

    def __init__(self, num_samples: int, world_size: int, seed: int = 1234) -> None:
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(num_samples, generator=g)
        part = num_samples // world_size
        self.partitions = [order[r * part : (r + 1) * part] for r in range(world_size)]

    def use(self, rank: int) -> torch.Tensor:
        return self.partitions[rank]


def partition_batches(rank: int, world_size: int):
    """This rank's list of (x, y) batches, the same in every epoch."""
    x, y = synthetic_dataset()
    idx = DataPartitioner(len(x), world_size).use(rank)
    bsz = GLOBAL_BATCH // world_size
    return [(x[idx[i : i + bsz]], y[idx[i : i + bsz]]) for i in range(0, len(idx), bsz)]


def make_model_and_optimizer():
    torch.manual_seed(1234)  # same initial weights on every rank, as in the tutorial
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    return model, optimizer


def average_gradients(model: nn.Module) -> None:
    """Gradient averaging, as in the tutorial."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run_sgd(rank: int, world_size: int) -> dict:
    """Distributed synchronous SGD; returns this rank's epoch losses and final parameters."""
    torch.set_num_threads(1)
    model, optimizer = make_model_and_optimizer()
    batches = partition_batches(rank, world_size)
    epoch_losses = []
    for _epoch in range(EPOCHS):
        epoch_loss = 0.0
        for data, target in batches:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
        epoch_losses.append(epoch_loss / len(batches))
    return {
        "epoch_losses": epoch_losses,
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def reference_sgd(world_size: int) -> dict:
    """The same training in one process; returns every rank's epoch losses and the params."""
    torch.set_num_threads(1)
    model, optimizer = make_model_and_optimizer()
    per_rank = [partition_batches(r, world_size) for r in range(world_size)]
    losses = [[0.0] * EPOCHS for _ in range(world_size)]
    for epoch in range(EPOCHS):
        for step in range(len(per_rank[0])):
            optimizer.zero_grad()
            for r in range(world_size):
                data, target = per_rank[r][step]
                loss = F.nll_loss(model(data), target)
                losses[r][epoch] += loss.item()
                loss.backward()  # accumulates: the sum over ranks
            for p in model.parameters():
                p.grad /= world_size
            optimizer.step()
    for r in range(world_size):
        losses[r] = [total / len(per_rank[r]) for total in losses[r]]
    return {
        "epoch_losses": losses,
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def main() -> None:
    args = parse_args(__doc__)

    dist.init_process_group(args.backend, init_method=args.init_method)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = run_sgd(rank, world_size)
    for epoch, loss in enumerate(result["epoch_losses"]):
        print(f"Rank {rank}, epoch {epoch}: {loss:.6f}", flush=True)

    ref = reference_sgd(world_size)
    ok = all(
        torch.allclose(result["params"][k], ref["params"][k], rtol=1e-4, atol=1e-6)
        for k in ref["params"]
    ) and all(
        math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)
        for a, b in zip(result["epoch_losses"], ref["epoch_losses"][rank], strict=True)
    )
    summary = {
        "rank": rank,
        "ok": ok,
        "epoch_losses": result["epoch_losses"],
        "params": {k: v.reshape(-1).tolist() for k, v in result["params"].items()},
    }
    emit_result(summary, rank, args.result_dir)
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: training differs from the single-process reference")
    if rank == 0:
        print(f"tutorial_sgd: OK on {world_size} ranks ({args.backend})", flush=True)


if __name__ == "__main__":
    main()
