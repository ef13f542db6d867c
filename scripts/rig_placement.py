"""Where a rig rank's threads ran: which core, how long each waited for one (issue #23).

The namespace rig puts both "hosts" on this machine's cores, so the two ranks' progress threads
either share a core (taking turns, each handing the other cache lines still in that core's
cache) or run on two (every datagram's buffers cross between cores). The two placements
measure differently (docs/performance.md, "udp's two modes on the rig"); this tells which one
a run had. Used by scripts/rig_plain_allreduce.py, in the rank's process:

- ``RIG_PIN_CORES=c0,c1`` pins rank r's process to core c_r before the group starts (every
  thread it starts inherits it), to put a run in one placement on purpose;
- ``RIG_PLACEMENT=1`` samples every thread's core every 5 ms during the timed loop (a Python
  thread: it costs a wake-up per sample, so it is off unless asked for) and reports each
  busy thread's CPU and runqueue time (``/proc/self/task/*/schedstat``), its context
  switches and the cores it was seen on.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_S = 0.005
COUNTERS = ("cpu_ms", "runq_ms", "sleeps", "preemptions")
PROGRESS_THREAD = "ucxb-progress"  # csrc/engine/progress_engine.cpp names its thread so


def pin_from_env(rank: int) -> None:
    """Pin this process to its core from ``RIG_PIN_CORES`` (``c0,c1``), if set."""
    spec = os.environ.get("RIG_PIN_CORES")
    if spec:
        cores = [int(c) for c in spec.split(",")]
        os.sched_setaffinity(0, {cores[rank]})


def threads() -> dict[str, dict[str, float]]:
    """Per thread (``comm:tid``): last core, CPU and runqueue ms, context switches."""
    out: dict[str, dict[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
            sched = (task / "schedstat").read_text().split()
            status = (task / "status").read_text().splitlines()
        except OSError:  # the thread ended between the listing and the read
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # comm may hold spaces
        switches = {
            line.split(":")[0]: float(line.split()[1]) for line in status if "ctxt_switches" in line
        }
        out[f"{comm}:{task.name}"] = {
            "core": float(fields[36]),  # field 39 of proc_pid_stat(5): the CPU last run on
            "cpu_ms": int(sched[0]) / 1e6,
            "runq_ms": int(sched[1]) / 1e6,
            "sleeps": switches["voluntary_ctxt_switches"],
            "preemptions": switches["nonvoluntary_ctxt_switches"],
        }
    return out


class Placement:
    """Samples this process's threads' cores from start() to stop(); report() sums them up."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rig-placement", daemon=True)
        self._before: dict[str, dict[str, float]] = {}

    def start(self) -> None:
        self._before = threads()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            now = time.monotonic()  # one clock for both ranks: namespaces share it
            self.samples.append((now, {k: int(v["core"]) for k, v in threads().items()}))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        after = threads()
        busy: dict[str, dict[str, Any]] = {}
        for name, v in after.items():
            if name not in self._before:
                continue
            d = {k: v[k] - self._before[name][k] for k in COUNTERS}
            if d["cpu_ms"] < 5:
                continue
            cores: dict[str, int] = {}
            for _, seen in self.samples:
                if name in seen:
                    cores[str(seen[name])] = cores.get(str(seen[name]), 0) + 1
            busy[name] = {**d, "cores": cores}
        progress = [
            (t, next((c for k, c in seen.items() if k.startswith(PROGRESS_THREAD)), -1))
            for t, seen in self.samples
        ]
        return {"threads": busy, "progress_cores": progress}


def shared_core(a: list[tuple[float, int]], b: list[tuple[float, int]]) -> tuple[int, int]:
    """Of the samples of two ranks' progress threads taken within a sample period of each
    other, how many found both on one core: (shared, paired)."""
    times = [t for t, _ in b]
    shared = paired = 0
    for t, core in a:
        i = bisect.bisect_left(times, t)
        near = [j for j in (i - 1, i) if 0 <= j < len(b) and abs(b[j][0] - t) <= SAMPLE_S / 2]
        if not near or core < 0:
            continue
        j = min(near, key=lambda j: abs(b[j][0] - t))
        paired += 1
        shared += int(b[j][1] == core)
    return shared, paired
