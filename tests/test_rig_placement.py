"""scripts/rig_placement.py: how the rig tells udp's two placements apart (issue #23).

The verdict "both ranks' progress threads on one core in N of M samples" must pair samples by
time and compare cores, so it is checked against hand-made samples whose answer is known;
the per-thread reading against a thread of this process pinned to a known core.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from rig_placement import SAMPLE_S, Placement, shared_core


def test_shared_core_pairs_by_time_and_compares_cores() -> None:
    a = [(0.000, 0), (0.005, 0), (0.010, 1), (0.015, 1), (0.100, 0), (0.020, -1)]
    b = [(0.001, 0), (0.006, 1), (0.011, 1), (0.014, 1)]
    # 0.100 has no partner within half a period, -1 (no progress thread seen) is skipped.
    assert shared_core(a, b) == (3, 4)
    assert shared_core(a, []) == (0, 0)
    far = [(t + 10 * SAMPLE_S, c) for t, c in b]
    assert shared_core(a[:4], far) == (0, 0)


def test_placement_sees_a_busy_thread_on_its_core() -> None:
    core = sorted(os.sched_getaffinity(0))[0]
    stop = threading.Event()
    pinned = threading.Event()
    counting = threading.Event()
    enough = threading.Event()

    def spin() -> None:
        os.sched_setaffinity(0, {core})  # this thread only (Linux: a tid is a pid here)
        pinned.set()
        counting.wait()
        since = time.thread_time()
        while not stop.is_set():
            sum(range(1000))
            if time.thread_time() - since >= 0.06:
                enough.set()

    worker = threading.Thread(target=spin, name="rig-test-spin")
    worker.start()
    pinned.wait()
    placement = Placement()  # counts the threads alive at start(): the spinner is
    placement.start()
    counting.set()
    # At least 60 ms of the spinner's own CPU inside the window, however loaded the host (a
    # fixed 0.2 s gave it 17 ms beside a full test run): CPU, not time, is what is checked.
    time.sleep(0.2)
    assert enough.wait(30), "the spinner got under 60 ms of CPU in 30 s"
    out = placement.stop()  # while the spinner lives: an ended thread has no /proc entry
    stop.set()
    worker.join()
    # Python names its threads in /proc only on 3.14+, so find ours by its core and its CPU.
    busy = [t for name, t in out["threads"].items() if t["cores"].keys() == {str(core)}]
    assert busy, out["threads"]
    assert max(t["cpu_ms"] for t in busy) >= 20
    assert len(out["progress_cores"]) == len(placement.samples) > 0
    assert all(c == -1 for _, c in out["progress_cores"])  # no ucxb-progress thread here
