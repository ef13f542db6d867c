"""``ucxbackend.bench.udp``: ``--udp-variant`` specs, the drop x policy sweep, ``--udp-common``,
their options, and a real run of a lossless and a lossy variant with transport statistics.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from bench_harness import (
    REPO,
    assert_clean,
    cell,
    needs_native,
    options,
    parse_args,
    parse_tables,
    run_bench,
)

import ucxbackend
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import options as bench_options
from ucxbackend.bench import report as bench_report
from ucxbackend.bench import udp as bench_udp


@pytest.mark.parametrize(
    ("text", "label", "config", "faults"),
    [
        ("lossless:", "lossless", "", ""),
        (" lossless : ", "lossless", "", ""),
        ("sr1:drop=0.01", "sr1", "", "drop=0.01,seed=1"),
        ("gbn5:drop=5%,loss_recovery=gbn", "gbn5", "loss_recovery=go_back_n", "drop=0.05,seed=1"),
        (
            "mix:loss_recovery=go_back_n,drop=0.1,seed=9,congestion=aimd,dup=0.001,",
            "mix",
            "loss_recovery=go_back_n,congestion=aimd",
            "drop=0.1,seed=9,dup=0.001",
        ),
        ("drop=0.1", "udp:sr@10%", "", "drop=0.1,seed=1"),
        (
            "loss_recovery=go_back_n,drop=0.01",
            "udp:gbn@1%",
            "loss_recovery=go_back_n",
            "drop=0.01,seed=1",
        ),
        ("loss_recovery=sr", "udp:sr@0%", "loss_recovery=selective_repeat", ""),
        ("udp:sr@1%:drop=0.01", "udp:sr@1%", "", "drop=0.01,seed=1"),  # ':' inside a label
        ("udp:sr@0%:", "udp:sr@0%", "", ""),
        # Multipath: pathN.KEY is a fault key for path N only (its own ';' section).
        (
            "ad:paths=4,path_policy=adaptive,path1.drop=5%",
            "ad",
            "paths=4,path_policy=adaptive",
            "seed=1;drop=0.05",
        ),
        ("p3:paths=4,path3.drop=0.1,dup=0.01", "p3", "paths=4", "dup=0.01,seed=1;;;drop=0.1"),
    ],
)
def test_udp_variant_parse(text: str, label: str, config: str, faults: str) -> None:
    v = bench_udp.parse_udp_variant(text)
    assert (v.label, v.udp_config, v.udp_faults) == (label, config, faults)
    # secret_file always passed, '' here: UCXBACKEND_SECRET_FILE does not reach a variant
    assert v.pg_options() == {"udp_config": config, "udp_faults": faults, "secret_file": ""}
    assert bench_udp.parse_udp_variant(v.spec()) == v  # what the ranks we start are given


def test_udp_variant_with_secret_file() -> None:
    """The authenticated mode as a variant of its own ('auth:secret_file=PATH')."""
    v = bench_udp.parse_udp_variant("auth:secret_file=/run/secret,drop=0.01")
    assert (v.label, v.secret_file, v.udp_faults) == ("auth", "/run/secret", "drop=0.01,seed=1")
    assert v.pg_options()["secret_file"] == "/run/secret"
    assert v.describe()["secret_file"] == "/run/secret"
    assert bench_udp.parse_udp_variant(v.spec()) == v


def test_udp_variants_list_and_seed() -> None:
    got = bench_udp.parse_udp_variants(
        "lossless:;sr1:drop=0.01; ;gbn:drop=0.01,loss_recovery=gbn", 7
    )
    assert [v.label for v in got] == ["lossless", "sr1", "gbn"]
    assert got[1].udp_faults == "drop=0.01,seed=7"  # --udp-seed, the same for every variant
    assert got[2].udp_faults == "drop=0.01,seed=7"
    assert got[0].udp_faults == ""  # no faults, no seed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty --udp-variant: expected LABEL:KEY=VALUE,... or LABEL:"),
        (" ; ", "empty --udp-variant"),
        (
            "lossless",
            "'lossless' is not KEY=VALUE (a variant named 'lossless' with the defaults is "
            "'lossless:')",
        ),
        ("sr:drop", "'sr:drop': 'drop' is not KEY=VALUE"),
        (":drop=0.1", "empty label before ':'"),
        ("a b:drop=0.1", "bad label 'a b'"),
        ("a/b:", "bad label 'a/b'"),
        ("sr:drop=0.1,bogus=1", "unknown key 'bogus'; udp_config keys: mtu_payload"),
        ("sr:drop=", "drop= has no value"),
        ("sr:drop=0.1,drop=0.2", "key 'drop' given twice"),
        ("sr:drop=x%", "drop=x% is not a percentage"),
        ("mp:path1.paths=2", "'path1.paths': only udp_faults keys may be given per path"),
        ("drop=0.1,congestion=aimd", "give it a label (LABEL:drop=0.1,congestion=aimd)"),
    ],
)
def test_udp_variant_parse_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        bench_udp.parse_udp_variants(text)


@needs_native
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sr:drop=2", "udp variant 'sr:drop=2': udp faults: drop='2' is invalid"),
        ("x:loss_recovery=fast", "udp config: loss_recovery='fast' is invalid (allowed: "),
        ("x:rto_min_us=abc", "rto_min_us='abc' is invalid"),
    ],
)
def test_udp_variant_values_checked_by_the_native_parser(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        bench_udp.parse_udp_variant(text)


def test_udp_policies_match_the_transport() -> None:
    # a variant routes each key by name: the two key sets must not overlap
    assert not set(ucxbackend.config.udp_config_keys()) & set(ucxbackend.config.udp_fault_keys())
    source = (REPO / "transports" / "udp" / "loss_recovery.cpp").read_text()
    # the short names (sr, gbn) refer to policies the registry has
    assert set(bench_udp.UDP_POLICIES) <= set(re.findall(r'\{"(\w+)", \[\]', source))
    if ucxbackend.is_available():
        default = ucxbackend._C.udp.describe_config("")
        assert f"loss_recovery={bench_udp.DEFAULT_UDP_POLICY}" in default


def test_udp_variant_options() -> None:
    opts = options(
        "--udp-variant",
        "lossless:",
        "--udp-variants",
        "gbn5:drop=0.05,loss_recovery=go_back_n",
        "--udp-drop",
        "0.01,10%",
        "--udp-policy",
        "sr,go_back_n",
        "--backends",
        "ucx,mpi,gloo",
        "--udp-seed",
        "3",
    )
    labels = ("lossless", "gbn5", "udp:sr@1%", "udp:sr@10%", "udp:gbn@1%", "udp:gbn@10%")
    assert opts.variant_labels == labels
    assert opts.columns(True) == (*labels, "ucx", "mpi", "gloo")  # the first is the reference
    assert opts.columns(False) == (*labels, "ucx", "gloo")
    assert bench_report.ratio_columns(opts.columns(False))[0] == "lossless/gbn5"
    assert opts.measured() == (*labels, "ucx", "gloo")
    assert opts.udp_columns() == frozenset(labels)
    sweep = {v.label: v for v in opts.udp_variants}
    assert sweep["udp:gbn@10%"].pg_options() == {
        "udp_config": "loss_recovery=go_back_n",
        "udp_faults": "drop=0.1,seed=3",
        "secret_file": "",
    }
    assert sweep["gbn5"].udp_faults == "drop=0.05,seed=3"
    again = bench_options.BenchOptions.from_args(parse_args(*opts.to_argv()))
    assert again == opts
    assert opts.describe()["udp_variants"][0] == {
        "label": "lossless",
        "backend": "udp",
        "udp_config": "",
        "udp_faults": "",
    }
    # without --backends: the variants only; a plain udp backend column has statistics too
    only = options("--udp-drop", "0,1%")
    assert only.columns(True) == ("udp:sr@0%", "udp:sr@1%") and only.backends == ()
    assert [v.udp_faults for v in only.udp_variants] == ["", "drop=0.01,seed=1"]
    assert bench_options.BenchOptions.from_args(parse_args(*only.to_argv())) == only
    assert options("--udp-policy", "gbn").variant_labels == ("udp:gbn@0%",)
    assert options("--backends", "udp,gloo").udp_columns() == frozenset({"udp"})
    assert options().udp_columns() == frozenset()


def test_udp_common_settings() -> None:
    opts = options(
        "--udp-variant",
        "lossless:;gbn:loss_recovery=gbn,max_rto_expiries=5",
        "--udp-drop",
        "1%",
        "--udp-common",
        "max_rto_expiries=50,congestion=aimd",
    )
    got = {v.label: (v.udp_config, v.udp_faults) for v in opts.udp_variants}
    assert got == {
        "lossless": ("max_rto_expiries=50,congestion=aimd", ""),
        "gbn": ("loss_recovery=go_back_n,max_rto_expiries=5,congestion=aimd", ""),  # own wins
        "udp:sr@1%": (
            "loss_recovery=selective_repeat,max_rto_expiries=50,congestion=aimd",
            "drop=0.01,seed=1",
        ),
    }
    # the ranks we start get the variants as resolved, without --udp-common
    assert not any(a.startswith("--udp-common") for a in opts.to_argv())
    assert bench_options.BenchOptions.from_args(parse_args(*opts.to_argv())) == opts
    dup = options("--udp-variant", "lossless:", "--udp-common", "dup=0.5%", "--udp-seed", "4")
    assert dup.udp_variants[0].udp_faults == "dup=0.005,seed=4"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--udp-variant", "a:;a:drop=0.1"), "label(s) used twice: a"),
        (("--udp-variant", "ucx:", "--backends", "ucx"), "label(s) ucx also in --backends"),
        (("--udp-variant", "sr:drop=0.1,bogus=1"), "unknown key 'bogus'"),
        (("--udp-drop", "0,abc"), "--udp-drop: 'abc' is not a probability"),
        (("--udp-drop", "1.5"), "--udp-drop: '1.5' is outside 0..1"),
        (("--udp-drop", ","), "--udp-drop: expected a comma-separated list"),
        (("--udp-policy", "sr,fast"), "--udp-policy: unknown policy 'fast' ("),
        (("--udp-drop", "0", "--udp-variant", "udp:sr@0%:"), "used twice: udp:sr@0%"),
        (("--udp-drop", "0", "--udp-common", "bogus=1"), "--udp-common: unknown key 'bogus'"),
        (("--udp-common", "max_rto_expiries=50"), "--udp-common: no udp variant to apply it to"),
    ],
)
def test_bad_udp_variant_options(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(bench_common.UsageError, match=re.escape(message)):
        options(*argv)


def _block_lines(stdout: str, collective: str) -> list[list[str]]:
    """The data lines of the udp transport statistics block, split (without the '#')."""
    lines = stdout.splitlines()
    start = lines.index(
        next(x for x in lines if x.startswith(f"# udp transport statistics ({collective})"))
    )
    out = []
    for line in lines[start + 2 :]:
        if line.strip() == "#":
            break
        out.append(line[1:].split())
    return out


@needs_native
def test_udp_variants_lossless_vs_lossy(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    started = time.monotonic()
    proc = run_bench(
        "all_reduce",
        "-b",
        "256K",
        "-e",
        "1M",
        "-f",
        "4",
        "-n",
        "6",
        "-w",
        "1",
        "--rounds",
        "2",  # the udp counters sum over rounds, count only timed iterations
        "--udp-variant",
        "lossless:;lossy:drop=0.1",
        "--backends",
        "udp,gloo",
        "--json",
        str(out_json),
        "--timeout",
        "60",
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_clean(proc)
    assert time.monotonic() - started < 60
    assert "# udp variant lossy: udp_config='' udp_faults='drop=0.1,seed=1'" in proc.stdout
    table = parse_tables(proc.stdout)["all_reduce"]
    assert table["columns"] == ["lossless", "lossy", "udp", "gloo"]
    assert table["ratios"] == ["lossless/lossy", "lossless/udp", "lossless/gloo"]
    assert len(table["rows"]) == 2  # the statistics block adds no data lines
    for row in table["rows"]:
        for col in table["columns"]:
            assert cell(table, row, col, "wrong") == "0", (col, row)
    assert "# #wrong (all columns) : 0 OK" in table["footer"]
    block = _block_lines(proc.stdout, "all_reduce")
    assert [(b[0], b[1]) for b in block] == [
        (size, col) for size in ("262144", "1048576") for col in ("lossless", "lossy", "udp")
    ]

    doc = json.loads(out_json.read_text())
    assert doc["ok"] is True
    assert [v["label"] for v in doc["udp_variants"]] == ["lossless", "lossy"]
    recs = {(r["backend"], r["bytes"]): r for r in doc["results"]}
    totals: dict[str, dict[str, float]] = {}
    for (col, nbytes), rec in recs.items():
        if col == "gloo":
            assert rec["transport"] is None
            continue
        st = rec["transport"]
        assert st["iters"] == 6 and set(st["per_op"]) == set(bench_udp.UDP_COUNTERS)
        assert st["rtt_smoothed_us"] > 0 and st["per_op"]["data_packets_sent"] > 0
        for key, value in st["per_op"].items():
            totals.setdefault(col, {}).setdefault(key, 0.0)
            totals[col][key] += value
        # the block shows what the JSON holds
        (line,) = [b for b in block if b[:2] == [str(nbytes), col]]
        assert line[2] == f"{st['per_op']['retransmitted_packets']:.2f}"
        assert line[5] == f"{st['per_op']['faults_dropped']:.2f}"
    assert totals["lossy"]["faults_dropped"] > 0
    assert totals["lossy"]["retransmitted_packets"] > 0
    assert totals["lossy"]["declared_lost"] > 0
    for col in ("lossless", "udp"):  # no faults injected; retransmissions only from stalls
        assert totals[col]["faults_dropped"] == 0
        assert totals[col]["retransmitted_packets"] < totals["lossy"]["retransmitted_packets"]
