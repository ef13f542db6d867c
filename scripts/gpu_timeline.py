"""Where a CUDA op's time goes: two ranks, op latency by size, and the device's timeline.

    python scripts/gpu_timeline.py [--device cuda] [--sizes 4,64K,1M,16M] [--timeout 90]

Two ranks (multiprocessing "spawn") share device 0 and rendezvous over ``tcp://`` on a port
picked at run time. Rank 0 prints, per size, the median host time of one ``all_reduce``
followed by ``torch.cuda.synchronize()`` and of one half round trip of ``send``/``recv``
(rank 0 to rank 1 and back), each over ``--iters`` iterations after warm-up. Then it records
two all_reduce of the largest size with ``torch.profiler`` (CUPTI sees the whole process's
device activity: UCX's ``cuda_ipc`` copies on UCX's streams as well as the backend's
reductions on its internal stream) and prints every device activity of the second one: its
start relative to the op's issue, its length, its stream. A gap between activities is time the
host spent deciding, waiting or sleeping; compare it with the op's host time above.

The environment passes to the ranks (``UCX_*``, ``UCXBACKEND_*``): run it once per setting to
compare, e.g. ``UCXBACKEND_CHUNK_BYTES=64M`` or ``UCX_RNDV_SCHEME=get_zcopy``. ``--device cpu``
runs the same on CPU tensors (the timeline then lists host activities only).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    if text and text[-1] in UNITS:
        return int(text[:-1]) * UNITS[text[-1]]
    return int(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, port: int, device_name: str, sizes: list[int], iters: int) -> None:
    os.environ.setdefault("UCXBACKEND_CUDA", "1")
    import torch
    import torch.distributed as dist

    import ucxbackend  # noqa: F401  (registers "ucx")

    cuda = device_name == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("ucx", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        for _ in range(max(3, iters // 5)):
            fn()
        sync()
        dist.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    for size in sizes:
        count = max(1, size // 4)
        t = torch.ones(count, dtype=torch.float32, device=device)

        def all_reduce(t: torch.Tensor = t) -> None:
            dist.all_reduce(t)
            sync()

        def ping(t: torch.Tensor = t) -> None:
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            sync()

        ar = timed(all_reduce)
        pp = timed(ping) / 2
        expected = float(2 ** (max(3, iters // 5) + iters))
        ok = bool(torch.all(t == expected).item()) if size >= 4 else True
        if rank == 0:
            print(f"size {size:>10} B  all_reduce {ar:9.1f} us  send/recv one way {pp:9.1f} us"
                  f"  values {'ok' if ok else 'WRONG'}", flush=True)
        del t

    size = max(sizes)
    t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    for _ in range(5):
        dist.all_reduce(t)
    sync()
    dist.barrier()
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            dist.all_reduce(t)
            sync()
    if rank == 0:
        events = [e for e in prof.events() if (e.device_type.name == "CUDA") == cuda]
        events.sort(key=lambda e: e.time_range.start)
        # The second op: from the second all_reduce call on the host.
        calls = [e for e in prof.events() if "allreduce" in e.name and e.device_type.name == "CPU"]
        calls.sort(key=lambda e: e.time_range.start)
        start = calls[-1].time_range.start if calls else events[0].time_range.start
        print(f"timeline of one all_reduce of {size} B (us from its issue on the host):")
        for e in events:
            if e.time_range.start < start:
                continue
            stream = getattr(e, "device_resource_id", "")
            print(f"  {e.time_range.start - start:9.1f} +{e.time_range.elapsed_us():8.1f}"
                  f"  stream {stream!s:>4}  {e.name[:70]}")
        print(f"  host calls: {[round(c.time_range.elapsed_us(), 1) for c in calls]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default="4,64K,1M,16M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, args.device, sizes, args.iters))
             for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    status = 0
    for p in procs:
        if p.is_alive():
            print(f"rank pid {p.pid} still running after {args.timeout} s: killed", flush=True)
            p.kill()
            p.join()
            status = 1
        elif p.exitcode != 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
