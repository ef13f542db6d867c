"""``ucxbackend.mps`` and ``bench --mps`` on a machine without a GPU.

A fake ``nvidia-cuda-mps-control`` first on PATH (``mps_fake.py``) records every invocation
and plays the daemon's part that the helper uses.

Checked: the daemon's start, the environment the ranks get, its stop on every way out (a
normal end, an exception inside, Ctrl-C, SIGTERM, a rank failing), the errors (no binary, a
daemon that does not come up or refuses, ``--mps`` without ``--device cuda`` or under
torchrun), the bench's note condition and its header and JSON, and that a forked rank keeps
SIGTERM's default action while its launcher turns SIGTERM into an exception.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench_harness import options
from mps_fake import calls, install_fake_control, kinds

from ucxbackend import mps
from ucxbackend.bench import common as bench_common
from ucxbackend.bench import launcher as bench_launcher
from ucxbackend.bench import mpi as bench_mpi
from ucxbackend.bench import report as bench_report
from ucxbackend.bench import runner as bench_runner

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake control first on PATH; yields its record file (JSON lines)."""
    bin_dir, record = install_fake_control(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.delenv("FAKE_MPS", raising=False)
    for name in (mps.PIPE_ENV, mps.LOG_ENV):
        monkeypatch.delenv(name, raising=False)
    yield record


def assert_stopped(record: Path, env: dict[str, str]) -> None:
    """Started once and quit once, both with ``env``, and the directory gone."""
    seen = calls(record)
    assert kinds(record) == ["start", "quit"], seen
    assert all(c["env"] == env for c in seen), seen
    assert not Path(env[mps.PIPE_ENV]).exists()


def test_start_hands_out_a_private_environment_and_stop_quits(fake: Path) -> None:
    server = mps.PrivateMps("--mps")
    env = server.start()
    # Its own directories, named in the environment the ranks get, the control pipe there.
    assert set(env) == {mps.PIPE_ENV, mps.LOG_ENV}
    pipe_dir, log_dir = Path(env[mps.PIPE_ENV]), Path(env[mps.LOG_ENV])
    assert pipe_dir.parent == log_dir.parent == server.directory
    assert pipe_dir.parent.name.startswith("ucxb-mps-") and log_dir.is_dir()
    assert stat.S_ISFIFO((pipe_dir / "control").stat().st_mode)
    assert server.pipe == pipe_dir / "control" and mps.server_running(env)
    assert kinds(fake) == ["start"] and calls(fake)[0]["env"] == env
    # The ranks' environment: the launcher's, with the server's added.
    rank_env = bench_launcher.child_env({**os.environ, **env}, 1, 2, 1234)
    assert rank_env[mps.PIPE_ENV] == str(pipe_dir) and rank_env[mps.LOG_ENV] == str(log_dir)
    assert server.stop() is None
    assert_stopped(fake, env)
    assert not pipe_dir.parent.exists()
    assert server.stop() is None and kinds(fake) == ["start", "quit"]  # once only


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt])
def test_with_block_stops_on_an_exception_inside(fake: Path, exc: type[BaseException]) -> None:
    env: dict[str, str] = {}
    with pytest.raises(exc):
        with mps.PrivateMps("--mps") as server:
            env = dict(server.env)
            assert kinds(fake) == ["start"]
            raise exc("inside")
    assert_stopped(fake, env)


def test_no_control_on_path(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(mps.MpsUnavailable, match=r"--mps: nvidia-cuda-mps-control is not on PATH"):
        mps.PrivateMps("--mps").start()
    assert calls(fake) == []


def test_a_daemon_that_does_not_come_up(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS", "no-pipe")
    server = mps.PrivateMps("--mps", start_timeout=0.3)
    with pytest.raises(mps.MpsStartFailed, match=r"--mps: the MPS control daemon did not come up "
                       r"within 0.3 s \(no control pipe at .*/pipe/control\)"):
        server.start()
    # Told to quit all the same (it may come up late), and its directory gone.
    assert kinds(fake) == ["start", "quit"]
    assert not Path(calls(fake)[0]["env"][mps.PIPE_ENV]).exists()


def test_a_daemon_that_refuses(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS", "refuse")
    with pytest.raises(mps.MpsStartFailed, match=r"`nvidia-cuda-mps-control -d` exited with "
                       r"status 1: An instance of this daemon is already running"):
        mps.PrivateMps("--mps").start()


def test_a_quit_that_fails_is_reported_not_raised(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = mps.PrivateMps("--mps")
    env = server.start()
    monkeypatch.setenv("FAKE_MPS", "stuck-quit")
    server.base_env["FAKE_MPS"] = "stuck-quit"
    problem = server.stop()
    assert problem is not None
    assert "--mps: the MPS control daemon did not quit" in problem
    assert "Cannot find MPS control daemon process" in problem and env[mps.PIPE_ENV] in problem
    assert Path(env[mps.PIPE_ENV]).exists()  # left for a daemon that may still use it
    shutil.rmtree(Path(env[mps.PIPE_ENV]).parent)  # the test's own leftover: no daemon here


def test_control_pipe_and_server_running(tmp_path: Path) -> None:
    assert mps.control_pipe({}) == Path("/tmp/nvidia-mps/control")
    env = {mps.PIPE_ENV: str(tmp_path)}
    assert mps.control_pipe(env) == tmp_path / "control"
    assert not mps.server_running(env)
    os.mkfifo(tmp_path / "control")
    assert mps.server_running(env)


@pytest.mark.parametrize(
    ("ranks", "gpus", "mps_on", "noted"),
    [
        (2, 1, False, True),  # the GPU session: two ranks on one H200
        (4, 2, False, True),
        (2, 1, True, False),  # --mps, or a server already running
        (1, 1, False, False),
        (2, 2, False, False),  # a GPU each: no second context to switch to
        (2, 0, False, False),  # no GPU: the bench's own error says so
    ],
)
def test_sharing_note(ranks: int, gpus: int, mps_on: bool, noted: bool) -> None:
    note = mps.sharing_note(ranks, gpus, mps_on)
    assert (note is not None) == noted
    if note is not None:
        assert note.startswith(f"note: {ranks} ranks share {gpus} GPU")
        assert "0.25 ms per device wait" in note and "--mps starts one" in note
        assert mps.DOCS in note and "\n" not in note


# ---- bench --mps: the launcher's wiring, the options, the rank's header and JSON ----


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """launch() with the environment checks passed and the ranks replaced: what
    ``launch_ranks`` got, and whether the server ran while it was called."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(bench_launcher, "validate_environment", lambda opts, world: None)

    def launch_ranks(command: str, argv: list[str], world: int, timeout: float, err: Any,
                     extra_env: dict[str, str] | None = None) -> int:
        seen.update(argv=argv, extra_env=dict(extra_env or {}))
        seen["running"] = mps.server_running(extra_env or {"CUDA_MPS_PIPE_DIRECTORY": "/none"})
        outcome = seen.get("outcome", bench_common.EXIT_OK)
        if isinstance(outcome, BaseException):
            raise outcome
        return int(outcome)

    monkeypatch.setattr(bench_launcher, "launch_ranks", launch_ranks)
    return seen


@pytest.mark.parametrize(
    "outcome",
    [bench_common.EXIT_OK, bench_common.EXIT_FAILED, RuntimeError("rank 1 blew up"),
     KeyboardInterrupt()],
    ids=["ok", "a-rank-failed", "exception", "ctrl-c"],
)
def test_bench_mps_runs_the_ranks_under_the_server_and_stops_it(
    fake: Path, launch_env: dict[str, Any], outcome: int | BaseException
) -> None:
    launch_env["outcome"] = outcome
    opts = options("--device", "cuda", "--mps")
    err = io.StringIO()
    if isinstance(outcome, BaseException):
        with pytest.raises(type(outcome)):
            bench_launcher.launch(opts, err)
    else:
        assert bench_launcher.launch(opts, err) == outcome
    env = launch_env["extra_env"]
    assert set(env) == {mps.PIPE_ENV, mps.LOG_ENV} and launch_env["running"]
    assert "--mps" in launch_env["argv"]  # the ranks' header says it was on
    assert_stopped(fake, env)
    assert err.getvalue() == ""


def test_bench_without_mps_starts_nothing(fake: Path, launch_env: dict[str, Any]) -> None:
    assert bench_launcher.launch(options("--device", "cuda"), io.StringIO()) == 0
    assert launch_env["extra_env"] == {} and calls(fake) == []


def test_bench_mps_errors(
    fake: Path, launch_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = options("--device", "cuda", "--mps")
    monkeypatch.setenv("FAKE_MPS", "refuse")
    with pytest.raises(bench_common.BenchError, match="--mps: `nvidia-cuda-mps-control -d`"):
        bench_launcher.launch(opts, io.StringIO())
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(bench_common.UsageError, match="--mps: nvidia-cuda-mps-control is not"):
        bench_launcher.launch(opts, io.StringIO())
    assert "argv" not in launch_env  # no rank was started
    with pytest.raises(bench_common.UsageError, match="--mps needs --device cuda"):
        options("--mps")


def test_mps_option_reaches_the_ranks_and_the_json() -> None:
    from bench_harness import parse_args

    from ucxbackend.bench import options as bench_options

    opts = options("--device", "cuda", "--mps")
    assert opts.mps and not options("--device", "cuda").mps
    assert bench_options.BenchOptions.from_args(parse_args(*opts.to_argv())) == opts
    assert opts.describe()["mps"] is True


def test_mps_under_torchrun_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(bench_common.ARGV_ENV, raising=False)
    with pytest.raises(bench_common.UsageError, match="--mps starts the ranks' MPS server from "
                       "the bench's own launcher, which torchrun replaces"):
        bench_runner.run_rank(options("--device", "cuda", "--mps"), io.StringIO(), io.StringIO())


def test_header_and_json_say_whether_mps_was_on(tmp_path: Path) -> None:
    versions = {"ucxbackend": "0", "torch": "t", "ucx": "u", "python": "p"}
    no_server = {mps.PIPE_ENV: str(tmp_path)}
    cuda, private = options("--device", "cuda"), options("--device", "cuda", "--mps")

    def header(opts: Any, state: Any) -> str:
        return "\n".join(bench_report.header_lines(
            opts, 2, versions, [], bench_mpi.MpiOutcome("not requested"), None, state))

    off = bench_runner.mps_state(cuda, no_server, 2, 1)
    assert off is not None and not off["on"] and off["note"] == mps.sharing_note(2, 1, False)
    text = header(cuda, off)
    assert f"# mps: off (no control pipe at {tmp_path}/control)" in text
    assert f"# {mps.sharing_note(2, 1, False)}" in text
    # One GPU each: the header says MPS is off, and no note.
    assert "# note:" not in header(cuda, bench_runner.mps_state(cuda, no_server, 2, 2))
    os.mkfifo(tmp_path / "control")
    running = bench_runner.mps_state(cuda, no_server, 2, 1)
    assert running == {"on": True, "private": False, "control_pipe": f"{tmp_path}/control",
                       "note": None}
    assert f"# mps: on (an MPS server's control pipe at {tmp_path}/control)" in header(
        cuda, running)
    mine = bench_runner.mps_state(private, no_server, 2, 1)
    assert "# mps: on, a private server that --mps started" in header(private, mine)
    assert "note" not in header(private, mine)
    # CPU tensors: nothing about MPS.
    assert bench_runner.mps_state(options(), no_server, 2, 1) is None
    assert "mps" not in header(options(), None)
    report = bench_report.build_report(
        opts=private, world=2, rows_by_collective={}, columns=[], versions={}, command=[],
        mpi={}, mps=mine,
    )
    assert report["mps"] == mine
    assert bench_report.build_report(
        opts=options(), world=2, rows_by_collective={}, columns=[], versions={}, command=[],
        mpi={},
    )["mps"] is None


def test_a_forked_rank_dies_at_sigterm_while_its_launcher_would_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A rank that sleeps in Python: a Python-level SIGTERM handler inherited from the launcher
    # would run there (SystemExit(143), exit status 143); the rank's own default action kills
    # it (-SIGTERM), as it must, since a rank blocked in a native wait never runs a handler.
    import ucxbackend.cli

    monkeypatch.setattr(ucxbackend.cli, "main", lambda argv: time.sleep(60) or 0)
    with mps.terminate_raises():
        rank = bench_launcher.ForkedRank([], dict(os.environ))
        try:
            time.sleep(0.3)
            os.kill(rank.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while rank.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            rank.kill()
            rank.wait()
    assert rank.returncode == -signal.SIGTERM


# ---- python -m ucxbackend.mps COMMAND: what scripts/gpu_session.sh's timeline uses ----


def _module(*command: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ucxbackend.mps", "--", *command],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def test_module_runs_a_command_under_the_server(fake: Path) -> None:
    proc = _module("sh", "-c", 'test -p "$CUDA_MPS_PIPE_DIRECTORY/control" && '
                   'echo "$CUDA_MPS_PIPE_DIRECTORY"; exit 7')
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err  # the command's status
    env = calls(fake)[0]["env"]
    assert out.strip() == env[mps.PIPE_ENV], err
    assert_stopped(fake, env)


def test_module_stops_the_server_at_sigterm(fake: Path) -> None:
    proc = _module("sleep", "60")
    deadline = time.monotonic() + 30
    while "start" not in kinds(fake) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the command started
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert_stopped(fake, calls(fake)[0]["env"])


def test_module_without_the_control(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    proc = _module("true")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "ucxbackend.mps: error: nvidia-cuda-mps-control is not on PATH" in err
