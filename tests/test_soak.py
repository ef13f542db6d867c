"""``python -m ucxbackend soak`` (ucxbackend/soak): the verdict's rule on made-up series, the
options, a short real soak of both backends that must come out flat, and one with a leak
injected (``UCXBACKEND_SOAK_TEST_LEAK``) that must come out growing."""

from __future__ import annotations

import re

import pytest
from bench_harness import bench_env, needs_native, run_command

from ucxbackend import cli
from ucxbackend.soak import options as soak_options
from ucxbackend.soak import verdict
from ucxbackend.soak.testhook import LEAK_ENV

FLAT = {"fds": 60.0, "threads": 10.0, "rss_mib": 250.0, "shm_files": 0.0, "shm_maps": 2.0}


def _series(n: int, **growth: float) -> list[dict[str, float]]:
    """``n`` samples of FLAT, each metric in ``growth`` rising by that much per sample."""
    return [{k: v + growth.get(k, 0.0) * i for k, v in FLAT.items()} for i in range(n)]


def test_verdict_flat_series_is_flat() -> None:
    result = verdict.judge({0: _series(10), 1: _series(10)})
    assert result.flat
    assert result.describe().startswith("verdict: flat")


def test_verdict_names_the_metric_and_rank_that_grows() -> None:
    result = verdict.judge({0: _series(10), 1: _series(10, fds=1)})
    assert not result.flat
    assert [(f.metric, f.rank) for f in result.growing] == [("fds", 1)]
    assert "fds on rank 1" in result.describe()


def test_verdict_ignores_warmup_and_spikes_but_not_a_raised_floor() -> None:
    warm = _series(12)
    warm[0]["threads"] = 3  # before the warm-up ends: not compared
    warm[11]["rss_mib"] += 500  # one spike in the last third: its floor is unchanged
    assert verdict.judge({0: warm}).flat
    # RSS that keeps rising past the tolerance (64 MiB + 10 %) over the compared thirds.
    assert [f.metric for f in verdict.judge({0: _series(12, rss_mib=20)}).growing] == ["rss_mib"]
    # ...and one that rises by less does not.
    assert verdict.judge({0: _series(12, rss_mib=5)}).flat


def test_verdict_needs_enough_samples() -> None:
    with pytest.raises(ValueError, match="fewer than"):
        verdict.judge({0: _series(verdict.MIN_SAMPLES - 1)})


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        ([], "exactly one of --minutes and --seconds"),
        (["--seconds", "5", "--interval", "1"], "too few for a verdict"),
        (["--seconds", "60", "--backend", "tcp"], "choose ucx, udp or both"),
        (["--seconds", "60", "--nproc", "1"], "at least 2 ranks"),
    ],
)
def test_bad_options_exit_2(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["soak", *argv]) == 2
    assert problem in capsys.readouterr().err


def test_options_round_trip_to_the_ranks() -> None:
    args = cli.build_parser().parse_args(["soak", "--minutes", "2", "--backend", "udp"])
    opts = soak_options.SoakOptions.from_args(args)
    assert opts.seconds == 120 and opts.backends == ("udp",) and opts.nproc == 2
    again = cli.build_parser().parse_args(["soak", *opts.to_argv()])
    assert soak_options.SoakOptions.from_args(again) == opts


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if re.match(r"\s+\d+\.\d\s", line)]


@needs_native
def test_short_soak_of_both_backends_is_flat() -> None:
    # A sample is taken between steps; a loaded host's steps take 0.5-0.9 s (a clean clone's
    # 4 s run took 6 samples, one short of a verdict): 8 s leaves MIN_SAMPLES a margin.
    result = run_command("soak", "--seconds", "8", "--interval", "0.5", "--backend", "both")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: flat" in result.stdout
    rows = _rows(result.stdout)
    assert len(rows) >= verdict.MIN_SAMPLES
    assert int(rows[-1][2]) > int(rows[0][2]) > 0  # ops went on all along


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("leak", ["fd", "group"])
def test_a_leak_per_cycle_turns_the_verdict_to_growing(leak: str) -> None:
    env = bench_env(**{LEAK_ENV: leak})
    result = run_command("soak", "--seconds", "4", "--interval", "0.5", "--backend", "ucx", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "verdict: GROWING" in result.stdout
    assert "fds on rank" in result.stdout
    if leak == "group":
        assert "threads on rank" in result.stdout  # each kept group's progress thread
