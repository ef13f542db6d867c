"""Typed configuration of the ``ucx`` backend.

Every knob has three sources, highest priority first:

1. the ``pg_options`` passed to ``init_process_group`` / ``new_group`` (an :class:`Options`
   or a plain ``dict`` of knob name -> value); applies to that process group only;
2. the environment variable ``UCXBACKEND_<KNOB>`` (read when a process group is created);
3. the built-in default.

UCX's own ``UCX_*`` variables (``UCX_TLS``, ``UCX_NET_DEVICES``, ...) are not handled here:
they pass straight through to UCX.

Values are validated eagerly; a bad value raises :class:`ValueError` naming the variable (or
option), the bad value and the allowed values.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias, cast

__all__ = [
    "ALGORITHMS",
    "ENV_PREFIX",
    "KNOBS",
    "UDP_CONFIG_KEYS",
    "UDP_FAULT_KEYS",
    "Config",
    "Knob",
    "LogLevel",
    "Options",
    "ProgressMode",
    "SharedMemoryMode",
    "Source",
    "StagingStores",
    "coerce_options",
    "unknown_env_vars",
]

ProgressMode: TypeAlias = Literal["sleep", "poll"]
SharedMemoryMode: TypeAlias = Literal["auto", "off"]
StagingStores: TypeAlias = Literal["cached", "streaming"]
LogLevel: TypeAlias = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
Source: TypeAlias = Literal["default", "env", "pg_options"]

ENV_PREFIX: Final = "UCXBACKEND_"
# Variables that are not knobs but are read elsewhere (test hooks), so not typos.
TEST_HOOK_ENV_VARS: Final = frozenset({"UCXBACKEND_BENCH_CORRUPT"})

PROGRESS_MODES: Final[tuple[ProgressMode, ...]] = ("sleep", "poll")
SHARED_MEMORY_MODES: Final[tuple[SharedMemoryMode, ...]] = ("auto", "off")
STAGING_STORES: Final[tuple[StagingStores, ...]] = ("cached", "streaming")
LOG_LEVELS: Final[tuple[LogLevel, ...]] = ("DEBUG", "INFO", "WARNING", "ERROR")
# spin_us travels to C++ as a string; keep it within a signed 32-bit int so any parser copes.
SPIN_US_MAX: Final = 2**31 - 1

_INT_RE: Final = re.compile(r"[+]?[0-9]+")
_SIZE_RE: Final = re.compile(r"([0-9]+)\s*([kmg]?)(?:i?b)?", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
CHUNK_BYTES_MAX: Final = 1 << 40

# The algorithms each op's ``algo_<op>`` knob accepts ("auto" = chosen by message and group
# size). Mirrors csrc/collectives/selection.cpp; a test checks the two agree.
ALGORITHMS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "allreduce": ("auto", "ring", "recursive_doubling", "rabenseifner"),
        "allgather": ("auto", "ring", "bruck", "linear"),
        "reduce_scatter": ("auto", "ring", "recursive_halving"),
        "broadcast": ("auto", "binomial", "chain"),
        "reduce": ("auto", "binomial", "chain"),
        "alltoall": ("auto", "pairwise", "linear"),
    }
)


# The keys of the udp backend's ``udp_config`` and ``udp_faults`` strings. Mirrors
# transports/udp/udp_config.cpp and faults.cpp (a test checks they agree); the values are
# checked by the C++ parser when the group is created.
UDP_CONFIG_KEYS: Final = (
    "mtu_payload",
    "rto_min_us",
    "rto_max_us",
    "initial_rtt_us",
    "max_rto_expiries",
    "ack_every",
    "max_ack_delay_us",
    "reorder_threshold",
    "send_window_bytes",
    "unexpected_bytes",
    "eager_max_bytes",
    "max_message_bytes",
    "loss_recovery",
    "congestion",
    "initial_cwnd_packets",
    "min_cwnd_packets",
    "keepalive_us",
    "peer_timeout_us",
    "tail_probes",
)
UDP_FAULT_KEYS: Final = (
    "drop",
    "dup",
    "reorder",
    "delay",
    "corrupt",
    "seed",
    "reorder_us",
    "delay_us",
)


class _Invalid(Exception):
    """Raised by a parser; turned into a ValueError that names where the value came from."""


def _parse_choice(choices: tuple[str, ...], *, upper: bool) -> Callable[[object], Any]:
    def parse(raw: object) -> str:
        if not isinstance(raw, str):
            raise _Invalid
        value = raw.strip().upper() if upper else raw.strip().lower()
        if value not in choices:
            raise _Invalid
        return value

    return parse


def _parse_spin_us(raw: object) -> int:
    if isinstance(raw, bool):  # bool is an int subclass; True is not a duration
        raise _Invalid
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and _INT_RE.fullmatch(raw.strip()):
        value = int(raw.strip(), 10)
    else:
        raise _Invalid
    if not 0 <= value <= SPIN_US_MAX:
        raise _Invalid
    return value


def _parse_chunk_bytes(raw: object) -> int:
    """Bytes, as an int or a string with an optional K/M/G (powers of 1024) suffix."""
    if isinstance(raw, bool):
        raise _Invalid
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and (m := _SIZE_RE.fullmatch(raw.strip())):
        value = int(m.group(1), 10) * _SIZE_UNITS[m.group(2).lower()]
    else:
        raise _Invalid
    if not 1 <= value <= CHUNK_BYTES_MAX:
        raise _Invalid
    return value


def _parse_ifname(raw: object) -> str:
    if not isinstance(raw, str):
        raise _Invalid
    if not raw.strip():
        return ""
    from .netif import parse_ifname_spec  # stdlib-only module; imported late to stay light

    try:
        parse_ifname_spec(raw)
    except ValueError:
        raise _Invalid from None
    return raw.strip()


def _parse_key_values(keys: tuple[str, ...]) -> Callable[[object], str]:
    """A ``"key=value,key=value"`` string whose keys are all in ``keys`` (normalised)."""

    def parse(raw: object) -> str:
        if not isinstance(raw, str):
            raise _Invalid
        items = [item.strip() for item in raw.split(",") if item.strip()]
        normalised = []
        for item in items:
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in keys or not value:
                raise _Invalid
            normalised.append(f"{key}={value}")
        return ",".join(normalised)

    return parse


@dataclass(frozen=True)
class Knob:
    """Description of one configuration knob."""

    name: str
    default: Any
    allowed: str
    help: str
    parse: Callable[[object], Any] = field(repr=False)

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def _error(self, where: str, raw: object) -> ValueError:
        return ValueError(f"{where}={raw!r} is not valid; allowed values: {self.allowed}")

    def from_env(self, raw: str) -> Any:
        try:
            return self.parse(raw)
        except _Invalid:
            raise self._error(self.env_var, raw) from None

    def from_option(self, raw: object) -> Any:
        try:
            return self.parse(raw)
        except _Invalid:
            where = f"ucx backend option {self.name!r} (env {self.env_var})"
            raise self._error(where, raw) from None


KNOBS: Final[Mapping[str, Knob]] = MappingProxyType(
    {
        "progress_mode": Knob(
            name="progress_mode",
            default="sleep",
            allowed="'sleep', 'poll'",
            help=(
                "sleep: the progress thread blocks on UCX's wakeup fd when idle and after "
                "spinning briefly (spin_us) during an op; poll: busy-poll, lowest latency, "
                "burns a core per rank"
            ),
            parse=_parse_choice(PROGRESS_MODES, upper=False),
        ),
        "spin_us": Knob(
            name="spin_us",
            default=250,
            allowed=f"an integer from 0 to {SPIN_US_MAX}",
            help="microseconds to poll while an op is pending before sleeping (sleep mode)",
            parse=_parse_spin_us,
        ),
        "log_level": Knob(
            name="log_level",
            default="WARNING",
            allowed="'DEBUG', 'INFO', 'WARNING', 'ERROR'",
            help="level of the 'ucxbackend' logger (standard Python logging)",
            parse=_parse_choice(LOG_LEVELS, upper=True),
        ),
        "chunk_bytes": Knob(
            name="chunk_bytes",
            default=4 << 20,
            allowed="bytes from 1 to 1T, e.g. 4194304 or '4M' (K/M/G = 1024^n)",
            help=(
                "largest piece of a message received into scratch or pipelined at once; "
                "extra memory per op is at most two chunks"
            ),
            parse=_parse_chunk_bytes,
        ),
        **{
            f"algo_{op}": Knob(
                name=f"algo_{op}",
                default="auto",
                allowed=", ".join(repr(n) for n in names),
                help=f"{op} algorithm; 'auto' chooses by message size and group size",
                parse=_parse_choice(names, upper=False),
            )
            for op, names in ALGORITHMS.items()
        },
        "shared_memory": Knob(
            name="shared_memory",
            default="auto",
            allowed="'auto', 'off'",
            help=(
                "ucx backend only: with 'auto', a group whose ranks all run on one host (same "
                "boot, mount and network namespace) moves large all_reduce, all_gather, "
                "broadcast and all_to_all messages through shared-memory slots, one copy "
                "less per byte than through UCX; off when UCX_TLS leaves out shared memory"
            ),
            parse=_parse_choice(SHARED_MEMORY_MODES, upper=False),
        ),
        "staging_stores": Knob(
            name="staging_stores",
            default="cached",
            allowed="'cached', 'streaming'",
            help=(
                "ucx backend, shared-memory staging only: how a rank writes the slots its "
                "peer reads; 'streaming' uses non-temporal stores that go around its cache, "
                "for hosts where handing freshly written cache lines to another core is slow "
                "(when scripts/cross_core_copy.cpp runs faster with 'streaming')"
            ),
            parse=_parse_choice(STAGING_STORES, upper=False),
        ),
        "ifname": Knob(
            name="ifname",
            default="",
            allowed="'' (automatic) or interface names: 'eth0', 'eth,ib' (prefixes), "
            "'=eth0' (exact), '^docker,lo' (exclude)",
            help=(
                "network interface(s) for traffic between hosts, for both backends (like "
                "NCCL_SOCKET_IFNAME): udp binds the first one's address; ucx gets "
                "UCX_NET_DEVICES = those interfaces plus their RDMA ports, unless "
                "UCX_NET_DEVICES is set. Automatic: the interface that routes to the "
                "rendezvous host, never loopback for a remote one"
            ),
            parse=_parse_ifname,
        ),
        "udp_config": Knob(
            name="udp_config",
            default="",
            allowed="'key=value,...' with keys " + ", ".join(UDP_CONFIG_KEYS),
            help=(
                "udp backend only: the reliability layer's settings, e.g. "
                "'loss_recovery=go_back_n,congestion=aimd' (mtu_payload defaults to the "
                "interface MTU)"
            ),
            parse=_parse_key_values(UDP_CONFIG_KEYS),
        ),
        "udp_faults": Knob(
            name="udp_faults",
            default="",
            allowed="'key=value,...' with keys " + ", ".join(UDP_FAULT_KEYS),
            help=(
                "udp backend only: seeded fault injection on received datagrams, e.g. "
                "'drop=0.01,dup=0.001,reorder=0.02,seed=7'"
            ),
            parse=_parse_key_values(UDP_FAULT_KEYS),
        ),
    }
)


def _default_sources() -> Mapping[str, Source]:
    return MappingProxyType(dict.fromkeys(KNOBS, cast(Source, "default")))


@dataclass(frozen=True)
class Config:
    """The configuration in force for one process group (or for the process, from the env).

    ``sources`` records, per knob, where its value came from: ``"default"``, ``"env"`` or
    ``"pg_options"``. It does not take part in equality.
    """

    progress_mode: ProgressMode = "sleep"
    spin_us: int = 250
    log_level: LogLevel = "WARNING"
    chunk_bytes: int = 4 << 20
    algo_allreduce: str = "auto"
    algo_allgather: str = "auto"
    algo_reduce_scatter: str = "auto"
    algo_broadcast: str = "auto"
    algo_reduce: str = "auto"
    algo_alltoall: str = "auto"
    shared_memory: SharedMemoryMode = "auto"
    staging_stores: StagingStores = "cached"
    ifname: str = ""
    udp_config: str = ""
    udp_faults: str = ""
    sources: Mapping[str, Source] = field(
        default_factory=_default_sources, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        for knob in KNOBS.values():
            raw = getattr(self, knob.name)
            object.__setattr__(self, knob.name, knob.from_option(raw))
        sources = dict(_default_sources())
        for name, source in self.sources.items():
            if name not in KNOBS:
                raise ValueError(f"unknown knob {name!r} in sources")
            if source not in ("default", "env", "pg_options"):
                raise ValueError(f"unknown source {source!r} for {name!r}")
            sources[name] = source
        object.__setattr__(self, "sources", MappingProxyType(sources))

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only sources mapping cannot be pickled as such; rebuild from plain values.
        values = {k: getattr(self, k) for k in KNOBS}
        return (_rebuild_config, (values, dict(self.sources)))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Defaults overridden by the ``UCXBACKEND_*`` variables of ``env`` (``os.environ``).

        An empty (or all-blank) variable counts as unset.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: dict[str, Source] = {}
        for knob in KNOBS.values():
            raw = env.get(knob.env_var)
            if raw is None or not raw.strip():
                continue
            values[knob.name] = knob.from_env(raw)
            sources[knob.name] = "env"
        return cls(**values, sources=sources)

    def with_options(self, options: Options) -> Config:
        """This config with every knob that ``options`` sets overridden."""
        values = {k.name: getattr(self, k.name) for k in KNOBS.values()}
        sources = dict(self.sources)
        for name, value in options.items():
            values[name] = value
            sources[name] = "pg_options"
        return Config(**values, sources=sources)

    def to_native(self) -> dict[str, str]:
        """The ``dict[str, str]`` handed to ``_C.ProcessGroupUCX`` (every knob, always)."""
        return {k.name: str(getattr(self, k.name)) for k in KNOBS.values()}

    def describe(self) -> list[dict[str, Any]]:
        """One row per knob: name, value, source, env var, default and allowed values."""
        return [
            {
                "name": k.name,
                "value": getattr(self, k.name),
                "source": self.sources[k.name],
                "env_var": k.env_var,
                "default": k.default,
                "allowed": k.allowed,
            }
            for k in KNOBS.values()
        ]

    @property
    def logging_level(self) -> int:
        """``log_level`` as a :mod:`logging` level number."""
        return cast(int, getattr(logging, self.log_level))


def _rebuild_config(values: dict[str, Any], sources: dict[str, Source]) -> Config:
    return Config(**values, sources=sources)


@dataclass(frozen=True)
class Options:
    """Per-process-group options for the ``ucx`` backend, passed as ``pg_options``.

    Fields left as ``None`` fall back to the ``UCXBACKEND_*`` environment variable, then to the
    default. Values are validated (and normalised, e.g. ``"debug"`` -> ``"DEBUG"``) here, so a
    bad value fails where it is written, not later inside ``init_process_group``::

        dist.init_process_group("ucx", pg_options=ucxbackend.Options(progress_mode="poll"))

    A plain dict works too: ``pg_options={"progress_mode": "poll"}``.
    """

    progress_mode: ProgressMode | None = None
    spin_us: int | None = None
    log_level: LogLevel | None = None
    chunk_bytes: int | str | None = None
    algo_allreduce: str | None = None
    algo_allgather: str | None = None
    algo_reduce_scatter: str | None = None
    algo_broadcast: str | None = None
    algo_reduce: str | None = None
    algo_alltoall: str | None = None
    shared_memory: SharedMemoryMode | None = None
    staging_stores: StagingStores | None = None
    ifname: str | None = None
    udp_config: str | None = None
    udp_faults: str | None = None

    def __post_init__(self) -> None:
        for knob in KNOBS.values():
            raw = getattr(self, knob.name)
            if raw is not None:
                object.__setattr__(self, knob.name, knob.from_option(raw))

    @classmethod
    def from_mapping(cls, mapping: Mapping[Any, object]) -> Options:
        """Build from a ``dict`` of knob name -> value; unknown names raise ValueError."""
        values: dict[str, object] = {}
        for key, value in mapping.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"ucx backend option names must be str, not {type(key).__name__}: {key!r}"
                )
            if key not in KNOBS:
                known = ", ".join(repr(k) for k in KNOBS)
                raise ValueError(f"unknown ucx backend option {key!r}; known options: {known}")
            values[key] = value
        return cls(**values)  # type: ignore[arg-type]

    def items(self) -> Iterator[tuple[str, Any]]:
        """The (name, value) pairs that are set (not ``None``)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                yield f.name, value

    def to_dict(self) -> dict[str, Any]:
        return dict(self.items())

    def resolve(self, env: Mapping[str, str] | None = None) -> Config:
        """The full config: these options over the environment over the defaults."""
        return Config.from_env(env).with_options(self)


def coerce_options(obj: object) -> Options:
    """Turn what a user passed as ``pg_options`` into :class:`Options`.

    Accepts ``None``, an :class:`Options` or a mapping of knob name -> value; anything else
    is a :class:`TypeError` naming the type.
    """
    if obj is None:
        return Options()
    if isinstance(obj, Options):
        return obj
    if isinstance(obj, Mapping):
        return Options.from_mapping(obj)
    cls = type(obj)
    raise TypeError(
        "pg_options for the ucx backend must be None, ucxbackend.Options or a dict of "
        f"option name -> value, not {cls.__module__}.{cls.__qualname__}"
    )


def unknown_env_vars(env: Mapping[str, str] | None = None) -> list[str]:
    """``UCXBACKEND_*`` variables in ``env`` that match no knob (probably typos)."""
    env = os.environ if env is None else env
    known = {k.env_var for k in KNOBS.values()} | TEST_HOOK_ENV_VARS
    return sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known)
