"""Point-to-point communication, after PyTorch's "Writing Distributed Applications" tutorial.

The tutorial's first two programs, generalised from 2 ranks to any world size:

* ``blocking_p2p``: rank 0 sends a tensor to every other rank with ``dist.send``;
  each of them receives it with ``dist.recv`` and answers with a tensor of its own.
* ``nonblocking_p2p``: every rank exchanges several messages of different sizes
  with every other rank at once, with ``dist.isend`` / ``dist.irecv`` and ``wait()``.

Run::

    torchrun --nproc-per-node 2 examples/tutorial_p2p.py --backend ucx

Each rank prints one ``RESULT {json}`` line (what it received), which the tests parse.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from tutorial_common import emit_result, parse_args

# Message sizes (elements) used by nonblocking_p2p: tiny, medium, and large enough
# (1.2 MB of float32) to leave the eager protocols of most transports.
NONBLOCKING_SIZES = (1, 1000, 300_000)


def p2p_payload(src: int, dst: int, numel: int, dtype=torch.float32) -> torch.Tensor:
    """The tensor ``src`` sends to ``dst``: distinct per pair, exact in float32."""
    return (torch.arange(numel, dtype=torch.int64) % 1021 + 1000 * src + 10 * dst).to(dtype)


def blocking_p2p(rank: int, world_size: int) -> dict[str, list]:
    """Blocking send/recv; returns what this rank received, keyed by peer."""
    received: dict[str, list] = {}
    if rank == 0:
        for dst in range(1, world_size):
            tensor = torch.zeros(5)
            tensor += 1 + dst  # the tutorial's "tensor += 1", distinct per receiver
            dist.send(tensor=tensor, dst=dst)
        for src in range(1, world_size):
            reply = torch.zeros(3, dtype=torch.int64)
            dist.recv(tensor=reply, src=src)
            received[str(src)] = reply.tolist()
    else:
        tensor = torch.zeros(5)
        dist.recv(tensor=tensor, src=0)
        received["0"] = tensor.tolist()
        reply = torch.tensor([rank, rank * 100, int(tensor[0].item())], dtype=torch.int64)
        dist.send(tensor=reply, dst=0)
    return received


def expected_blocking_p2p(rank: int, world_size: int) -> dict[str, list]:
    if rank == 0:
        return {str(src): [src, src * 100, 1 + src] for src in range(1, world_size)}
    return {"0": [float(1 + rank)] * 5}


def nonblocking_p2p(rank: int, world_size: int) -> dict[str, list]:
    """All-pairs isend/irecv, several messages per pair, all in flight at once.

    Returns, per peer, the checksum and the first/last values of every message
    received from that peer, in posting order.
    """
    recv_bufs: dict[int, list[torch.Tensor]] = {}
    reqs = []
    for peer in range(world_size):
        if peer == rank:
            continue
        recv_bufs[peer] = [torch.full((n,), -1.0) for n in NONBLOCKING_SIZES]
        for buf in recv_bufs[peer]:
            reqs.append(dist.irecv(tensor=buf, src=peer))
    send_bufs = []  # must stay alive until the sends complete
    for peer in range(world_size):
        if peer == rank:
            continue
        for n in NONBLOCKING_SIZES:
            buf = p2p_payload(rank, peer, n)
            send_bufs.append(buf)
            reqs.append(dist.isend(tensor=buf, dst=peer))
    for req in reqs:
        req.wait()
    return {str(peer): [checksum(b) for b in bufs] for peer, bufs in recv_bufs.items()}


def checksum(t: torch.Tensor) -> list:
    """Exact summary of a received message: integer sum, first and last values."""
    return [int(t.double().sum().item()), t[0].item(), t[-1].item()]


def expected_nonblocking_p2p(rank: int, world_size: int) -> dict[str, list]:
    out = {}
    for peer in range(world_size):
        if peer == rank:
            continue
        msgs = []
        for n in NONBLOCKING_SIZES:
            msgs.append(checksum(p2p_payload(peer, rank, n)))
        out[str(peer)] = msgs
    return out


def main() -> None:
    args = parse_args(__doc__)

    dist.init_process_group(args.backend, init_method=args.init_method)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result = {
        "rank": rank,
        "world_size": world_size,
        "backend": dist.get_backend(),
        "blocking": blocking_p2p(rank, world_size),
        "nonblocking": nonblocking_p2p(rank, world_size),
    }
    ok = result["blocking"] == expected_blocking_p2p(rank, world_size) and result[
        "nonblocking"
    ] == expected_nonblocking_p2p(rank, world_size)
    result["ok"] = ok
    emit_result(result, rank, args.result_dir)
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"rank {rank}: received data differs from the expected values")
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"tutorial_p2p: OK on {world_size} ranks ({args.backend})", flush=True)


if __name__ == "__main__":
    main()
