"""send/recv of the dtypes the collectives do not reduce or carry: uint16/32/64 and the float8
types. A point-to-point op carries a tensor's bytes without reading them as numbers, so, as
with Gloo, any dtype goes, bit for bit; before, ucx and udp refused them ("tensor has
unsupported dtype UInt16[8]"), where a Gloo program sent them. The collectives still refuse
them before anything is sent, naming the op, the dtype and the shape, and the group stays
usable."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from dist_harness import BACKEND, run_world

OURS = "ucx" in BACKEND or BACKEND == "udp"
N = 8

# Each dtype's bit patterns, as the unsigned integers of its width: every byte differs
# across elements and ranks, and the high bit is set (uint64 values past 2^63).
WIDE: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "uint16": (torch.uint16, torch.int16),
    "uint32": (torch.uint32, torch.int32),
    "uint64": (torch.uint64, torch.int64),
}
FLOAT8 = [
    name
    for name in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    )
    if hasattr(torch, name)
]


def _pattern(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """N elements of `dtype` whose bytes are 0x80 | (rank, element, byte) mixed."""
    width = torch.empty(0, dtype=dtype).element_size()
    raw = torch.tensor(
        [0x80 | ((rank * 37 + i * 11 + b * 5) & 0x7F) for i in range(N) for b in range(width)],
        dtype=torch.uint8,
    )
    return raw.view(dtype)


def _bits(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.uint8).tolist()


def _dtypes() -> list[torch.dtype]:
    return [d for d, _ in WIDE.values()] + [getattr(torch, n) for n in FLOAT8]


def _p2p_dtypes(rank: int, ws: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    peer = 1 - rank
    for dtype in _dtypes():
        got = torch.zeros(N, dtype=dtype)
        works = [dist.isend(_pattern(dtype, rank), peer), dist.irecv(got, peer)]
        for w in works:
            w.wait()
        out[str(dtype)] = (_bits(got), _bits(_pattern(dtype, peer)))
    # From any source, and into a strided view on ucx/udp (staged, then copied back; Gloo
    # takes contiguous tensors only).
    dtype = torch.uint32
    if rank == 0:
        step = 2 if OURS else 1
        buf = torch.zeros(step * N, dtype=dtype)
        dist.recv(buf[::step])
        out["recv from any source, strided"] = (_bits(buf[::step]), _bits(_pattern(dtype, 1)))
        gaps = buf.view(torch.int32).view(N, step)[:, 1:]
        out["gaps untouched"] = bool((gaps == 0).all())
    else:
        dist.send(_pattern(dtype, 1), 0)
    if OURS:
        refused: dict[str, Any] = {}
        for dtype in (torch.uint16, torch.uint64, *(getattr(torch, n) for n in FLOAT8[:1])):
            t = torch.zeros(3, 2, dtype=dtype)
            for op, call in (
                ("broadcast", lambda t=t: dist.broadcast(t, src=0)),
                ("allreduce", lambda t=t: dist.all_reduce(t)),
            ):
                try:
                    call()
                    refused[f"{op} {dtype}"] = None
                except ValueError as e:
                    refused[f"{op} {dtype}"] = str(e)
        out["refused"] = refused
    t = torch.full((4,), rank + 1, dtype=torch.int64)
    dist.all_reduce(t)
    out["still usable"] = t.tolist() == [3] * 4
    return out


@pytest.fixture(scope="module")
def p2p_dtypes_world() -> list[dict[str, Any]]:
    return run_world(_p2p_dtypes, 2, pg_timeout=20, timeout=60)


def test_send_recv_carry_every_dtype_bit_for_bit(p2p_dtypes_world: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(p2p_dtypes_world):
        for dtype in _dtypes():
            got, want = out[str(dtype)]
            assert got == want, (rank, str(dtype), got, want)
    out = p2p_dtypes_world[0]
    got, want = out["recv from any source, strided"]
    assert got == want, (got, want)
    assert out["gaps untouched"]


def test_collectives_refuse_the_dtypes_they_do_not_take(
    p2p_dtypes_world: list[dict[str, Any]],
) -> None:
    if not OURS:
        pytest.skip(f"ucx/udp only ({BACKEND} under test): Gloo's messages name no shape")
    for rank, out in enumerate(p2p_dtypes_world):
        assert out["still usable"], f"rank {rank}: group broken after the refusals"
        for what, msg in out["refused"].items():
            op, dtype = what.split(" ")
            assert msg is not None, f"rank {rank}: {what} was not refused"
            # "ucx broadcast on rank 0: tensor has unsupported dtype UInt16[3, 2]"
            assert op in msg and "unsupported dtype" in msg and f"rank {rank}" in msg, msg
            assert f"{dtype.removeprefix('torch.')}[3, 2]" in msg.lower(), (what, msg)
