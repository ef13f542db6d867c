"""Real loss against injected loss (scripts/rig_real_loss.py) across the namespace rig.

Two ranks, one per host, all_reduce 1 MiB ten times with 5% of datagrams dropped by the udp
fault layer, then by the kernel (iptables ``statistic`` on each host's INPUT chain): both runs
must be bit-exact (the worker compares every result with numpy's sum of the same inputs), the
kernel must really have dropped about 5%, retransmissions per op and op times must agree
within the script's tolerance, and afterwards neither host's INPUT chain may hold a rule of
the run (listed here, independently of the script's own check).

Skipped, with the reason, without root, iproute2, unshare, iptables or the built extension.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from bench_harness import needs_native
from rig_harness import NetnsRig, available, fresh_rig

# scripts/rig_real_loss.py: scripts/ is on sys.path once rig_harness is imported.
rig_real_loss = importlib.import_module("rig_real_loss")

_OK, _WHY = available()
pytestmark = [
    pytest.mark.slow,
    needs_native,
    pytest.mark.skipif(not _OK, reason=f"namespace rig unavailable: {_WHY}"),
    pytest.mark.skipif(shutil.which("iptables") is None, reason="iptables is not installed"),
]

LOSS = 0.05


@pytest.fixture(scope="module")
def rig() -> Iterator[NetnsRig]:
    with fresh_rig() as r:
        yield r


def _input_rules(rig: NetnsRig) -> list[str]:
    rules = []
    for host in ("a", "b"):
        proc = subprocess.run(rig.wrap(host, ["iptables", "-w", "-S", "INPUT"], isolate=False),
                              capture_output=True, text=True, timeout=30, check=True)
        rules += [line for line in proc.stdout.splitlines() if line.startswith("-A")]
    return rules


def test_kernel_loss_agrees_with_injected_loss(rig: NetnsRig) -> None:
    assert _input_rules(rig) == []
    # The counts must agree as tightly as the script asks; the median op times only to within
    # 10x: 1 MiB ops take a few ms, and on a 2-core host running other test files beside this
    # one they swing more than the script's 2.5x (11.7 against 4.6 ms in one such run).
    report = rig_real_loss.compare(rig, LOSS, nbytes=1 << 20, iters=10, timeout=150,
                                   time_factor=10.0)
    injected, kernel = report["results"]
    print(report["results"])
    assert (injected["kind"], kernel["kind"]) == ("injected", "kernel")
    for r in (injected, kernel):
        assert r["ops"] == 10
        assert r["retransmits_per_op"] > 0, r  # the loss was there, and was recovered from
        # what each kind made is about the rate asked for (thousands of arrivals)
        assert 0.5 * LOSS < r["loss_made"] < 2 * LOSS, r
    assert report["problems"] == [], report["problems"]
    assert _input_rules(rig) == [], "rules left behind"
