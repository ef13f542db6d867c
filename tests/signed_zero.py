"""MIN and MAX of -0.0 against +0.0 (and NaN) in all_reduce: every rank must end with the same bits.

IEEE says -0.0 == +0.0, so which zero a MIN or MAX of a tie returns is the implementation's
choice; what a backend owes its callers is that every rank gets the *same* one (DDP replicas
stay bit-identical). An algorithm in which each rank folds "mine op theirs" (recursive
doubling's exchange, the 2-rank exchange and staged paths) gives rank 0 ``min(x0, x1)`` and
rank 1 ``min(x1, x0)``: a different zero wherever the kernel keeps its first operand on a tie.
The backend makes the two ranks of each exchange fold in one order (lower rank's value first:
``foldOrder`` and ``Reduction.swapped`` in ``csrc/collectives``, which the device's ATen
reductions honour by swapping their operands).

The ranks run all_reduce MIN and MAX of float16, bfloat16, float32 and float64 vectors in which
some elements are zeros of opposite signs on alternate ranks and some are NaN on one or on every
rank, on the group that the automatic choice serves and on groups forcing each all_reduce
algorithm with small chunks (many chunks per exchange, double-buffered). Per group and device:

* the result's bytes, gathered over a Gloo group, are the same on every rank;
* its values equal MIN/MAX of every rank's input (gathered over Gloo as CPU copies, reduced by
  torch on the host), -0.0 and +0.0 counting as equal, NaN where any input is NaN.

Used by ``tests/test_signed_zero.py`` (CPU tensors) and ``tests/gpu/test_cuda_signed_zero.py``
(CUDA tensors, and CPU ones in the same ranks).
"""

from __future__ import annotations

from typing import Any

DTYPES = ("float16", "bfloat16", "float32", "float64")
OPS = ("MIN", "MAX")
SMALL_CHUNK = 4096  # bytes: a 40,000-element vector is tens of chunks per exchange
# (name, pg_options, element counts). "auto" at 2 ranks: 1-1000 elements one exchange (recursive
# doubling), 40,000 Rabenseifner or ring by dtype, 300,000 the ring (through the shared-memory
# slots for CPU tensors on one host, chunked through the transport for CUDA ones).
GROUPS: tuple[tuple[str, dict[str, Any], tuple[int, ...]], ...] = (
    ("auto", {}, (1, 7, 1000, 40_000, 300_000)),
    (
        "recursive_doubling",
        {
            "algo_allreduce": "recursive_doubling",
            "chunk_bytes": SMALL_CHUNK,
            "device_chunk_bytes": SMALL_CHUNK,
        },
        (1000, 40_000),
    ),
    (
        "ring",
        {"algo_allreduce": "ring", "chunk_bytes": SMALL_CHUNK, "device_chunk_bytes": SMALL_CHUNK},
        (1000, 40_000),
    ),
    (
        "rabenseifner",
        {
            "algo_allreduce": "rabenseifner",
            "chunk_bytes": SMALL_CHUNK,
            "device_chunk_bytes": SMALL_CHUNK,
        },
        (1000, 40_000),
    ),
)
GROUP_NAMES = tuple(name for name, _, _ in GROUPS)
CHECKS = ("same bits on every rank", "values match the Gloo-gathered reference")


def check_name(group: str, device: str, check: str) -> str:
    return f"{group} on {device}: {check}"


def inputs(rank: int, n: int, dtype_name: str) -> Any:
    """Rank ``rank``'s CPU input: random values, zeros of the sign that alternates with the
    rank at every 5th and 5th+1 element, NaN on rank 0 only at every 11th, on every rank at
    every 13th."""
    import torch

    g = torch.Generator().manual_seed(104_729 + 31 * n + rank)
    x = torch.randn(n, generator=g, dtype=torch.float64).to(getattr(torch, dtype_name))
    neg, pos = (-0.0, 0.0) if rank % 2 == 0 else (0.0, -0.0)
    x[::5] = neg
    x[1::5] = pos
    if rank == 0:
        x[2::11] = float("nan")
    x[3::13] = float("nan")
    return x


def bits(x: Any) -> Any:
    """``x``'s bytes as uint8 (torch.equal holds -0.0 equal to +0.0 and NaN unequal to NaN)."""
    import torch

    return x.contiguous().view(-1).view(torch.uint8)


def gathered_bits(x: Any, ws: int, gloo: Any) -> list[Any]:
    """Every rank's bytes of CPU tensor ``x``, gathered over ``gloo``."""
    import torch
    import torch.distributed as dist

    raw = bits(x)
    parts = [torch.empty_like(raw) for _ in range(ws)]
    dist.all_gather(parts, raw, group=gloo)
    return parts


def reference(xs: list[Any], op: str) -> Any:
    """MIN/MAX of the ranks' inputs in float64 on the host (exact; NaN where any is NaN)."""
    import torch

    stack = torch.stack([x.double() for x in xs])
    return stack.amin(0) if op == "MIN" else stack.amax(0)


def value_mismatch(got: Any, want: Any) -> str | None:
    """Where ``got`` differs from ``want`` in value (-0.0 == +0.0, NaN only against NaN)."""
    import torch

    g = got.double()
    g_nan, w_nan = torch.isnan(g), torch.isnan(want)
    bad = (g_nan != w_nan) | (~g_nan & ~w_nan & (g != want))
    if not bool(bad.any()):
        return None
    i = int(bad.nonzero()[0])
    return f"element {i}: got {g[i].item()!r}, want {want[i].item()!r} ({int(bad.sum())} differ)"


def signed_zero_main(rank: int, ws: int, devices: tuple[str, ...]) -> dict[str, Any]:
    """Rank entry point: every group x device x dtype x op x count; per-check outcomes, and how
    many tie elements the devices' results differ in (``facts``)."""
    import torch
    import torch.distributed as dist

    if any(d.startswith("cuda") for d in devices):
        from gpu.cuda_harness import use_gpu0

        use_gpu0()
    gloo = dist.new_group(backend="gloo")
    results: dict[str, dict[str, Any]] = {}
    facts: dict[str, Any] = {}

    def record(name: str, problem: str | None) -> None:
        if name not in results or results[name]["ok"]:
            results[name] = {"ok": problem is None, "detail": f"[rank {rank}] {problem or ''}"}

    for group_name, options, counts in GROUPS:
        group = dist.new_group(backend=dist.get_backend(), pg_options=options or None)
        outputs: dict[tuple[str, str, str, int], Any] = {}
        for device in devices:
            for check in CHECKS:
                record(check_name(group_name, device, check), None)
            for dtype_name in DTYPES:
                for op in OPS:
                    for n in counts:
                        what = f"{op} {dtype_name} n={n}"
                        x = inputs(rank, n, dtype_name)
                        xs = [p.view(x.dtype) for p in gathered_bits(x, ws, gloo)]
                        y = x.to(device, copy=True)
                        dist.all_reduce(y, op=getattr(dist.ReduceOp, op), group=group)
                        got = y.cpu()
                        outputs[(device, dtype_name, op, n)] = got
                        every = gathered_bits(got, ws, gloo)
                        differ = [r for r, b in enumerate(every) if not torch.equal(b, every[0])]
                        if differ:
                            where = int((every[differ[0]] != every[0]).nonzero()[0])
                            record(
                                check_name(group_name, device, CHECKS[0]),
                                f"{what}: ranks {differ} differ from rank 0 in byte {where}",
                            )
                        bad = value_mismatch(got, reference(xs, op))
                        if bad is not None:
                            record(check_name(group_name, device, CHECKS[1]), f"{what}: {bad}")
        if len(devices) == 2:
            # How many elements the two devices' results differ in by their bits (the sign of
            # a zero; which of two NaNs): each device keeps its own rule for ties.
            a, b = devices
            facts[group_name] = sum(
                int((bits(outputs[(a, *key)]) != bits(outputs[(b, *key)])).sum())
                for key in {k[1:] for k in outputs}
            )
    if any(d.startswith("cuda") for d in devices):
        # The device's own rule for ties: which zero torch.minimum/maximum keep, in each order.
        dev = next(d for d in devices if d.startswith("cuda"))
        z = torch.tensor([-0.0], device=dev)
        p = torch.tensor([0.0], device=dev)
        facts["device ties"] = {
            "minimum(-0,+0)": str(torch.minimum(z, p).item()),
            "minimum(+0,-0)": str(torch.minimum(p, z).item()),
            "maximum(-0,+0)": str(torch.maximum(z, p).item()),
            "maximum(+0,-0)": str(torch.maximum(p, z).item()),
        }
    dist.barrier(group=gloo)
    return {"results": results, "facts": facts}
