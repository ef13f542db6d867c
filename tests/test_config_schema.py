"""The one configuration schema (csrc/backend_options.cpp, transports/config/): Python's knobs
come from it, one size parser serves every layer, the C++ side rejects what Python would,
the docs' reference is rendered from it, and creating a group leaves ``os.environ`` alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ucxbackend
from ucxbackend import config as cfg
from ucxbackend import config_reference

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)


def _native() -> object:
    from ucxbackend import _C

    return _C


def test_python_knobs_are_the_schema() -> None:
    rows = _native().config.schema()  # type: ignore[attr-defined]
    public = [r for r in rows if not r["internal"]]
    assert list(cfg.KNOBS) == [r["name"] for r in public]
    for row in public:
        knob = cfg.KNOBS[row["name"]]
        assert knob.allowed == row["allowed"] and knob.help == row["help"], row
        assert knob.help.strip(), f"{row['name']} has no help"
        # every default is a value the parser itself accepts, unchanged
        assert knob.parse(str(row["default"])) == knob.default, row
    internal = {r["name"] for r in rows if r["internal"]}
    assert internal == {"transport", "udp_host", "ucx_net_devices"}
    assert not internal & set(cfg.KNOBS)


SIZES = [("4194304", 4 << 20), ("4M", 4 << 20), ("4MiB", 4 << 20), ("4 mb", 4 << 20),
         ("64k", 64 << 10), ("64KiB", 64 << 10), ("2G", 2 << 30), ("512B", 512)]
NOT_SIZES = ["4MX", "-1", "4.5M", "M", "", "0x10", "4 M B", "4iB"]


@pytest.mark.parametrize(("text", "value"), SIZES)
def test_one_size_grammar_everywhere(text: str, value: int) -> None:
    """A size reads the same in a knob, a udp_config key and the bench's parser."""
    assert cfg.parse_size(text) == value
    assert cfg.Config.from_env({"UCXBACKEND_CHUNK_BYTES": text}).chunk_bytes == value
    described = _native().udp.describe_config(f"max_message_bytes={text}")  # type: ignore[attr-defined]
    assert f"max_message_bytes={value}," in described
    assert cfg.parse_size(cfg.format_size(value)) == value


@pytest.mark.parametrize("text", NOT_SIZES)
def test_one_size_grammar_rejects_alike(text: str) -> None:
    with pytest.raises(ValueError):
        cfg.parse_size(text)
    if text.strip():
        with pytest.raises(ValueError, match="UCXBACKEND_CHUNK_BYTES"):
            cfg.Config.from_env({"UCXBACKEND_CHUNK_BYTES": text})
        with pytest.raises(ValueError, match="max_message_bytes"):
            _native().udp.describe_config(f"max_message_bytes={text}")  # type: ignore[attr-defined]


def test_udp_config_is_checked_when_written() -> None:
    """A udp_config value is parsed by the transport's own schema at config time, relations
    included, and comes back in canonical form."""
    c = cfg.Config.from_env({"UCXBACKEND_UDP_CONFIG": " send_window_bytes = 2M , congestion=AIMD"})
    assert c.udp_config == "send_window_bytes=2097152,congestion=aimd"
    with pytest.raises(ValueError, match=r"rto_min_us.*rto_max_us"):
        cfg.Options(udp_config="rto_min_us=500,rto_max_us=100")


def test_native_rejects_unknown_and_bad_options() -> None:
    """The C++ side checks every option it is handed (a stale or misspelt key from a caller
    that bypasses config.py is an error, not silently ignored)."""
    normalize = _native().config.normalize  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"unknown key 'spin'.*spin_us"):
        normalize("spin", "1")
    with pytest.raises(ValueError, match=r"progress_mode='fast' is invalid.*'sleep', 'poll'"):
        normalize("progress_mode", "fast")
    assert normalize("progress_mode", " POLL ") == "poll"
    with pytest.raises(ValueError, match=r"unknown key 'bogus'"):
        _native().algorithms.choose("allreduce", 8, 2, {"bogus": "1"})  # type: ignore[attr-defined]


def test_docs_reference_is_generated_from_the_schema() -> None:
    doc = REPO / "docs" / "configuration.md"
    text = doc.read_text()
    assert config_reference.BEGIN in text and config_reference.END in text
    assert config_reference.splice(text, config_reference.render()) == text, (
        "docs/configuration.md is stale: run `python -m ucxbackend config --write "
        "docs/configuration.md`"
    )
    for knob in cfg.KNOBS.values():
        assert f"`{knob.env_var}`" in text
    for key in cfg.udp_config_keys() + cfg.udp_fault_keys():
        assert f"| `{key}` |" in text


def test_group_creation_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """ifname reaches UCX through the group's own context: os.environ is never written, so a
    later group can pick other interfaces."""
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    before = dict(os.environ)
    store = dist.HashStore()
    try:
        dist.init_process_group(
            "ucx", store=store, rank=0, world_size=1, pg_options={"ifname": "lo"}
        )
        t = torch.arange(4, dtype=torch.int64)
        dist.all_reduce(t)
        assert t.tolist() == [0, 1, 2, 3]
        assert dict(os.environ) == before
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
