"""A hand-written ring all-reduce, after PyTorch's "Writing Distributed Applications" tutorial.

Two versions built only from point-to-point operations:

* ``tutorial_ring_allreduce``: the tutorial's program: every rank passes whole
  buffers to its right neighbour (``isend``) while receiving from its left
  neighbour (``recv``), ``world_size - 1`` times, accumulating as it goes.
* ``chunked_ring_allreduce``: the bandwidth-optimal ring: the tensor is cut into
  ``world_size`` chunks; a reduce-scatter phase sends one chunk per step around
  the ring and accumulates it, then an all-gather phase circulates the reduced chunks.

Both are compared with ``dist.all_reduce`` on integer and integer-valued float
tensors, so the comparison is exact whatever the summation order.

Run::

    torchrun --nproc-per-node 2 examples/tutorial_ring_allreduce.py --backend ucx
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tutorial_common import emit_result, parse_args


def tutorial_ring_allreduce(send: torch.Tensor, recv: torch.Tensor) -> None:
    """The tutorial's ring all-reduce (SUM), result written into ``recv``."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.clone()
    recv_buff = send.clone()
    accum = send.clone()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def chunked_ring_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter + all-gather ring all-reduce (SUM); returns a new tensor.

    Works for any numel (chunks may be uneven or empty).
    """
    rank = dist.get_rank()
    size = dist.get_world_size()
    out = tensor.detach().clone().contiguous()
    if size == 1:
        return out
    flat = out.view(-1)
    chunks = list(torch.tensor_split(flat, size))  # views into ``out``
    left = (rank - 1) % size
    right = (rank + 1) % size

    # Reduce-scatter: after step s, chunk (rank - s - 1) % size holds the partial
    # sum of s + 2 ranks; after size - 1 steps chunk (rank + 1) % size is complete.
    for step in range(size - 1):
        send_idx = (rank - step) % size
        recv_idx = (rank - step - 1) % size
        incoming = torch.empty_like(chunks[recv_idx])
        req = dist.isend(chunks[send_idx].clone(), right)
        dist.recv(incoming, left)
        req.wait()
        chunks[recv_idx] += incoming

    # All-gather: circulate the completed chunks.
    for step in range(size - 1):
        send_idx = (rank + 1 - step) % size
        recv_idx = (rank - step) % size
        incoming = torch.empty_like(chunks[recv_idx])
        req = dist.isend(chunks[send_idx].clone(), right)
        dist.recv(incoming, left)
        req.wait()
        chunks[recv_idx].copy_(incoming)
    return out


def ring_inputs(rank: int) -> dict[str, torch.Tensor]:
    """Per-rank inputs: integer tensors and integer-valued float tensors (sums are exact)."""
    g = torch.Generator().manual_seed(1234 + rank)
    return {
        "int64_small": torch.randint(-1000, 1000, (7,), generator=g, dtype=torch.int64),
        "int64_odd": torch.randint(-(10**9), 10**9, (1001,), generator=g, dtype=torch.int64),
        "float32_2d": torch.randint(-512, 512, (33, 65), generator=g).to(torch.float32),
        "float64_big": torch.randint(-(2**20), 2**20, (262_147,), generator=g).to(torch.float64),
    }


def run_ring_allreduce(rank: int, world_size: int) -> dict[str, dict[str, list]]:
    """For every input: the tutorial ring, the chunked ring and dist.all_reduce results.

    Large tensors are summarised (checksum, first and last values) to keep results small.
    """
    results: dict[str, dict[str, list]] = {}
    for name, inp in ring_inputs(rank).items():
        naive = torch.zeros_like(inp)
        tutorial_ring_allreduce(inp, naive)
        chunked = chunked_ring_allreduce(inp)
        reference = inp.clone()
        dist.all_reduce(reference, op=dist.ReduceOp.SUM)
        results[name] = {
            "tutorial_ring": summarise(naive),
            "chunked_ring": summarise(chunked),
            "all_reduce": summarise(reference),
            "input_unchanged": [bool(torch.equal(inp, ring_inputs(rank)[name]))],
        }
    return results


def summarise(t: torch.Tensor) -> list:
    flat = t.reshape(-1)
    if flat.numel() <= 64:
        return flat.tolist()
    return [flat.sum().item(), flat[:4].tolist(), flat[-4:].tolist(), flat.numel()]


def expected_sums(world_size: int) -> dict[str, list]:
    """What every rank must get: the exact sum of all ranks' inputs."""
    per_rank = [ring_inputs(r) for r in range(world_size)]
    return {name: summarise(sum(inp[name] for inp in per_rank)) for name in per_rank[0]}


def main() -> None:
    args = parse_args(__doc__)

    dist.init_process_group(args.backend, init_method=args.init_method)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    results = run_ring_allreduce(rank, world_size)
    expected = expected_sums(world_size)
    ok = all(
        r["tutorial_ring"] == r["chunked_ring"] == r["all_reduce"] == expected[name]
        and r["input_unchanged"] == [True]
        for name, r in results.items()
    )
    emit_result({"rank": rank, "ok": ok, "results": results}, rank, args.result_dir)
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: ring all-reduce differs from dist.all_reduce")
    if rank == 0:
        print(f"tutorial_ring_allreduce: OK on {world_size} ranks ({args.backend})", flush=True)


if __name__ == "__main__":
    main()
