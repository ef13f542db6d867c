"""Typed configuration of the ``ucx`` and ``udp`` backends.

Every knob is declared once, in C++ (``csrc/backend_options.cpp``): its name, kind, default,
range or choices and help. This module reads that schema from the native extension and adds
where a value comes from. Every knob has three sources, highest priority first:

1. the ``pg_options`` passed to ``init_process_group`` / ``new_group`` (an :class:`Options`
   or a plain ``dict`` of knob name -> value); applies to that process group only;
2. the environment variable ``UCXBACKEND_<KNOB>`` (read when a process group is created);
3. the built-in default.

UCX's own ``UCX_*`` variables (``UCX_TLS``, ``UCX_NET_DEVICES``, ...) are not handled here:
they pass straight through to UCX.

Values are validated eagerly, by the same C++ parser the group uses; a bad value raises
:class:`ValueError` naming the variable (or option), the bad value and the allowed values.
``docs/configuration.md``'s knob reference is generated from the same schema (``python -m
ucxbackend config --write docs/configuration.md``).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import FrozenInstanceError, dataclass
from functools import cache
from types import MappingProxyType, ModuleType
from typing import Any, Final, Literal, TypeAlias, cast

__all__ = [
    "ALGORITHMS",
    "ENV_PREFIX",
    "KNOBS",
    "Config",
    "Knob",
    "Options",
    "Source",
    "coerce_options",
    "format_size",
    "parse_size",
    "udp_config_keys",
    "udp_fault_keys",
    "unknown_env_vars",
]

Source: TypeAlias = Literal["default", "env", "pg_options"]
SOURCES: Final[tuple[Source, ...]] = ("default", "env", "pg_options")

ENV_PREFIX: Final = "UCXBACKEND_"
# Variables that are not knobs but are read elsewhere (test hooks, docs/testing.md), so not
# typos.
TEST_HOOK_ENV_VARS: Final = frozenset(
    {
        "UCXBACKEND_BENCH_CORRUPT",
        "UCXBACKEND_TEST_SEQ_BITS",
        "UCXBACKEND_TEST_FAULT_INJECTION",
        "UCXBACKEND_TEST_ANY_HOST",
        "UCXBACKEND_TEST_KILL_AT",
        "UCXBACKEND_TEST_THREAD_FAILS",
    }
)
# Kinds whose values are numbers in Python (the schema's "integer" and "bytes").
_NUMERIC_KINDS: Final = frozenset({"integer", "bytes"})


def _native() -> ModuleType:
    """The native extension, which owns the schema; RuntimeError naming why it is missing."""
    try:
        return importlib.import_module("ucxbackend._C")
    except ImportError as exc:
        raise RuntimeError(
            "the ucxbackend configuration is declared in the native extension "
            f"ucxbackend._C, which could not be loaded ({type(exc).__name__}: {exc}); "
            "run `make build` and see `python -m ucxbackend info`"
        ) from exc


def _check_ifname(value: str) -> None:
    from .netif import parse_ifname_spec  # stdlib-only module; imported late to stay light

    parse_ifname_spec(value)


# Checks that need Python's view of the machine, run after the schema's own. The grammar of
# an interface list lives with the code that selects interfaces (netif).
_PYTHON_CHECKS: Final[Mapping[str, Callable[[str], None]]] = MappingProxyType(
    {"ifname": _check_ifname}
)


class _Invalid(Exception):
    """A value that the schema rejects; ``detail`` says why when the check knows more."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class Knob:
    """One knob as the native schema declares it."""

    name: str
    kind: str  # "integer", "bytes", "choice" or "text"
    default: Any
    allowed: str
    help: str
    choices: tuple[str, ...] = ()
    # Every rank of a group must set it alike: creating the group fails, naming it, where the
    # ranks differ (for udp_config: in its keys marked so). docs/configuration.md.
    must_agree: bool = False

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def parse(self, raw: object) -> Any:
        """The value in its canonical form (an int for numbers); :class:`_Invalid` if bad."""
        if isinstance(raw, bool):  # bool is an int subclass; True is not a number here
            raise _Invalid
        if isinstance(raw, int) and self.kind in _NUMERIC_KINDS:
            text = str(raw)
        elif isinstance(raw, str):
            text = raw
        else:
            raise _Invalid
        try:
            canonical = str(_native().config.normalize(self.name, text))
            check = _PYTHON_CHECKS.get(self.name)
            if check is not None and canonical:
                check(canonical)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None
        return int(canonical) if self.kind in _NUMERIC_KINDS else canonical

    def _error(self, where: str, raw: object, why: _Invalid) -> ValueError:
        detail = f" ({why.detail})" if why.detail and self.kind == "text" else ""
        return ValueError(f"{where}={raw!r} is not valid; allowed values: {self.allowed}{detail}")

    def from_env(self, raw: str) -> Any:
        try:
            return self.parse(raw)
        except _Invalid as why:
            raise self._error(self.env_var, raw, why) from None

    def from_option(self, raw: object) -> Any:
        try:
            return self.parse(raw)
        except _Invalid as why:
            where = f"ucxbackend option {self.name!r} (env {self.env_var})"
            raise self._error(where, raw, why) from None


def _knob_from_row(row: Mapping[str, Any]) -> Knob:
    kind = str(row["kind"])
    default: Any = str(row["default"])
    if kind in _NUMERIC_KINDS:
        default = int(default)
    return Knob(
        name=str(row["name"]),
        kind=kind,
        default=default,
        allowed=str(row["allowed"]),
        help=str(row["help"]),
        choices=tuple(str(c) for c in row["choices"]),
        must_agree=bool(row["must_agree"]),
    )


@cache
def _knobs() -> Mapping[str, Knob]:
    rows = _native().config.schema()
    return MappingProxyType(
        {k.name: k for k in (_knob_from_row(r) for r in rows if not r["internal"])}
    )


class _LazyMapping(Mapping[str, Any]):
    """A read-only mapping built on first use, so that importing this module never needs the
    native extension (``python -m ucxbackend info`` must work without it)."""

    def __init__(self, build: Callable[[], Mapping[str, Any]]) -> None:
        self._build = build

    def __getitem__(self, key: str) -> Any:
        return self._build()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())

    def __repr__(self) -> str:
        return repr(dict(self._build()))


# The knobs, in schema order: name -> Knob.
KNOBS: Final[Mapping[str, Knob]] = _LazyMapping(_knobs)
# op -> the algorithm names its ``algo_<op>`` knob accepts ("auto" first).
ALGORITHMS: Final[Mapping[str, tuple[str, ...]]] = _LazyMapping(
    lambda: {
        k.name.removeprefix("algo_"): k.choices
        for k in _knobs().values()
        if k.name.startswith("algo_")
    }
)


def udp_config_keys() -> tuple[str, ...]:
    """The keys ``udp_config`` accepts (transports/udp/udp_config.cpp)."""
    return tuple(str(k) for k in _native().udp.config_keys())


def udp_fault_keys() -> tuple[str, ...]:
    """The keys ``udp_faults`` accepts (transports/udp/faults.cpp)."""
    return tuple(str(k) for k in _native().udp.fault_keys())


def parse_size(text: str) -> int:
    """Bytes in ``"4194304"``, ``"4M"``, ``"4 MiB"`` or ``"4mb"`` (1024^n): the one size parser,
    shared with every knob and ``udp_config`` key that takes bytes. ValueError if not a size."""
    return int(_native().config.parse_size(text))


def format_size(nbytes: int) -> str:
    """The shortest exact spelling of ``nbytes`` that :func:`parse_size` reads back."""
    return str(_native().config.format_size(nbytes))


def _validated_sources(sources: Mapping[str, Source]) -> dict[str, Source]:
    default: Source = "default"
    out: dict[str, Source] = dict.fromkeys(KNOBS, default)
    for name, source in sources.items():
        if name not in KNOBS:
            raise ValueError(f"unknown knob {name!r} in sources")
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r} for {name!r}")
        out[name] = source
    return out


def _unknown_option(key: object) -> Exception:
    if not isinstance(key, str):
        return TypeError(
            f"ucxbackend option names must be str, not {type(key).__name__}: {key!r}"
        )
    known = ", ".join(repr(k) for k in KNOBS)
    return ValueError(f"unknown ucxbackend option {key!r}; known options: {known}")


class Config:
    """The configuration in force for one process group (or for the process, from the env).

    Every knob is an attribute (``config.spin_us``). ``sources`` records, per knob, where its
    value came from: ``"default"``, ``"env"`` or ``"pg_options"``; it does not take part in
    equality. Immutable.
    """

    __slots__ = ("_sources", "_values")
    _values: Mapping[str, Any]
    _sources: Mapping[str, Source]

    def __init__(self, sources: Mapping[str, Source] | None = None, **values: object) -> None:
        parsed: dict[str, Any] = {}
        for name, knob in KNOBS.items():
            parsed[name] = knob.from_option(values.pop(name)) if name in values else knob.default
        if values:
            raise _unknown_option(next(iter(values)))
        object.__setattr__(self, "_values", MappingProxyType(parsed))
        object.__setattr__(self, "_sources", MappingProxyType(_validated_sources(sources or {})))

    @classmethod
    def _from_parsed(cls, values: Mapping[str, Any], sources: Mapping[str, Source]) -> Config:
        """A Config of values a :class:`Knob` has parsed already (defaults for those left out).

        Every group's creation resolves its config: parsing those values again would cost a
        native call per knob, in a forked rank mostly copy-on-write faults
        (docs/performance.md#start-up)."""
        config = object.__new__(cls)
        parsed = {name: values.get(name, knob.default) for name, knob in KNOBS.items()}
        object.__setattr__(config, "_values", MappingProxyType(parsed))
        object.__setattr__(config, "_sources", MappingProxyType(_validated_sources(sources)))
        return config

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"Config has no knob {name!r}") from None

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to {name!r}: Config is immutable")

    @property
    def sources(self) -> Mapping[str, Source]:
        return self._sources

    def values(self) -> dict[str, Any]:
        """Every knob's value, by name."""
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and dict(self._values) == dict(other._values)

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Config({body})"

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only mappings cannot be pickled as such; rebuild from plain values.
        return (_rebuild_config, (dict(self._values), dict(self._sources)))

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
        return cls._from_parsed(values, sources)

    def with_options(self, options: Options) -> Config:
        """This config with every knob that ``options`` sets overridden."""
        values = dict(self._values)
        sources = dict(self._sources)
        for name, value in options.items():  # parsed when the Options were made
            values[name] = value
            sources[name] = "pg_options"
        return Config._from_parsed(values, sources)

    def to_native(self) -> dict[str, str]:
        """The ``dict[str, str]`` handed to ``_C.create_backend`` (every knob, always)."""
        return {k: str(v) for k, v in self._values.items()}

    def describe(self) -> list[dict[str, Any]]:
        """One row per knob: name, value, source, env var, default and allowed values."""
        return [
            {
                "name": k.name,
                "value": self._values[k.name],
                "source": self._sources[k.name],
                "env_var": k.env_var,
                "default": k.default,
                "allowed": k.allowed,
            }
            for k in KNOBS.values()
        ]

    @property
    def logging_level(self) -> int:
        """``log_level`` as a :mod:`logging` level number."""
        return cast(int, getattr(logging, str(self._values["log_level"])))


def _rebuild_config(values: dict[str, Any], sources: dict[str, Source]) -> Config:
    return Config(sources, **values)


class Options:
    """Per-process-group options for the ``ucx`` and ``udp`` backends, passed as ``pg_options``.

    Knobs left out fall back to the ``UCXBACKEND_*`` environment variable, then to the default;
    reading one that was left out gives ``None``. Values are validated (and normalised, e.g.
    ``"debug"`` -> ``"DEBUG"``) here, so a bad value fails where it is written, not later
    inside ``init_process_group``::

        dist.init_process_group("ucx", pg_options=ucxbackend.Options(progress_mode="poll"))

    A plain dict works too: ``pg_options={"progress_mode": "poll"}``.
    """

    __slots__ = ("_set",)
    _set: Mapping[str, Any]

    def __init__(self, **values: object) -> None:
        parsed: dict[str, Any] = {}
        for name, raw in values.items():
            knob = KNOBS.get(name)
            if knob is None:
                raise _unknown_option(name)
            if raw is not None:
                parsed[name] = knob.from_option(raw)
        object.__setattr__(self, "_set", MappingProxyType(parsed))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._set:
            return self._set[name]
        if name in KNOBS:
            return None
        raise AttributeError(f"Options has no knob {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to {name!r}: Options is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Options) and dict(self._set) == dict(other._set)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._set.items())))

    def __repr__(self) -> str:
        return "Options(" + ", ".join(f"{k}={v!r}" for k, v in self._set.items()) + ")"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_options, (dict(self._set),))

    @classmethod
    def from_mapping(cls, mapping: Mapping[Any, object]) -> Options:
        """Build from a ``dict`` of knob name -> value; unknown names raise ValueError."""
        for key in mapping:
            if not isinstance(key, str) or key not in KNOBS:
                raise _unknown_option(key)
        return cls(**{cast(str, k): v for k, v in mapping.items()})

    def items(self) -> Iterator[tuple[str, Any]]:
        """The (name, value) pairs that are set, in schema order."""
        for name in KNOBS:
            if name in self._set:
                yield name, self._set[name]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.items())

    def resolve(self, env: Mapping[str, str] | None = None) -> Config:
        """The full config: these options over the environment over the defaults."""
        config = Config.from_env(env)
        # No pg_options (the default group's case): the environment's config as it is, not a
        # copy rebuilt knob by knob, which in a forked rank's first creation is mostly
        # copy-on-write faults (docs/performance.md#start-up).
        return config.with_options(self) if self._set else config


def _rebuild_options(values: dict[str, Any]) -> Options:
    return Options(**values)


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
