"""The udp columns: ``--udp-variant`` specs and the ``--udp-drop`` x ``--udp-policy`` sweep
become :class:`UdpVariant` s, each a column on a ``udp`` group of its own.

Call order: :func:`parse_udp_settings` reads ``KEY=VALUE,...`` (``--udp-common`` and each
variant's body); :func:`parse_udp_variants` / :func:`parse_udp_variant` read the labelled
specs; :func:`parse_drops` and :func:`parse_policies` read the sweep's lists and
:func:`udp_sweep` crosses them. The native parser (``ucxbackend._C.udp``) has the last word
on every value when the extension is built. :data:`UDP_COUNTERS` and :data:`UDP_GAUGES` name
what a udp column reports (read in :mod:`.timing`, shown by :mod:`.report`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .common import split_list

UDP: Final = "udp"
# The built-in loss-recovery policies of the udp transport (transports/udp/loss_recovery.cpp;
# a test checks it has them) with the short names of sweep labels, --udp-policy and
# loss_recovery=; other registered policies are accepted under their own names.
UDP_POLICIES: Final[Mapping[str, str]] = {"selective_repeat": "sr", "go_back_n": "gbn"}
DEFAULT_UDP_POLICY: Final = "selective_repeat"
DEFAULT_UDP_SEED: Final = 1
_UDP_PROBABILITIES: Final = frozenset(
    {"drop", "dup", "reorder", "delay", "corrupt", "ge_enter", "ge_leave", "ge_drop"}
)
_LABEL_RE: Final = re.compile(r"[A-Za-z0-9_.@%+:-]+")
# A udp_faults key for one path only ('path1.drop=5%': path 1 loses 5%, the others what the
# plain keys say): its own ';'-separated section of udp_faults (transports/udp/faults.h).
_PATH_KEY_RE: Final = re.compile(r"path([0-9]+)\.([a-z_]+)")
# The one variant key that is a knob of its own rather than a udp_config or udp_faults key:
# a variant measured in the authenticated mode ('auth:secret_file=/path/to/secret').
SECRET_FILE_KEY: Final = "secret_file"
# Per-op counters of a udp column: udp stats() "total" keys (and the "faults_*" ones, from
# "transport"), the change over the timed iterations summed over ranks, divided by -n.
UDP_COUNTERS: Final = (
    "retransmitted_packets",
    "retransmitted_bytes",
    "declared_lost",
    "rto_expiries",
    "faults_dropped",
    "faults_queue_dropped",  # the emulated bottleneck's drop-tail
    "faults_marked",
    "faults_trimmed",
    "spurious_retransmissions",
    "data_packets_sent",
    "datagrams_sent",
    "duplicate_packets",
    "out_of_order",
    "dropped",  # datagrams the receiver rejected (malformed, stale, ...), injected drops not
    "queue_cuts",  # adaptive: path windows halved for a standing queue (receive timestamps)
    "queue_at_bdp",  # adaptive: queues met with the window at the path's bandwidth-delay product
)
# Gauges read after the timed iterations, max over ranks.
UDP_GAUGES: Final = ("rtt_smoothed_us", "rtt_min_us")


@dataclass(frozen=True)
class UdpVariant:
    """A column measured on a ``udp`` group of its own, created with these ``pg_options``.

    ``udp_config`` and ``udp_faults`` are the normalised ``key=value,...`` strings of the
    ``udp_config`` and ``udp_faults`` knobs (``ucxbackend.config``); both are always passed, so
    ``UCXBACKEND_UDP_CONFIG`` / ``UCXBACKEND_UDP_FAULTS`` do not reach a variant.
    """

    label: str
    udp_config: str = ""
    udp_faults: str = ""
    # The authenticated mode's secret file ('': off); passed always, so that
    # UCXBACKEND_SECRET_FILE does not reach a variant either.
    secret_file: str = ""

    def pg_options(self) -> dict[str, str]:
        return {
            "udp_config": self.udp_config,
            "udp_faults": self.udp_faults,
            "secret_file": self.secret_file,
        }

    def spec(self) -> str:
        """``LABEL:KEY=VALUE,...``, which :func:`parse_udp_variants` reads back."""
        secret = f"{SECRET_FILE_KEY}={self.secret_file}" if self.secret_file else ""
        parts = (self.udp_config, _path_items(self.udp_faults), secret)
        return f"{self.label}:{','.join(s for s in parts if s)}"

    def describe(self) -> dict[str, str]:
        described = {"label": self.label, "backend": UDP, **self.pg_options()}
        if not self.secret_file:
            del described[SECRET_FILE_KEY]
        return described


def _percent(drop: float) -> str:
    return f"{drop * 100:.4g}%"


def _validate_udp(kind: str, text: str) -> None:
    """The native parser's verdict on a udp_config / udp_faults string (skipped when the
    extension is not built: validate_environment reports that)."""
    import ucxbackend

    native = ucxbackend._C
    if native is None or not text:
        return
    describe = native.udp.describe_config if kind == "config" else native.udp.describe_faults
    describe(text)  # ValueError: "udp config: loss_recovery='x' is invalid (allowed: ...)"


def parse_udp_settings(where: str, body: str, *, labelled: bool = True) -> dict[str, str]:
    """``KEY=VALUE,...`` with udp_config and udp_faults keys in any order -> {key: value}, in
    order; ``loss_recovery`` may be ``sr``/``gbn``, probabilities may be percentages (``5%``).
    Raises ValueError starting with ``where``."""
    from ..config import udp_config_keys, udp_fault_keys

    config_keys, fault_keys = udp_config_keys(), udp_fault_keys()
    settings: dict[str, str] = {}
    for item in (part.strip() for part in body.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        path_key = _PATH_KEY_RE.fullmatch(key)
        base_key = path_key.group(2) if path_key else key
        if path_key and base_key not in fault_keys:
            raise ValueError(
                f"{where}: {key!r}: only udp_faults keys may be given per path "
                f"(pathN.KEY), not {base_key!r}"
            )
        if not sep:
            hint = f" (a variant named {item!r} with the defaults is '{item}:')"
            raise ValueError(f"{where}: {item!r} is not KEY=VALUE{'' if labelled else hint}")
        if key not in config_keys and base_key not in fault_keys and key != SECRET_FILE_KEY:
            raise ValueError(
                f"{where}: unknown key {key!r}; udp_config keys: {', '.join(config_keys)}; "
                f"udp_faults keys: {', '.join(fault_keys)}; and {SECRET_FILE_KEY}"
            )
        if not value:
            raise ValueError(f"{where}: {key}= has no value")
        if key in settings:
            raise ValueError(f"{where}: key {key!r} given twice")
        if key == "loss_recovery":  # the sweep's short names work here too
            value = {short: name for name, short in UDP_POLICIES.items()}.get(value, value)
        elif base_key in _UDP_PROBABILITIES and value.endswith("%"):
            try:
                value = repr(float(value[:-1]) / 100)
            except ValueError:
                raise ValueError(f"{where}: {key}={value} is not a percentage") from None
        settings[key] = value
    return settings


def parse_udp_variant(
    text: str, seed: int = DEFAULT_UDP_SEED, common: Mapping[str, str] | None = None
) -> UdpVariant:
    """One variant: ``LABEL:KEY=VALUE,...`` or, unlabelled, ``KEY=VALUE,...``.

    The label is everything before the last ``:`` that comes before the first ``=`` (so a
    label may contain ``:`` itself, as the sweep's ``udp:sr@1%`` do); ``LABEL:`` alone is a
    variant with the udp defaults (lossless). Each key goes to ``udp_config`` or
    ``udp_faults`` by name (the two key sets are disjoint). ``common`` settings
    (``--udp-common``) apply where the variant does not set the key itself. Without a
    ``seed`` key, faults get ``seed=<seed>``. ``secret_file=PATH`` measures the variant in the
    authenticated mode (the ``secret_file`` knob). An unlabelled variant may only set
    ``loss_recovery`` and ``drop``; it is labelled as the sweep labels (``udp:gbn@5%``).
    Raises ValueError naming the bad part.
    """
    from ..config import udp_config_keys

    config_keys = udp_config_keys()
    raw = text.strip()
    where = f"udp variant {raw!r}"
    if not raw:
        raise ValueError("empty udp variant: expected LABEL:KEY=VALUE,... or LABEL:")
    eq = raw.find("=")
    colon = (raw if eq < 0 else raw[:eq]).rfind(":")
    label: str | None = None
    body = raw
    if colon >= 0:
        label, body = raw[:colon].strip(), raw[colon + 1 :]
        if not label:
            raise ValueError(f"{where}: empty label before ':'")
        if not _LABEL_RE.fullmatch(label):
            raise ValueError(
                f"{where}: bad label {label!r}: use letters, digits and _ . @ % + : - only"
            )
    own = parse_udp_settings(where, body, labelled=label is not None)
    if label is None:
        extra = sorted(set(own) - {"loss_recovery", "drop"})
        if extra:
            raise ValueError(
                f"{where}: give it a label (LABEL:{body.strip()}); only loss_recovery and "
                f"drop make an automatic one, not {', '.join(extra)}"
            )
        policy = own.get("loss_recovery", (common or {}).get("loss_recovery", DEFAULT_UDP_POLICY))
        try:
            drop = float(own.get("drop", 0))
        except ValueError:
            raise ValueError(f"{where}: drop={own['drop']} is not a probability") from None
        label = f"udp:{UDP_POLICIES.get(policy, policy)}@{_percent(drop)}"
    settings = {**own, **{k: v for k, v in (common or {}).items() if k not in own}}
    secret_file = settings.pop(SECRET_FILE_KEY, "")
    config = {k: v for k, v in settings.items() if k in config_keys}
    faults = {k: v for k, v in settings.items() if k not in config_keys}
    if faults and "seed" not in faults:
        faults["seed"] = str(seed)
    udp_config = ",".join(f"{k}={v}" for k, v in config.items())
    udp_faults = _fault_sections(faults)
    try:
        _validate_udp("config", udp_config)
        _validate_udp("faults", udp_faults)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return UdpVariant(label, udp_config, udp_faults, secret_file)


def _fault_sections(faults: Mapping[str, str]) -> str:
    """{key: value} with pathN.KEY keys -> udp_faults: the plain keys, then one ';'-separated
    section per path up to the highest named (an empty section: that path as the first)."""
    sections: dict[int, list[str]] = {}
    plain: list[str] = []
    for key, value in faults.items():
        path_key = _PATH_KEY_RE.fullmatch(key)
        if path_key:
            sections.setdefault(int(path_key.group(1)), []).append(f"{path_key.group(2)}={value}")
        else:
            plain.append(f"{key}={value}")
    if 0 in sections:
        plain += sections.pop(0)
    last = max(sections, default=0)
    return ";".join([",".join(plain)] + [",".join(sections.get(p, [])) for p in range(1, last + 1)])


def _path_items(udp_faults: str) -> str:
    """The inverse of :func:`_fault_sections`: udp_faults with ';'-separated path sections ->
    ``KEY=VALUE,...`` with pathN.KEY items (a variant body, which may not hold a ';')."""
    sections = udp_faults.split(";")
    items = [item for item in sections[0].split(",") if item]
    for path, section in enumerate(sections[1:], start=1):
        items += [f"path{path}.{item}" for item in section.split(",") if item]
    return ",".join(items)


def parse_udp_variants(
    text: str, seed: int = DEFAULT_UDP_SEED, common: Mapping[str, str] | None = None
) -> list[UdpVariant]:
    """Variants separated by ``;`` (see :func:`parse_udp_variant`)."""
    parts = [part for part in text.split(";") if part.strip()]
    if not parts:
        raise ValueError("empty --udp-variant: expected LABEL:KEY=VALUE,... or LABEL:")
    return [parse_udp_variant(part, seed, common) for part in parts]


def parse_drops(text: str) -> list[float]:
    """``0,0.01,5%`` -> [0.0, 0.01, 0.05] (probabilities; ``%`` for percent)."""
    drops: list[float] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        try:
            value = float(word[:-1]) / 100 if word.endswith("%") else float(word)
        except ValueError:
            raise ValueError(f"--udp-drop: {word!r} is not a probability (0.01 or 1%)") from None
        if not 0.0 <= value <= 1.0 or math.isnan(value):
            raise ValueError(f"--udp-drop: {word!r} is outside 0..1 (0%..100%)")
        if value not in drops:
            drops.append(value)
    if not drops:
        raise ValueError("--udp-drop: expected a comma-separated list such as 0,0.01,0.1")
    return drops


def parse_policies(text: str) -> list[str]:
    """``sr,go_back_n`` -> ["selective_repeat", "go_back_n"]: short names for the built-in
    policies, and any policy the transport's registry has (checked by the native parser)."""
    import ucxbackend

    by_name = {**{v: k for k, v in UDP_POLICIES.items()}, **{k: k for k in UDP_POLICIES}}
    policies: list[str] = []
    for word in split_list(text):
        policy = by_name.get(word, word)
        problem = None
        if ucxbackend._C is not None:
            try:
                _validate_udp("config", f"loss_recovery={policy}")
            except ValueError as exc:
                problem = str(exc)
        elif policy not in UDP_POLICIES:
            problem = "allowed: " + ", ".join(UDP_POLICIES)
        if problem is not None:
            short = ", ".join(f"{v} = {k}" for k, v in UDP_POLICIES.items())
            raise ValueError(f"--udp-policy: unknown policy {word!r} ({problem}; {short})")
        if policy not in policies:
            policies.append(policy)
    if not policies:
        raise ValueError("--udp-policy: expected a comma-separated list such as sr,gbn")
    return policies


def udp_sweep(
    drops: Sequence[float],
    policies: Sequence[str],
    seed: int = DEFAULT_UDP_SEED,
    common: Mapping[str, str] | None = None,
) -> list[UdpVariant]:
    """The cross product, policy by policy: ``udp:sr@0%``, ``udp:sr@1%``, ..., ``udp:gbn@1%``
    (``loss_recovery`` always set, ``drop`` when not 0; then ``common`` and ``seed``)."""
    out = []
    for policy in policies:
        for drop in drops:
            label = f"udp:{UDP_POLICIES.get(policy, policy)}@{_percent(drop)}"
            spec = f"{label}:loss_recovery={policy}" + (f",drop={drop!r}" if drop > 0 else "")
            out.append(parse_udp_variant(spec, seed, common))
    return out
