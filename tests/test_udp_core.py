"""The UDP transport's reliability core (transports/udp/, issue #4) in its simulator.

The core is plain C++ (torch-free, UCX-free, socket-free), so these tests do not need the
extension: they compile tests/cpp/udp_core_test.cpp with the core and the deterministic
simulator (tests/udp_sim/) in one g++ invocation, then run each scenario group of the program
as its own test. Everything is seeded: a failure reproduces with
``./udp_core_test GROUP`` (see ``--list``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import cpp_build
import pytest

REPO = Path(__file__).resolve().parent.parent
TEST_PROGRAM = "tests/cpp/udp_core_test.cpp"

# The program's scenario groups (checked against its --list below).
GROUPS = [
    "crc32c",
    "range_set",
    "wire_format",
    "one_way_delay",
    "config",
    "faults",
    "rtt_congestion",
    "lossless",
    "loss",
    "go_back_n",
    "tail_loss_probe",
    "immediate_acks",
    "duplication",
    "reordering",
    "delayed_acks",
    "corruption",
    "mixed",
    "unexpected",
    "matching",
    "receive_sink",
    "security",
    "fuzz",
    "peer_failure",
    "soak",
    "bottleneck",
    "lab_policies",
    "lab_fault_matrix",
    "lab_bottleneck_flow",
    "trim_nack",
    "incast",
    "rack_reordering",
    "lab_determinism",
    "credit",
    "credit_incast",
    "credit_grant_loss",
    "stalled_receiver",
]

RUN_TIMEOUT_S = 120  # every group takes well under a second at -O1


def _plain(name: str, program: str) -> cpp_build.Program:
    """`program` with the UDP core, its socket loop and the simulator, unsanitized."""
    return cpp_build.Program(name, program, groups=["udp", "udp_sim"], flags=cpp_build.PLAIN)


# The three plain programs, which tests/cpp_prebuild.py also compiles ahead of this file.
CORE = _plain("udp_core_test", TEST_PROGRAM)
ENDPOINT = _plain("udp_endpoint_test", "tests/cpp/udp_endpoint_test.cpp")
TRANSPORT = _plain("udp_transport_test", "tests/cpp/udp_transport_test.cpp")
PLAIN_PROGRAMS = [CORE, ENDPOINT, TRANSPORT]


def _compile(out: Path, program: cpp_build.Program) -> Path:
    """`program`, built by tests/cpp_build.py (cached across sessions) and copied to `out`."""
    shutil.copy2(program.build(), out)
    return out


def _run(
    binary: Path, args: list[str], env: dict[str, str] | None = None, timeout: int = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(binary), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"udp_core_test {' '.join(args)} ran over {timeout} s:\n{e.stdout}")


def _assert_passed(result: subprocess.CompletedProcess[str], what: str) -> None:
    assert result.returncode == 0, (
        f"udp_core_test {what} failed (exit code {result.returncode}):\n"
        f"{result.stdout}\n{result.stderr}"
    )


@pytest.fixture(scope="module")
def udp_core_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test program, compiled once for this module."""
    return _compile(tmp_path_factory.mktemp("udp_core") / "udp_core_test", CORE)


def test_groups_are_all_listed(udp_core_test: Path) -> None:
    result = _run(udp_core_test, ["--list"])
    _assert_passed(result, "--list")
    listed = result.stdout.split()
    assert [g for g in listed if g != "measure"] == GROUPS


@pytest.mark.parametrize("group", GROUPS)
def test_scenario(udp_core_test: Path, group: str) -> None:
    result = _run(udp_core_test, [group])
    _assert_passed(result, group)
    assert f"[{group}] ok" in result.stdout


def test_unknown_group_is_an_error(udp_core_test: Path) -> None:
    result = _run(udp_core_test, ["no_such_group"])
    assert result.returncode == 2
    assert "unknown group 'no_such_group'" in result.stderr


def test_measurements(udp_core_test: Path) -> None:
    """Goodput and retransmissions per policy and loss rate: printed (``pytest -s``), the only
    thing asserted is that the simulation ran (every byte is still checked). With a 2 MiB
    message instead of 16 (0.7 s instead of 8): every run still loses, resends and times out
    (``./udp_core_test measure`` gives the 16 MiB figures)."""
    result = _run(udp_core_test, ["measure"], env={"UDP_MEASURE_MIB": "2"})
    _assert_passed(result, "measure")
    print(result.stdout)


# Every group again under AddressSanitizer and UndefinedBehaviorSanitizer:
# tests/test_udp_core_sanitizers.py.


# ------------------------------------------------------------- the sans-IO endpoint, simulated

# tests/cpp/udp_endpoint_test.cpp's groups (checked against its --list below): several
# Endpoints on one simulated network.
ENDPOINT_GROUPS = [
    "routing",
    "trains",
    "any_source",
    "cancellation",
    "peer_failure",
    "silent_peer",
    "killed_peer",
    "killed_peer_any_source",
    "multipath_unreachable",
    "linger",
    "linger_close",
    "linger_close_faults",
    "closed_peer_receive",
    "wire_version",
    "in_flight_cap_under_loss",
    "transmit_turns",
    "faults",
    "credit_downlink",
    "credit_receiver_stall",
    "trace_samples",
    "trace_at_op_end",
    "trace_credit",
    "multipath_fault_matrix",
    "multipath_adaptive",
    "multipath_reordering",
    "multipath_adaptive_heals",
    "multipath_spurious_loss",
    "multipath_op_time",
    "multipath_rate_limited",
    "multipath_host_stalls",
]


@pytest.fixture(scope="module")
def udp_endpoint_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("udp_endpoint") / "udp_endpoint_test"
    return _compile(out, ENDPOINT)


def test_endpoint_groups_are_all_listed(udp_endpoint_test: Path) -> None:
    result = _run(udp_endpoint_test, ["--list"])
    _assert_passed(result, "--list")
    assert result.stdout.split() == ENDPOINT_GROUPS


@pytest.mark.parametrize("group", ENDPOINT_GROUPS)
def test_endpoint_scenario(udp_endpoint_test: Path, group: str) -> None:
    """transports/udp/endpoint.h (routing by address, any-source receives, cancellation, peer
    failure, linger) with three or four ranks in tests/udp_sim/endpoint_network.h."""
    result = _run(udp_endpoint_test, [group])
    _assert_passed(result, group)
    assert f"[{group}] ok" in result.stdout


# ------------------------------------------------------------------ the socket loop, for real


@pytest.mark.parametrize(
    ("faults", "mtu"),
    [
        ("", "8972"),
        ("drop=0.1,dup=0.02,reorder=0.05,delay=0.01,corrupt=0.01,seed=3", "8972"),
        # Ethernet-sized datagrams go out in GSO trains and come back GRO-coalesced.
        ("", "1472"),
        ("drop=0.05,seed=5", "1472"),
    ],
)
def test_transport_over_loopback_sockets(
    tmp_path_factory: pytest.TempPathFactory, faults: str, mtu: str
) -> None:
    """UdpTransport (the socket loop around the core) with three ranks in one process on
    127.0.0.1: messages from 0 bytes to 4 MiB between every pair, byte-compared with canaries
    after each buffer, any-source receives, truncation, cancellation, and a peer that vanishes
    (found by keepalive and retransmission timeouts), and address blobs that are not one (the
    error names the rank that published it). tests/cpp/udp_transport_test.cpp."""
    binary = tmp_path_factory.getbasetemp() / "udp_transport_test"
    if not binary.exists():
        _compile(binary, TRANSPORT)
    result = _run(binary, [faults, mtu], timeout=180)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    if mtu == "1472" and "trains_sent=" in result.stdout:
        trains = [int(n) for n in re.findall(r"trains_sent=(\d+)", result.stdout)]
        assert sum(trains) > 0, result.stdout
    assert "PASS" in result.stdout
    assert "ok dead peer detected" in result.stdout
