"""scripts/gpu_session.sh and its summary, on a machine without a GPU.

* The summary reads a session's files: a bench document made by the bench's own report code
  (so a change of its JSON breaks this test, not the GPU session), JUnit with a failure, a
  recorded property and a test that the time running out stopped, the steps and the smoke's
  lines; it says whether issue #20's targets (ucx >= 5x Gloo, >= 0.5x the d2d copy at
  64 MiB) are met, on both sides of each target.
* The script itself runs here end to end: its steps run under their caps (functions too),
  the build step fails at once on a torch without CUDA, the rest is skipped, the summary is
  written, and the exit status says that a step failed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from mps_fake import calls, install_fake_control, kinds

from ucxbackend.bench import report as bench_report
from ucxbackend.bench import sizes as bench_sizes
from ucxbackend.bench import timing as bench_timing

REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu.test_cuda_streams" name="test_stream_semantics[host-x]"/>
<testcase classname="tests.gpu.test_cuda_streams" name="test_stream_semantics[stream-y]">
<failure message="AssertionError: [rank 0] wait() returned after 0.512 s">tb</failure>
</testcase>
<testcase classname="tests.gpu.test_cuda_signed_zero" name="test_device_tie_rule">
<properties><property name="minimum(-0,+0)" value="-0.0"/></properties>
</testcase>
<testcase time="0.000" />
</testsuite></testsuites>
"""


def _m(us: float) -> bench_timing.Measurement:
    return bench_timing.Measurement(True, None, dict.fromkeys(("mean", "median", "min", "max"), us))


def _session(
    tmp: Path,
    ucx_us: float,
    gloo_us: float,
    copy_us: float,
    name: str = "bench.json",
    mps: dict[str, object] | None = None,
) -> Path:
    def ucx(size: int) -> bench_timing.Measurement:
        m = _m(ucx_us * size / (64 * MiB))
        per_op = {"transport_wait_us": 1700.0, "device_wait_us": 120.4}
        m.waits = {"iters": 20, "per_op": per_op}
        return m

    rows = [
        bench_report.Row(
            bench_sizes.layout_for("all_reduce", size, 4, 2),
            "float",
            "sum",
            -1,
            {"ucx": ucx(size), "gloo": _m(gloo_us * size / (64 * MiB))},
            limit=_m(copy_us * size / (64 * MiB)),
        )
        for size in (MiB, 64 * MiB)
    ]
    doc = {
        "world_size": 2,
        "mps": mps,
        "results": bench_report.row_records(rows, "mean", 2),
        "limits": bench_report.limit_records(rows, "mean"),
    }
    (tmp / name).write_text(json.dumps(doc))
    (tmp / "junit.xml").write_text(JUNIT)
    (tmp / "steps.tsv").write_text("facts\t0\t1\nbuild\t0\t40\ntests\t1\t200\n")
    (tmp / "smoke.log").write_text(
        "[rank 0] ok 0.6 s  wait() after a kernel, cuda_wait=stream: "
        "wait() blocked the host 0.004 s (the kernel before the op: 0.5 s or more)\n"
        "noise\ngpu_smoke: passed in 12.0 s\n"
    )
    return tmp


def _summary(out: Path, *more: Path) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_session_summary.py"), str(out),
         *map(str, more)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_summary_targets_met(tmp_path: Path) -> None:
    # 64 MiB: ucx 1000 us (67.1 GB/s busbw at 2 ranks), Gloo 10x slower, the copy 2x faster.
    text = _summary(_session(tmp_path, 1000.0, 10_000.0, 500.0))
    assert "all_reduce of 64 MiB" in text
    assert "- ucx: busbw 67.11 GB/s" in text
    # What the ucx column's ops waited for; Gloo's column has no such counts.
    assert "waits per op (both ranks): transport 1700 us, device 120 us" in text
    assert "- gloo: busbw 6.71 GB/s, unchecked wrong\n" in text
    assert "ucx / Gloo: 10.0x (target 5x: met)" in text
    assert "ucx / d2d copy: 0.50x (target 0.5x: met)" in text
    # The nameless test case: what pytest writes for a test that SIGINT stopped.
    assert "2 passed, 1 failed, 0 errors, 0 skipped, 1 interrupted" in text
    assert "test_stream_semantics[stream-y]` (failure): AssertionError" in text
    assert "minimum(-0,+0) = -0.0" in text
    assert "wait() blocked the host 0.004 s" in text and "noise" not in text
    assert "| tests | 1 | 200 |" in text


def test_summary_targets_missed(tmp_path: Path) -> None:
    text = _summary(_session(tmp_path, 1000.0, 4_900.0, 190.0))
    assert "ucx / Gloo: 4.9x (target 5x: NOT met)" in text
    assert "ucx / d2d copy: 0.19x (target 0.5x: NOT met)" in text


def test_summary_of_an_empty_session(tmp_path: Path) -> None:
    text = _summary(tmp_path)
    for what in ("steps.tsv", "junit.xml", "bench.json", "bench_mps.json", "smoke.log"):
        assert f"(no {what}" in text


def test_summary_of_the_bench_under_mps(tmp_path: Path) -> None:
    # The bench without MPS in OUT, the same under --mps in the scratch folder (the device
    # tool brings back 8 files of OUT): each section has #20's figures and whether MPS was
    # on, and the MPS one ucx's gain.
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    out.mkdir()
    scratch.mkdir()
    off = {"on": False, "private": False, "control_pipe": "/tmp/nvidia-mps/control", "note": "n"}
    _session(out, 8000.0, 80_000.0, 60.0, mps=off)
    on = {"on": True, "private": True, "control_pipe": "/tmp/ucxb-mps-x/pipe/control"}
    _session(scratch, 1000.0, 80_000.0, 60.0, name="bench_mps.json", mps=on)
    text = _summary(out, scratch)
    plain, under = text.split("## Bench (issue #20's table)", 1)[1].split(
        "## Bench under MPS (bench --mps)", 1
    )
    under = under.split("## Smoke", 1)[0]
    assert "all_reduce of 64 MiB, 2 ranks, MPS: off:" in plain
    assert "ucx / Gloo: 10.0x (target 5x: met)" in plain
    assert "ucx / d2d copy: 0.01x (target 0.5x: NOT met)" in plain
    assert "all_reduce of 64 MiB, 2 ranks, MPS: on, a private server (--mps):" in under
    assert "- ucx: busbw 67.11 GB/s" in under and "ucx / Gloo: 80.0x (target 5x: met)" in under
    assert "ucx / d2d copy: 0.06x (target 0.5x: NOT met)" in under
    assert "ucx under MPS / without, at 64 MiB: 8.0x (8.39 -> 67.11 GB/s)" in under
    # A document of a bench older than the mps record, and OUT's own copy first.
    _session(out, 500.0, 80_000.0, 60.0, name="bench_mps.json")
    text = _summary(out, scratch)
    assert "2 ranks, MPS: not recorded:" in text and "8.39 -> 134.22 GB/s" in text


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("torch").version.cuda is not None, reason="the build step would run on CUDA torch"
)
def test_session_script_without_a_gpu(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_ninja_wheel(wheels)
    site = tmp_path / "site"
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "GPU_SESSION_BUDGET_S": "120",
        "GPU_SESSION_WHEELS": str(wheels),
        "GPU_SESSION_SITE": str(site),
    }
    env.pop("MAKEFLAGS", None)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_session.sh")],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    steps = [line.split("\t") for line in (tmp_path / "steps.tsv").read_text().splitlines()]
    assert [s[:2] for s in steps] == [["facts", "0"], ["wheels", "0"], ["build", "2"]], steps
    assert "built without CUDA" in (tmp_path / "build.log").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert "| build | 2 |" in summary and "(no junit.xml" in summary
    log = (tmp_path / "session.log").read_text()
    assert "torch " in log and f"installed into {site}" in log, log
    # The carried ninja's binary (in the site's bin/, which --target leaves off PATH) is the
    # one the build finds: torch runs `ninja --version` from PATH.
    assert f"ninja 9.9.9-fake at {site}/bin/ninja" in log, log
    assert f"ninja for the build: {site}/bin/ninja" in log, log


TIMELINE_LOG = """== bench_mps: exit 0 in 30 s
size   1048576 B  all_reduce   1000.0 us  (a bench line: not the timeline's)
== timeline (cap 120 s) 10:00:00
-- timeline default: UCX's and the backend's defaults (10:00:00)
size          4 B  all_reduce     50.0 us  send/recv one way     20.0 us  values ok
[rank 0] size          4 B  all_reduce waits per op: tw us 40.0  dw us 2.0
[rank 1] size          4 B  all_reduce waits per op: tw us 41.0  dw us 2.0
contention probe: kernel + synchronize, median of 200: rank 0 alone 9.0 us, both 300.0 us
[rank 1] contention probe: both ranks at once 310.0 us
[rank 0] timeline of one all_reduce of 4 B (us from its issue on the host):
[rank 0]        1.0 +     2.0  stream    7  add_kernel
-- timeline get_zcopy: UCX_RNDV_SCHEME=get_zcopy (10:00:30)
rank pid 123 still running after 40.0 s: killed
-- timeline get_zcopy: exit 1
== timeline: exit 0 in 60 s
size     999 B  after the step: not the timeline's
"""


def test_summary_picks_the_timeline_headlines(tmp_path: Path) -> None:
    (tmp_path / "session.log").write_text(TIMELINE_LOG)
    text = _summary(tmp_path)
    section = text.split("## Timeline", 1)[1]
    for line in TIMELINE_LOG.splitlines()[3:9] + TIMELINE_LOG.splitlines()[11:14]:
        assert f"    {line.strip()}" in section, (line, section)
    # Not the device timelines (they stay in session.log), nor lines outside the step.
    assert "add_kernel" not in section and "timeline of one" not in section
    assert "bench line" not in section and "after the step" not in section


def test_summary_without_a_timeline(tmp_path: Path) -> None:
    (tmp_path / "session.log").write_text("== facts (cap 30 s)\n")
    assert "(the timeline step did not run)" in _summary(tmp_path)


def _run_session(tmp_path: Path, timeout: int, **env: str) -> subprocess.CompletedProcess[str]:
    wheels = tmp_path / "wheels"
    wheels.mkdir(exist_ok=True)
    full = {
        **os.environ,
        "OUT": str(tmp_path),
        "GPU_SESSION_WHEELS": str(wheels),
        "GPU_SESSION_SCRATCH": str(tmp_path / "scratch"),
        **env,
    }
    full.pop("MAKEFLAGS", None)
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_session.sh")],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
        cwd=tmp_path,
    )


def _steps(out: Path) -> list[list[str]]:
    return [line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines()]


def _mps_step_dry_run(out: Path, step: str) -> str:
    """Runs the session's MPS step ``step`` on this CPU machine: without
    nvidia-cuda-mps-control it is skipped, saying why; with one (the fake) it runs its bench
    with --mps, which stops at the missing CUDA before it starts any daemon. Returns the
    second run's session.log."""
    path = os.environ["PATH"]
    if shutil.which("nvidia-cuda-mps-control", path=path) is None:
        proc = _run_session(out, 120, GPU_SESSION_BUDGET_S="100", GPU_SESSION_STEPS=step,
                            PATH=path)
        assert proc.returncode == 1, proc.stdout + proc.stderr  # a step not passed
        assert _steps(out) == [["facts", "0"], ["wheels", "0"], [step, "skipped"]]
        log = (out / "session.log").read_text()
        assert f"== {step}: skipped, no nvidia-cuda-mps-control on PATH (bench --mps needs " \
               "it)" in log, log
    fake_dir = out / "fake"
    fake_dir.mkdir()
    bin_dir, record = install_fake_control(fake_dir)
    proc = _run_session(out, 120, GPU_SESSION_BUDGET_S="100", GPU_SESSION_STEPS=step,
                        PATH=f"{bin_dir}{os.pathsep}{path}", FAKE_MPS_RECORD=str(record))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _steps(out)[-1] == [step, "2"], _steps(out)
    log = (out / "session.log").read_text()
    assert "bench: error: --device cuda: CUDA is not available" in log, log
    assert calls(record) == []
    return log


@pytest.mark.slow
def test_bench_mps_step_dry_run(tmp_path: Path) -> None:
    log = _mps_step_dry_run(tmp_path, "bench_mps")
    assert "## Bench under MPS (bench --mps)\n\n(no bench_mps.json)" in log, log


@pytest.mark.slow
def test_peer_bench_step_dry_run(tmp_path: Path) -> None:
    # The bench under MPS with the peer-mapped all_reduce forced on.
    log = _mps_step_dry_run(tmp_path, "peer_bench")
    assert "-- peer_bench: UCXBACKEND_DEVICE_PEER_MAP=on, under a private MPS server" in log


@pytest.mark.slow
def test_timeline_step_dry_run_on_cpu(tmp_path: Path) -> None:
    # The timeline step end to end on CPU tensors (GPU_TIMELINE_DEVICE=cpu), three of its
    # runs, with the in-place build (GPU_SESSION_STEPS without "build"): each run's setting
    # reaches the ranks' environment, rank 0 prints its latencies and both ranks their waits
    # per op, and the summary picks them up. The mps run goes through `python -m
    # ucxbackend.mps` with the fake nvidia-cuda-mps-control: started before, quit after.
    from conftest import skip_unless_ucx

    skip_unless_ucx("gpu_timeline.py runs the ucx backend")
    fake_dir = tmp_path / "fake"
    fake_dir.mkdir()
    bin_dir, record = install_fake_control(fake_dir)
    proc = _run_session(
        tmp_path,
        300,
        GPU_SESSION_BUDGET_S="240",
        GPU_SESSION_STEPS="timeline",
        GPU_TIMELINE_DEVICE="cpu",
        GPU_TIMELINE_RUNS="default mps get_zcopy",
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        FAKE_MPS_RECORD=str(record),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = _steps(tmp_path)
    assert steps == [["facts", "0"], ["wheels", "0"], ["timeline", "0"]], steps
    log = (tmp_path / "session.log").read_text()
    assert "-- timeline default: UCX's and the backend's defaults" in log, log
    assert "-- timeline mps: the defaults under a private MPS server" in log, log
    assert "-- timeline get_zcopy: UCX_RNDV_SCHEME=get_zcopy" in log, log
    assert "-- timeline put_zcopy" not in log, log
    assert kinds(record) == ["start", "quit"], calls(record)
    pipe_dir = calls(record)[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert calls(record)[1]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe_dir
    assert f"ucxbackend.mps: MPS control daemon up, CUDA_MPS_PIPE_DIRECTORY={pipe_dir}" in log
    # (session.log also has the summary, which repeats the headlines.)
    step = log.split("== timeline (cap", 1)[1].split("== timeline:", 1)[0]
    # Both ranks, per size: the default run's 4 sizes, mps's 3 and get_zcopy's 3.
    assert step.count("all_reduce waits per op: tw us") == 2 * (4 + 3 + 3), step
    assert "timeline of one all_reduce of 16777216 B" in step, step  # the default run's profile
    assert step.count("contention probe") == 4, step  # default's and mps's, both ranks
    assert "values WRONG" not in step and "-- timeline default: exit" not in step, step
    assert "-- timeline get_zcopy: exit" not in step and "-- timeline mps: exit" not in step
    summary = (tmp_path / "summary.md").read_text()
    assert "| timeline | 0 |" in summary, summary
    assert "size   16777216 B  all_reduce" in summary.split("## Timeline", 1)[1], summary


def _fake_ninja_wheel(folder: Path) -> None:
    """A wheel shaped as ninja's (its binary a data script, bin/ninja once installed) whose
    `ninja --version` answers 9.9.9-fake: no registry needed."""
    name = "fakeninja-0.1"
    files = {
        "fakeninja/__init__.py": "",
        f"{name}.data/scripts/ninja": "#!/bin/sh\necho 9.9.9-fake\n",
        f"{name}.dist-info/METADATA": "Metadata-Version: 2.1\nName: fakeninja\nVersion: 0.1\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in [*files, f"{name}.dist-info/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-py3-none-any.whl", "w") as wheel:
        for path, text in {**files, f"{name}.dist-info/RECORD": record}.items():
            info = zipfile.ZipInfo(path)
            info.create_system = 3  # Unix: pip keeps the mode below
            info.external_attr = 0o100755 << 16  # a regular file, executable
            wheel.writestr(info, text)
