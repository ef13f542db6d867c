"""The 64-bit tag layout (transports/tag.h): fields round-trip and never collide."""

from __future__ import annotations

import itertools

import pytest

_C = pytest.importorskip("ucxbackend._C", reason="the native extension is not built")
tags = _C.tags


def test_collective_fields_round_trip() -> None:
    t = tags.collective(group=1234, seq=987654, step=321, src=4321)
    assert tags.fields(t) == {
        "p2p": False, "group": 1234, "seq": 987654, "step": 321,
        "user": (987654 << 16) | 321, "src": 4321,
    }


def test_p2p_fields_round_trip_and_differ_from_collectives() -> None:
    t = tags.p2p(group=7, user_tag=2**31 - 1, src=65535)
    f = tags.fields(t)
    assert (f["p2p"], f["group"], f["user"], f["src"]) == (True, 7, 2**31 - 1, 65535)
    assert t != tags.collective(group=7, seq=0, step=0, src=65535)


def test_distinct_fields_never_collide_within_the_window() -> None:
    groups = [0, 1, 2047]
    seqs = [0, 1, 2, tags.SEQ_WINDOW - 1]
    steps = [0, 1, 255, tags.MAX_STEPS - 1]
    srcs = [0, 1, 3, tags.MAX_RANKS - 1]
    seen: dict[int, tuple[int, int, int, int]] = {}
    for combo in itertools.product(groups, seqs, steps, srcs):
        t = tags.collective(*combo)
        assert t not in seen, f"{combo} collides with {seen[t]}"
        seen[t] = combo
    for g, user, src in itertools.product(groups, [0, 1, 2**31 - 1], srcs):
        t = tags.p2p(g, user, src)
        assert t not in seen
        seen[t] = (g, user, src, -1)


def test_sequence_wraps_only_after_the_window() -> None:
    a = tags.collective(group=5, seq=3, step=0, src=0)
    assert tags.collective(group=5, seq=3 + tags.SEQ_WINDOW, step=0, src=0) == a
    assert all(
        tags.collective(group=5, seq=3 + k, step=0, src=0) != a
        for k in range(1, 4096)
    )


def test_any_source_mask_ignores_only_the_source() -> None:
    mask = tags.ANY_SOURCE_MASK
    a = tags.p2p(group=3, user_tag=11, src=0)
    b = tags.p2p(group=3, user_tag=11, src=9)
    c = tags.p2p(group=3, user_tag=12, src=0)
    assert a & mask == b & mask
    assert a & mask != c & mask
    assert tags.fields(mask)["src"] == 0


def test_group_hash_is_stable_and_bounded() -> None:
    h = tags.group_hash("default_pg")
    assert h == tags.group_hash("default_pg")
    assert 0 <= h < 2048
    assert len({tags.group_hash(str(i)) for i in range(100)}) > 90
