"""The udp backend's authenticated mode in C++ (transports/udp/datagram_auth.h): the groups of
tests/cpp/udp_auth_test.cpp (the auth layer alone and inside Endpoints on the simulated
network, and over real sockets), and the auth layer built without OpenSSL. Real 2-rank groups
are tests/test_udp_auth.py's.

Torch-free, so that tests/cpp_prebuild.py can import the programs and compile them on idle CPU
before these tests run (their compile was about 15 s of tests/test_udp_auth.py's time in a
loaded clean clone).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import cpp_build
import pytest

REPO = Path(__file__).resolve().parent.parent
GROUPS = [
    "replay_window",
    "seal_open",
    "keys",
    "secret_file",
    "forgery",
    "replay_and_instances",
    "fault_matrix",
    "mtu_room",
    "spoofed_socket",  # real sockets; a raw socket spoofs rank 1 (skipped without CAP_NET_RAW)
    "replay_safe_window",  # real sockets: the automatic window, the same in both modes
    "replay_small_datagrams",  # no more datagrams in flight than the replay window covers
]

AUTH = cpp_build.Program(
    "udp_auth_test",
    "tests/cpp/udp_auth_test.cpp",
    groups=["udp", "udp_sim"],
    flags=cpp_build.PLAIN,
)
# The auth layer compiled as setup.py compiles it where <openssl/evp.h> is missing.
AUTH_UNAVAILABLE = cpp_build.Program(
    "udp_auth_unavailable_test",
    "tests/cpp/udp_auth_unavailable_test.cpp",
    flags=[*cpp_build.PLAIN, "-DUCXB_WITHOUT_OPENSSL"],
    extra_sources=[
        "transports/udp/datagram_auth.cpp",
        "transports/udp/auth_keys.cpp",
        "transports/udp/replay_window.cpp",
    ],
)


def openssl() -> bool:
    """Whether the authenticated mode is built here (OpenSSL's headers were found)."""
    return cpp_build.link_libraries() == ["-lcrypto"]


@pytest.fixture(scope="module")
def auth_test() -> Path:
    if not openssl():
        pytest.skip("<openssl/evp.h> not found: the authenticated mode is not built")
    return AUTH.build()


def test_groups_are_all_listed(auth_test: Path) -> None:
    listed = subprocess.run([auth_test, "--list"], capture_output=True, text=True, timeout=30)
    assert [g for g in listed.stdout.split() if g != "measure"] == GROUPS


@pytest.mark.parametrize("group", GROUPS)
def test_auth_layer(auth_test: Path, group: str) -> None:
    run = subprocess.run([auth_test, group], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"[{group}] ok" in run.stdout, run.stdout


def test_build_without_openssl_refuses_the_mode() -> None:
    """The auth layer compiled as setup.py compiles it where <openssl/evp.h> is missing
    (-DUCXB_WITHOUT_OPENSSL): it builds, and asking for the mode names the fix."""
    run = subprocess.run([AUTH_UNAVAILABLE.build()], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[refused] ok" in run.stdout, run.stdout
