"""The classic programs of PyTorch's "Writing Distributed Applications" tutorial.

The programs live in ``examples/`` (each is also runnable with torchrun); here every one
runs on the backend under test (``UCXB_TEST_BACKEND``, default ``ucx``) and its results
are checked against values known in advance where possible and against the SAME
program run on Gloo:

* blocking ``send``/``recv`` and non-blocking ``isend``/``irecv``;
* the tutorial's ring all-reduce and a chunked ring all-reduce, written with
  ``isend``/``recv``, against ``dist.all_reduce``;
* synchronous data-parallel SGD (gradient averaging with all-reduce), also against a
  single-process reference;
* the examples under ``torchrun --standalone`` (env:// rendezvous), and the p2p programs
  with the harness initialising over tcp:// and env://.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from dist_harness import BACKEND, run_world
from session_run import run_in_session
from torch.testing import assert_close

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
if str(EXAMPLES) not in sys.path:
    # The spawned ranks inherit sys.path, so they can unpickle the example functions.
    sys.path.insert(0, str(EXAMPLES))

import tutorial_p2p  # noqa: E402
import tutorial_ring_allreduce  # noqa: E402
import tutorial_sgd  # noqa: E402

WORLD_TIMEOUT = 90.0
TORCHRUN_TIMEOUT = 150.0
# Training results on different backends: the summation order may differ (world size > 2).
TRAIN_TOL = {"rtol": 1e-5, "atol": 1e-6}


# --------------------------------------------------------------------------------------
# Point to point
# --------------------------------------------------------------------------------------


def _p2p(rank, world_size):
    return {
        "blocking": tutorial_p2p.blocking_p2p(rank, world_size),
        "nonblocking": tutorial_p2p.nonblocking_p2p(rank, world_size),
    }


def _expected_p2p(world_size):
    return [
        {
            "blocking": tutorial_p2p.expected_blocking_p2p(rank, world_size),
            "nonblocking": tutorial_p2p.expected_nonblocking_p2p(rank, world_size),
        }
        for rank in range(world_size)
    ]


def _check_p2p(got, world_size):
    expected = _expected_p2p(world_size)
    for rank in range(world_size):
        assert got[rank]["blocking"] == expected[rank]["blocking"], f"send/recv, rank {rank}"
        assert got[rank]["nonblocking"] == expected[rank]["nonblocking"], (
            f"isend/irecv, rank {rank}"
        )


@pytest.mark.parametrize("world_size", [2, 3])
def test_point_to_point(world_size):
    """Blocking send/recv, then all-pairs isend/irecv (several sizes in flight at once)."""
    got = run_world(_p2p, world_size, timeout=WORLD_TIMEOUT)
    _check_p2p(got, world_size)
    gloo = run_world(_p2p, world_size, backend="gloo", timeout=WORLD_TIMEOUT)
    assert got == gloo


@pytest.mark.parametrize("init", ["tcp", "env"])
def test_point_to_point_init_method(init):
    """The same programs with the process group initialised over tcp:// and env://."""
    got = run_world(_p2p, 2, init=init, timeout=WORLD_TIMEOUT)
    _check_p2p(got, 2)


# --------------------------------------------------------------------------------------
# Ring all-reduce
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [3])
def test_ring_allreduce_matches_all_reduce(world_size):
    fn = tutorial_ring_allreduce.run_ring_allreduce
    got = run_world(fn, world_size, timeout=WORLD_TIMEOUT)
    expected = tutorial_ring_allreduce.expected_sums(world_size)
    for rank, per_input in enumerate(got):
        assert set(per_input) == set(expected)
        for name, res in per_input.items():
            where = f"rank {rank}, input {name}"
            assert res["all_reduce"] == expected[name], f"dist.all_reduce wrong: {where}"
            assert res["tutorial_ring"] == expected[name], f"tutorial ring wrong: {where}"
            assert res["chunked_ring"] == expected[name], f"chunked ring wrong: {where}"
            assert res["input_unchanged"] == [True], f"input modified: {where}"
    gloo = run_world(fn, world_size, backend="gloo", timeout=WORLD_TIMEOUT)
    assert got == gloo


# --------------------------------------------------------------------------------------
# Synchronous SGD
# --------------------------------------------------------------------------------------


def _numpy_params(result: dict) -> dict:
    return {**result, "params": {k: v.numpy() for k, v in result["params"].items()}}


def _sgd(rank, world_size):
    # Tensors are not sent back through the harness' queue as tensors (torch pickles them
    # through shared memory that dies with the rank); numpy arrays travel by value.
    return _numpy_params(tutorial_sgd.run_sgd(rank, world_size))


@pytest.mark.parametrize("world_size", [2, 3])
def test_synchronous_sgd(world_size):
    got = run_world(_sgd, world_size, timeout=WORLD_TIMEOUT)
    gloo = run_world(_sgd, world_size, backend="gloo", timeout=WORLD_TIMEOUT)
    ref = _numpy_params(tutorial_sgd.reference_sgd(world_size))

    for rank in range(world_size):
        losses = got[rank]["epoch_losses"]
        assert len(losses) == tutorial_sgd.EPOCHS
        assert losses[-1] < losses[0] - 0.05, f"rank {rank} did not learn: {losses}"
        # Against the same program on Gloo, and against the single-process reference.
        assert_close(losses, gloo[rank]["epoch_losses"], **TRAIN_TOL)
        assert_close(got[rank]["params"], gloo[rank]["params"], **TRAIN_TOL)
        assert_close(losses, ref["epoch_losses"][rank], rtol=1e-4, atol=1e-6)
        assert_close(got[rank]["params"], ref["params"], rtol=1e-4, atol=1e-6)

    # Every rank must end with the same model: all-reduce gives every rank the same sum.
    # With two ranks a + b == b + a exactly, so the replicas must agree bit for bit.
    cross_rank_tol = {"rtol": 0.0, "atol": 0.0} if world_size == 2 else TRAIN_TOL
    for rank in range(1, world_size):
        assert_close(got[rank]["params"], got[0]["params"], **cross_rank_tol)


# --------------------------------------------------------------------------------------
# The example files under torchrun (env:// rendezvous)
# --------------------------------------------------------------------------------------


def _run_torchrun(script: str, tmp_path: Path, nproc: int = 2) -> list[dict]:
    """Run ``torchrun --standalone`` on an example; return the ranks' RESULT records."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env["TMPDIR"] = str(tmp_path)  # torchrun's torchelastic_* log dir goes with the test's
    cmd = [
        sys.executable,  # "torchrun" is this module; this way it runs under this interpreter
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(EXAMPLES / script),
        "--backend",
        BACKEND,
        "--result-dir",
        str(tmp_path),
    ]
    run = run_in_session(cmd, timeout=TORCHRUN_TIMEOUT, env=env, cwd=REPO, stderr_to_stdout=True)
    out = run.out
    if run.timed_out:
        pytest.fail(f"torchrun {script} timed out after {TORCHRUN_TIMEOUT}s:\n{out[-4000:]}")
    assert run.returncode == 0, f"torchrun {script} exited {run.returncode}:\n{out[-4000:]}"
    records = []
    for rank in range(nproc):
        path = tmp_path / f"result_rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result:\n{out[-4000:]}"
        records.append(json.loads(path.read_text()))
        assert records[-1]["rank"] == rank
    return records


def test_torchrun_p2p(tmp_path):
    records = _run_torchrun("tutorial_p2p.py", tmp_path)
    for r in records:
        assert r["ok"] is True
        assert r["backend"] == BACKEND
        assert r["world_size"] == 2
        assert r["blocking"] == tutorial_p2p.expected_blocking_p2p(r["rank"], 2)
        assert r["nonblocking"] == tutorial_p2p.expected_nonblocking_p2p(r["rank"], 2)


def test_torchrun_ring_allreduce(tmp_path):
    records = _run_torchrun("tutorial_ring_allreduce.py", tmp_path)
    expected = tutorial_ring_allreduce.expected_sums(2)
    for r in records:
        assert r["ok"] is True
        for name, res in r["results"].items():
            assert res["tutorial_ring"] == res["chunked_ring"] == res["all_reduce"]
            assert res["all_reduce"] == expected[name]


def test_torchrun_sgd(tmp_path):
    records = _run_torchrun("tutorial_sgd.py", tmp_path)
    ref = tutorial_sgd.reference_sgd(2)
    ref_params = {k: v.reshape(-1).tolist() for k, v in ref["params"].items()}
    for r in records:
        assert r["ok"] is True
        assert_close(r["epoch_losses"], ref["epoch_losses"][r["rank"]], rtol=1e-4, atol=1e-6)
        assert_close(r["params"], ref_params, rtol=1e-4, atol=1e-6)
    assert records[0]["params"] == records[1]["params"]
