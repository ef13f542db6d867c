"""The udp backend's authenticated mode (``secret_file``; transports/udp/datagram_auth.h).

Without it, anyone who can reach a rank's port and read the session token (it is in the Store
and in every datagram) can inject traffic; with it, every datagram is sealed with AES-256-GCM
under keys derived from a secret every rank shares, bound to the group and its instance, and a
forged, altered, replayed or stale datagram is dropped and counted. The C++ programs
(tests/test_udp_auth_programs.py) run the auth layer alone and inside Endpoints on the
simulated network; here, real 2-rank groups: results against numpy, mismatched secrets failing
at creation on every rank, bad secret files refused with a clear error.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_harness import error_of, run_world
from test_udp_auth_programs import openssl

import ucxbackend

REPO = Path(__file__).resolve().parent.parent

needs_extension = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)
_WORLD = {"backend": "gloo", "timeout": 90.0, "pg_timeout": 20.0}


@needs_extension
def test_info_says_whether_the_mode_is_built() -> None:
    """`python -m ucxbackend info` (build_info) tells a user whether secret_file can work."""
    from ucxbackend import _C

    expected = "openssl (aes-256-gcm)" if openssl() else "unavailable (built without OpenSSL)"
    assert _C.build_info()["udp_auth"] == expected


def _write_secret(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def _auth_world(rank: int, world_size: int, secrets: dict[str, str]) -> dict[str, Any]:
    """Collectives on a udp group authenticated through UCXBACKEND_SECRET_FILE against numpy,
    its drop counters, a ucx group under the same environment, then creations that must fail:
    another secret on rank 1, no secret on rank 1."""
    out: dict[str, Any] = {}
    group = dist.new_group(backend="udp")  # UCXBACKEND_SECRET_FILE, from the environment
    results = {}
    for dtype, np_dtype in ((torch.int64, np.int64), (torch.float32, np.float32)):
        n = 1 << 18  # 2 MB of int64: rendezvous, many datagrams
        t = torch.arange(n, dtype=dtype) * (rank + 1) + rank
        dist.all_reduce(t, group=group)
        base = np.arange(n, dtype=np_dtype)
        expected = sum(base * (r + 1) + r for r in range(world_size)).astype(np_dtype)
        results[f"all_reduce {dtype}"] = bool(np.array_equal(t.numpy(), expected))
    gathered = [torch.zeros(1000, dtype=torch.int32) for _ in range(world_size)]
    dist.all_gather(gathered, torch.full((1000,), rank + 7, dtype=torch.int32), group=group)
    results["all_gather"] = all(bool((g == r + 7).all()) for r, g in enumerate(gathered))
    b = (
        torch.arange(100_000, dtype=torch.int64)
        if rank == 0
        else torch.zeros(100_000, dtype=torch.int64)
    )
    dist.broadcast(b, src=0, group=group)
    results["broadcast"] = bool(torch.equal(b, torch.arange(100_000, dtype=torch.int64)))
    out["results"] = results
    stats = ucxbackend.stats(group)
    out["total"] = {k: v for k, v in stats["total"].items() if k.startswith("dropped")}
    out["authenticated"] = stats["transport"]["authenticated"]
    dist.destroy_process_group(group)
    # The ucx backend ignores the knob (UCX has no authentication): same environment, works.
    ucx = dist.new_group(backend="ucx")
    t = torch.full((1000,), rank + 1, dtype=torch.int64)
    dist.all_reduce(t, group=ucx)
    out["ucx ignores it"] = bool((t == sum(range(1, world_size + 1))).all())
    dist.destroy_process_group(ucx)
    other = secrets["other"] if rank == 1 else secrets["good"]
    out["other secret"] = error_of(
        lambda: dist.new_group(backend="udp", pg_options={"secret_file": other})
    )
    none = "" if rank == 1 else secrets["good"]
    out["no secret"] = error_of(
        lambda: dist.new_group(backend="udp", pg_options={"secret_file": none})
    )
    return out


@needs_extension
def test_authenticated_groups(tmp_path: Path) -> None:
    if not openssl():
        pytest.skip("built without OpenSSL")
    secrets = {
        "good": _write_secret(tmp_path / "good", os.urandom(64)),
        "other": _write_secret(tmp_path / "other", os.urandom(64)),
    }
    env = {"UCXBACKEND_SECRET_FILE": secrets["good"]}
    world = run_world(_auth_world, 2, args=(secrets,), env=env, **_WORLD)
    for r in world:
        assert r["results"] and all(r["results"].values()), r["results"]
        assert r["authenticated"] == 1 and r["ucx ignores it"]
        assert r["total"]["dropped_auth_failed"] == 0 and r["total"]["dropped_replayed"] == 0
        for case in ("other secret", "no secret"):
            message = r[case]
            assert message.startswith("DistBackendError: udp: setting up group"), message
            assert "secret_file is '" in message and "'on, key check " in message, message
            assert "must be the same on every rank" in message, message
        assert "'off' on rank 1" in r["no secret"], r["no secret"]


@needs_extension
@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        ("missing", "cannot be read: No such file or directory"),
        ("short", "holds 16 bytes; a secret needs at least 32"),
        ("open", "is accessible by group or others (mode 644)"),
    ],
)
def test_bad_secret_file_is_a_clear_error(tmp_path: Path, case: str, fragment: str) -> None:
    if not openssl():
        pytest.skip("built without OpenSSL")
    path = tmp_path / "secret"
    if case == "short":
        _write_secret(path, b"x" * 16)
    elif case == "open":
        _write_secret(path, b"x" * 64, 0o644)
    world = run_world(_bad_secret, 1, args=(str(path),), **_WORLD)
    message = world[0]
    assert message.startswith("ValueError: udp: secret_file (UCXBACKEND_SECRET_FILE)"), message
    assert fragment in message, message


def _bad_secret(rank: int, world_size: int, path: str) -> str:
    return error_of(lambda: dist.new_group(backend="udp", pg_options={"secret_file": path}))


def _one_bad_secret(rank: int, world_size: int, good: str, bad: str) -> dict[str, Any]:
    start = time.monotonic()
    path = bad if rank == 1 else good
    message = error_of(lambda: dist.new_group(backend="udp", pg_options={"secret_file": path}))
    return {"message": message, "seconds": time.monotonic() - start}


@needs_extension
def test_one_bad_secret_file_fails_every_rank_at_once(tmp_path: Path) -> None:
    """A secret file that one rank cannot use fails the creation on every rank, naming that
    rank's reason, as a disagreeing setting does: never the others waiting for the Store's
    timeout (pg_timeout, 20 s here) for a record that rank never publishes."""
    if not openssl():
        pytest.skip("built without OpenSSL")
    good = _write_secret(tmp_path / "good", os.urandom(64))
    bad = _write_secret(tmp_path / "bad", os.urandom(64), 0o644)
    world = run_world(_one_bad_secret, 2, args=(good, bad), **_WORLD)
    mine = world[1]["message"]
    assert mine.startswith("ValueError: udp: secret_file (UCXBACKEND_SECRET_FILE)"), mine
    assert "mode 644" in mine, mine
    other = world[0]["message"]
    assert other.startswith("DistBackendError: udp: setting up group"), other
    assert "secret_file is 'on, key check " in other and "on rank 1" in other, other
    assert "is accessible by group or others (mode 644)" in other, other
    for r in world:
        assert r["seconds"] < 10.0, r
