"""``python -m ucxbackend info``.

In-process tests use a stand-in ``_C`` and run without the build; the subprocess tests check
the real extension and skip with a reason when ``ucxbackend._C`` is not built.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ucxbackend
from ucxbackend import cli, doctor
from ucxbackend.config import KNOBS

REPO = Path(__file__).resolve().parent.parent

needs_native = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "UCXBACKEND_"))}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env.update(extra)
    return env


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ucxbackend", *args],
        env=_env() if env is None else env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


@functools.cache
def default_info_json() -> subprocess.CompletedProcess[str]:
    """``python -m ucxbackend info --json`` in the plain environment, run once for the tests
    that read it (each such run costs a torch import)."""
    return run_module("info", "--json")


def run_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    parsed = cli.build_parser().parse_args(list(args))
    rc = parsed._run(parsed, out, err)
    return rc, out.getvalue(), err.getvalue()


class FakeNative:
    __file__ = "/fake/_C.so"

    @staticmethod
    def ucx_version() -> str:
        return "9.8.7"

    @staticmethod
    def ucx_library_path() -> str:
        return "/fake/lib/libucp.so.0"

    @staticmethod
    def ucx_transports() -> list[tuple[str, str]]:
        return [("tcp", "lo"), ("posix", "memory"), ("tcp", "eth0"), ("tcp", "lo")]

    @staticmethod
    def build_info() -> dict[str, str]:
        return {"ucx_home": "/fake", "torch_version": "0.0.0"}

    @staticmethod
    def one_host_transport(options: dict[str, str]) -> tuple[str, str]:
        return ("shm", f"one_host_transport={options['one_host_transport']}")

    @staticmethod
    def ucx_defaults() -> list[tuple[list[str], str, str]]:
        return [
            (["UCX_FAKE_A"], "1s", "0.0"),
            (["UCX_FAKE_B", "UCX_FAKE_C"], "512k", "0.0"),
            (["UCX_FAKE_NEW"], "y", "9.9"),
        ]


class FakeCudaNative(FakeNative):
    @staticmethod
    def ucx_transports() -> list[tuple[str, str]]:
        return [("tcp", "lo"), ("cuda_copy", "cuda"), ("cuda_ipc", "cuda"), ("posix", "memory")]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for k in list(os.environ):
        if k.startswith(("UCX_", "UCXBACKEND_")):
            monkeypatch.delenv(k)
    return monkeypatch


# --------------------------------------------------------------------------- in process


def test_info_with_stand_in(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(ucxbackend, "_C", FakeNative())
    clean_env.setenv("UCX_TLS", "tcp,self")
    clean_env.setenv("UCX_FAKE_C", "1m")
    clean_env.setenv("UCXBACKEND_SPIN_US", "7")
    rc, out, err = run_main("info")
    assert rc == 0, err
    assert err == ""
    assert re.search(r"^UCX version\s+9\.8\.7$", out, re.M)
    assert re.search(r"^UCX library\s+/fake/lib/libucp\.so\.0$", out, re.M)
    assert re.search(r"^ucxbackend version\s+" + re.escape(ucxbackend.__version__), out, re.M)
    assert re.search(r"^\s+tcp\s+eth0, lo$", out, re.M)  # grouped, sorted, deduplicated
    assert re.search(r"^\s+posix\s+memory$", out, re.M)
    assert re.search(r"^\s+ucx_home\s+/fake$", out, re.M)
    assert re.search(r"^\s+UCX_FAKE_A\s+1s\s+applied$", out, re.M)
    # UCX 9.8.7 is too old for UCX_FAKE_NEW; UCX_FAKE_C is set, so its whole group is left alone
    assert re.search(r"^\s+UCX_FAKE_NEW\s+y\s+not applied: needs UCX >= 9\.9", out, re.M)
    for name in ("UCX_FAKE_B", "UCX_FAKE_C"):
        assert re.search(rf"^\s+{name}\s+512k\s+not applied: you set UCX_FAKE_C$", out, re.M)
    assert re.search(r"^\s+UCX_TLS\s+tcp,self$", out, re.M)
    assert re.search(r"^\s+spin_us\s+7\s+env\s+UCXBACKEND_SPIN_US$", out, re.M)
    assert re.search(r"^\s+progress_mode\s+sleep\s+default\s+UCXBACKEND_PROGRESS_MODE$", out, re.M)
    assert re.search(
        r"^\s+ucx groups\s+the backend's shared-memory rings \(one_host_transport=auto\)$",
        out,
        re.M,
    )


def test_info_json_with_stand_in(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(ucxbackend, "_C", FakeNative())
    clean_env.setenv("UCXBACKEND_PROGRESS_MODE", "poll")
    rc, out, _ = run_main("info", "--json")
    assert rc == 0
    info = json.loads(out)
    assert info["ok"] is True and info["errors"] == []
    assert info["ucx"]["version"] == "9.8.7"
    assert info["ucx"]["transports"] == {"posix": ["memory"], "tcp": ["eth0", "lo"]}
    assert info["build"] == {"ucx_home": "/fake", "torch_version": "0.0.0"}
    assert info["ucxbackend"]["version"] == ucxbackend.__version__
    config = {row["name"]: row for row in info["config"]}
    assert config["progress_mode"]["value"] == "poll"
    assert config["progress_mode"]["source"] == "env"
    assert config["spin_us"] == {
        "name": "spin_us",
        "value": 250,
        "source": "default",
        "env_var": "UCXBACKEND_SPIN_US",
        "default": 250,
        "allowed": "an integer from 0 to 2147483647",
    }


def test_info_native_missing(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(ucxbackend, "_C", None)
    clean_env.setattr(ucxbackend, "_C_error", ImportError("libucp.so.0: cannot open"))
    rc, out, err = run_main("info")
    assert rc == 1
    assert "NOT LOADED" in out
    assert "ucxbackend._C could not be loaded" in err
    assert "libucp.so.0: cannot open" in err
    assert "make build" in err
    rc, out, _ = run_main("info", "--json")
    assert rc == 1
    info = json.loads(out)
    assert info["ok"] is False
    assert info["ucx"] is None
    assert info["ucxbackend"]["native_loaded"] is False
    assert "libucp.so.0" in info["ucxbackend"]["native_error"]


def test_info_native_query_fails(clean_env: pytest.MonkeyPatch) -> None:
    class Broken(FakeNative):
        @staticmethod
        def ucx_transports() -> list[tuple[str, str]]:
            raise RuntimeError("ucp_init failed")

    clean_env.setattr(ucxbackend, "_C", Broken())
    rc, out, err = run_main("info")
    assert rc == 1
    assert "ucp_init failed" in err
    assert re.search(r"^UCX version\s+9\.8\.7$", out, re.M)  # the rest is still reported


def test_info_bad_config(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(ucxbackend, "_C", FakeNative())
    clean_env.setenv("UCXBACKEND_PROGRESS_MODE", "turbo")
    clean_env.setenv("UCXBACKEND_TYPO", "1")
    rc, out, err = run_main("info")
    assert rc == 1
    assert "UCXBACKEND_PROGRESS_MODE='turbo'" in err
    assert "'sleep', 'poll'" in err
    assert "UCXBACKEND_TYPO" in out


def _fake_host(root: Path, *, rdma: bool, peermem: bool, gpu: bool) -> doctor.Inputs:
    """doctor's inputs for a fake host under ``root`` (only what the CUDA lines read)."""
    p = doctor.Paths.under(root)
    if rdma:
        (root / "dev/infiniband").mkdir(parents=True)
        (root / "dev/infiniband/uverbs0").touch()
    if peermem:
        (root / "sys/module/nvidia_peermem").mkdir(parents=True)
    if gpu:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX Kernel Module")
    return doctor.Inputs(paths=p, kernel_release="5.4.0", cuda_available=gpu)


def test_info_cuda_section(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setattr(ucxbackend, "_C", FakeCudaNative())
    inputs = _fake_host(tmp_path / "a", rdma=True, peermem=True, gpu=True)
    info = cli.collect_info(doctor_inputs=inputs)
    cuda = info["cuda"]
    assert cuda["ucx_transports"] == {"cuda_copy": ["cuda"], "cuda_ipc": ["cuda"]}
    assert cuda["ucx_missing"] == ["gdr_copy"]
    gdr = cuda["gpudirect_rdma"]
    assert gdr["possible"] is True and gdr["nvidia_peermem"] is True and gdr["rdma_devices"]
    assert "pinned host memory" in cuda["udp"]
    text = cli.format_info(info)
    section = text.split("\nCUDA\n", 1)[1].split("\n\n", 1)[0]
    assert re.search(
        r"^\s+UCX CUDA transports\s+cuda_copy \(cuda\), cuda_ipc \(cuda\); absent: gdr_copy$",
        section,
        re.M,
    ), section
    assert re.search(r"^\s+GPUDirect RDMA\s+possible: .*nvidia_peermem loaded$", section, re.M)
    assert re.search(r"^\s+udp\s+stages CUDA tensors through pinned host memory", section, re.M)
    json.dumps(info)  # still JSON-serialisable

    # A GPU and RDMA, but neither nvidia_peermem nor dma-buf (kernel 5.4): not possible.
    inputs = _fake_host(tmp_path / "b", rdma=True, peermem=False, gpu=True)
    gdr = cli.collect_info(doctor_inputs=inputs)["cuda"]["gpudirect_rdma"]
    assert gdr["applicable"] and not gdr["possible"]
    assert gdr["summary"].startswith("not possible")
    # No RDMA device: not applicable, whatever else.
    inputs = _fake_host(tmp_path / "c", rdma=False, peermem=True, gpu=True)
    gdr = cli.collect_info(doctor_inputs=inputs)["cuda"]["gpudirect_rdma"]
    assert not gdr["applicable"] and not gdr["possible"]
    assert gdr["summary"].startswith("not applicable: no RDMA devices")
    # No GPU: not applicable either.
    inputs = _fake_host(tmp_path / "d", rdma=True, peermem=True, gpu=False)
    gdr = cli.collect_info(doctor_inputs=inputs)["cuda"]["gpudirect_rdma"]
    assert not gdr["applicable"] and not gdr["possible"] and not gdr["gpu"]


def test_info_cuda_section_without_cuda_transports(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.setattr(ucxbackend, "_C", FakeNative())
    inputs = _fake_host(tmp_path, rdma=False, peermem=False, gpu=False)
    info = cli.collect_info(doctor_inputs=inputs)
    assert info["cuda"]["ucx_transports"] == {}
    assert info["cuda"]["ucx_missing"] == list(cli.CUDA_TRANSPORTS)
    assert re.search(
        r"^\s+UCX CUDA transports\s+none \(cuda_copy, cuda_ipc, gdr_copy absent",
        cli.format_info(info),
        re.M,
    )
    clean_env.setattr(ucxbackend, "_C", None)
    info = cli.collect_info(doctor_inputs=inputs)
    assert info["cuda"]["ucx_transports"] is None
    assert re.search(r"^\s+UCX CUDA transports\s+unknown", cli.format_info(info), re.M)


def test_parser_requires_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2
    assert "info" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert ucxbackend.__version__ in capsys.readouterr().out


# --------------------------------------------------------------------------- subprocess


def _cpu_flags() -> set[str] | None:
    """The first CPU's feature flags from /proc/cpuinfo (None where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def _native_facts() -> dict[str, Any]:
    native = ucxbackend._C
    assert native is not None
    return {"version": native.ucx_version(), "library": native.ucx_library_path()}


@needs_native
def test_info_subprocess() -> None:
    proc = run_module("info", env=_env(UCX_TLS="tcp,self,sm", UCXBACKEND_SPIN_US="11"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    facts = _native_facts()
    m = re.search(r"^UCX version\s+(\S+)$", out, re.M)
    assert m, out
    assert m.group(1) == facts["version"]
    assert re.search(r"^UCX library\s+" + re.escape(facts["library"]) + "$", out, re.M)
    section = out.split("Transports UCX sees", 1)[1].split("\n\n", 1)[0]
    tcp = re.search(r"^\s+tcp\s+(.*)$", section, re.M)
    assert tcp, section
    assert "lo" in [d.strip() for d in tcp.group(1).split(",")]
    assert re.search(r"^\s+UCX_TLS\s+tcp,self,sm$", out, re.M)
    assert re.search(r"^\s+spin_us\s+11\s+env\s+UCXBACKEND_SPIN_US$", out, re.M)
    assert re.search(r"^\s+UCX CUDA transports\s+\S", out, re.M)
    assert re.search(r"^\s+GPUDirect RDMA\s+(possible|not possible|not applicable)", out, re.M)
    assert re.search(r"^\s+udp\s+stages CUDA tensors through pinned host memory", out, re.M)
    import torch

    assert torch.__version__ in out


@needs_native
def test_info_json_subprocess() -> None:
    proc = default_info_json()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    facts = _native_facts()
    assert info["ok"] is True
    assert info["ucx"]["version"] == facts["version"]
    assert info["ucx"]["library_path"] == facts["library"]
    assert "lo" in info["ucx"]["transports"]["tcp"]
    assert set(info["build"]) >= {"ucx_home", "torch_version", "udp_crc32c"}
    # The checksum kernel matches what the CPU offers (x86-64 Linux: /proc/cpuinfo's flags).
    flags = _cpu_flags()
    if flags is not None:
        expected = (
            "vpclmulqdq"
            if {"avx512f", "vpclmulqdq", "pclmulqdq", "sse4_2"} <= flags
            else "sse4.2"
            if "sse4_2" in flags
            else "tables"
        )
        assert info["build"]["udp_crc32c"] == expected
    assert info["torch"]["ucx_registered"] is True
    assert [row["name"] for row in info["config"]] == list(KNOBS)
    # The CUDA transports reported are exactly those among what the loaded UCX lists.
    native = ucxbackend._C
    assert native is not None
    listed = {str(t) for t, _ in native.ucx_transports()}
    cuda = info["cuda"]
    assert set(cuda["ucx_transports"]) == listed & set(cli.CUDA_TRANSPORTS)
    assert set(cuda["ucx_missing"]) == set(cli.CUDA_TRANSPORTS) - listed
    assert set(cuda["gpudirect_rdma"]) >= {"possible", "applicable", "summary"}


def _ucx_at_least(major: int, minor: int) -> bool:
    native = ucxbackend._C
    assert native is not None
    parts = [int(p) for p in native.ucx_version().split(".")[:2]]
    return tuple(parts) >= (major, minor)


@needs_native
def test_info_shows_the_ucx_settings_the_backend_chooses() -> None:
    """The TCP segment sizes are one setting: a user who sets either keeps UCX's defaults for
    both (UCX refuses RX < TX), and info says which of the backend's choices are in force.
    UCX before 1.22 cannot take the segment sizes from the backend."""

    def defaults(**env: str) -> dict[str, bool]:
        proc = run_module("info", "--json", env=_env(**env)) if env else default_info_json()
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = json.loads(proc.stdout)["ucx"]["defaults"]
        return {row["variable"]: row["applied"] for row in rows}

    tcp = {"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"}
    always = {
        "UCX_POSIX_ERROR_HANDLING",
        "UCX_SYSV_ERROR_HANDLING",
        "UCX_KEEPALIVE_INTERVAL",
        "UCX_POSIX_FIFO_SIZE",
        "UCX_SYSV_FIFO_SIZE",
        "UCX_POSIX_RX_BUFS_GROW",
        "UCX_SYSV_RX_BUFS_GROW",
    }
    new_enough = _ucx_at_least(1, 22)
    assert defaults() == {**dict.fromkeys(always, True), **dict.fromkeys(tcp, new_enough)}
    mine = defaults(
        UCX_TCP_RX_SEG_SIZE="64k", UCX_KEEPALIVE_INTERVAL="5s", UCX_SYSV_RX_BUFS_GROW="512"
    )
    bufs = {"UCX_POSIX_RX_BUFS_GROW", "UCX_SYSV_RX_BUFS_GROW"}
    assert {k for k, applied in mine.items() if not applied} == {
        *tcp,
        *bufs,
        "UCX_KEEPALIVE_INTERVAL",
    }


@needs_native
def test_tcp_segment_sizes_reach_ucx() -> None:
    """The 512 KiB segments reach UCX: its protocol table (UCX_PROTO_INFO) sends messages up to
    ~270 KB by zero-copy eager, where with its own 8 KiB segments that stops at ~16 KB."""
    if not _ucx_at_least(1, 22):
        pytest.skip("UCX before 1.22 cannot take the segment sizes from the backend")

    def tcp_protocols(**env: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "ucxbackend", "bench", "all_reduce", "-b", "1M", "-e", "1M",
             "-n", "1", "-w", "0", "--backends", "ucx"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env=_env(OMP_NUM_THREADS="1", UCX_TLS="tcp,self", UCX_PROTO_INFO="y", **env),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc.stdout + proc.stderr

    def largest_zero_copy_eager(text: str) -> int:
        bounds = re.findall(r"\|\s*\d+\.\.(\d+)\s*\|\s*eager zero-copy copy-out\s*\|\s*tcp/", text)
        assert bounds, text[-3000:]
        return max(int(b) for b in bounds)

    # A zero-copy eager fragment is at most one TX segment.
    assert largest_zero_copy_eager(tcp_protocols()) > 256 << 10
    ucx_own = tcp_protocols(UCX_TCP_TX_SEG_SIZE="8k", UCX_TCP_RX_SEG_SIZE="64k")
    assert largest_zero_copy_eager(ucx_own) < 64 << 10


def test_info_subprocess_without_native() -> None:
    # Blocks the extension's import whether or not it is built.
    code = (
        "import sys\n"
        "sys.modules['ucxbackend._C'] = None\n"
        "from ucxbackend.cli import main\n"
        "sys.exit(main(['info']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ucxbackend._C could not be loaded" in proc.stderr
    assert "make build" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(ucxbackend._C is None, reason="needs the native module")
def test_info_says_what_carries_a_one_host_group(clean_env: pytest.MonkeyPatch) -> None:
    """The factory's own rule (csrc/transport_factory.cpp oneHostTransport), through info:
    the rings by default, UCX where the user set UCX_TLS or asked for ucx."""
    from ucxbackend import cli

    assert cli.collect_info()["one_host"] == {
        "transport": "shm",
        "why": "one_host_transport=auto",
    }
    clean_env.setenv("UCX_TLS", "all")
    assert cli.collect_info()["one_host"] == {
        "transport": "ucx",
        "why": "one_host_transport=auto and UCX_TLS is set",
    }
    clean_env.delenv("UCX_TLS")
    clean_env.setenv("UCXBACKEND_ONE_HOST_TRANSPORT", "ucx")
    assert cli.collect_info()["one_host"]["transport"] == "ucx"
