"""Fuzzing the UDP transport's packet parser and connection state machine (issue #4).

tests/fuzz/udp_fuzz_target.cpp is a libFuzzer target (``LLVMFuzzerTestOneInput``) over the
wire format and two PeerConnections; tests/fuzz/standalone_driver.cpp drives it where
libFuzzer is not available, which is the case with g++. Both are compiled here with the core
under AddressSanitizer and UndefinedBehaviorSanitizer, the core and target also with
``-fsanitize-coverage=trace-pc`` so that the driver is coverage-guided, and run for a fixed
number of inputs. The target checks its invariants itself and aborts on the first
violation; the driver then writes the input to ``crash-<hash>``, replayable with
``udp_fuzz FILE``.

The runs start from tests/fuzz/corpus/ as well as the target's built-in seeds: inputs kept
from longer runs (``udp_fuzz -merge=1``), which reach every line and branch that a
two-minute run from the seeds alone reached, so each run fuzzes from covered ground
(docs/udp-protocol.md#fuzzing says how the corpus was made and how to renew it).
``UDP_FUZZ_SEED``, ``UDP_FUZZ_RUNS`` and ``UDP_FUZZ_SECONDS`` change the seed and the length
of the slow run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import cpp_build
import pytest

REPO = Path(__file__).resolve().parent.parent
TARGET = "tests/fuzz/udp_fuzz_target.cpp"
ENDPOINT_MODE = "tests/fuzz/endpoint_fuzz.cpp"  # the target's endpoint-level mode
DRIVER = "tests/fuzz/standalone_driver.cpp"
CORPUS = REPO / "tests" / "fuzz" / "corpus"

ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}

INITED = re.compile(r"^#(?P<inited>\d+)\tINITED", re.MULTILINE)
DONE = re.compile(
    r"udp_fuzz: done: (?P<runs>\d+) runs in (?P<secs>[\d.]+) s \((?P<rate>\d+) exec/s\), "
    r"seed (?P<seed>\d+), corpus (?P<corpus>\d+), edges (?P<edges>\d+), cpu (?P<cpu>[\d.]+) s"
)
# Inputs per second of the fuzzer's own CPU time, below which a run fails as too slow: about
# a fifth of this machine's rate (600-700/s), however busy the machine is.
MIN_RUNS_PER_CPU_SECOND = 150


# Built with the sans-IO core (the socket loop is never called by the target) and the flags
# of the core's own sanitizer run (tests/test_udp_core_sanitizers.py), whose objects it
# shares. Every unit but the driver carries the coverage calls.
FUZZER = cpp_build.Program(
    "udp_fuzz",
    TARGET,
    groups=["udp_sans_io"],
    flags=cpp_build.ASAN_UBSAN,
    extra_sources=[ENDPOINT_MODE, DRIVER],
    unit_flags=lambda source: [] if source == DRIVER else cpp_build.COVERAGE,
)


@pytest.fixture(scope="module")
def udp_fuzz() -> Path:
    """The fuzzer (FUZZER), built by tests/cpp_build.py."""
    return FUZZER.build()


def _run(
    binary: Path,
    args: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [str(binary), *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **ENV, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{binary.name} {' '.join(args)} ran over {timeout} s:\n{e.stdout}\n{e.stderr}")


def _fuzz(
    binary: Path,
    work: Path,
    runs: int,
    seed: int,
    seconds: int = 0,
    corpus: bool = True,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Runs `runs` inputs (-1: until `seconds`) after the seeds and, with `corpus`, after
    tests/fuzz/corpus/; inputs that reach a new edge go to work/new, crashes to work/."""
    (work / "new").mkdir(parents=True, exist_ok=True)
    args = [
        f"-runs={runs}",
        f"-max_total_time={seconds}",
        f"-seed={seed}",
        f"-artifact_prefix={work}/",
        str(work / "new"),
        *([str(CORPUS)] if corpus else []),
    ]
    result = _run(binary, args, timeout=(seconds or 300) + 120, env=env)
    crashes = sorted(work.glob("*-*"))
    assert result.returncode == 0, (
        f"the fuzzer failed (exit code {result.returncode}, seed {seed}); "
        f"reproduce with: {binary} {' '.join(map(str, crashes)) or ' '.join(args)}\n"
        f"{result.stderr[-6000:]}\n{result.stdout[-2000:]}"
    )
    match, inited = DONE.search(result.stdout), INITED.search(result.stdout)
    assert match and inited, f"no summary line in the fuzzer's output:\n{result.stdout[-3000:]}"
    print(match.group(0))
    found = sorted((work / "new").iterdir())
    if found and corpus:
        print(
            f"{len(found)} inputs reached new edges; to keep them: "
            f"{binary} -merge=1 {CORPUS.relative_to(REPO)} {work / 'new'}"
        )
    return {k: float(v) for k, v in {**match.groupdict(), **inited.groupdict()}.items()}


def _seed(default: int) -> int:
    return int(os.environ.get("UDP_FUZZ_SEED", default))


@pytest.fixture(scope="module")
def loaded(udp_fuzz: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """Inputs a run executes before fuzzing (its -runs count them): the seeds and the corpus."""
    seeds = tmp_path_factory.mktemp("seeds") / "seeds"
    assert _run(udp_fuzz, [f"-dump_seeds={seeds}"], timeout=60).returncode == 0
    return len(list(seeds.iterdir())) + len(list(CORPUS.iterdir()))


def test_fuzz_quick(udp_fuzz: Path, loaded: int, tmp_path: Path) -> None:
    """The corpus, then 2000 inputs fuzzed from it. Counted in inputs, so a busy machine only
    makes it longer; too few inputs per second of the fuzzer's own CPU time fail it."""
    runs = loaded + 2000
    summary = _fuzz(udp_fuzz, tmp_path, runs=runs, seed=_seed(1), seconds=300)
    assert summary["inited"] == loaded, "the corpus was not loaded"
    assert summary["runs"] == runs, "stopped at its 300 s limit: far too slow"
    rate = summary["runs"] / max(summary["cpu"], 0.01)
    assert rate >= MIN_RUNS_PER_CPU_SECOND, (
        f"{rate:.0f} inputs per CPU second, under {MIN_RUNS_PER_CPU_SECOND}: "
        "the target or the core has become much slower"
    )
    assert summary["edges"] >= 1000  # the coverage instrumentation is there


def test_fuzz_authenticated(udp_fuzz: Path, loaded: int, tmp_path: Path) -> None:
    """The corpus and 500 more inputs with every endpoint in the authenticated mode
    (UDP_FUZZ_AUTH=1, tests/fuzz/endpoint_fuzz.cpp): nothing an attacker makes is accepted,
    a forged packet with the right token, rank and address included."""
    runs = loaded + 500
    summary = _fuzz(
        udp_fuzz, tmp_path, runs=runs, seed=_seed(2), seconds=300, env={"UDP_FUZZ_AUTH": "1"}
    )
    assert summary["runs"] == runs, "stopped at its 300 s limit: far too slow"


def test_coverage_guides_the_fuzzer(udp_fuzz: Path, tmp_path: Path) -> None:
    """From the built-in seeds alone (about 40), 500 inputs: coverage feedback adds inputs
    that reach new edges to the corpus (about a hundred here)."""
    summary = _fuzz(udp_fuzz, tmp_path, runs=500, seed=_seed(3), corpus=False)
    assert summary["edges"] >= 1000
    assert summary["corpus"] >= 50
    assert len(list((tmp_path / "new").iterdir())) >= 10


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


def test_merge_keeps_inputs_with_new_edges(udp_fuzz: Path, tmp_path: Path) -> None:
    """-merge=1 OUT IN copies the inputs that reach an edge the seeds do not: none of the
    seeds themselves, some of the corpus."""
    seeds, out = tmp_path / "seeds", tmp_path / "out"
    assert _run(udp_fuzz, [f"-dump_seeds={seeds}"], timeout=60).returncode == 0
    out.mkdir()
    merged = _run(udp_fuzz, ["-merge=1", str(out), str(seeds)], timeout=60)
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert list(out.iterdir()) == [], merged.stdout
    merged = _run(udp_fuzz, ["-merge=1", str(out), str(CORPUS)], timeout=120)
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert 0 < len(list(out.iterdir())) <= len(list(CORPUS.iterdir())), merged.stdout


def test_bad_flag_is_an_error(udp_fuzz: Path) -> None:
    result = _run(udp_fuzz, ["-no_such_flag=1"], timeout=30)
    assert result.returncode == 2
    assert "unknown flag -no_such_flag=1" in result.stderr


def test_planted_overflow_is_caught(udp_fuzz: Path, tmp_path: Path) -> None:
    """The harness can fail: with UDP_FUZZ_PLANTED_OVERFLOW set, the target writes one byte
    past a receive buffer; that is reported, the input is saved, and replaying it fails
    again (and passes without the variable)."""
    planted = {"UDP_FUZZ_PLANTED_OVERFLOW": "1"}
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    args = ["-runs=2000", "-max_total_time=60", "-seed=1", f"-artifact_prefix={artifacts}/"]
    result = _run(udp_fuzz, args, timeout=180, env=planted)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "use-after-poison" in result.stderr, result.stderr[-6000:]
    assert "udp_fuzz_target.cpp" in result.stderr  # the stack names the write
    crashes = sorted(artifacts.glob("crash-*"))
    assert len(crashes) == 1, result.stderr[-3000:]
    # Replayed where its copy would land (the default artifact prefix is ./): none is made,
    # the replayed file is named instead. (Replays in the repo once left crash-<hash> there,
    # a planted crash that later looked like a real one.)
    replay = _run(udp_fuzz, [str(crashes[0])], timeout=60, env=planted, cwd=tmp_path)
    assert replay.returncode != 0
    assert "use-after-poison" in replay.stderr
    assert f"crash while replaying {crashes[0]} (no artifact written)" in replay.stderr
    assert not list(tmp_path.glob("crash-*")), "the replay wrote a copy of its input"
    assert _run(udp_fuzz, [str(crashes[0])], timeout=60).returncode == 0


def test_abort_sent_from_outside_is_not_a_crash(udp_fuzz: Path, tmp_path: Path) -> None:
    """A SIGABRT that another process sends (a supervisor's timeout, kill -ABRT) is told from
    one the target raised: the sender's pid is printed, and the input goes to killed-<hash>,
    never to crash-<hash>, which replays as no crash."""
    args = ["-runs=-1", "-max_total_time=120", "-seed=1", f"-artifact_prefix={tmp_path}/"]
    proc = subprocess.Popen(
        [str(udp_fuzz), *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # fuzzing from here on: inside an input nearly all the time
            if "INITED" in line:
                break
        proc.send_signal(signal.SIGABRT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGABRT, stderr[-3000:]
    assert f"signal {int(signal.SIGABRT)} sent by pid {os.getpid()}" in stderr, stderr[-3000:]
    assert not list(tmp_path.glob("crash-*")), stderr[-3000:]


@pytest.mark.slow
def test_fuzz_long(udp_fuzz: Path, loaded: int, tmp_path: Path) -> None:
    """The corpus, then 10k inputs (``UDP_FUZZ_RUNS``; or ``UDP_FUZZ_SECONDS`` seconds) from
    another seed. From the corpus, coverage no longer grows: two runs of 20k inputs found no
    new edge, line or branch (docs/testing.md); this run is for what the quick one's 2000
    inputs may miss at the same coverage."""
    seconds = int(os.environ.get("UDP_FUZZ_SECONDS", "0"))
    runs = -1 if seconds else loaded + int(os.environ.get("UDP_FUZZ_RUNS", "10000"))
    summary = _fuzz(udp_fuzz, tmp_path, runs=runs, seed=_seed(2), seconds=seconds or 900)
    assert summary["inited"] == loaded, "the corpus was not loaded"
    if not seconds:
        assert summary["runs"] == runs, "stopped at its 900 s limit: far too slow"
