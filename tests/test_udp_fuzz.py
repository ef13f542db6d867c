"""Fuzzing the UDP transport's packet parser and connection state machine (issue #4).

tests/fuzz/udp_fuzz_target.cpp is a libFuzzer target (``LLVMFuzzerTestOneInput``) over the
wire format and two PeerConnections; tests/fuzz/standalone_driver.cpp drives it where
libFuzzer is not available, which is the case with g++. Both are compiled here with the core
under AddressSanitizer and UndefinedBehaviorSanitizer, the core and target also with
``-fsanitize-coverage=trace-pc`` so that the driver is coverage-guided, and run for a bounded
number of inputs and seconds. The target checks its invariants itself and aborts on the first
violation; the driver then writes the input to ``crash-<hash>``, replayable with
``udp_fuzz FILE``. ``UDP_FUZZ_SEED`` and ``UDP_FUZZ_SECONDS`` change the seed and the length
of the slow run.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import cpp_build
import pytest

REPO = Path(__file__).resolve().parent.parent
TARGET = "tests/fuzz/udp_fuzz_target.cpp"
ENDPOINT_MODE = "tests/fuzz/endpoint_fuzz.cpp"  # the target's endpoint-level mode
DRIVER = "tests/fuzz/standalone_driver.cpp"

SANITIZE = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
COMMON = ["-std=c++20", "-O1", "-g", "-Wall", "-Wextra", "-I.", *SANITIZE]
# Everything but the driver: the driver defines the coverage callback and must not call it.
COVERAGE = ["-fsanitize-coverage=trace-pc"]
ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

DONE = re.compile(
    r"udp_fuzz: done: (?P<runs>\d+) runs in (?P<secs>[\d.]+) s \((?P<rate>\d+) exec/s\), "
    r"seed (?P<seed>\d+), corpus (?P<corpus>\d+), edges (?P<edges>\d+)"
)


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    """``udp_fuzz`` and ``udp_fuzz_planted`` (the same with a bug planted in the target: one
    byte written past a receive buffer), built by tests/cpp_build.py with the sans-IO core
    (the socket loop is never called by the target). Every unit but the driver carries the
    coverage instrumentation; the two programs share every object but the target's."""

    def build(name: str, target_flags: list[str]) -> Path:
        def unit_flags(source: str) -> list[str]:
            if source == DRIVER:
                return []
            return [*COVERAGE, *target_flags] if source == TARGET else COVERAGE

        return cpp_build.build(
            name,
            TARGET,
            groups=["udp_sans_io"],
            flags=COMMON,
            extra_sources=[ENDPOINT_MODE, DRIVER],
            unit_flags=unit_flags,
        )

    return {
        "udp_fuzz": build("udp_fuzz", []),
        "udp_fuzz_planted": build("udp_fuzz_planted", ["-DUDP_FUZZ_PLANTED_OVERFLOW"]),
    }


@pytest.fixture(scope="module")
def udp_fuzz(binaries: dict[str, Path]) -> Path:
    return binaries["udp_fuzz"]


@pytest.fixture(scope="module")
def udp_fuzz_planted(binaries: dict[str, Path]) -> Path:
    return binaries["udp_fuzz_planted"]


def _run(binary: Path, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(binary), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **ENV},
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{binary.name} {' '.join(args)} ran over {timeout} s:\n{e.stdout}\n{e.stderr}")


def _fuzz(binary: Path, artifacts: Path, runs: int, seconds: int, seed: int) -> dict[str, float]:
    artifacts.mkdir(parents=True, exist_ok=True)
    args = [
        f"-runs={runs}",
        f"-max_total_time={seconds}",
        f"-seed={seed}",
        f"-artifact_prefix={artifacts}/",
    ]
    result = _run(binary, args, timeout=seconds + 120)
    crashes = sorted(artifacts.glob("*-*"))
    assert result.returncode == 0, (
        f"the fuzzer failed (exit code {result.returncode}, seed {seed}); "
        f"reproduce with: {binary} {' '.join(map(str, crashes)) or ' '.join(args)}\n"
        f"{result.stderr[-6000:]}\n{result.stdout[-2000:]}"
    )
    match = DONE.search(result.stdout)
    assert match, f"no summary line in the fuzzer's output:\n{result.stdout[-3000:]}"
    print(match.group(0))
    return {k: float(v) for k, v in match.groupdict().items()}


def _seed(default: int) -> int:
    return int(os.environ.get("UDP_FUZZ_SEED", default))


def test_fuzz_quick(udp_fuzz: Path, tmp_path: Path) -> None:
    """20k inputs or 6 s, whichever comes first (about 1000 inputs/s on this machine)."""
    summary = _fuzz(udp_fuzz, tmp_path / "artifacts", runs=20_000, seconds=6, seed=_seed(1))
    assert summary["runs"] >= 1000, "the fuzzer ran too few inputs to mean anything"
    # Coverage feedback works: the seeds alone reach a few thousand edges.
    assert summary["edges"] >= 1000
    assert summary["corpus"] >= 50


def test_seeds_and_replay(udp_fuzz: Path, tmp_path: Path) -> None:
    """-dump_seeds writes a corpus that libFuzzer can start from; replaying files works."""
    corpus = tmp_path / "corpus"
    dumped = _run(udp_fuzz, [f"-dump_seeds={corpus}"], timeout=60)
    assert dumped.returncode == 0, dumped.stderr
    files = sorted(corpus.iterdir())
    assert len(files) >= 20
    replayed = _run(udp_fuzz, [str(f) for f in files], timeout=120)
    assert replayed.returncode == 0, replayed.stderr[-6000:]
    assert replayed.stdout.count("Executed ") == len(files)


def test_bad_flag_is_an_error(udp_fuzz: Path) -> None:
    result = _run(udp_fuzz, ["-no_such_flag=1"], timeout=30)
    assert result.returncode == 2
    assert "unknown flag -no_such_flag=1" in result.stderr


def test_planted_overflow_is_caught(udp_fuzz_planted: Path, tmp_path: Path) -> None:
    """The harness can fail: a one-byte write past a receive buffer is reported, the input is
    saved, and replaying it fails again."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    args = ["-runs=2000", "-max_total_time=60", "-seed=1", f"-artifact_prefix={artifacts}/"]
    result = _run(udp_fuzz_planted, args, timeout=180)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "use-after-poison" in result.stderr, result.stderr[-6000:]
    assert "udp_fuzz_target.cpp" in result.stderr  # the stack names the write
    crashes = sorted(artifacts.glob("crash-*"))
    assert len(crashes) == 1, result.stderr[-3000:]
    replay = _run(udp_fuzz_planted, [str(crashes[0])], timeout=60)
    assert replay.returncode != 0
    assert "use-after-poison" in replay.stderr


@pytest.mark.slow
def test_fuzz_long(udp_fuzz: Path, tmp_path: Path) -> None:
    """Two minutes (``UDP_FUZZ_SECONDS``) from another seed."""
    seconds = int(os.environ.get("UDP_FUZZ_SECONDS", "120"))
    summary = _fuzz(udp_fuzz, tmp_path / "artifacts", runs=-1, seconds=seconds, seed=_seed(2))
    assert summary["runs"] >= 10 * seconds
