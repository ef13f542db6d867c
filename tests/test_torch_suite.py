"""A selection of PyTorch's own distributed test suite on the backend under test.

``tests/torch_suite.py`` runs tests of ``torch.testing._internal.distributed.distributed_test``
(as torch's ``test_distributed_spawn.py`` does) and reports counts; here it runs in a
subprocess with a hard deadline (the whole process group is killed past it), and the
counts are checked: nothing failed, and enough tests really ran (rather than skipped).

Three tiers (see the runner's docstring): ``native`` with the skip decorators evaluated
for the backend's own name, ``gloo_gated`` with them evaluated as for gloo, and ``detail``:
three tests under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch's ``ProcessGroupWrapper`` around
every group), ``test_all_gather_object_subgroup`` among them.

Needs ``expecttest`` (imported by torch's test utilities). Each tier is a runner of its own
that imports torch's test suite and forks the ranks of each of its tests, mostly waiting on
them: the three run side by side (``@pooled``, tests/world_pool.py), each checked by its own
test. Hence ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from dist_harness import BACKEND
from session_run import run_in_session
from world_pool import pooled

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RUNNER = HERE / "torch_suite.py"

PER_TEST_TIMEOUT = 90  # seconds, enforced by MultiProcessTestCase inside the runner
DEADLINE_SCALE = float(os.environ.get("UCXB_SUITE_DEADLINE_SCALE", "1"))

# tier -> (extra runner arguments, deadline in seconds, minimum number of tests that ran)
TIERS = {
    "native": ([], 1500, 40),
    "gloo_gated": (["--gate-as", "gloo"], 600, 10),
    "detail": (["--gate-as", "gloo"], 300, 3),
}


def _run_suite(tmp_path: Path, tier: str) -> dict:
    extra, deadline, _ = TIERS[tier]
    deadline *= DEADLINE_SCALE
    summary_path = tmp_path / "summary.json"
    progress_path = tmp_path / "progress.json"
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [*filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), str(REPO)]
    )
    cmd = [
        sys.executable,
        str(RUNNER),
        "--backend",
        BACKEND,
        "--world-size",
        "2",
        "--tier",
        tier,
        "--per-test-timeout",
        str(PER_TEST_TIMEOUT),
        "--json-out",
        str(summary_path),
        "--progress-out",
        str(progress_path),
        "-v",
        *extra,
    ]
    # The runner and all the ranks it spawns: one session, killed together at the deadline.
    run = run_in_session(cmd, timeout=deadline, env=env, cwd=REPO, stderr_to_stdout=True)
    out = run.out
    if run.timed_out:
        done = json.loads(progress_path.read_text()) if progress_path.exists() else {}
        statuses = {name: o["status"] for name, o in done.items()}
        pytest.fail(
            f"torch suite ({tier}, backend={BACKEND}) killed after {deadline:.0f}s; "
            f"{len(done)} tests had finished: {statuses}\n--- output tail ---\n{out[-6000:]}"
        )
    if not summary_path.exists():
        pytest.fail(f"the runner exited {run.returncode} without a summary:\n{out[-6000:]}")
    summary = json.loads(summary_path.read_text())
    summary["_output"] = out
    summary["_returncode"] = run.returncode
    return summary


def _check(summary: dict, tier: str) -> None:
    _, _, min_ran = TIERS[tier]
    failures = summary["failures"]
    details = "\n\n".join(f"=== {name} ===\n{text}" for name, text in failures.items())
    counts = {k: summary[k] for k in ("selected", "ran", "passed", "failed", "errors", "skipped")}
    print(f"torch suite {tier} on {BACKEND}: {counts} in {summary['seconds']}s")
    for name, why in summary["skip_reasons"].items():
        print(f"  skipped {name}: {why}")
    assert summary["failed"] == 0 and summary["errors"] == 0, (
        f"{summary['failed']} failed, {summary['errors']} errors: "
        f"{sorted(failures)}\n{details[-12000:]}"
    )
    assert summary["missing"] == 0, f"not in this torch: {summary['names']['missing']}"
    assert summary["ran"] >= min_ran, (
        f"only {summary['ran']} of {summary['selected']} tests ran (need {min_ran}); "
        f"skips: {summary['skip_reasons']}"
    )
    assert summary["_returncode"] == 0, summary["_output"][-4000:]


def _require_expecttest() -> None:
    if importlib.util.find_spec("expecttest") is None:
        pytest.fail("torch's distributed test suite needs expecttest: pip install expecttest")


def _tier(tier: str) -> dict:
    """One tier's summary (its runner in a folder of its own): a pooled test's world."""
    _require_expecttest()
    with tempfile.TemporaryDirectory(prefix="ucxb_torch_suite_") as tmp:
        return _run_suite(Path(tmp), tier)


Summary = Callable[[], dict]


@pytest.mark.slow
@pooled(lambda: _tier("native"))
def test_torch_suite_native(pooled_result: Summary) -> None:
    """Collectives, p2p and DDP tests, decorators evaluated for the backend's own name."""
    _check(pooled_result(), "native")


@pytest.mark.slow
@pooled(lambda: _tier("gloo_gated"))
def test_torch_suite_gloo_gated(pooled_result: Summary) -> None:
    """Backend-agnostic tests whose decorators only admit gloo: run with gloo's gating."""
    _check(pooled_result(), "gloo_gated")


@pytest.mark.slow
@pooled(lambda: _tier("detail"))
def test_torch_suite_detail(pooled_result: Summary) -> None:
    """A few tests with every group wrapped by TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    summary = pooled_result()
    _check(summary, "detail")
    assert summary["debug_level"] == "DETAIL", summary["debug_level"]
