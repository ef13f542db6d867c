"""Per-op time of a 2-rank all_reduce whose peer sleeps now and then, so that wake-ups are
needed: shm against ucx (and one build against another), optionally next to busy processes.

    OMP_NUM_THREADS=1 python scripts/wake_probe.py --pairs 3 --hogs 4 \
        --runs shm@new,shm@old,ucx@new --build new=$PWD --build old=/path/to/other/checkout

Each run starts two fresh ranks (UCXBACKEND_ONE_HOST_TRANSPORT=<transport>, PYTHONPATH=the
build's path, else this checkout) and `--hogs` processes that spin (each ends by itself after
90 s, and is killed at the run's end). Every rank runs `--ops` blocking all_reduces over six
sizes, 8 B to 1 MiB; before a third of them rank 0 sleeps 1-5 ms, before another third rank 1
does (one seeded stream on both ranks). Per op each rank records its CLOCK_MONOTONIC start and
end (one clock for both processes), its thread's CPU time and run-queue wait
(/proc/thread-self/schedstat) and `wait_stats()["sleep_timeouts"]`.

Printed per run: the load average at its start and end, the host's steal time, op times
(p50/p99/max, from the rank's own start) and net times (from the later rank's start, which
removes the peer's sleep: what the wake-ups and the scheduler cost), the ops whose net time
passed 20 ms, each with where its time went (`runq`: this rank's thread or the peer's waited
for a CPU at least half of it; `sleep`: this thread slept through half of it with the peer
running; else `other`), and the progress threads' runs and CPU time over the run. A missed
wake-up shows as `sleep` with a sleep timeout (100 ms) while the peer had ended long before.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZES = (8, 256, 4096, 32768, 262144, 1048576)  # bytes of float32
HOG = "import time\nend = time.monotonic() + 90\nwhile time.monotonic() < end:\n    pass\n"
SLOW_MS = 20.0


def schedstat(path: str = "/proc/thread-self/schedstat") -> tuple[int, int, int]:
    """(ns on a CPU, ns runnable and waiting for one, times run) of a thread."""
    with open(path) as f:
        cpu, wait, runs = f.read().split()[:3]
    return int(cpu), int(wait), int(runs)


def progress_threads() -> tuple[int, int]:
    """(CPU ns, times run) of this process's ucxb-progress threads."""
    cpu = runs = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != "ucxb-progress":
                    continue
            c, _, r = schedstat(f"/proc/self/task/{tid}/schedstat")
        except OSError:
            continue  # a thread that ended meanwhile
        cpu += c
        runs += r
    return cpu, runs


def rank_main(rank: int, port: int, ops: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    import ucxbackend

    torch.set_num_threads(1)
    dist.init_process_group(
        "ucx", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    tensors = [torch.ones(s // 4) for s in SIZES]
    for t in tensors:
        for _ in range(5):
            dist.all_reduce(t)
    dist.barrier()
    rng = random.Random(1234)
    recs = []
    wait0, threads0 = ucxbackend.wait_stats(), progress_threads()
    for i in range(ops):
        sleeper, sleep_ms = rng.randrange(3), rng.uniform(1.0, 5.0)
        if sleeper == rank:
            time.sleep(sleep_ms / 1000)
        timeouts0 = ucxbackend.wait_stats()["sleep_timeouts"]
        cpu0, runq0, _ = schedstat()
        t0 = time.monotonic_ns()
        dist.all_reduce(tensors[i % len(SIZES)])
        t1 = time.monotonic_ns()
        cpu1, runq1, _ = schedstat()
        timeouts = ucxbackend.wait_stats()["sleep_timeouts"] - timeouts0
        recs.append((i, SIZES[i % len(SIZES)], t0, t1, runq1 - runq0, cpu1 - cpu0, timeouts))
    wait1, threads1 = ucxbackend.wait_stats(), progress_threads()
    info = {
        "recs": recs,
        "wait": {k: wait1[k] - wait0[k] for k in wait1},
        "inline": ucxbackend.inline_stats()["inline"],
        "threads": (threads1[0] - threads0[0], threads1[1] - threads0[1]),
        "transports": ucxbackend.startup_profile()["transports"],
    }
    dist.destroy_process_group()
    Path(out).write_text(json.dumps(info))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def steal_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[7], sum(v)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def one_run(spec: str, builds: dict[str, str], hogs: int, ops: int, tmp: str) -> dict[str, Any]:
    transport, _, build = spec.partition("@")
    env = dict(os.environ, UCXBACKEND_ONE_HOST_TRANSPORT=transport, OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    # The named build, else this checkout (the ranks run this file from scripts/).
    env["PYTHONPATH"] = builds[build] if build else str(Path(__file__).resolve().parents[1])
    busy = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    try:
        time.sleep(0.3)
        load0, steal0 = os.getloadavg()[0], steal_jiffies()
        port = free_port()
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(2)]
        ranks = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(r), "--port", str(port), "--ops",
                 str(ops), "--out", outs[r]],
                env=env,
            )
            for r in range(2)
        ]
        for p in ranks:
            try:
                p.wait(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        load1, steal1 = os.getloadavg()[0], steal_jiffies()
    finally:
        for b in busy:
            b.kill()
            b.wait()
    data = [json.loads(Path(o).read_text()) for o in outs]
    steal = 100.0 * (steal1[0] - steal0[0]) / max(1, steal1[1] - steal0[1])
    return {"spec": spec, "load": (load0, load1), "steal": steal, "data": data}


def summarize(run: dict[str, Any]) -> tuple[list[float], list[float]]:
    d0, d1 = run["data"]
    op_ms: list[float] = []
    net_ms: list[float] = []
    slow: list[tuple[float, str]] = []
    kinds = {"runq": 0, "sleep": 0, "other": 0}
    for r, (mine, peer) in enumerate(((d0, d1), (d1, d0))):
        for a, b in zip(mine["recs"], peer["recs"], strict=True):
            i, size, t0, t1, runq, cpu, timeouts = a
            later = max(t0, b[2])
            op, net = (t1 - t0) / 1e6, (t1 - later) / 1e6
            op_ms.append(op)
            net_ms.append(net)
            if net <= SLOW_MS:
                continue
            asleep = op - (runq + cpu) / 1e6
            kind = ("runq" if max(runq, b[4]) / 1e6 >= 0.5 * net
                    else "sleep" if asleep >= 0.5 * net else "other")
            kinds[kind] += 1
            slow.append((net, f"rank {r} op {i} {size} B: op {op:.1f} net {net:.1f} ms; runq "
                              f"{runq / 1e6:.1f} cpu {cpu / 1e6:.1f} asleep {asleep:.1f} "
                              f"timeouts {timeouts}; peer runq {b[4] / 1e6:.1f}, ended "
                              f"{(b[3] - later) / 1e6:.1f} after the later start: {kind}"))
    threads = [(d["threads"][1] / len(d["recs"]), d["threads"][0] / 1e6) for d in run["data"]]
    print(f"{run['spec']:10s} load {run['load'][0]:.2f}->{run['load'][1]:.2f} steal "
          f"{run['steal']:.1f}% | op ms p50 {pct(op_ms, .5):.2f} p99 {pct(op_ms, .99):.1f} "
          f"max {max(op_ms):.1f} | net p50 {pct(net_ms, .5):.2f} p99 {pct(net_ms, .99):.1f} "
          f"max {max(net_ms):.1f} | >{SLOW_MS:.0f} ms: {len(slow)} {kinds} | sleep timeouts "
          f"{[d['wait']['sleep_timeouts'] for d in run['data']]} | inline "
          f"{[d['inline'] for d in run['data']]} {d0['transports']} | progress threads: runs/op, "
          f"CPU ms {[(round(n, 2), round(c, 1)) for n, c in threads]}", flush=True)
    for _, line in sorted(slow, reverse=True)[:4]:
        print("   ", line, flush=True)
    return op_ms, net_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="rounds of --runs")
    ap.add_argument("--runs", default="shm,ucx", help="transport[@build], comma-separated")
    ap.add_argument("--build", action="append", default=[], help="name=path for PYTHONPATH")
    ap.add_argument("--hogs", type=int, default=4, help="busy processes beside the ranks")
    ap.add_argument("--ops", type=int, default=900)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank is not None:
        rank_main(a.rank, a.port, a.ops, a.out)
        return
    builds = dict(b.split("=", 1) for b in a.build)
    totals: dict[str, tuple[list[float], list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="wake_probe_") as tmp:
        for _ in range(a.pairs):
            for spec in a.runs.split(","):
                op_ms, net_ms = summarize(one_run(spec, builds, a.hogs, a.ops, tmp))
                ops, nets = totals.setdefault(spec, ([], []))
                ops.extend(op_ms)
                nets.extend(net_ms)
    for spec, (op_ms, net_ms) in totals.items():
        print(f"all {spec}: op p50 {pct(op_ms, .5):.2f} p99 {pct(op_ms, .99):.1f} max "
              f"{max(op_ms):.1f} | net p50 {pct(net_ms, .5):.2f} p99 {pct(net_ms, .99):.1f} "
              f"p99.9 {pct(net_ms, .999):.1f} max {max(net_ms):.1f} ms ({len(op_ms)} records)")


if __name__ == "__main__":
    main()
