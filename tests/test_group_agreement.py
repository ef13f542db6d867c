"""What the ranks of a group must agree on, checked when the group is created (csrc/handshake.h):
every rank publishes its address in a record naming its transport and carrying the settings
flagged "must agree" in the schema, and every rank checks every record before its transport
sees an address. A group whose ranks run different backends, or differ in such a setting, fails
on every rank with an error naming both sides; settings that may differ per rank do not.
"""

from __future__ import annotations

from typing import Any

import cpp_build
import pytest
import torch
import torch.distributed as dist
from dist_harness import error_of, run_world

import ucxbackend

pytestmark = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)

# Bounds for worlds that the code before the check hung or crashed in (a udp rank waited for a
# session token a ucx rank 0 never published; a ucx rank aborted in UCX).
_WORLD = {"backend": "gloo", "timeout": 60.0, "pg_timeout": 20.0}


def _mixed_backends(rank: int, world_size: int) -> list[str]:
    """Two groups whose ranks run different backends, each way round (rank 0 is udp, then
    rank 1): what creating each one raised on this rank."""
    return [
        error_of(lambda u=udp_rank: dist.new_group(backend="udp" if rank == u else "ucx"))
        for udp_rank in (0, 1)
    ]


def _disagreeing_members(rank: int, world_size: int) -> dict[str, str]:
    """One group id on one Store, created by two processes told different members: this one
    as rank 0 of global ranks [0, 1], the other as rank 1 of [0, 2] (what torch's new_group
    with different rank lists on different ranks makes, as its group names count calls: the
    process of global rank 2 joins where global rank 1 should). What each creation raised, or
    what an all_reduce on the group then returned, per backend."""
    from datetime import timedelta

    from ucxbackend import _C

    store = dist.PrefixStore("members/", dist.distributed_c10d._get_default_store())
    out = {}
    for backend in ("ucx", "udp"):
        members = [0, 1] if rank == 0 else [0, 2]

        def create_and_reduce(b: str = backend, m: list[int] = members) -> None:
            group = _C.create_backend(store, rank, 2, timedelta(seconds=10), f"g-{b}", m,
                                      {"transport": b})
            t = torch.full((4,), float(m[rank] + 1))
            group.allreduce([t]).wait()
            group.shutdown()
            raise AssertionError(f"created, and the all_reduce returned {t.tolist()}")

        out[backend] = error_of(create_and_reduce)
    return out


# An address of TEST-NET-1 (RFC 5737): on no host's interface, so binding it fails.
_NOT_HERE = "192.0.2.1"


def _unmakeable_transport(rank: int, world_size: int) -> tuple[float, str]:
    """A udp group whose rank 1 cannot make its transport (its socket cannot bind udp_host):
    how long creating it took on this rank, and what it raised."""
    import time
    from datetime import timedelta

    from ucxbackend import _C

    store = dist.PrefixStore("unmakeable/", dist.distributed_c10d._get_default_store())
    options = {"transport": "udp", **({"udp_host": _NOT_HERE} if rank == 1 else {})}
    start = time.monotonic()
    error = error_of(lambda: _C.create_backend(store, rank, 2, timedelta(seconds=10), "g-bind",
                                               [0, 1], options).shutdown())
    return time.monotonic() - start, error


def _groups(rank: int, world_size: int) -> dict[str, Any]:
    """The checks in one world (a world costs seconds to start, a group milliseconds)."""
    return {
        "settings": _disagreeing_settings(rank, world_size),
        "mixed": _mixed_backends(rank, world_size),
        "members": _disagreeing_members(rank, world_size),
        "unmakeable": _unmakeable_transport(rank, world_size),
    }


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_world(_groups, 2, **_WORLD)


def test_mixed_backends_fail_on_every_rank_naming_both(world: list[dict[str, Any]]) -> None:
    for rank, messages in enumerate(r["mixed"] for r in world):
        for udp_rank, message in zip((0, 1), messages, strict=True):
            mine, theirs = ("udp", "ucx") if rank == udp_rank else ("ucx", "udp")
            assert message.startswith(f"DistBackendError: {mine}: setting up group"), message
            assert f"rank {1 - rank} published a {theirs} address but this group is {mine}" in (
                message
            ), message


def test_a_rank_without_a_transport_fails_every_rank_at_once(
    world: list[dict[str, Any]],
) -> None:
    """A rank whose transport cannot be made publishes why in its record instead of leaving:
    the other rank fails at once naming it and the reason, not after the Store's timeout
    (_WORLD's pg_timeout, which the code before waited out)."""
    for rank, (seconds, message) in enumerate(r["unmakeable"] for r in world):
        assert message.startswith("DistBackendError: udp: setting up group 'g-bind'"), message
        assert _NOT_HERE in message, message
        assert seconds < _WORLD["pg_timeout"] / 2, (rank, seconds, message)
        if rank == 0:
            assert "rank 1 could not make its udp transport" in message, message


def _disagreeing_settings(rank: int, world_size: int) -> dict[str, str]:
    """Groups whose ranks differ in settings that must agree (creating them fails), then groups
    whose ranks differ only in settings that may differ (they work)."""
    out: dict[str, str] = {}
    first = rank == 0
    out["ucx"] = error_of(
        lambda: dist.new_group(
            backend="ucx",
            pg_options={
                "chunk_bytes": "4M" if first else "1M",
                "algo_allreduce": "ring" if first else "auto",
                "progress_mode": "sleep" if first else "poll",  # may differ: not named
            },
        )
    )
    out["udp"] = error_of(
        lambda: dist.new_group(
            backend="udp",
            pg_options={
                # eager_max_bytes must agree; mtu_payload and loss_recovery may differ
                "udp_config": "eager_max_bytes=64K,mtu_payload=8972"
                if first
                else "eager_max_bytes=16K,loss_recovery=go_back_n"
            },
        )
    )
    local_ucx = {
        "progress_mode": "poll" if first else "sleep",
        "spin_us": 10 if first else 500,
        "shared_memory": "auto" if first else "off",  # the staging rounds agree: staging off
        "staging_stores": "streaming" if first else "cached",
    }
    local_udp = {
        "spin_us": 10 if first else 500,
        "udp_config": "mtu_payload=1472,loss_recovery=go_back_n,congestion=aimd,rto_min_us=500"
        if first
        else "mtu_payload=8972,tail_probes=0,peer_timeout_us=9000000",
        "udp_faults": "dup=0.01,seed=3" if first else "",
    }
    for backend, options in (("ucx", local_ucx), ("udp", local_udp)):
        group = dist.new_group(backend=backend, pg_options=options)
        t = torch.arange(300_000, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(t, group=group)
        expected = torch.arange(300_000, dtype=torch.float32) * sum(range(1, world_size + 1))
        out[f"local {backend}"] = "ok" if torch.equal(t, expected) else "wrong result"
    return out


def test_disagreeing_settings_fail_on_every_rank_naming_them(world: list[dict[str, Any]]) -> None:
    def values(rank: int, mine: str, theirs: str) -> str:
        return f"'{mine}' on rank {rank} (this rank) but '{theirs}' on rank {1 - rank}"

    for rank, got in enumerate(r["settings"] for r in world):
        ucx, udp = got["ucx"], got["udp"]
        assert ucx.startswith("DistBackendError: ucx: setting up group"), ucx
        assert "must be the same on every rank" in ucx, ucx
        chunk = ("4194304", "1048576") if rank == 0 else ("1048576", "4194304")
        algo = ("ring", "auto") if rank == 0 else ("auto", "ring")
        assert f"chunk_bytes is {values(rank, *chunk)}" in ucx, ucx
        assert f"algo_allreduce is {values(rank, *algo)}" in ucx, ucx
        assert "progress_mode" not in ucx and "sizes" not in ucx, ucx
        assert udp.startswith("DistBackendError: udp: setting up group"), udp
        eager = ("65536", "16384") if rank == 0 else ("16384", "65536")
        assert f"udp_config.eager_max_bytes is {values(rank, *eager)}" in udp, udp
        assert "mtu_payload" not in udp and "loss_recovery" not in udp, udp
        assert got["local ucx"] == "ok" and got["local udp"] == "ok", got


def test_handshake_unit() -> None:
    """The record's encoding and every check on it, without torch (tests/cpp/handshake_test.cpp)."""
    cpp_build.check_unit("handshake_test", extra_sources=["csrc/handshake.cpp"])


def test_must_agree_is_in_the_schema() -> None:
    """One flag per Field says which settings must agree; Python, and the reference, show it."""
    from ucxbackend import _C, config_reference
    from ucxbackend import config as cfg

    rows = _C.config.schema()
    flagged = {r["name"] for r in rows if r["must_agree"]}
    algos = {f"algo_{op}" for op in cfg.ALGORITHMS}
    # udp_config is flagged for the udp_config keys flagged in their own table.
    # secret_file: the ranks compare a key check derived from it (csrc/udp_auth_setup.hpp).
    # one_host_transport: one rank's ucx address means nothing to another's shm transport.
    # device_peer_map: a rank that maps waits for notices a peer on another algorithm never sends.
    assert flagged == {
        "transport",
        "chunk_bytes",
        "device_chunk_bytes",
        "device_peer_map",
        "udp_config",
        "secret_file",
        "one_host_transport",
        *algos,
    }, flagged
    assert {k for k, knob in cfg.KNOBS.items() if knob.must_agree} == flagged - {"transport"}
    udp_flagged = {r["name"] for r in _C.udp.config_schema() if r["must_agree"]}
    assert udp_flagged == {
        "unexpected_bytes",
        "eager_max_bytes",
        "max_message_bytes",
        "paths",
        "cc_credit_initial_bytes",
    }
    assert not any(r["must_agree"] for r in _C.udp.fault_schema())
    reference = config_reference.render()
    assert "| `chunk_bytes` | `UCXBACKEND_CHUNK_BYTES` | `4194304` | yes |" in reference
    assert "| `spin_us` | `UCXBACKEND_SPIN_US` | `250` | no |" in reference
    assert "| `unexpected_bytes` | `1048576` | yes |" in reference


@pytest.mark.parametrize("backend", ["ucx", "udp"])
def test_ranks_told_different_members_fail_naming_both_lists(
    world: list[dict[str, Any]], backend: str
) -> None:
    # Before the record carried the members, both creations succeeded and the all_reduce
    # returned [4.0, ...] on both: global rank 0's 1.0 plus global rank 2's 3.0, in a group
    # that global rank 0 had created with global rank 1.
    lists = {0: "[0,1]", 1: "[0,2]"}
    for rank, r in enumerate(world):
        message = r["members"][backend]
        assert message.startswith(f"DistBackendError: {backend}: setting up group"), message
        assert (
            f"rank {1 - rank} joined this group as a member of global ranks '{lists[1 - rank]}'"
            f" but rank {rank} (this rank) of '{lists[rank]}'"
        ) in message, message
