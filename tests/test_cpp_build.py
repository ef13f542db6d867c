"""tests/cpp_build.py's prebuild (tests/cpp_prebuild.py runs it while make test runs): it
fills the cache that build() then links from, and leaves alone a unit that another process is
compiling. A three-unit program at -O0 in a private cache, so that it costs a second or two."""

from __future__ import annotations

import fcntl
import subprocess
from collections.abc import Callable
from pathlib import Path

import cpp_build
import pytest

PROBE = cpp_build.Program(
    "tls_probe",
    "tests/cpp/shared_memory_tls_probe.cpp",
    flags=["-O0"],
    extra_sources=["transports/ucx/shared_memory_tls.cpp", "tests/cpp/no_coverage.cpp"],
)
UNITS = [PROBE.main, *PROBE.extra_sources]


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cpp_build, "BUILD", tmp_path)
    return tmp_path


def _object(source: str) -> Path:
    return cpp_build._object_path(source, [*cpp_build.BASE_FLAGS, *PROBE.flags])


def test_prebuild_fills_the_cache_that_build_links_from(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpp_build, "PCH_MIN_UNITS", 2)  # the precompiled headers' path too
    cpp_build.prebuild(PROBE)
    assert all(_object(s).exists() for s in UNITS)
    assert list(private_cache.glob("obj/pch-*/std.h.gch")), "no precompiled headers"
    assert not list(private_cache.glob("prebuild-*")), "its scratch folder was left behind"

    def no_compile(*args: object) -> None:
        raise AssertionError(f"build() compiled {args[0]} again")

    monkeypatch.setattr(cpp_build, "_compile", no_compile)
    exe = PROBE.build()
    run = subprocess.run([exe, "posix"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_prebuild_leaves_a_unit_being_compiled_elsewhere(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy = _object(PROBE.main)
    install = cpp_build._install

    def checked_install(make: Callable[[Path], None], target: Path, scratch: Path) -> bool:
        # Fail here: installing it would wait for the lock this test holds, for ever.
        assert target != busy, "the prebuild compiled a unit that another process compiles"
        return install(make, target, scratch)

    monkeypatch.setattr(cpp_build, "_install", checked_install)
    busy.parent.mkdir(parents=True, exist_ok=True)
    with open(busy.with_name(busy.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as _compile holds it while it compiles
        cpp_build.prebuild(PROBE)
    assert not busy.exists()
    assert all(_object(s).exists() for s in PROBE.extra_sources)
