"""A 64 MB all_reduce across the namespace rig, run the way a user runs it: no torchrun, no bench.

Each rank runs in its own "host" (network, IPC and UTS namespace; scripts/netns_rig.py), finds
the other through ``env://`` (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE), calls a plain
``dist.init_process_group(BACKEND)`` and times a loop of float32 all_reduces. Nothing else is
set for the backend: no UCXBACKEND_* or UCX_* variable, no pg_options. This is the "outside"
measurement of issue #23; ``python -m ucxbackend bench`` on the rig is the other.

Usage (root, iproute2; iperf3 for the reference)::

    python scripts/rig_plain_allreduce.py [--backends udp,ucx,gloo] [--rounds 3] [--mbytes 64]
        [--iters 20] [--warmup 3] [--iperf SECONDS] [--bench] [--env K=V ...] [--repo DIR]
        [--against DIR] [--variant K=V ...]

Prints one line per run: backend, round, bus bandwidth in GB/s (1e9 B/s; the slower rank's mean
time over the timed loop, the statistic bench reports), the CPU both ranks' processes used per
GB moved one way and each rank's sleeps and preemptions per op (voluntary and involuntary
context switches of all its threads: its wake-ups); for udp also the transport's counters
(packets, resends, timeouts and the runs of them an ACK showed were early, smoothed RTT, the
receive buffer the kernel granted, the send window, GRO trains, ACKs sent, packets declared
lost, out-of-order arrivals, receive and send batches, sends a full socket blocked, waits for
credit) and each namespace's kernel UDP drops
(``RcvbufErrors``). ``--bench`` runs ``python -m
ucxbackend bench`` under torchrun after each round, as docs/performance.md does; ``--iperf``
then runs two iperf3 transfers at once, one per direction (two processes, not ``--bidir``), and
prints each direction's rate and CPU per GB: what the kernel's TCP carries each way with both
ways busy. ``--env`` adds variables to the ranks' environment (e.g.
``UCXBACKEND_UDP_CONFIG=socket_buffer_bytes=208K`` to emulate a rank without CAP_NET_ADMIN under
the stock net.core.rmem_max); ``--repo`` runs the ranks on another checkout's build, and
``--against DIR`` repeats each plain run on DIR's build right after (interleaved pairs of two
builds in one rig session, in the other order every second round; the line names the
checkout). ``--variant K=V`` repeats each plain
run with that variable added as well (settings compared in one rig session, e.g.
``--variant UCXBACKEND_UDP_CONFIG=send_window_bytes=4M``; the line names it).
``--env RIG_PLACEMENT=1`` adds where the ranks' threads ran (the share of samples with both
progress threads on one core: udp's two modes on the rig) and ``--variant RIG_PIN_CORES=0,0``
/ ``0,1`` puts a run in either placement (scripts/rig_placement.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

from netns_rig import Host, NetnsRig  # noqa: E402
from rig_placement import Placement, pin_from_env, shared_core  # noqa: E402

DEADLINE_S = 180.0
HOSTS: tuple[Host, Host] = ("a", "b")  # rank 0 on a, rank 1 on b


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import ucxbackend  # noqa: F401  (registers "ucx" and "udp")

    pin_from_env(int(os.environ["RANK"]))
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    t = torch.ones(args.mbytes * (1 << 20) // 4, dtype=torch.float32)
    for _ in range(args.warmup):
        dist.all_reduce(t)
    before = _udp_counters() if args.backend == "udp" else {}
    dist.barrier()
    times = []
    placement = Placement() if os.environ.get("RIG_PLACEMENT") == "1" else None
    if placement:
        placement.start()
    usage0 = _usage()
    for _ in range(args.iters):
        start = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - start)
    usage = {k: v - usage0[k] for k, v in _usage().items()}
    placed = placement.stop() if placement else None
    dist.barrier()
    # Every rank started from ones and each all_reduce of 2 ranks doubled them: a power of two,
    # exact in float32.
    correct = bool(torch.all(t == 2.0 ** (args.warmup + args.iters)))
    out: dict[str, Any] = {
        "rank": rank,
        "backend": args.backend,
        "times": times,
        "cpu_per_op": usage["cpu"] / args.iters,
        # Sleeps (voluntary) and preemptions (involuntary) of all threads: the wake-ups an op
        # costs, which the host's load moves far less than its CPU time.
        "sleeps_per_op": usage["sleeps"] / args.iters,
        "preemptions_per_op": usage["preemptions"] / args.iters,
        "correct": correct,
        "placement": placed,
    }
    if args.backend == "udp":
        time.sleep(0.05)  # the counters are published when the progress thread goes idle
        after = _udp_counters()
        # Gauges (RTTs, buffer sizes, the datagram size) as they are; counters as the change.
        gauge = ("_us", "socket_", "mtu_", "paths", "offload", "_window_")
        out["counters"] = {
            k: v if any(g in k for g in gauge) else v - before.get(k, 0) for k, v in after.items()
        }
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


def _usage() -> dict[str, float]:
    """User + system CPU time and context switches of every thread of this process so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu": r.ru_utime + r.ru_stime,
        "sleeps": float(r.ru_nvcsw),
        "preemptions": float(r.ru_nivcsw),
    }


def _udp_counters() -> dict[str, int]:
    import ucxbackend

    st = ucxbackend.stats()
    merged = {**st["transport"], **st["total"]}
    return {k: int(v) for k, v in merged.items() if isinstance(v, int)}


def _start(rig: NetnsRig, host: Host, argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
    """``argv`` started on ``host``, its stdout and stderr together in a pipe."""
    return rig.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


def _plain_env(
    rig: NetnsRig, rank: int, port: int, repo: str, extra: Mapping[str, str]
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "UCXBACKEND_"))}
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(MASTER_ADDR=rig.addr_a, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    env.update(extra)
    # Gloo resolves the hostname to find its interface; the rig's hostnames resolve to nothing
    # (it then binds loopback and hangs), so it is told. Our backends are told nothing.
    env["GLOO_SOCKET_IFNAME"] = rig.ifname(HOSTS[rank])
    return env


@dataclass
class PlainRun:
    """One run of both ranks: their RESULT records, outputs, and each host's change in the
    kernel's UDP counters (/proc/net/snmp: RcvbufErrors counts datagrams the kernel dropped
    for a full receive buffer)."""

    results: list[dict[str, Any]]
    outputs: list[str]
    kernel_udp: list[dict[str, int]]

    def gbs(self, nbytes: int) -> float:
        """Bus bandwidth in GB/s of the slower rank's whole timed loop (what a user's timed
        loop reads, and bench's mean: max over ranks of each rank's mean time)."""
        slowest = max(sum(r["times"]) / len(r["times"]) for r in self.results)
        return float(nbytes / slowest / 1e9)  # 2 ranks: busbw = algbw


def collect_outputs(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Each process's stdout once all exited (DEADLINE_S each); whatever is still running then,
    or when reading fails, is killed with its process group."""
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=DEADLINE_S)
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return outputs


def run_plain(
    rig: NetnsRig,
    backend: str,
    *,
    port: int,
    mbytes: int = 64,
    iters: int = 20,
    warmup: int = 3,
    repo: str = str(REPO),
    extra_env: Mapping[str, str] | None = None,
) -> PlainRun:
    """Run one rank per host of ``rig`` the plain way; raise RuntimeError if one fails."""
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--backend",
        backend,
        "--mbytes",
        str(mbytes),
        "--iters",
        str(iters),
        "--warmup",
        str(warmup),
    ]
    before = _udp_snmp(rig)
    procs = [
        _start(rig, host, argv, env=_plain_env(rig, rank, port, repo, extra_env or {}), cwd=repo)
        for rank, host in enumerate(HOSTS)
    ]
    outputs = collect_outputs(procs)
    bad = [(p.returncode, out) for p, out in zip(procs, outputs, strict=False) if p.returncode]
    if bad or len(outputs) < 2:
        raise RuntimeError(f"{backend} ranks failed: {bad or outputs}")
    kernel = [
        {k: v - s0[k] for k, v in s1.items()} for s0, s1 in zip(before, _udp_snmp(rig), strict=True)
    ]
    results = [
        json.loads(line[len("RESULT ") :])
        for o in outputs
        for line in o.splitlines()
        if line.startswith("RESULT ")
    ]
    return PlainRun(results, outputs, kernel)


def iperf_both_ways(rig: NetnsRig, seconds: int, port: int) -> list[tuple[float, float]]:
    """(GB/s, CPU seconds per GB of sender and receiver together) of the transfers a->b and
    b->a, run at the same time."""
    servers = [
        rig.popen(
            h,
            ["iperf3", "-s", "-1", "-B", rig.addr(h), "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for h in HOSTS
    ]
    time.sleep(0.5)
    clients = [
        _start(rig, src, ["iperf3", "-c", rig.addr(dst), "-p", str(port), "-t", str(seconds), "-J"])
        for src, dst in (HOSTS, HOSTS[::-1])
    ]
    rates = []
    for c in clients:
        out, _ = c.communicate(timeout=seconds + 30)
        end = json.loads(out)["end"]
        gbs = end["sum_received"]["bits_per_second"] / 8e9
        cpu = end["cpu_utilization_percent"]
        rates.append((gbs, (cpu["host_total"] + cpu["remote_total"]) / 100 / gbs))
    for s in servers:
        s.wait(timeout=30)
    return rates


def _udp_snmp(rig: NetnsRig) -> list[dict[str, int]]:
    """Each host's kernel UDP counters."""
    return [rig.udp_counters(host) for host in HOSTS]


def _bench(rig: NetnsRig, args: argparse.Namespace, port: int) -> str:
    """``python -m ucxbackend bench`` under torchrun on the rig, as docs/performance.md runs it;
    returns the table's data row and the udp statistics row."""
    outs = []
    procs = []
    for rank, host in enumerate(HOSTS):
        ifname = rig.ifname(host)
        env = {
            **_plain_env(rig, rank, port, args.repo, {}),
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": ifname,
            "UCXBACKEND_IFNAME": ifname,
        }
        launch = f"--nnodes 2 --node-rank {rank} --nproc-per-node 1 --master-addr {rig.addr_a}"
        bench = f"all_reduce -b {args.mbytes}M -e {args.mbytes}M -n {args.iters} -w {args.warmup}"
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *launch.split(),
            "--master-port",
            str(port),
            "-m",
            "ucxbackend",
            "bench",
            *bench.split(),
            "--backends",
            args.backends,
        ]
        procs.append(_start(rig, host, argv, env=env, cwd=args.repo))
    for p in procs:
        out, _ = p.communicate(timeout=DEADLINE_S * 2)
        outs.append(out)
    rows = [
        line
        for line in outs[0].splitlines()
        if line.strip().startswith(str(args.mbytes * (1 << 20)))
    ]
    return "\n".join(rows) if rows else outs[0][-3000:]


def _describe(run: PlainRun, backend: str, rnd: int, nbytes: int) -> str:
    # Each rank sends and receives the tensor's size per op (2 ranks): CPU seconds per GB moved
    # one way, both ranks together, comparable with iperf3's sender + receiver.
    cpu = sum(r["cpu_per_op"] for r in run.results) / (2 * nbytes / 1e9)
    sleeps = "/".join(f"{r['sleeps_per_op']:.0f}" for r in run.results)
    preempted = "/".join(f"{r['preemptions_per_op']:.0f}" for r in run.results)
    line = (
        f"{backend:5s} round {rnd}: {run.gbs(nbytes):5.2f} GB/s (CPU {cpu:.2f} s per GB; "
        f"per op and rank {sleeps} sleeps, {preempted} preemptions)"
    )
    placed = [r["placement"] for r in run.results if r.get("placement")]
    if len(placed) == 2:
        shared, paired = shared_core(placed[0]["progress_cores"], placed[1]["progress_cores"])
        line += f"\n      progress threads on one core in {shared} of {paired} paired samples"
        for r, p in zip(run.results, placed, strict=True):
            for name, t in p["threads"].items():
                line += (
                    f"\n      rank {r['rank']} {name}: CPU {t['cpu_ms']:.0f} ms, runnable "
                    f"{t['runq_ms']:.0f} ms, {t['sleeps']:.0f} sleeps, "
                    f"{t['preemptions']:.0f} preemptions, cores seen {t['cores']}"
                )
    if not all(r["correct"] for r in run.results):
        line += " WRONG RESULT"
    if backend == "udp":
        c = [r["counters"] for r in run.results]
        keys = (
            "data_packets_sent",
            "retransmitted_packets",
            "spurious_retransmissions",
            "rto_expiries",
            "spurious_rtos",
            "rtt_smoothed_us",
            "socket_receive_buffer",
            "send_window_bytes",
            "trains_received",
            "ack_packets_sent",
            "packets_declared_lost",
            "out_of_order_packets",
            "receive_batches",
            "send_batches",
            "send_blocked",
            "credit_stalls",
        )
        line += "\n      " + " ".join(f"{k}={'/'.join(str(x.get(k, 0)) for x in c)}" for k in keys)
        line += "\n      kernel " + " ".join(
            f"{k}={'/'.join(str(h[k]) for h in run.kernel_udp)}"
            for k in ("RcvbufErrors", "SndbufErrors")
        )
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="udp", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default="udp,ucx,gloo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mbytes", type=int, default=64)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iperf", type=int, default=0, metavar="SECONDS")
    parser.add_argument("--env", action="append", default=[], metavar="K=V")
    parser.add_argument(
        "--repo",
        default=str(REPO),
        help="the checkout (with its build) the ranks import ucxbackend from",
    )
    parser.add_argument(
        "--against",
        metavar="DIR",
        help="another checkout (with its build): each plain run is repeated on it right after",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="K=V",
        help="each plain run is repeated with this variable added (repeatable)",
    )
    parser.add_argument(
        "--bench",
        action="store_true",
        help="after each round, also run `ucxbackend bench` (torchrun) on the rig",
    )
    args = parser.parse_args()
    if args.worker:
        return _worker(args)

    extra = dict(kv.split("=", 1) for kv in args.env)
    # The plain runs of each round: every checkout, each with the settings as given and with
    # every variant added, back to back (pairs that share the host's state).
    variants: list[dict[str, str]] = [{}, *(dict([kv.split("=", 1)]) for kv in args.variant)]
    runs = [
        (repo, variant)
        for repo in [args.repo, *([args.against] if args.against else [])]
        for variant in variants
    ]
    port = random.randrange(20000, 40000)
    with NetnsRig.create() as rig:
        print(
            f"# rig {rig.ns_a}={rig.addr_a} {rig.ns_b}={rig.addr_b}, mtu {rig.mtu}; "
            f"{args.mbytes} MB float32, {args.iters} iterations after {args.warmup}; env {extra}"
        )
        for rnd in range(1, args.rounds + 1):
            for backend in args.backends.split(","):
                # Even rounds reverse the order: the first run of a pair is not always the same.
                for repo, variant in runs if rnd % 2 else runs[::-1]:
                    port += 1
                    run = run_plain(
                        rig,
                        backend,
                        port=port,
                        mbytes=args.mbytes,
                        iters=args.iters,
                        warmup=args.warmup,
                        repo=repo,
                        extra_env={**extra, **variant},
                    )
                    first, *rest = _describe(run, backend, rnd, args.mbytes << 20).split("\n")
                    label = f" [{repo}]" if args.against else ""
                    label += "".join(f" [{k}={v}]" for k, v in variant.items())
                    print("\n".join([first + label, *rest]), flush=True)
            if args.bench:
                port += 1
                print(f"bench round {rnd}:\n{_bench(rig, args, port)}", flush=True)
            if args.iperf:
                port += 1
                (ab, ab_cpu), (ba, ba_cpu) = iperf_both_ways(rig, args.iperf, port)
                print(
                    f"iperf3 round {rnd}: both ways at once, a->b {ab:.2f} b->a {ba:.2f} GB/s "
                    f"(CPU {ab_cpu:.2f}/{ba_cpu:.2f} s per GB)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
