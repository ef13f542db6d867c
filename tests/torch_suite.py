"""Run a selection of PyTorch's own distributed test suite against a c10d backend.

The tests are those of ``torch.testing._internal.distributed.distributed_test``
(class ``DistributedTest._DistTestBase``), driven the way torch's
``test/distributed/test_distributed_spawn.py`` drives them: one
``MultiProcessTestCase`` per test, which spawns ``WORLD_SIZE`` processes that
``init_process_group(BACKEND, file://...)`` and run the test body.

Usage::

    python tests/torch_suite.py --backend ucx            # the whole selection
    python tests/torch_suite.py --backend gloo --tier native -v
    python tests/torch_suite.py --backend ucx --tier gloo_gated --gate-as gloo
    python tests/torch_suite.py --backend ucx --list     # selection + decoration-time skips

Environment the torch suite reads (set here from the command line): ``BACKEND``,
``WORLD_SIZE``, ``TEMP_DIR`` (re-created per test by ``TestDistBackend.setUp``, which
also sets ``INIT_METHOD``), ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT`` (per-test limit).

How the backend gets into the spawned ranks: the ranks are started with the
``spawn`` method, which re-imports this file (as ``__mp_main__``) to find the test
class; the module-level code below runs again there and imports ``ucxbackend``,
which registers ``ucx``, before ``init_process_group`` is called.

Skips. Many tests are decorated, when the module is imported, to skip for backends
other than gloo/nccl/mpi. A backend that is not built in is registered here in the
``DistTestCases.backend_feature`` sets that describe CPU capabilities a plugin may
have ("plugin", "ddp", "subgroup"). The selection has two tiers:

* ``native``: tests that run on gloo and on a plugin backend under its own name;
* ``gloo_gated``: backend-agnostic tests whose decorators only admit gloo (or a
  GPU-capable backend although the test runs on CPU for gloo), and whose bodies do
  not branch on the backend's name (checked by running them under a gloo alias
  registered as "ucx"). With
  ``--gate-as gloo`` the decorators are evaluated as if BACKEND were ``gloo``
  while the process group is still created with the real backend; without it
  they are reported as skipped.
* ``detail``: a few tests run with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (set by the
  runner before torch is imported, so every group is wrapped in torch's
  ``ProcessGroupWrapper``), among them ``test_all_gather_object_subgroup``; run it
  with ``--gate-as gloo``. Not part of ``--tier all``, which runs without it.

The last line of output is ``TORCH_SUITE_SUMMARY {json}`` (also written to
``--json-out``) with the counts: selected, ran, passed, failed, errors, skipped, missing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing.connection
import os
import sys
import tempfile
import time
import unittest

# --------------------------------------------------------------------------------------
# The selection. Every test here passes on gloo with world size 2 (CPU only).
# --------------------------------------------------------------------------------------

NATIVE_TESTS = (
    # process groups
    "test_get_rank",
    "test_get_backend",
    "test_Backend_enum_class",
    # all_reduce
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_product",
    "test_all_reduce_min",
    "test_all_reduce_max",
    "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_sum",
    "test_all_reduce_full_group_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    # broadcast
    "test_broadcast",
    "test_broadcast_full_group",
    # reduce
    "test_reduce_sum",
    "test_reduce_product",
    "test_reduce_min",
    "test_reduce_max",
    "test_reduce_full_group_sum",
    "test_reduce_sum_twice",
    # all_gather / all_gather_coalesced
    "test_all_gather",
    "test_all_gather_complex",
    "test_all_gather_full_group",
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_with_empty",
    # gather / scatter
    "test_gather",
    "test_gather_checks",
    "test_gather_full_group",
    "test_scatter",
    "test_scatter_checks",
    "test_scatter_full_group",
    # barrier
    "test_barrier",
    "test_barrier_full_group",
    # point to point
    "test_send_recv",
    "test_send_recv_with_tag",
    "test_send_recv_any_source",
    "test_isend",
    "test_irecv",
    # DistributedDataParallel on CPU
    "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad",
    "test_ddp_create_graph",
    # (not test_ddp_logging_data_cpu: it expects DDP's logged backend name to equal
    # dist.get_backend(), but c10d logs every registered plugin backend as "custom")
    "test_static_graph_api_cpu",
)

GLOO_GATED_TESTS = (
    # all_reduce_coalesced (decorated @require_backend_is_available({"gloo"}))
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_sum",
    # batch_isend_irecv (decorated BACKEND != "gloo" -> skip)
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    # Work futures and DDP no_sync (decorated gloo/nccl/mpi only). Not the
    # test_accumulate_gradients_no_sync* tests: their bodies build the model only
    # `if BACKEND == "mpi" or BACKEND == "gloo"`, so they cannot run under another name.
    "test_get_future",
    "test_grads_same_across_ranks_with_no_sync",
    # object collectives (gated on the "gpu" feature set, run on CPU for gloo)
    "test_all_gather_object_default_pg",
    "test_scatter_object_list",
)

# Run with TORCH_DISTRIBUTED_DEBUG=DETAIL (the runner sets it for these tiers): torch then
# wraps every group in its ProcessGroupWrapper, which reads the backend's sequence number and
# checks each collective's fingerprint across ranks. A few cheap tests, gated as for gloo
# (test_all_gather_object_subgroup is gated on the "gpu" feature set; it sets DETAIL itself
# for the subgroup it creates, here the default group is wrapped too).
DETAIL_TESTS = (
    "test_all_gather_object_subgroup",
    "test_all_reduce_sum",
    "test_all_gather",
)

TIERS = {"native": NATIVE_TESTS, "gloo_gated": GLOO_GATED_TESTS, "detail": DETAIL_TESTS}
# Tiers run under a torch debug level (TORCH_DISTRIBUTED_DEBUG, read when torch is imported).
TIER_DEBUG_LEVEL = {"detail": "DETAIL"}
BUILTIN_BACKENDS = {"gloo", "nccl", "mpi", "ucc", "xccl"}
SUMMARY_TAG = "TORCH_SUITE_SUMMARY "


def _parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Run a selection of torch's distributed_test suite against a backend."
    )
    p.add_argument("--backend", default=os.environ.get("UCXB_TEST_BACKEND", "ucx"))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--tier", choices=["all", *TIERS], default="all")
    p.add_argument("--tests", help="comma-separated test names (overrides --tier)")
    p.add_argument(
        "--gate-as",
        default=None,
        help="backend name the skip decorators see at import (e.g. gloo); default: --backend",
    )
    p.add_argument("--per-test-timeout", type=int, default=120, help="seconds per test")
    p.add_argument("--json-out", help="also write the summary JSON to this file")
    p.add_argument(
        "--progress-out", help="rewrite the per-test outcomes to this JSON file after each test"
    )
    p.add_argument("--list", action="store_true", help="list the selection and exit")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    # Only the parent parses the command line; the spawned ranks (which import this
    # file as __mp_main__) inherit the environment set here.
    _ARGS = _parse_args()
    os.environ["BACKEND"] = _ARGS.backend
    os.environ["WORLD_SIZE"] = str(_ARGS.world_size)
    os.environ["UCXB_SUITE_GATE"] = _ARGS.gate_as or _ARGS.backend
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(_ARGS.per_test_timeout)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())
    if _ARGS.tier in TIER_DEBUG_LEVEL:
        # Before torch is imported, here and (inherited) in every spawned rank.
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = TIER_DEBUG_LEVEL[_ARGS.tier]
    if _ARGS.progress_out:
        os.environ["UCXB_SUITE_PROGRESS"] = _ARGS.progress_out
else:
    os.environ.setdefault("BACKEND", os.environ.get("UCXB_TEST_BACKEND", "ucx"))
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("TEMP_DIR", tempfile.gettempdir())

# ---- runs in the parent and again in every spawned rank ------------------------------
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

REAL_BACKEND = os.environ["BACKEND"]
GATE_BACKEND = os.environ.get("UCXB_SUITE_GATE", REAL_BACKEND)

if "ucx" in REAL_BACKEND:
    import ucxbackend  # noqa: F401  (registers the "ucx" backend in this process)

from torch.testing._internal import common_distributed  # noqa: E402

if REAL_BACKEND not in BUILTIN_BACKENDS:
    # CPU capabilities a plugin backend declares; read by decorators at import below.
    for _feature in ("plugin", "ddp", "subgroup"):
        common_distributed.DistTestCases.backend_feature[_feature].add(REAL_BACKEND)

# The decorators of distributed_test read BACKEND when the module is imported.
os.environ["BACKEND"] = GATE_BACKEND
try:
    from torch.testing._internal.distributed import distributed_test
finally:
    os.environ["BACKEND"] = REAL_BACKEND
# ...but the process groups are created with (and the test bodies see) the real backend.
distributed_test.BACKEND = REAL_BACKEND

torch.backends.cuda.matmul.allow_tf32 = False

# How often the suite's file barrier (distributed_test.Barrier, twice per test in every rank)
# looks again. torch polls it, and the parent its ranks' exits, every 0.1 s: about a third of
# a test's 0.5 s here (the native tier alone took 24 s, 16 s without both). A look costs a
# few file reads under a lock.
POLL_S = 0.02


def _barrier_sync(cls, wait_for=None, timeout=10):
    """distributed_test.Barrier.sync, polling every POLL_S instead of 0.1 s."""
    if wait_for is None:
        wait_for = dist.get_world_size()
    cls.barrier_id += 1
    barrier_dir = os.path.join(os.environ["TEMP_DIR"], "barrier")
    with distributed_test._lock():
        with open(os.path.join(barrier_dir, str(os.getpid())), "w") as f:
            f.write(str(cls.barrier_id))
    start_time = time.time()
    while True:
        arrived = 0
        with distributed_test._lock():
            for f_name in os.listdir(barrier_dir):
                with open(os.path.join(barrier_dir, f_name)) as f:
                    if int(f.read()) >= cls.barrier_id:
                        arrived += 1
        if arrived == wait_for:
            break
        if time.time() - start_time > timeout:
            raise RuntimeError("barrier timeout")
        time.sleep(POLL_S)


distributed_test.Barrier.sync = classmethod(_barrier_sync)


class TorchSuiteTest(
    distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase
):
    """What test_distributed_spawn.py's TestDistBackendWithSpawn is, for any backend."""

    def setUp(self):
        super().setUp()
        # Forked, not spawned as test_distributed_spawn.py does: a spawned rank re-imports
        # torch and its whole distributed test suite (~5 s of CPU), twice per test. This
        # process has imported them and created no process group, thread pool or UCX
        # context, so a fork starts each rank from a clean state.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def _join_processes(self, fn):
        """MultiProcessTestCase._join_processes, woken by a rank's exit instead of looking
        every 0.1 s: stop the others at the first rank that failed, terminate them all past
        the test's timeout (checked at least every 0.1 s), then check the exit codes."""
        timeout = common_distributed.get_timeout(self.id())
        error_code = common_distributed.MultiProcessTestCase.TEST_ERROR_EXIT_CODE
        start_time = time.time()
        try:
            while True:
                if any(p.exitcode == error_code for p in self.processes):
                    for child in torch.multiprocessing.active_children():
                        child.terminate()
                    break
                running = [p.sentinel for p in self.processes if p.exitcode is None]
                if not running:
                    break
                if time.time() - start_time > timeout:
                    self._get_timedout_process_traceback()
                    print(f"Timing out after {timeout} seconds and killing subprocesses.")
                    for p in self.processes:
                        p.terminate()
                    break
                multiprocessing.connection.wait(running, timeout=0.1)
            self._check_return_codes(fn, time.time() - start_time)
        finally:
            for pipe in self.pid_to_pipe.values():
                pipe.close()


# --------------------------------------------------------------------------------------
# Parent side: run the selection, count outcomes.
# --------------------------------------------------------------------------------------


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._t0 = 0.0
        self.progress_path = os.environ.get("UCXB_SUITE_PROGRESS")

    @staticmethod
    def _name(test) -> str:
        return test.id().split(".")[-1]

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _record(self, test, status, detail=""):
        self.outcomes[self._name(test)] = {
            "status": status,
            "seconds": round(time.monotonic() - self._t0, 2),
            "detail": detail[-3000:],
        }
        if self.progress_path:  # so that a run killed on a deadline still tells how far it got
            with open(self.progress_path, "w") as f:
                json.dump(self.outcomes, f)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def _selection(args) -> list[str]:
    if args.tests:
        return [t.strip() for t in args.tests.split(",") if t.strip()]
    if args.tier == "all":
        return [*NATIVE_TESTS, *GLOO_GATED_TESTS]
    return list(TIERS[args.tier])


def _static_skip(name: str) -> str | None:
    fn = getattr(TorchSuiteTest, name, None)
    if fn is None:
        return "missing"
    if getattr(fn, "__unittest_skip__", False):
        return str(getattr(fn, "__unittest_skip_why__", "skipped"))
    return None


def main(args: argparse.Namespace) -> int:
    names = _selection(args)
    header = (
        f"torch {torch.__version__}: {len(names)} tests of distributed_test, "
        f"backend={REAL_BACKEND}, gate-as={GATE_BACKEND}, world_size={os.environ['WORLD_SIZE']}"
    )
    print(header, flush=True)
    if args.list:
        for name in names:
            why = _static_skip(name)
            print(f"  {name}: {'runs' if why is None else 'SKIP (' + why + ')'}")
        return 0

    missing = [n for n in names if not hasattr(TorchSuiteTest, n)]
    suite = unittest.TestSuite(TorchSuiteTest(n) for n in names if n not in missing)
    runner = unittest.TextTestRunner(
        stream=sys.stdout, verbosity=2 if args.verbose else 1, resultclass=_Result
    )
    t0 = time.monotonic()
    result = runner.run(suite)
    outcomes = result.outcomes
    by_status: dict[str, list[str]] = {}
    for name, o in outcomes.items():
        by_status.setdefault(o["status"], []).append(name)
    summary = {
        "backend": REAL_BACKEND,
        "gate_as": GATE_BACKEND,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "torch": torch.__version__,
        # What torch read at import in this process (the ranks inherit the same environment).
        "debug_level": str(torch.distributed.get_debug_level()).split(".")[-1],
        "selected": len(names),
        "ran": len(by_status.get("passed", []))
        + len(by_status.get("failed", []))
        + len(by_status.get("error", [])),
        "passed": len(by_status.get("passed", [])),
        "failed": len(by_status.get("failed", [])),
        "errors": len(by_status.get("error", [])),
        "skipped": len(by_status.get("skipped", [])),
        "missing": len(missing),
        "seconds": round(time.monotonic() - t0, 1),
        "names": {k: sorted(v) for k, v in by_status.items()} | {"missing": missing},
        "skip_reasons": {n: o["detail"] for n, o in outcomes.items() if o["status"] == "skipped"},
        "failures": {
            n: o["detail"] for n, o in outcomes.items() if o["status"] in ("failed", "error")
        },
        "test_seconds": {n: o["seconds"] for n, o in outcomes.items()},
    }
    print(
        f"\n{summary['ran']} ran ({summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['errors']} errors), {summary['skipped']} skipped, "
        f"{summary['missing']} missing, in {summary['seconds']}s",
        flush=True,
    )
    for name, why in summary["skip_reasons"].items():
        print(f"  skipped {name}: {why}")
    line = json.dumps(summary)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line)
    print(SUMMARY_TAG + line, flush=True)
    return 0 if summary["failed"] == summary["errors"] == summary["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(_ARGS))
