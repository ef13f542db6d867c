"""Real loss against injected loss: the udp backend across the namespace rig, twice.

Two ranks, one per host of a rig (scripts/netns_rig.py), run timed all_reduces, every result
checked bit for bit (scripts/real_loss_worker.py), once with each kind of loss at the same
rate P:

  injected - the udp fault layer drops each datagram a rank receives with probability P
             (``UCXBACKEND_UDP_FAULTS=drop=P``);
  kernel   - the kernel drops it: an ``iptables -m statistic --mode random --probability P
             -j DROP`` rule on each host's INPUT chain for UDP arriving on its veth end (the
             only UDP in these namespaces is ours; the transport's ports are picked at run
             time, so the rule matches the interface rather than a port). A counting rule in
             front of it tells how many datagrams arrived, so the loss the kernel made is
             measured, not assumed.

and compares retransmissions per op and op times (see agreement()). Both runs cut the
transport's GSO trains into datagrams on the veth (segment_trains), or a train would cross
as one packet and the kernel would drop it whole. Every rule it adds lives in a namespace of
the rig and is deleted again (finally and atexit); the script then lists each host's INPUT
chain and fails if anything of its own is left, and the rig itself is removed at the end.

    python scripts/rig_real_loss.py --loss 5% --bytes 4M --iters 20 [--json OUT]

Needs root, iproute2, unshare and iptables (``statistic`` match); exits 2 with the reason
without them. Exit 0 when both kinds ran bit-exact and agree, 1 when they disagree, and
an exception when a rank failed (a wrong result included) or a rule was left.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns_rig import Host, NetnsRig, RigError, available, cleanup_dead

log = logging.getLogger("ucxbackend.rig_real_loss")

REPO: Final = Path(__file__).resolve().parent.parent
WORKER: Final = REPO / "scripts" / "real_loss_worker.py"
HOSTS: Final[tuple[Host, Host]] = ("a", "b")
KINDS: Final = ("injected", "kernel")
# Marks the rules of one run, so that the check after removal finds exactly ours.
COMMENT_PREFIX: Final = "ucxb-real-loss-"
# Agreement. The retransmissions that repaired a loss (retransmitted less spurious) are what
# the loss rate decides: per op within RETRANSMIT_TOLERANCE of the injected run's (a few
# hundred losses per op vary by several percent from run to run). The spurious ones come from
# the host (a progress thread starved of CPU takes its ACKs late and declares packets lost
# by time) and swing 2-3x between runs of either kind, so all retransmissions need only be of
# the same order (SAME_ORDER), and so does the median op time (TIME_FACTOR).
DEFAULT_TOLERANCE: Final = 0.25
SAME_ORDER: Final = 4.0
TIME_FACTOR: Final = 2.5


class RuleGuard:
    """The iptables rules this run added, each deleted again exactly once (remove_all)."""

    def __init__(self, rig: NetnsRig, comment: str) -> None:
        self.rig = rig
        self.comment = comment
        self._added: list[tuple[Host, list[str]]] = []
        atexit.register(self.remove_all)

    def _iptables(self, host: Host, *args: str) -> subprocess.CompletedProcess[str]:
        # Without unshare: iptables needs the host's network namespace only.
        argv = self.rig.wrap(host, ["iptables", "-w", *args], isolate=False)
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    def add(self, host: Host, spec: Sequence[str]) -> None:
        rule = [*spec, "-m", "comment", "--comment", self.comment]
        # Recorded before it is added: a rule whose -A timed out may still have gone in.
        self._added.append((host, rule))
        proc = self._iptables(host, "-A", "INPUT", *rule)
        if proc.returncode != 0:
            raise RigError(f"iptables -A INPUT {' '.join(rule)} in {self.rig.ns(host)} failed "
                           f"(exit {proc.returncode}): {proc.stderr.strip()}")

    def counters(self, host: Host) -> list[tuple[int, str]]:
        """(packets, rule) of this run's rules on ``host``, in chain order."""
        proc = self._iptables(host, "-L", "INPUT", "-v", "-x", "-n")
        return [(int(line.split()[0]), line) for line in proc.stdout.splitlines()
                if self.comment in line]

    def remove_all(self) -> None:
        """Delete every rule added (idempotent; never raises: it runs from finally/atexit)."""
        while self._added:
            host, rule = self._added.pop()
            try:
                self._iptables(host, "-D", "INPUT", *rule)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("removing %s in %s: %s", rule, self.rig.ns(host), exc)

    def left(self) -> list[str]:
        """This run's rules still in either host's INPUT chain (should be none)."""
        left = []
        for host in HOSTS:
            proc = self._iptables(host, "-S", "INPUT")
            left += [f"{self.rig.ns(host)}: {line}" for line in proc.stdout.splitlines()
                     if self.comment in line]
        return left


@dataclass
class KindResult:
    kind: str
    op_times_s: list[float]          # per timed op, the slower rank's
    per_op: dict[str, float]         # worker COUNTERS over the timed ops, summed over ranks,
                                     # divided by the ops
    arrived: int = 0                 # datagrams (kernel: packets) that reached the loss
    dropped: int = 0                 # of those, dropped
    buffer_drops: int = 0            # UDP RcvbufErrors in the hosts' namespaces: a socket
                                     # buffer that overflowed is loss neither kind made

    @property
    def loss_made(self) -> float:
        return self.dropped / self.arrived if self.arrived else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ops": len(self.op_times_s),
            "median_op_ms": 1000 * statistics.median(self.op_times_s),
            "retransmits_per_op": self.per_op["retransmitted_packets"],
            "declared_lost_per_op": self.per_op["declared_lost"],
            "rto_per_op": self.per_op["rto_expiries"],
            "spurious_per_op": self.per_op["spurious_retransmissions"],
            "repairs_per_op": self.per_op["retransmitted_packets"]
            - self.per_op["spurious_retransmissions"],
            "data_packets_per_op": self.per_op["data_packets_sent"],
            "arrived": self.arrived,
            "dropped": self.dropped,
            "loss_made": self.loss_made,
            "buffer_drops": self.buffer_drops,
        }


def _rcvbuf_errors(rig: NetnsRig) -> int:
    """UDP RcvbufErrors summed over both hosts."""
    return sum(rig.udp_counters(host)["RcvbufErrors"] for host in HOSTS)


def _free_port() -> int:
    # The namespaces are fresh: a port free here is free on host a too.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(rig: NetnsRig, env: dict[str, str], nbytes: int, iters: int,
               timeout: float) -> list[dict[str, Any]]:
    """Rank 0 on host a and rank 1 on host b; their REAL_LOSS_RESULT records, by rank."""
    port = str(_free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "UCXBACKEND_"))}
    base.update(env)
    base["PYTHONPATH"] = str(REPO) + (os.pathsep + base["PYTHONPATH"]
                                      if base.get("PYTHONPATH") else "")
    base.update({"OMP_NUM_THREADS": "1", "MASTER_ADDR": rig.addr_a, "MASTER_PORT": port,
                 "WORLD_SIZE": "2"})
    argv = [sys.executable, str(WORKER), "--bytes", str(nbytes), "--iters", str(iters),
            "--timeout", str(int(timeout))]
    procs = {}
    try:
        for rank, host in enumerate(HOSTS):
            procs[host] = rig.popen(host, argv, env={**base, "RANK": str(rank)},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
        outputs = {}
        deadline = time.monotonic() + timeout
        for host, proc in procs.items():
            try:
                outputs[host], _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"rank on host {host} ran past {timeout:.0f} s") from None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)  # its own session (NetnsRig.popen): the worker too
                proc.wait(timeout=10)
    results, failed = [], []
    for host, proc in procs.items():
        found = re.findall(r"^REAL_LOSS_RESULT (.*)$", outputs[host], re.MULTILINE)
        if proc.returncode != 0 or not found:
            # Every failed rank's words: the first to fail says why, the other only that
            # its peer went away.
            failed.append(f"--- rank on host {host} failed (exit {proc.returncode}):\n"
                          f"{outputs[host][-3000:]}")
        else:
            results.append(json.loads(found[-1]))
    if failed:
        raise RuntimeError("\n".join(failed))
    return sorted(results, key=lambda r: r["rank"])


def _combine(kind: str, ranks: list[dict[str, Any]]) -> KindResult:
    times = list(zip(*(r["times_s"] for r in ranks), strict=True))
    names = ranks[0]["counters"].keys()
    return KindResult(
        kind=kind,
        op_times_s=[max(per_rank) for per_rank in times],
        per_op={c: sum(int(r["counters"][c]) for r in ranks) / len(times) for c in names},
        # The fault layer's own count (injected; zero without faults), the warm-up included.
        arrived=sum(int(r["faults"].get("faults_seen", 0)) for r in ranks),
        dropped=sum(int(r["faults"].get("faults_dropped", 0)) for r in ranks),
    )


def run_kind(rig: NetnsRig, kind: str, loss: float, *, nbytes: int, iters: int, seed: int,
             udp_config: str, timeout: float, comment: str) -> KindResult:
    """One run with ``kind`` of loss; for ``kernel`` the rules are removed before returning."""
    env = {"UCXBACKEND_UDP_CONFIG": udp_config} if udp_config else {}
    overflows = _rcvbuf_errors(rig)
    if kind == "injected":
        env["UCXBACKEND_UDP_FAULTS"] = f"drop={loss},seed={seed}"
        result = _combine(kind, _run_ranks(rig, env, nbytes, iters, timeout))
        result.buffer_drops = _rcvbuf_errors(rig) - overflows
        return result
    guard = RuleGuard(rig, comment)
    try:
        for host in HOSTS:
            match = ["-i", rig.ifname(host), "-p", "udp"]
            guard.add(host, match)  # counts what arrives (no target: falls through)
            guard.add(host, [*match, "-m", "statistic", "--mode", "random", "--probability",
                             f"{loss:.6f}", "-j", "DROP"])
        result = _combine(kind, _run_ranks(rig, env, nbytes, iters, timeout))
        result.buffer_drops = _rcvbuf_errors(rig) - overflows
        for host in HOSTS:
            (arrived, _), (dropped, _) = guard.counters(host)
            result.arrived += arrived
            result.dropped += dropped
    finally:
        guard.remove_all()
    left = guard.left()
    if left:
        raise RigError("iptables rules left after removal: " + "; ".join(left))
    return result


def _within(a: float, b: float, factor: float) -> bool:
    return a > 0 and b > 0 and 1 / factor <= a / b <= factor


def agreement(injected: KindResult, kernel: KindResult, tolerance: float,
              time_factor: float = TIME_FACTOR) -> list[str]:
    """What disagrees beyond the tolerances (empty: the two kinds agree)."""
    problems = []
    needed = {r.kind: r.per_op["retransmitted_packets"] - r.per_op["spurious_retransmissions"]
              for r in (injected, kernel)}
    ni, nk = needed["injected"], needed["kernel"]
    if ni <= 0 or abs(nk - ni) > tolerance * ni:
        problems.append(f"retransmissions that repaired a loss, per op: kernel {nk:.1f} vs "
                        f"injected {ni:.1f} (tolerance {tolerance:.0%})")
    ri = injected.per_op["retransmitted_packets"]
    rk = kernel.per_op["retransmitted_packets"]
    if not _within(rk, ri, SAME_ORDER):
        problems.append(f"retransmissions per op: kernel {rk:.1f} vs injected {ri:.1f} "
                        f"(factor {SAME_ORDER:g})")
    ti = statistics.median(injected.op_times_s)
    tk = statistics.median(kernel.op_times_s)
    if not _within(tk, ti, time_factor):
        problems.append(f"median op time: kernel {1000 * tk:.2f} ms vs injected "
                        f"{1000 * ti:.2f} ms (factor {time_factor:g})")
    return problems


def segment_trains(rig: NetnsRig) -> None:
    """Make each veth end cut UDP GSO trains into datagrams before they leave (gso_max_segs
    1: the kernel segments in software what the device may not take whole), so that the
    receiving INPUT chain sees, and drops, single datagrams; otherwise a train of up to 64
    datagrams crosses the veth pair as one packet and the kernel drops it whole."""
    for host in HOSTS:
        subprocess.run(["ip", "-n", rig.ns(host), "link", "set", "dev", rig.ifname(host),
                        "gso_max_segs", "1"], check=True, capture_output=True, timeout=30)


def compare(rig: NetnsRig, loss: float, *, nbytes: int, iters: int, seed: int = 7,
            udp_config: str = "", timeout: float = 120.0, tolerance: float = DEFAULT_TOLERANCE,
            whole_trains: bool = False, time_factor: float = TIME_FACTOR) -> dict[str, Any]:
    """Both kinds of loss on ``rig`` (injected first); the report ``main`` prints. Unless
    ``whole_trains``, GSO trains are segmented on the veth for both (segment_trains).
    ``time_factor`` bounds the ratio of the two median op times."""
    comment = f"{COMMENT_PREFIX}{os.getpid()}"
    if not whole_trains:
        segment_trains(rig)
    results = {kind: run_kind(rig, kind, loss, nbytes=nbytes, iters=iters, seed=seed,
                              udp_config=udp_config, timeout=timeout, comment=comment)
               for kind in KINDS}
    injected, kernel = results["injected"], results["kernel"]
    return {
        "loss": loss,
        "bytes": nbytes,
        "iters": iters,
        "udp_config": udp_config,
        "whole_trains": whole_trains,
        "comment": comment,
        "results": [asdict(r) | r.summary() for r in results.values()],
        "problems": agreement(injected, kernel, tolerance, time_factor),
        "tolerance": tolerance,
    }


def _percent(text: str) -> float:
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: a loss rate in (0, 1), e.g. 5% or 0.05")
    return value


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units \
        else int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loss", type=_percent, default=0.05, help="loss rate (5%% or 0.05)")
    parser.add_argument("--bytes", type=_size, default=4 << 20, help="all_reduce size (4M)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7, help="the injected loss's seed")
    parser.add_argument("--udp-config", default="", help="UCXBACKEND_UDP_CONFIG for both runs")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument("--timeout", type=float, default=180.0, help="per run, seconds")
    parser.add_argument("--whole-trains", action="store_true",
                        help="leave GSO trains whole on the veth: the kernel then drops a "
                        "train of datagrams at a time (bursty), the fault layer one datagram")
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok, why = available()
    if not ok or shutil.which("iptables") is None:
        print(f"rig_real_loss: cannot run here: {why if not ok else 'iptables not installed'}",
              file=sys.stderr)
        return 2
    removed = cleanup_dead()
    if removed:
        log.info("removed rigs left by dead processes: %s", removed)
    with NetnsRig.create() as rig:
        report = compare(rig, args.loss, nbytes=args.bytes, iters=args.iters, seed=args.seed,
                         udp_config=args.udp_config, timeout=args.timeout,
                         tolerance=args.tolerance, whole_trains=args.whole_trains)
    for r in report["results"]:
        print(f"{r['kind']:>8}: {r['ops']} ops of {args.bytes} B, median {r['median_op_ms']:.2f} "
              f"ms, {r['retransmits_per_op']:.1f} retransmits/op, {r['declared_lost_per_op']:.1f} "
              f"declared lost/op ({r['spurious_per_op']:.1f} spurious: "
              f"{r['repairs_per_op']:.1f} repairs/op), "
              f"{r['rto_per_op']:.1f} RTO/op, {r['data_packets_per_op']:.0f} DATA/op; dropped "
              f"{r['dropped']} of {r['arrived']} arrivals ({r['loss_made']:.2%}); socket "
              f"buffer overflows {r['buffer_drops']}")
    for p in report["problems"]:
        print(f"DISAGREE: {p}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
