"""A plain-socket 2-rank all_reduce across the namespace rig, next to ucx and two opposite
iperf3 transfers in the same rig session: how close an all_reduce over the kernel's TCP can
come to iperf3 on this rig at all (issue #23; docs/performance.md).

Usage (root, iproute2, g++; iperf3 for the reference)::

    python scripts/rig_socket_allreduce.py [--rounds 2] [--mbytes 64] [--iters 20]
        [--modes fold,copyout,move,epoll] [--backends ucx] [--iperf 5]

Per round it prints iperf3's two directions, then scripts/socket_allreduce.cpp in each mode
(fold: reduce-scatter pieces summed from a warm buffer, all-gather read into place; copyout:
the all-gather copied out of a warm buffer as UCX's TCP transport does; move: no arithmetic;
epoll: fold on a non-blocking socket that waits in epoll_wait, as UCX's TCP transport waits),
then each backend the plain way (scripts/rig_plain_allreduce.py). Every line gives the bus
bandwidth in GB/s (slower rank) and the CPU seconds of both ranks per GB moved one way, the
figure comparable with iperf3's sender + receiver per GB.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns_rig import Host, NetnsRig
from rig_plain_allreduce import _describe, collect_outputs, iperf_both_ways, run_plain

SOURCE = Path(__file__).resolve().parent / "socket_allreduce.cpp"
HOSTS: tuple[Host, Host] = ("a", "b")  # rank 0 on a (it listens), rank 1 on b


def build(out_dir: Path) -> Path:
    """Compile scripts/socket_allreduce.cpp into ``out_dir``; return the executable."""
    exe = out_dir / "socket_allreduce"
    cmd = ["g++", "-O3", "-march=native", "-std=c++20", "-Wall", "-Wextra", "-Werror", "-pthread"]
    cmd += [str(SOURCE), "-o", str(exe)]
    subprocess.run(cmd, check=True)
    return exe


def run_socket(
    rig: NetnsRig, exe: Path, mode: str, *, port: int, mbytes: int, iters: int, warmup: int
) -> tuple[float, float]:
    """(bus GB/s of the slower rank, CPU seconds of both ranks per GB moved one way)."""
    procs = [
        rig.popen(
            host,
            [str(exe), str(rank), rig.addr("a"), rig.addr("a"), str(port), str(mbytes),
             str(iters), str(warmup), mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank, host in enumerate(HOSTS)
    ]
    outs = collect_outputs(procs)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"socket all_reduce ({mode}) failed: {[p.returncode for p in procs]}")
    results = [json.loads(o) for o in outs]
    nbytes = mbytes << 20
    gbs = nbytes * iters / max(r["seconds"] for r in results) / 1e9
    cpu = sum(r["cpu"] for r in results) / (2 * nbytes * iters / 1e9)
    return gbs, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mbytes", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--modes", default="fold,copyout,move,epoll")
    parser.add_argument("--backends", default="ucx", help="'' for none")
    parser.add_argument("--iperf", type=int, default=5, metavar="SECONDS")
    args = parser.parse_args()
    port = random.randrange(20000, 40000)
    with tempfile.TemporaryDirectory(prefix="rig-socket-allreduce-") as tmp:
        exe = build(Path(tmp))
        with NetnsRig.create() as rig:
            print(f"# rig {rig.ns_a}={rig.addr_a} {rig.ns_b}={rig.addr_b}, mtu {rig.mtu}; "
                  f"{args.mbytes} MB float32, {args.iters} iterations after {args.warmup}")
            for rnd in range(1, args.rounds + 1):
                if args.iperf:
                    port += 1
                    (ab, ab_cpu), (ba, ba_cpu) = iperf_both_ways(rig, args.iperf, port)
                    print(f"iperf3 round {rnd}: a->b {ab:.2f} b->a {ba:.2f} GB/s "
                          f"(CPU {ab_cpu:.2f}/{ba_cpu:.2f} s per GB)", flush=True)
                for mode in filter(None, args.modes.split(",")):
                    port += 1
                    gbs, cpu = run_socket(rig, exe, mode, port=port, mbytes=args.mbytes,
                                          iters=args.iters, warmup=args.warmup)
                    print(f"socket {mode:7s} round {rnd}: {gbs:5.2f} GB/s "
                          f"(CPU {cpu:.2f} s per GB)", flush=True)
                for backend in filter(None, args.backends.split(",")):
                    port += 1
                    run = run_plain(rig, backend, port=port, mbytes=args.mbytes,
                                    iters=args.iters, warmup=args.warmup)
                    print(_describe(run, backend, rnd, args.mbytes << 20), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
