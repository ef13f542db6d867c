"""Configuration (ucxbackend.config), Options and backend registration.

Everything here runs without the native extension except the tests marked as needing it,
which skip with a reason when ``ucxbackend._C`` is not built. The registration path through
``init_process_group`` is exercised with a stand-in ``_C`` whose ``create_backend`` records
its arguments and returns a Gloo backend.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import importlib
import logging
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

import ucxbackend
from ucxbackend import config as cfg
from ucxbackend.config import KNOBS, Config, Options, coerce_options

REPO = Path(__file__).resolve().parent.parent

needs_native = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)

# The inline path, algorithm selection, chunking, staging and network knobs, at their defaults.
TUNING_DEFAULTS: dict[str, object] = {
    "inline_bytes": 1 << 20,
    "chunk_bytes": 4 << 20,
    "device_chunk_bytes": 64 << 20,
    **{f"algo_{op}": "auto" for op in cfg.ALGORITHMS},
    "shared_memory": "auto",
    "send_lane": "auto",
    "one_host_transport": "auto",
    "staging_stores": "auto",
    "ifname": "",
    "udp_config": "",
    "udp_faults": "",
    "secret_file": "",
    "cuda": 1,
    "cuda_wait": "host",
    "device_peer_map": "off",
}
TUNING_NATIVE = {k: str(v) for k, v in TUNING_DEFAULTS.items()}
DEFAULTS = {
    "progress_mode": "sleep",
    "spin_us": 250,
    "log_level": "WARNING",
    **TUNING_DEFAULTS,
}


# --------------------------------------------------------------------------- defaults / env


def test_defaults() -> None:
    c = Config()
    assert {k: getattr(c, k) for k in DEFAULTS} == DEFAULTS
    assert dict(c.sources) == dict.fromkeys(DEFAULTS, "default")
    assert Config.from_env({}) == c
    assert {k.name: k.default for k in KNOBS.values()} == DEFAULTS


def test_knob_env_var_names() -> None:
    assert {k.env_var for k in KNOBS.values()} == {
        "UCXBACKEND_PROGRESS_MODE",
        "UCXBACKEND_SPIN_US",
        "UCXBACKEND_INLINE_BYTES",
        "UCXBACKEND_LOG_LEVEL",
        "UCXBACKEND_CHUNK_BYTES",
        "UCXBACKEND_DEVICE_CHUNK_BYTES",
        *(f"UCXBACKEND_ALGO_{op.upper()}" for op in cfg.ALGORITHMS),
        "UCXBACKEND_SHARED_MEMORY",
        "UCXBACKEND_SEND_LANE",
        "UCXBACKEND_ONE_HOST_TRANSPORT",
        "UCXBACKEND_STAGING_STORES",
        "UCXBACKEND_IFNAME",
        "UCXBACKEND_UDP_CONFIG",
        "UCXBACKEND_UDP_FAULTS",
        "UCXBACKEND_SECRET_FILE",
        "UCXBACKEND_CUDA",
        "UCXBACKEND_CUDA_WAIT",
        "UCXBACKEND_DEVICE_PEER_MAP",
    }


def test_staging_stores_knob() -> None:
    assert Config.from_env({"UCXBACKEND_STAGING_STORES": "streaming"}).staging_stores == (
        "streaming"
    )
    assert Options(staging_stores="cached").resolve({}).staging_stores == "cached"
    assert Config(staging_stores="streaming").to_native()["staging_stores"] == "streaming"
    choices = r"UCXBACKEND_STAGING_STORES.*'auto', 'cached', 'streaming'"
    with pytest.raises(ValueError, match=choices):
        Config.from_env({"UCXBACKEND_STAGING_STORES": "nontemporal"})


@pytest.mark.parametrize("raw", ["eth0", " eth,ib ", "=eth0", "^docker,lo", "^=lo"])
def test_ifname_knob(raw: str) -> None:
    assert Config.from_env({"UCXBACKEND_IFNAME": raw}).ifname == raw.strip()


@pytest.mark.parametrize("raw", ["eth0,,eth1", "^", "="])
def test_ifname_knob_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="UCXBACKEND_IFNAME"):
        Config.from_env({"UCXBACKEND_IFNAME": raw})


@pytest.mark.parametrize(
    ("knob", "raw", "value"),
    [
        ("udp_config", "loss_recovery=go_back_n", "loss_recovery=go_back_n"),
        (
            "udp_config",
            " mtu_payload = 8972 , congestion=aimd ",
            "mtu_payload=8972,congestion=aimd",
        ),
        ("udp_config", "", ""),
        ("udp_faults", "drop=0.01,dup=0.001,seed=7", "drop=0.01,dup=0.001,seed=7"),
    ],
)
def test_udp_knobs(knob: str, raw: str, value: str) -> None:
    assert getattr(Config.from_env({f"UCXBACKEND_{knob.upper()}": raw}), knob) == value
    assert getattr(Options.from_mapping({knob: raw}).resolve({}), knob) == value


@pytest.mark.parametrize(
    ("knob", "raw"),
    [
        ("udp_config", "loss=go_back_n"),  # unknown key
        ("udp_config", "mtu_payload"),  # no value
        ("udp_faults", "drop=0.1,seed="),
        ("udp_faults", "mtu_payload=1000"),  # a config key, not a fault key
    ],
)
def test_udp_knobs_reject(knob: str, raw: str) -> None:
    with pytest.raises(ValueError, match=f"UCXBACKEND_{knob.upper()}"):
        Config.from_env({f"UCXBACKEND_{knob.upper()}": raw})


@needs_native
def test_udp_key_lists_match_native() -> None:
    """config.py's key lists are the C++ schemas' (transports/udp/)."""
    from ucxbackend import _C

    assert cfg.udp_config_keys() == tuple(r["name"] for r in _C.udp.config_schema())
    assert cfg.udp_fault_keys() == tuple(r["name"] for r in _C.udp.fault_schema())
    assert "loss_recovery" in cfg.udp_config_keys() and "drop" in cfg.udp_fault_keys()


@pytest.mark.parametrize(
    ("var", "raw", "knob", "value"),
    [
        ("UCXBACKEND_PROGRESS_MODE", "poll", "progress_mode", "poll"),
        ("UCXBACKEND_PROGRESS_MODE", " POLL ", "progress_mode", "poll"),
        ("UCXBACKEND_PROGRESS_MODE", "sleep", "progress_mode", "sleep"),
        ("UCXBACKEND_SPIN_US", "0", "spin_us", 0),
        ("UCXBACKEND_SPIN_US", "1000", "spin_us", 1000),
        ("UCXBACKEND_SPIN_US", str(2**31 - 1), "spin_us", 2**31 - 1),
        ("UCXBACKEND_LOG_LEVEL", "debug", "log_level", "DEBUG"),
        ("UCXBACKEND_LOG_LEVEL", "ERROR", "log_level", "ERROR"),
    ],
)
def test_env(var: str, raw: str, knob: str, value: object) -> None:
    c = Config.from_env({var: raw})
    assert getattr(c, knob) == value
    assert c.sources[knob] == "env"
    others = set(DEFAULTS) - {knob}
    assert all(c.sources[k] == "default" for k in others)
    assert all(getattr(c, k) == DEFAULTS[k] for k in others)


@pytest.mark.parametrize("raw", ["", "   "])
def test_empty_env_counts_as_unset(raw: str) -> None:
    c = Config.from_env({"UCXBACKEND_SPIN_US": raw, "UCXBACKEND_PROGRESS_MODE": raw})
    assert c == Config()
    assert c.sources["spin_us"] == "default"


def test_unrelated_env_ignored() -> None:
    env = {"UCX_TLS": "tcp", "UCXBACKEND_SPINUS": "7", "PATH": "/bin"}
    assert Config.from_env(env) == Config()
    assert cfg.unknown_env_vars(env) == ["UCXBACKEND_SPINUS"]


def test_every_documented_test_hook_is_known() -> None:
    """The test-only hooks docs/testing.md lists are not knobs, and not typos either: a rank
    that sets one (a test does) must not be warned about an unknown UCXBACKEND_ variable.
    UCXBACKEND_TEST_KILL_AT was missing from the list until 2026-11-28."""
    import re

    page = (REPO / "docs" / "testing.md").read_text()
    section = page.split("## Test-only hooks", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(UCXBACKEND_[A-Z_]+)", section, flags=re.M))
    assert "UCXBACKEND_TEST_KILL_AT" in documented, documented
    assert documented <= cfg.TEST_HOOK_ENV_VARS, documented - cfg.TEST_HOOK_ENV_VARS
    assert cfg.unknown_env_vars({name: "1" for name in documented}) == []


BAD_ENV = [
    ("UCXBACKEND_PROGRESS_MODE", "fast", "'sleep', 'poll'"),
    ("UCXBACKEND_PROGRESS_MODE", "sleep,poll", "'sleep', 'poll'"),
    ("UCXBACKEND_SPIN_US", "-1", "an integer from 0 to 2147483647"),
    ("UCXBACKEND_SPIN_US", "abc", "an integer from 0 to 2147483647"),
    ("UCXBACKEND_SPIN_US", "1.5", "an integer from 0 to 2147483647"),
    ("UCXBACKEND_SPIN_US", "0x10", "an integer from 0 to 2147483647"),
    ("UCXBACKEND_SPIN_US", str(2**31), "an integer from 0 to 2147483647"),
    ("UCXBACKEND_LOG_LEVEL", "TRACE", "'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
    ("UCXBACKEND_LOG_LEVEL", "WARN", "'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
]


@pytest.mark.parametrize(("var", "raw", "allowed"), BAD_ENV)
def test_bad_env_value(var: str, raw: str, allowed: str) -> None:
    with pytest.raises(ValueError) as info:
        Config.from_env({var: raw})
    message = str(info.value)
    assert var in message
    assert repr(raw) in message
    assert allowed in message


def test_get_config_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for knob in KNOBS.values():
        monkeypatch.delenv(knob.env_var, raising=False)
    assert ucxbackend.get_config() == Config()
    monkeypatch.setenv("UCXBACKEND_SPIN_US", "7")
    monkeypatch.setenv("UCXBACKEND_PROGRESS_MODE", "poll")
    c = ucxbackend.get_config()
    assert (c.spin_us, c.progress_mode) == (7, "poll")
    assert c.sources["spin_us"] == "env"
    monkeypatch.setenv("UCXBACKEND_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="UCXBACKEND_LOG_LEVEL='loud'"):
        ucxbackend.get_config()


# --------------------------------------------------------------------------- pg_options


def test_pg_options_override_env() -> None:
    env = {"UCXBACKEND_PROGRESS_MODE": "sleep", "UCXBACKEND_SPIN_US": "7"}
    c = Options(progress_mode="poll").resolve(env)
    assert (c.progress_mode, c.spin_us, c.log_level) == ("poll", 7, "WARNING")
    assert dict(c.sources) == {
        "progress_mode": "pg_options",
        "spin_us": "env",
        "log_level": "default",
        **dict.fromkeys(TUNING_DEFAULTS, "default"),
    }


def test_resolve_parses_each_value_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every group's creation resolves its config: parsing the values that the environment
    # or the Options gave again, and every default, was a native call per knob each time.
    options = Options(progress_mode="poll")
    parsed: list[str] = []
    real_parse = cfg.Knob.parse

    def counting_parse(self: cfg.Knob, raw: object) -> Any:
        parsed.append(self.name)
        return real_parse(self, raw)

    monkeypatch.setattr(cfg.Knob, "parse", counting_parse)
    c = options.resolve({"UCXBACKEND_SPIN_US": "7"})
    assert parsed == ["spin_us"]
    assert c == Config(progress_mode="poll", spin_us=7)
    assert (c.sources["progress_mode"], c.sources["spin_us"]) == ("pg_options", "env")
    assert c.sources["log_level"] == "default"


def test_dict_pg_options() -> None:
    c = ucxbackend.get_config({"spin_us": "12", "log_level": "info"}, env={})
    assert (c.spin_us, c.log_level, c.progress_mode) == (12, "INFO", "sleep")
    assert c.sources["spin_us"] == c.sources["log_level"] == "pg_options"
    assert ucxbackend.get_config(None, env={}) == Config()


def test_pg_options_apply_over_bad_env_is_still_an_error() -> None:
    # The environment is always validated, even where pg_options override it: a typo in a
    # variable should never go unnoticed.
    with pytest.raises(ValueError, match="UCXBACKEND_SPIN_US"):
        Options(spin_us=3).resolve({"UCXBACKEND_SPIN_US": "x"})


def test_to_native() -> None:
    options = Options(spin_us=0, progress_mode="poll")
    native = options.resolve({"UCXBACKEND_LOG_LEVEL": "debug"}).to_native()
    assert native == {
        "progress_mode": "poll",
        "spin_us": "0",
        "log_level": "DEBUG",
        **TUNING_NATIVE,
    }
    assert Config().to_native() == {
        "progress_mode": "sleep",
        "spin_us": "250",
        "log_level": "WARNING",
        **TUNING_NATIVE,
    }
    assert all(isinstance(v, str) for v in native.values())


def test_options_normalise_and_items() -> None:
    o = Options(progress_mode="POLL", log_level="debug", spin_us="25")  # type: ignore[arg-type]
    assert (o.progress_mode, o.log_level, o.spin_us) == ("poll", "DEBUG", 25)
    assert o.to_dict() == {"progress_mode": "poll", "spin_us": 25, "log_level": "DEBUG"}
    assert Options().to_dict() == {}
    assert Options(spin_us=3) == Options.from_mapping({"spin_us": 3})


@pytest.mark.parametrize(
    ("kwargs", "name", "allowed"),
    [
        ({"progress_mode": "fast"}, "progress_mode", "'sleep', 'poll'"),
        ({"progress_mode": 1}, "progress_mode", "'sleep', 'poll'"),
        ({"spin_us": -5}, "spin_us", "an integer from 0"),
        ({"spin_us": 1.5}, "spin_us", "an integer from 0"),
        ({"spin_us": True}, "spin_us", "an integer from 0"),
        ({"spin_us": "ten"}, "spin_us", "an integer from 0"),
        ({"log_level": "verbose"}, "log_level", "'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
        ({"log_level": 10}, "log_level", "'DEBUG', 'INFO', 'WARNING', 'ERROR'"),
    ],
)
def test_bad_option_value(kwargs: dict[str, Any], name: str, allowed: str) -> None:
    (raw,) = kwargs.values()
    for make in (lambda: Options(**kwargs), lambda: coerce_options(kwargs)):
        with pytest.raises(ValueError) as info:
            make()
        message = str(info.value)
        assert repr(name) in message
        assert repr(raw) in message
        assert allowed in message
        assert KNOBS[name].env_var in message


def test_config_validates_too() -> None:
    with pytest.raises(ValueError, match="spin_us"):
        Config(spin_us=-1)
    with pytest.raises(ValueError, match="unknown knob"):
        Config(sources={"nope": "env"})


def test_unknown_option_name() -> None:
    with pytest.raises(ValueError) as info:
        coerce_options({"spin": 3})
    assert "'spin'" in str(info.value)
    assert "'spin_us'" in str(info.value)  # lists the known ones
    with pytest.raises(TypeError, match="must be str"):
        coerce_options({1: 3})


@pytest.mark.parametrize("bad", [42, "poll", ["spin_us", 3], object()])
def test_pg_options_wrong_type(bad: object) -> None:
    with pytest.raises(TypeError) as info:
        coerce_options(bad)
    assert type(bad).__qualname__ in str(info.value)


def test_pg_options_wrong_type_names_foreign_options() -> None:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("gloo not available")
    foreign = dist.ProcessGroupGloo._Options()
    with pytest.raises(TypeError, match="_Options"):
        coerce_options(foreign)


def test_coerce_passthrough() -> None:
    o = Options(spin_us=1)
    assert coerce_options(o) is o
    assert coerce_options(None) == Options()


def test_frozen_hashable_copyable() -> None:
    o = Options(progress_mode="poll")
    c = o.resolve({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.spin_us = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.spin_us = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.sources["spin_us"] = "env"  # type: ignore[index]
    assert hash(o) == hash(Options(progress_mode="poll"))
    assert hash(c) == hash(Config(progress_mode="poll"))
    # torch deep-copies pg_options in some paths (split_group); users pickle them.
    assert copy.deepcopy(o) == o
    assert pickle.loads(pickle.dumps(o)) == o
    assert pickle.loads(pickle.dumps(c)).sources == c.sources


def test_logging_level() -> None:
    assert Config(log_level="DEBUG").logging_level == logging.DEBUG
    assert Config().logging_level == logging.WARNING


# --------------------------------------------------------------------------- registration


def test_registered() -> None:
    assert dist.is_available()
    plugin = dist.Backend._plugins["UCX"]
    assert plugin.extended_api is True
    assert plugin.creator_fn is ucxbackend._create_ucx_backend
    assert dist.Backend.backend_capability["ucx"] == ["cpu", "cuda"]
    assert dist.Backend("ucx") == "ucx"
    assert dist.Backend.UCX == "ucx"  # type: ignore[attr-defined]
    udp = dist.Backend._plugins["UDP"]
    assert udp.extended_api is True
    assert udp.creator_fn is ucxbackend._create_udp_backend
    assert dist.Backend.backend_capability["udp"] == ["cpu", "cuda"]
    # Registering must not take the default backend away from gloo / nccl.
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"
    assert dist.Backend.default_device_backend_map["cuda"] == "nccl"


def test_registration_idempotent_and_silent() -> None:
    before = dict(dist.Backend._plugins)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(ucxbackend)
        ucxbackend._register()
        ucxbackend._register()
    assert dist.Backend._plugins == before
    assert dist.Backend.backend_list.count("ucx") == 1


def test_import_emits_no_warning() -> None:
    # A fresh interpreter, every warning an error, imported and reloaded.
    code = (
        "import importlib, warnings\n"
        "warnings.simplefilter('error')\n"
        "import ucxbackend\n"
        "importlib.reload(ucxbackend)\n"
        "import torch.distributed as dist\n"
        "assert 'UCX' in dist.Backend._plugins\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


class FakeNative:
    """Stands in for ucxbackend._C: records create_backend's arguments, returns Gloo."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def create_backend(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        group_id: str,
        global_ranks: list[int],
        options: dict[str, str],
    ) -> Any:
        self.calls.append(
            {
                "rank": rank,
                "size": size,
                "timeout": timeout,
                "group_id": group_id,
                "global_ranks": global_ranks,
                "options": options,
            }
        )
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    def ucx_leave_device_modules_out(self) -> None:
        """What a CPU-only torch asks before its first ucx group: nothing to do here, no UCX."""


@pytest.fixture
def fake_native(monkeypatch: pytest.MonkeyPatch) -> FakeNative:
    if not dist.is_gloo_available():
        pytest.skip("the stand-in backend needs gloo")
    for knob in KNOBS.values():
        monkeypatch.delenv(knob.env_var, raising=False)
    fake = FakeNative()
    monkeypatch.setattr(ucxbackend, "_C", fake)
    yield fake
    if dist.is_initialized():
        dist.destroy_process_group()


def _init(backend: str, pg_options: object = None) -> None:
    dist.init_process_group(
        backend,
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
        pg_options=pg_options,
    )


def test_init_process_group_reaches_native(fake_native: FakeNative) -> None:
    _init("ucx", ucxbackend.Options(spin_us=7))
    (call,) = fake_native.calls  # one backend for both cpu and cuda
    assert call["rank"] == 0
    assert call["size"] == 1
    assert call["timeout"] == datetime.timedelta(seconds=30)
    assert isinstance(call["group_id"], str) and call["group_id"]
    assert call["global_ranks"] == [0]  # the default group gets the real list, not []
    assert call["options"] == {
        "progress_mode": "sleep",
        "spin_us": "7",
        "log_level": "WARNING",
        **TUNING_NATIVE,
        "transport": "ucx",
        "ucx_net_devices": "",
    }
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [1.0] * 4


def test_init_with_dict_and_env(fake_native: FakeNative, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCXBACKEND_PROGRESS_MODE", "poll")
    _init("ucx", {"spin_us": 0})
    (call,) = fake_native.calls
    assert call["options"] == {
        "progress_mode": "poll",
        "spin_us": "0",
        "log_level": "WARNING",
        **TUNING_NATIVE,
        "transport": "ucx",
        "ucx_net_devices": "",
    }


def test_new_group_gets_global_ranks(fake_native: FakeNative) -> None:
    _init("ucx")
    dist.new_group([0], backend="ucx", pg_options={"progress_mode": "poll"})
    assert len(fake_native.calls) == 2
    sub = fake_native.calls[1]
    assert sub["global_ranks"] == [0]
    assert sub["options"]["progress_mode"] == "poll"
    assert sub["group_id"] != fake_native.calls[0]["group_id"]


def test_mixed_backend_string(fake_native: FakeNative) -> None:
    # Every backend creator of a "device:backend" list receives the same pg_options: gloo
    # ignores them, so our Options must not (and do not) break gloo creation.
    _init("cpu:gloo,cuda:ucx", ucxbackend.Options(progress_mode="poll"))
    (call,) = fake_native.calls
    assert call["options"]["progress_mode"] == "poll"
    pg = dist.group.WORLD
    assert isinstance(pg._get_backend(torch.device("cpu")), dist.ProcessGroupGloo)


def test_bad_pg_options_fail_init(fake_native: FakeNative) -> None:
    with pytest.raises(TypeError, match="int"):
        _init("ucx", 42)
    with pytest.raises(ValueError, match="spin_us"):
        _init("ucx", {"spin_us": -1})
    assert fake_native.calls == []


def test_missing_native_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucxbackend, "_C", None)
    monkeypatch.setattr(ucxbackend, "_C_error", ImportError("libucp.so.0: cannot open"))
    assert not ucxbackend.is_available()
    opts = SimpleNamespace(
        store=None,
        group_rank=0,
        group_size=1,
        timeout=datetime.timedelta(seconds=1),
        group_id="0",
        global_ranks_in_group=[],
    )
    with pytest.raises(RuntimeError) as info:
        ucxbackend._create_ucx_backend(opts, None)
    assert "libucp.so.0: cannot open" in str(info.value)
    assert "make build" in str(info.value)
    # pg_options are still checked first
    with pytest.raises(TypeError):
        ucxbackend._create_udp_backend(opts, 3.0)


@needs_native
def test_real_native_single_rank() -> None:
    try:
        _init("ucx", {"spin_us": 5})
        t = torch.arange(4, dtype=torch.float32)
        dist.all_reduce(t)
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- tuning knobs


@pytest.mark.parametrize(
    ("raw", "value"), [(1, 1), ("8", 8), ("4M", 4 << 20), ("64k", 64 << 10), ("2MiB", 2 << 20)]
)
def test_chunk_bytes_parses_sizes(raw: object, value: int) -> None:
    assert Options(chunk_bytes=raw).to_dict() == {"chunk_bytes": value}  # type: ignore[arg-type]
    assert Config.from_env({"UCXBACKEND_CHUNK_BYTES": str(raw)}).chunk_bytes == value


@pytest.mark.parametrize("raw", [0, -1, "0", "x", "4T", True, 1.5])
def test_chunk_bytes_rejects(raw: object) -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        Options(chunk_bytes=raw)  # type: ignore[arg-type]


def test_algo_knobs_validate_names() -> None:
    assert Config.from_env({"UCXBACKEND_ALGO_ALLREDUCE": "Ring"}).algo_allreduce == "ring"
    with pytest.raises(ValueError, match=r"UCXBACKEND_ALGO_ALLREDUCE.*'rabenseifner'"):
        Config.from_env({"UCXBACKEND_ALGO_ALLREDUCE": "bruck"})
    with pytest.raises(ValueError, match="algo_broadcast"):
        Options(algo_broadcast="ring")


@needs_native
def test_algorithm_names_match_native() -> None:
    from ucxbackend import _C

    assert _C.algorithms.names() == {op: list(names) for op, names in cfg.ALGORITHMS.items()}


def test_small_udp_socket_buffer_is_named_with_its_fix() -> None:
    from ucxbackend import _transport_options as t

    asked = 8 << 20
    assert t.socket_buffer_warning(16 << 20, asked, 1 << 20, 3) is None  # as root: granted
    assert t.socket_buffer_warning(425984, asked, 1 << 20, 0) is None  # one rank: no peers
    message = t.socket_buffer_warning(425984, asked, 1 << 20, 3)  # rmem_max's usual cap
    assert message is not None
    for part in ("425984-byte receive buffer", "3145728 bytes", "send_window_bytes=1048576",
                 "CAP_NET_ADMIN", "initial network namespace",
                 f"net.core.rmem_max={asked}", f"socket_buffer_bytes={asked}"):
        assert part in message, message
    # 32 ranks on one host, as root: the kernel granted the 8 MiB asked for (it reports 16),
    # short of 31 peers' windows; only a larger request (or a smaller window) helps.
    granted = t.socket_buffer_warning(16 << 20, asked, 1 << 20, 31)
    assert granted is not None
    assert f"got the socket_buffer_bytes={asked} it asked for" in granted, granted
    assert f"socket_buffer_bytes in udp_config to {31 << 20} or more" in granted, granted
    assert "CAP_NET_ADMIN" not in granted and "rmem_max" not in granted, granted
    # Capped and short of the windows even if granted: both fixes, and the sysctl to the need.
    both = t.socket_buffer_warning(425984, asked, 1 << 20, 15)
    assert both is not None
    for part in ("CAP_NET_ADMIN", f"net.core.rmem_max={15 << 20}",
                 f"socket_buffer_bytes in udp_config to {15 << 20} or more"):
        assert part in both, both


class _FakeUdp:
    def __init__(self, receive: int) -> None:
        self.receive = receive
        self.hosts: list[str] = []

    def socket_buffers(self, host: str, udp_config: str) -> tuple[int, int]:
        self.hosts.append(host)
        return self.receive, self.receive

    def describe_config(self, text: str) -> str:
        window = 1 << 20
        for kv in text.split(","):
            if kv.startswith("send_window_bytes="):
                window = int(kv.split("=", 1)[1])
        return (
            f"mtu_payload=65507,send_window_bytes={window},unexpected_bytes=1048576,"
            "socket_buffer_bytes=8388608"
        )


@pytest.mark.parametrize(
    ("receive", "udp_config", "size", "warned"),
    [
        (425984, "", 4, True),
        (425984, "send_window_bytes=131072", 4, False),  # the user lowered the window
        (16 << 20, "", 4, False),
        (425984, "", 1, False),
    ],
)
def test_udp_group_warns_when_the_kernel_caps_its_buffer(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    receive: int,
    udp_config: str,
    size: int,
    warned: bool,
) -> None:
    fake = _FakeUdp(receive)
    monkeypatch.setattr(ucxbackend, "_C", SimpleNamespace(udp=fake))
    with caplog.at_level(logging.WARNING, logger="ucxbackend"):
        ucxbackend._warn_small_udp_buffer(
            {"udp_host": "10.0.0.7", "udp_config": udp_config}, size
        )
    assert fake.hosts == ["10.0.0.7"]
    assert ("receive buffer" in caplog.text) == warned, caplog.text


def test_native_socket_buffers_match_what_the_group_asks_for() -> None:
    if ucxbackend._C is None:
        pytest.skip("native extension not built")
    udp = ucxbackend._C.udp
    default = int(dict(kv.split("=") for kv in udp.describe_config("").split(","))[
        "socket_buffer_bytes"])
    assert default == 8 << 20
    receive, send = udp.socket_buffers("127.0.0.1")
    assert receive > 0 and send > 0
    small, _ = udp.socket_buffers("127.0.0.1", "socket_buffer_bytes=256K")
    if os.geteuid() == 0:  # SO_RCVBUFFORCE: the kernel grants (and doubles) the request
        assert receive >= default and send >= default
        # the udp_config key reaches the socket: 256 KiB asked, 512 KiB granted
        assert (256 << 10) <= small < default, small
    with pytest.raises(ValueError, match=r"socket_buffer_bytes='1K' is invalid"):
        udp.socket_buffers("127.0.0.1", "socket_buffer_bytes=1K")
