"""Where a CUDA op's time goes: two ranks, op latency by size, and the device's timeline.

    python scripts/gpu_timeline.py [--device cuda] [--sizes 4,64K,1M,16M] [--timeout 90]
                                   [--iters 20] [--no-profile] [--no-probe]

Two ranks (multiprocessing "spawn") share device 0 and rendezvous over ``tcp://`` on a port
picked at run time. Each rank prints (docs/cuda.md, "Where a CUDA op's millisecond goes"):

* per size, the median host time of one ``all_reduce`` followed by
  ``torch.cuda.synchronize()`` and of one half round trip of ``send``/``recv`` (rank 0 to
  rank 1 and back), each over ``--iters`` iterations after warm-up; with ``--device cuda``
  also the same send/recv of a CPU tensor (the host path's floor, in the same processes);
* per size, the all_reduce's waits per op from ``ucxbackend.wait_stats()`` (this rank's
  threads together): how long the op waited for its transport requests (``tw``) and for the
  device (``dw``: the caller's stream, its own copies and reductions), how many device waits
  (sync points) it made, the polls and sleeps of those, and the transport waits' yields and
  sleeps. An op of 1000 us whose ``tw`` is 900 us waited for UCX; one whose ``dw`` is, for the
  GPU;
* the contention probe: a one-element kernel plus ``torch.cuda.synchronize()``, timed with
  rank 0 alone on the GPU and with both ranks at once. Two processes have two CUDA contexts,
  which the GPU runs one at a time (no MPS): a "both" far above "alone" is the price of each
  switch between them, which every exchange of an op pays several times (on CPU tensors the
  same loop runs without a device: a dry run);
* then it records two all_reduce of the largest size with ``torch.profiler`` (CUPTI sees the
  whole process's device activity: UCX's ``cuda_ipc`` copies on UCX's streams as well as the
  backend's reductions on its internal stream) and prints every device activity of the second
  one and the host's CUDA calls (runtime and driver API, any thread): its start relative to
  the op's issue, its length, its stream or thread. A gap between a call and its activity is
  the device's queue (another context holding the GPU); a gap between activities is time the
  host spent deciding, waiting or sleeping.

The environment passes to the ranks (``UCX_*``, ``UCXBACKEND_*``): run it once per setting to
compare, e.g. ``UCXBACKEND_DEVICE_CHUNK_BYTES=4M`` or ``UCX_RNDV_SCHEME=get_zcopy``
(scripts/gpu_session.sh's ``timeline`` step). ``--device cpu`` runs the same on CPU tensors
(the timeline then lists host activities only).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# wait_stats() counters printed per op: (key, column label).
WAIT_COLUMNS = (
    ("transport_wait_us", "tw us"),
    ("device_wait_us", "dw us"),
    ("device_waits", "dwaits"),
    ("device_polls", "dpolls"),
    ("device_sleeps", "dsleeps"),
    ("yields", "yields"),
    ("sleeps", "sleeps"),
)
PROBE_ITERS = 200
# Activities of the profiled op listed per rank, at most (session.log comes back as a file).
MAX_TIMELINE_LINES = 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emit(text: str) -> None:
    """One line in one write: the two ranks share stdout, and print()'s separate write of the
    newline let their lines run together."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def say(rank: int, text: str) -> None:
    emit(f"[rank {rank}] {text}")


def rank_main(rank: int, port: int, device_name: str, sizes: list[int], iters: int,
              profile: bool, probe: bool) -> None:
    import torch
    import torch.distributed as dist

    import ucxbackend

    cuda = device_name == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # Start-up as users wait for it at every restart (the GPU run of 2026-11-28 took 1.4 s for
    # init_process_group alone): the group, then its first op on each kind of memory.
    t0 = time.perf_counter()
    dist.init_process_group("ucx", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t1 = time.perf_counter()
    dist.all_reduce(torch.ones(2))
    t2 = time.perf_counter()
    first = torch.ones(2, device=device)
    dist.all_reduce(first)
    if cuda:
        torch.cuda.synchronize(device)
    t3 = time.perf_counter()
    say(rank, f"start-up: init_process_group {1e3 * (t1 - t0):.1f} ms, first CPU all_reduce "
        f"{1e3 * (t2 - t1):.1f} ms, first {device_name} all_reduce {1e3 * (t3 - t2):.1f} ms")
    warm = max(3, iters // 5)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def timed(fn: Callable[[], None], waits: dict[str, float] | None = None) -> float:
        """The median of `iters` runs of `fn` after warm-up, in us; `waits`, if given, gets
        wait_stats()'s changes per run over them."""
        for _ in range(warm):
            fn()
        sync()
        dist.barrier()
        times = []
        before = ucxbackend.wait_stats()
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if waits is not None:
            after = ucxbackend.wait_stats()
            waits.update({k: (after[k] - before[k]) / iters for k, _ in WAIT_COLUMNS})
        return statistics.median(times) * 1e6

    def reduce_of(t: torch.Tensor) -> Callable[[], None]:
        def all_reduce() -> None:
            dist.all_reduce(t)
            sync()

        return all_reduce

    def ping_of(t: torch.Tensor) -> Callable[[], None]:
        def ping() -> None:
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            sync()

        return ping

    for size in sizes:
        count = max(1, size // 4)
        t = torch.ones(count, dtype=torch.float32, device=device)

        per_op: dict[str, float] = {}
        ar = timed(reduce_of(t), per_op)
        pp = timed(ping_of(t)) / 2
        host = ""
        if cuda:
            on_host = torch.ones(count, dtype=torch.float32)
            host = f"  (CPU tensor {timed(ping_of(on_host)) / 2:9.1f} us)"
            del on_host
        expected = float(2 ** (warm + iters))
        ok = bool(torch.all(t == expected).item())
        if rank == 0:
            emit(f"size {size:>10} B  all_reduce {ar:9.1f} us  send/recv one way {pp:9.1f} us"
                 f"{host}  values {'ok' if ok else 'WRONG'}")
        waits = "  ".join(f"{label} {per_op[k]:.1f}" for k, label in WAIT_COLUMNS)
        say(rank, f"size {size:>10} B  all_reduce waits per op: {waits}")
        del t

    if probe:
        contention_probe(rank, device, cuda)

    if profile:
        profile_one(rank, device, max(sizes), cuda)
    dist.barrier()
    dist.destroy_process_group()


def contention_probe(rank: int, device: object, cuda: bool) -> None:
    """A one-element kernel and a device synchronize, timed with rank 0 alone on the GPU (rank
    1 waits in a barrier, on the host) and with both ranks at once. On CPU tensors (a dry run)
    the same loop with no device."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(1, device=device)  # type: ignore[call-overload]

    def loop() -> float:
        times = []
        for _ in range(PROBE_ITERS):
            t0 = time.perf_counter()
            x.add_(1)
            if cuda:
                torch.cuda.synchronize(device)  # type: ignore[arg-type]
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    loop()  # warm
    dist.barrier()
    alone = loop() if rank == 0 else None
    dist.barrier()  # rank 1 stays off the GPU until rank 0 is done
    both = loop()
    dist.barrier()
    if rank == 0:
        emit(f"contention probe: kernel + synchronize, median of {PROBE_ITERS}: rank 0 alone "
             f"{alone:.1f} us, both ranks at once {both:.1f} us")
    else:
        say(rank, f"contention probe: both ranks at once {both:.1f} us")


def profile_one(rank: int, device: object, size: int, cuda: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)  # type: ignore[call-overload]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)  # type: ignore[arg-type]

    for _ in range(5):
        dist.all_reduce(t)
    sync()
    dist.barrier()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(2):
            dist.all_reduce(t)
            sync()
    events = list(prof.events())
    # The second op: from the second all_reduce call on the host.
    calls = sorted((e for e in events if "allreduce" in e.name and e.device_type.name == "CPU"),
                   key=lambda e: e.time_range.start)
    on_device = [e for e in events if e.device_type.name == "CUDA"]
    # The host's CUDA calls (runtime cuda*, driver cu*: UCX's cuMemcpyDtoDAsync where CUPTI
    # records the driver API), on any thread: the progress thread's, UCX's, the caller's.
    api = [e for e in events if e.device_type.name == "CPU" and e.name.startswith("cu")]
    shown = sorted((on_device + api) if cuda else events, key=lambda e: e.time_range.start)
    if not shown:
        say(rank, "profile: no events")
        return
    start = calls[-1].time_range.start if calls else shown[0].time_range.start
    lines = [f"timeline of one all_reduce of {size} B (us from its issue on the host):"]
    # Polls (cudaEventQuery, cuEventQuery, cudaStreamQuery: the backend's device waits and
    # UCX's progress) come by the thousand: counted per name and thread, not listed.
    polls: dict[tuple[str, str], list[float]] = {}
    listed = 0
    for e in shown:
        if e.time_range.start < start:
            continue
        if e.device_type.name == "CUDA":
            where = f"stream {getattr(e, 'device_resource_id', '')!s:>4}"
        else:
            where = f"thread {getattr(e, 'thread', '')!s:>6}"
        at = e.time_range.start - start
        if "Query" in e.name:
            polls.setdefault((e.name, where), []).append(at)
            continue
        listed += 1
        if listed <= MAX_TIMELINE_LINES:
            lines.append(f"  {at:9.1f} +{e.time_range.elapsed_us():8.1f}  {where}  {e.name[:70]}")
    if listed > MAX_TIMELINE_LINES:
        lines.append(f"  ... {listed - MAX_TIMELINE_LINES} more activities not listed")
    for (name, where), ats in sorted(polls.items()):
        lines.append(f"  polls: {name} on {where.strip()}: {len(ats)} from {min(ats):.1f} "
                     f"to {max(ats):.1f} us")
    lines.append(f"  host calls: {[round(c.time_range.elapsed_us(), 1) for c in calls]}")
    # One rank at a time, so that the two timelines do not interleave line by line.
    for turn in range(2):
        if turn == rank:
            for line in lines:
                say(rank, line)
        dist.barrier()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--sizes", default="4,64K,1M,16M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the torch.profiler timeline")
    parser.add_argument("--no-probe", dest="probe", action="store_false",
                        help="skip the contention probe")
    args = parser.parse_args()
    from ucxbackend.config import parse_size  # the project's one size parser ("4M", "64K")

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main,
                         args=(r, port, args.device, sizes, args.iters, args.profile, args.probe))
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
