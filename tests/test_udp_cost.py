"""``scripts/udp_cost.cpp``, the per-byte cost probe of the UDP transport (docs/performance.md,
"Traced"): built with the transport's sources by tests/cpp_build.py and run in both modes on
small messages. The program compares every byte it receives with what was sent, so a zero exit
status is the check that it measured a correct transfer."""

from __future__ import annotations

import re
import subprocess

import cpp_build
import pytest

RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def udp_cost() -> str:
    return str(
        cpp_build.build("udp_cost", "scripts/udp_cost.cpp", groups=["udp"], flags=cpp_build.PLAIN)
    )


def _run(exe: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=cpp_build.REPO
    )


def test_memory_mode_moves_every_byte_and_counts_datagrams(udp_cost: str) -> None:
    """Two connections in memory: 3 rounds of 1 MiB + 5 bytes each way at 1472-byte datagrams
    need at least 2 x 3 x 718 data datagrams, none resent (nothing is lost in memory)."""
    proc = _run(udp_cost, "memory", str((1 << 20) + 5), "3")
    assert proc.returncode == 0, proc.stderr
    m = re.fullmatch(r"datagrams (\d+) retransmitted (\d+)\n", proc.stdout)
    assert m is not None, proc.stdout
    assert int(m.group(1)) >= 2 * 3 * 718 and int(m.group(2)) == 0


def test_sockets_mode_reports_each_rank(udp_cost: str) -> None:
    """Two UdpTransports over loopback at 8972-byte datagrams: a line per rank and the CPU per
    GB (no speed is checked: it belongs in docs/performance.md, not in a test)."""
    proc = _run(udp_cost, "sockets", str(4 << 20), "2", "8972")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    for rank, line in enumerate(lines[:2]):
        assert re.fullmatch(rf"rank {rank} user_s \S+ system_s \S+ retransmitted \d+", line), line
    assert re.fullmatch(r"cpu_s_per_gb \d+\.\d{3}", lines[2]), lines[2]


@pytest.mark.parametrize("mode", ["fold4", "fold8"])
def test_fold_modes_check_every_sum(udp_cost: str, mode: str) -> None:
    """Folded receives over loopback at Ethernet's datagram size (GSO/GRO trains where the
    kernel has them): 3 rounds of 1 MiB + 24 bytes each way, every element of the accumulator
    compared with start + 3 x what the peer sent (wrapping integer sums: exact). A payload
    folded twice, skipped or misaligned into the wrong elements exits 1."""
    proc = _run(udp_cost, mode, str((1 << 20) + 24), "3", "1472")
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"cpu_s_per_gb \d+\.\d{3}", proc.stdout.splitlines()[-1]), proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("memory",),
        ("fold8", "1028", "1"),
        ("fast", "1024", "1"),
        ("memory", "0", "1"),
        ("memory", "1024", "0"),
        ("memory", "1024", "1", "100"),
    ],
)
def test_bad_arguments_exit_2(udp_cost: str, args: tuple[str, ...]) -> None:
    """A wrong mode, an empty message, no rounds, a fold of a size its elements do not divide
    or an mtu_payload below the minimum: exit 2."""
    proc = _run(udp_cost, *args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
