"""``ucxbackend.bench.startup`` (``bench startup``): a tiny run read back (rows, ratios, the
breakdown), its options, and the Store traffic of a group's creation, which must not grow
with the group (ucxbackend.startup_profile)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from bench_harness import assert_clean, needs_native, parse_args, run_bench
from conftest import skip_unless_ucx
from dist_harness import run_world

import ucxbackend
from ucxbackend.bench import startup_options
from ucxbackend.bench.common import UsageError

# Every Store call one rank makes to create a group, at most, whatever the group's size
# (csrc/address_exchange.hpp): joining the instance (up to 6 when rank 0 opens it late) and
# publishing its card (1), the records round (4), the shared-memory answer (3), and the last
# rank's clean-up (12, and 1 to release rank 0, which waits for that and deletes the key: 2 for
# rank 0). A wait longer than csrc/creation_watch.cpp's kWatchAfter adds a few on a connection of
# its own (not in a normal creation). Before,
# each rank read every peer's key in three rounds and waited on a key per peer: at 6 ranks
# about 30 calls, 60 for the rank that deleted the keys.
_MAX_CREATION_CALLS = 27


def test_startup_options() -> None:
    opts = startup_options.StartupOptions.from_args(parse_args("startup"))
    assert opts.world_sizes == (2, 4, 8, 16, 32)
    assert opts.backends == ("ucx", "udp", "gloo") and opts.repeats == 3
    assert opts.store_host == "agent"  # as under torchrun
    assert startup_options.StartupOptions.from_args(
        parse_args("startup", "--store-host", "rank0")
    ).store_host == "rank0"
    with pytest.raises(SystemExit):  # argparse's own choices
        parse_args("startup", "--store-host", "rank1")
    opts = startup_options.StartupOptions.from_args(
        parse_args("startup", "--world-sizes", "3,2,3", "--repeats", "1", "--backends", "gloo")
    )
    assert opts.world_sizes == (3, 2) and opts.backends == ("gloo",) and opts.repeats == 1
    for bad in (["startup", "all_reduce"], ["startup", "--world-sizes", "0"],
                ["startup", "--repeats", "0"], ["startup", "--backends", "ucx,mpi"]):
        with pytest.raises(UsageError):
            startup_options.StartupOptions.from_args(parse_args(*bad))


def _table(stdout: str) -> dict[tuple[int, str], float]:
    """(world size, column) -> median seconds or ratio, from the printed table: each backend
    cell is "median [min-max]", each ratio cell one number."""
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("# ranks"))
    columns = lines[head].split()[2:]
    cells: dict[tuple[int, str], float] = {}
    for line in lines[head + 1 :]:
        if line.startswith("#"):
            break
        words = line.split()
        world, at = int(words[0]), 1
        for name in columns:
            value = words[at]
            if "/" not in name:
                assert re.fullmatch(r"\[[\d.]+-[\d.]+\]", words[at + 1]), line
                at += 1
            at += 1
            cells[(world, name)] = float("nan") if value == "n/a" else float(value)
        assert at == len(words), line
    return cells


@needs_native
def test_startup_mode_tiny_run(tmp_path: Path) -> None:
    """2 and 3 ranks, one start each, ucx and gloo: both rows, the ratio is ucx's median over
    Gloo's, and ucx's breakdown (the slowest rank's phases) adds up to its total."""
    skip_unless_ucx("times ucx groups")
    out_json = tmp_path / "s.json"
    proc = run_bench(
        "startup", "--world-sizes", "2,3", "--repeats", "1", "--backends", "ucx,gloo",
        "--json", str(out_json), "--timeout", "60",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(proc)
    cells = _table(proc.stdout)
    report: dict[str, Any] = json.loads(out_json.read_text())
    assert report["store_host"] == "agent"
    by = {(r["backend"], r["world_size"]): r for r in report["results"]}
    for world in (2, 3):
        ucx, gloo = by[("ucx", world)], by[("gloo", world)]
        assert cells[(world, "ucx")] == pytest.approx(ucx["median_s"], abs=1e-4)
        assert cells[(world, "gloo")] == pytest.approx(gloo["median_s"], abs=1e-4)
        assert ucx["ratio_vs_gloo"] == pytest.approx(ucx["median_s"] / gloo["median_s"])
        assert cells[(world, "ucx/gloo")] == pytest.approx(ucx["ratio_vs_gloo"], abs=0.01)
        phases = ucx["breakdown_s"]
        assert {"torch", "join", "exchange", "first_op"} <= set(phases), phases
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) <= ucx["median_s"] * (1 + 1e-9) + 1e-9
        assert 0 < ucx["store_calls"] <= _MAX_CREATION_CALLS
        assert gloo["store_calls"] is None
    assert re.search(r"^\s+ucx\s+3\s", proc.stdout, re.M), proc.stdout  # the breakdown row
    assert "plot" not in proc.stdout  # none asked for


def _creation_profile(rank: int, ws: int) -> dict[str, Any]:
    return ucxbackend.startup_profile()


# How many more Store calls a phase of the creation may make at 6 ranks than at 2, because of
# a rank's role, not the group's size: in "join", a rank that came before rank 0 opened the
# creation waits for it once and looks again (2: at 2 ranks rank 1 may not have come early);
# in "cleanup", a last rank other than rank 0 also releases rank 0 (1: at 2 ranks rank 0 may
# have been last). Every other phase makes as many calls at any size.
_ROLE_CALLS = {"join": 2, "cleanup": 1}


@needs_native
def test_creation_store_calls_do_not_grow_with_the_group() -> None:
    """On a TCPStore, each phase of a group's creation makes as many Store calls at 6 ranks as
    at 2 (one append and one multi-key read for everyone's records, counters for the rest),
    not a few more per peer: compared phase by phase, the most any rank made, less what a
    rank's role adds (_ROLE_CALLS)."""
    skip_unless_ucx("profiles a ucx group's creation")
    profiles = {
        ws: run_world(_creation_profile, ws, init="tcp", timeout=90) for ws in (2, 6)
    }
    most: dict[int, dict[str, int]] = {}
    for ws, ranks in profiles.items():
        for p in ranks:
            by_phase = p["store_calls_by_phase"]
            assert list(by_phase) == list(p["phases"]), p
            assert sum(by_phase.values()) == p["store_calls"], p
        most[ws] = {
            phase: max(p["store_calls_by_phase"][phase] for p in ranks)
            for phase in ranks[0]["phases"]
        }
    assert list(most[6]) == list(most[2]), most
    for phase, calls in most[6].items():
        assert calls <= most[2][phase] + _ROLE_CALLS.get(phase, 0), (phase, most)
    assert max(p["store_calls"] for p in profiles[6]) <= _MAX_CREATION_CALLS, most
