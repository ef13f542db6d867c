"""``python -m ucxbackend bench``: an nccl-tests-style benchmark of torch.distributed backends.

Several backends are measured side by side in one job: the default process group is a Gloo
control group, each measured backend gets ``dist.new_group(backend=name)`` over all ranks, and
every size is timed on each backend in turn (interleaved, so that noise hits them alike), and
with ``--rounds R`` each size's iterations are cut into R rounds that the backends take in turn,
so that a machine whose speed drifts for seconds at a time skews no ratio.
Sizes, counts, algorithm and bus bandwidths follow nccl-tests (its ``PERFORMANCE.md``).

Examples::

    # all_reduce, ucx vs gloo, 2 ranks started here, 8 B .. 64 MB
    OMP_NUM_THREADS=1 python -m ucxbackend bench all_reduce

    # every collective, a short sweep, int32 max, results as JSON and a plot
    python -m ucxbackend bench all -b 8 -e 1M -f 8 -d int32 -o max --json r.json --plot r.png

    # latency: min over iterations instead of the mean, 4 ranks, MPI (mpi4py) as a reference
    python -m ucxbackend bench all_reduce -b 8 -e 64K --stat min --nproc 4 --backends ucx,gloo,mpi

    # under torchrun (rank, world size and rendezvous from the environment)
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m ucxbackend bench all_gather

    # udp protocol variants, each a column on a udp group of its own with its own pg_options
    # (the first, lossless, is the reference of the ratio columns)
    python -m ucxbackend bench -b 1M -f 4 --udp-variant "lossless:;gbn5:drop=5%,loss_recovery=gbn"

    # a sweep: selective repeat and go-back-N at 0, 1 and 10% drop (six columns)
    python -m ucxbackend bench -b 1M -f 4 --udp-drop 0,1%,10% --udp-policy sr,gbn

Exit status: 0 success; 1 wrong results (``#wrong`` > 0); 2 bad options; 3 a rank failed or
the run went past ``--timeout``.

Test-only hook: ``UCXBACKEND_BENCH_CORRUPT=<backend>`` makes the bench overwrite one element of
the checked output of every op of that backend (on rank 0; on the root for ``reduce``) right
after the op, so that ``#wrong`` is non-zero and the bench exits 1. It exists to prove that
``-c 1`` can fail; never set it for a real measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, TextIO

import torch
import torch.distributed as dist

__all__ = [
    "COLLECTIVES",
    "BenchError",
    "BenchOptions",
    "Layout",
    "Measurement",
    "Row",
    "UsageError",
    "add_arguments",
    "bandwidths",
    "build_report",
    "bus_factor",
    "format_footer",
    "format_header",
    "format_row",
    "layouts_for",
    "parse_size",
    "run",
    "size_sweep",
    "write_plot",
]

logger = logging.getLogger(__name__)

COLLECTIVES: Final = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "barrier",
    "sendrecv",
)
_COLLECTIVE_ALIASES: Final[Mapping[str, str]] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all",
}
_REDUCING: Final = frozenset({"all_reduce", "reduce_scatter", "reduce"})
_ROOTED: Final = frozenset({"broadcast", "reduce"})
# nccl-tests: the size of these is the whole (gathered / scattered / exchanged) buffer.
_TOTAL_BUFFER: Final = frozenset({"all_gather", "reduce_scatter", "all_to_all"})

# nccl-tests names first; the display name of each dtype is its nccl-tests name.
_DTYPE_NAMES: Final[Mapping[str, str]] = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "half": "half",
    "float16": "half",
    "float": "float",
    "float32": "float",
    "double": "double",
    "float64": "double",
    "bfloat16": "bfloat16",
}
_TORCH_DTYPES: Final[Mapping[str, torch.dtype]] = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "uint32": torch.uint32,
    "int64": torch.int64,
    "uint64": torch.uint64,
    "half": torch.float16,
    "float": torch.float32,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
}
OPS: Final = ("sum", "prod", "min", "max", "avg")
_REDUCE_OPS: Final[Mapping[str, Any]] = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}
STATS: Final = ("mean", "median", "min")
DEFAULT_BACKENDS: Final = ("ucx", "gloo")
MPI: Final = "mpi"
CORRUPT_ENV: Final = "UCXBACKEND_BENCH_CORRUPT"
_ARGV_ENV: Final = "_UCXBENCH_COMMAND"  # the user's command line, handed to the ranks we start
_LAUNCH_ENV: Final = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

EXIT_OK: Final = 0
EXIT_WRONG: Final = 1
EXIT_USAGE: Final = 2
EXIT_FAILED: Final = 3

# After one rank fails, how long the others get to exit on their own before they are killed.
_FAIL_GRACE_S: Final = 10.0


class BenchError(Exception):
    """A failure of the run itself (not of the results)."""


class UsageError(BenchError):
    """Bad options or an environment the options cannot work in."""


# --------------------------------------------------------------------------- sizes


_SIZE_RE: Final = re.compile(r"([0-9]+)\s*([KMG]?)", re.IGNORECASE)
_SIZE_UNITS: Final[Mapping[str, int]] = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``16M``, ``1G`` (K/M/G are powers of 1024)."""
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(
            f"invalid size {text!r}: expected a byte count such as 8, 64K, 16M or 1G "
            "(K, M, G are powers of 1024)"
        )
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """``16M`` for 16 MiB, ``1536`` for 1536 bytes: the largest unit that divides exactly."""
    for unit in ("G", "M", "K"):
        scale = _SIZE_UNITS[unit]
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def size_sweep(minbytes: int, maxbytes: int, stepfactor: int) -> list[int]:
    """The requested sizes: ``minbytes`` times powers of ``stepfactor`` up to ``maxbytes``."""
    if minbytes < 1:
        raise ValueError(f"minbytes must be at least 1, got {minbytes}")
    if maxbytes < minbytes:
        raise ValueError(f"maxbytes ({maxbytes}) is smaller than minbytes ({minbytes})")
    if stepfactor < 2:
        raise ValueError(f"stepfactor must be at least 2, got {stepfactor}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= stepfactor
    return sizes


@dataclass(frozen=True)
class Layout:
    """One row of a sweep, with nccl-tests' meaning of the ``size`` and ``count`` columns.

    ``nbytes``: the whole buffer (the gathered output of all_gather, the input of
    reduce_scatter, the send buffer of all_to_all; the tensor for the others). ``count``:
    nccl-tests' count column, i.e. elements per rank for all_gather/reduce_scatter, per peer
    for all_to_all, and of the tensor for the others. Barrier has neither (0, 0).
    """

    collective: str
    nbytes: int
    count: int


def layout_for(collective: str, nbytes: int, elsize: int, world: int) -> Layout:
    """The layout for a requested size: whole elements (whole per-rank chunks where the size
    is the total buffer), at least one element (per rank)."""
    if collective == "barrier":
        return Layout(collective, 0, 0)
    if collective in _TOTAL_BUFFER:
        per_rank = max(1, nbytes // elsize // world)
        return Layout(collective, per_rank * world * elsize, per_rank)
    count = max(1, nbytes // elsize)
    return Layout(collective, count * elsize, count)


def layouts_for(collective: str, sizes: Sequence[int], elsize: int, world: int) -> list[Layout]:
    """The rows of a sweep; a size that rounds onto an earlier one is measured once."""
    if collective == "barrier":
        return [Layout(collective, 0, 0)]
    seen: set[int] = set()
    out = []
    for size in sizes:
        layout = layout_for(collective, size, elsize, world)
        if layout.nbytes not in seen:
            seen.add(layout.nbytes)
            out.append(layout)
    return out


def bus_factor(collective: str, world: int) -> float:
    """busbw / algbw, as nccl-tests' PERFORMANCE.md defines it."""
    if collective == "all_reduce":
        return 2.0 * (world - 1) / world
    if collective in _TOTAL_BUFFER:
        return (world - 1) / world
    if collective in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    if collective == "barrier":
        return 0.0
    raise ValueError(f"unknown collective {collective!r}")


def bandwidths(collective: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second): algbw = size / time."""
    if seconds <= 0 or nbytes == 0:
        return 0.0, 0.0
    algbw = nbytes / 1e9 / seconds
    return algbw, algbw * bus_factor(collective, world)


# --------------------------------------------------------------------------- options


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _split_list(text: str) -> list[str]:
    return [part.strip().lower() for part in text.split(",") if part.strip()]


def parse_collectives(words: Iterable[str]) -> tuple[str, ...]:
    """``["all_reduce,all_gather", "barrier"]`` -> the collectives, in order, deduplicated;
    ``all`` is every collective. Raises ValueError naming the unknown ones."""
    chosen: list[str] = []
    for word in words:
        for name in _split_list(word):
            names = COLLECTIVES if name == "all" else (_COLLECTIVE_ALIASES.get(name, name),)
            for coll in names:
                if coll not in COLLECTIVES:
                    raise ValueError(
                        f"unknown collective {name!r}; choose from {', '.join(COLLECTIVES)} or all"
                    )
                if coll not in chosen:
                    chosen.append(coll)
    return tuple(chosen) or ("all_reduce",)


def _collectives_arg(text: str) -> str:
    try:
        parse_collectives([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _backends_arg(text: str) -> tuple[str, ...]:
    names = _split_list(text)
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of backends")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise argparse.ArgumentTypeError(f"backend(s) listed twice: {', '.join(duplicates)}")
    return tuple(names)


# --------------------------------------------------------------------------- udp variants

UDP: Final = "udp"
# The built-in loss-recovery policies of the udp transport (transports/udp/loss_recovery.cpp;
# a test checks it has them) with the short names of sweep labels, --udp-policy and
# loss_recovery=; other registered policies are accepted under their own names.
UDP_POLICIES: Final[Mapping[str, str]] = {"selective_repeat": "sr", "go_back_n": "gbn"}
DEFAULT_UDP_POLICY: Final = "selective_repeat"
DEFAULT_UDP_SEED: Final = 1
_UDP_PROBABILITIES: Final = frozenset({"drop", "dup", "reorder", "delay", "corrupt"})
_LABEL_RE: Final = re.compile(r"[A-Za-z0-9_.@%+:-]+")
# Per-op counters of a udp column: udp stats() "total" keys (and "faults_dropped", from
# "transport"), the change over the timed iterations summed over ranks, divided by -n.
UDP_COUNTERS: Final = (
    "retransmitted_packets",
    "retransmitted_bytes",
    "declared_lost",
    "rto_expiries",
    "faults_dropped",
    "data_packets_sent",
    "datagrams_sent",
    "duplicate_packets",
    "out_of_order",
    "dropped",  # datagrams the receiver rejected (malformed, stale, ...), injected drops not
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

    def pg_options(self) -> dict[str, str]:
        return {"udp_config": self.udp_config, "udp_faults": self.udp_faults}

    def spec(self) -> str:
        """``LABEL:KEY=VALUE,...``, which :func:`parse_udp_variants` reads back."""
        return f"{self.label}:{','.join(s for s in (self.udp_config, self.udp_faults) if s)}"

    def describe(self) -> dict[str, str]:
        return {"label": self.label, "backend": UDP, **self.pg_options()}


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
    from .config import UDP_CONFIG_KEYS, UDP_FAULT_KEYS

    settings: dict[str, str] = {}
    for item in (part.strip() for part in body.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep:
            hint = f" (a variant named {item!r} with the defaults is '{item}:')"
            raise ValueError(f"{where}: {item!r} is not KEY=VALUE{'' if labelled else hint}")
        if key not in UDP_CONFIG_KEYS and key not in UDP_FAULT_KEYS:
            raise ValueError(
                f"{where}: unknown key {key!r}; udp_config keys: {', '.join(UDP_CONFIG_KEYS)}; "
                f"udp_faults keys: {', '.join(UDP_FAULT_KEYS)}"
            )
        if not value:
            raise ValueError(f"{where}: {key}= has no value")
        if key in settings:
            raise ValueError(f"{where}: key {key!r} given twice")
        if key == "loss_recovery":  # the sweep's short names work here too
            value = {short: name for name, short in UDP_POLICIES.items()}.get(value, value)
        elif key in _UDP_PROBABILITIES and value.endswith("%"):
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
    ``seed`` key, faults get ``seed=<seed>``. An unlabelled variant may only set
    ``loss_recovery`` and ``drop``; it is labelled as the sweep labels (``udp:gbn@5%``).
    Raises ValueError naming the bad part.
    """
    from .config import UDP_CONFIG_KEYS

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
    config = {k: v for k, v in settings.items() if k in UDP_CONFIG_KEYS}
    faults = {k: v for k, v in settings.items() if k not in UDP_CONFIG_KEYS}
    if faults and "seed" not in faults:
        faults["seed"] = str(seed)
    udp_config = ",".join(f"{k}={v}" for k, v in config.items())
    udp_faults = ",".join(f"{k}={v}" for k, v in faults.items())
    try:
        _validate_udp("config", udp_config)
        _validate_udp("faults", udp_faults)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return UdpVariant(label, udp_config, udp_faults)


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
    for word in _split_list(text):
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


def _udp_variant_list(args: argparse.Namespace) -> tuple[UdpVariant, ...]:
    """--udp-variant (in order), then the --udp-drop x --udp-policy sweep; raises UsageError."""
    seed = getattr(args, "udp_seed", DEFAULT_UDP_SEED)
    common_text = getattr(args, "udp_common", None)
    variants: list[UdpVariant] = []
    try:
        common = parse_udp_settings("--udp-common", common_text) if common_text else {}
        for text in getattr(args, "udp_variant", None) or []:
            variants += parse_udp_variants(text, seed, common)
        drops, policies = getattr(args, "udp_drop", None), getattr(args, "udp_policy", None)
        if drops is not None or policies is not None:
            variants += udp_sweep(
                parse_drops(drops) if drops is not None else [0.0],
                parse_policies(policies) if policies is not None else [DEFAULT_UDP_POLICY],
                seed,
                common,
            )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if common_text and not variants:
        raise UsageError("--udp-common: no udp variant to apply it to (--udp-variant, --udp-drop)")
    labels = [v.label for v in variants]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise UsageError(f"udp variant label(s) used twice: {', '.join(twice)}")
    return tuple(variants)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` command's options (nccl-tests' short options where they exist)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "collectives: " + ", ".join(COLLECTIVES) + ", or all (default: all_reduce)\n"
        "exit status: 0 ok, 1 wrong results, 2 bad options, 3 a rank failed or timed out"
    )
    parser.add_argument(
        "collectives",
        nargs="*",
        type=_collectives_arg,
        metavar="COLLECTIVE",
        help="collectives to measure, space- or comma-separated (default: all_reduce)",
    )
    sweep = parser.add_argument_group("sweep (as nccl-tests)")
    sweep.add_argument("-b", "--minbytes", type=_size_arg, default=8, help="smallest size (8)")
    sweep.add_argument(
        "-e", "--maxbytes", type=_size_arg, default=64 << 20, help="largest size (64M)"
    )
    sweep.add_argument(
        "-f", "--stepfactor", type=_positive_int, default=2, help="size multiplier (2)"
    )
    sweep.add_argument(
        "-n", "--iters", type=_positive_int, default=20, help="timed iterations (20)"
    )
    sweep.add_argument(
        "-w", "--warmup_iters", type=_nonnegative_int, default=5, help="warm-up iterations (5)"
    )
    sweep.add_argument("-o", "--op", choices=OPS, default="sum", help="reduce op (sum)")
    sweep.add_argument(
        "-d",
        "--datatype",
        choices=tuple(_DTYPE_NAMES),
        default="float",
        metavar="TYPE",
        help=f"{', '.join(_DTYPE_NAMES)} (float)",
    )
    sweep.add_argument(
        "-c", "--check", type=int, choices=(0, 1), default=1, help="check results: #wrong (1)"
    )
    sweep.add_argument("-r", "--root", type=_nonnegative_int, default=0, help="root rank (0)")
    parser.add_argument(
        "--backends",
        type=_backends_arg,
        default=None,
        help="comma-separated backends measured side by side, the first is the reference of "
        "the ratio columns; 'mpi' adds an mpi4py Allreduce column (default: ucx,gloo; with "
        "udp variants: none, give it to add columns after the variants)",
    )
    udp = parser.add_argument_group(
        "udp protocol variants",
        "Each variant is a column of its own: a udp group created with its own pg_options "
        "(udp_config and udp_faults; UCXBACKEND_UDP_CONFIG/_FAULTS do not reach it). Variant "
        "columns come first, in order (the first column is the reference of the ratios), then "
        "--backends. A transport statistics block (retransmissions, losses, RTOs, injected "
        "drops per op, smoothed RTT) follows each table for every udp column.",
    )
    udp.add_argument(
        "--udp-variant",
        "--udp-variants",
        dest="udp_variant",
        action="append",
        metavar="LABEL:KEY=VALUE,...",
        help="a udp column: LABEL, a colon, then udp_config and udp_faults keys in any order "
        "(each key goes where it belongs, e.g. 'gbn5:drop=0.05,loss_recovery=go_back_n'); "
        "'LABEL:' alone = udp defaults, lossless; without 'LABEL:' only loss_recovery and drop "
        "may be set and the label is made as the sweep's; several variants: repeat the option "
        "or separate them with ';' ('lossless:;sr1:drop=0.01')",
    )
    udp.add_argument(
        "--udp-drop",
        metavar="P,...",
        help="sweep: injected drop probabilities (0,0.01,0.1 or 0,1%%,10%%); crossed with "
        "--udp-policy into columns udp:<policy>@<drop>, after the --udp-variant ones "
        "(default policy: selective_repeat)",
    )
    udp.add_argument(
        "--udp-policy",
        metavar="POLICY,...",
        help="sweep: loss_recovery policies, "
        + ", ".join(f"{k} ({v})" for k, v in UDP_POLICIES.items())
        + " or any other in the transport's registry (default drop: 0)",
    )
    udp.add_argument(
        "--udp-common",
        metavar="KEY=VALUE,...",
        help="settings for every variant that does not set the key itself, e.g. "
        "'max_rto_expiries=100,congestion=aimd' or 'dup=0.001'",
    )
    udp.add_argument(
        "--udp-seed",
        type=_nonnegative_int,
        default=DEFAULT_UDP_SEED,
        help="fault seed of every variant that injects faults without its own seed= (1); "
        "the same for all, so that lossier variants drop a superset of the same datagrams "
        "as far as their traffic agrees",
    )
    parser.add_argument(
        "--stat",
        choices=STATS,
        default="mean",
        help="per-iteration time shown and used for bandwidths and ratios (mean, as "
        "nccl-tests; median to ignore scheduling hiccups on a busy machine; min for latency)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive_int,
        default=1,
        help="cut each size's -n timed iterations into this many rounds, taken by the "
        "backends in turn (ucx, gloo, ucx, gloo, ...), each after one untimed iteration, so "
        "that a machine whose speed drifts skews no ratio; 1 (default) times each backend "
        "in one block, as nccl-tests",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="tensor device")
    parser.add_argument(
        "--nproc",
        type=_positive_int,
        default=None,
        help="ranks to start on this host when not under torchrun (2)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds after which the whole run is killed (600)",
    )
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot busbw vs size (matplotlib)")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="progress lines and log messages on stderr"
    )


@dataclass(frozen=True)
class BenchOptions:
    """Validated options of one run."""

    collectives: tuple[str, ...] = ("all_reduce",)
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 2
    iters: int = 20
    warmup_iters: int = 5
    op: str = "sum"
    datatype: str = "float"  # display (nccl-tests) name
    check: bool = True
    root: int = 0
    backends: tuple[str, ...] = DEFAULT_BACKENDS  # torch backends measured, in order
    udp_variants: tuple[UdpVariant, ...] = ()  # columns of their own, before the backends
    mpi: bool = False  # an mpi4py Allreduce reference column
    mpi_position: int = 2  # where the mpi column goes among the backends
    stat: str = "mean"
    rounds: int = 1
    device: str = "cpu"
    nproc: int | None = None
    timeout: float = 600.0
    json: str | None = None
    plot: str | None = None
    verbose: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        """Validate what argparse could not; raises UsageError."""
        try:
            collectives = parse_collectives(args.collectives or [])
            size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        variants = _udp_variant_list(args)
        if args.backends is None:
            names: tuple[str, ...] = () if variants else DEFAULT_BACKENDS
        else:
            names = tuple(args.backends)
        torch_backends = tuple(n for n in names if n != MPI)
        if not torch_backends and not variants:
            raise UsageError("--backends needs at least one torch.distributed backend")
        if names and names[0] == MPI and not variants:
            raise UsageError("--backends: list mpi after the torch backend the ratios refer to")
        if args.rounds > args.iters:
            raise UsageError(
                f"--rounds {args.rounds}: more rounds than timed iterations (-n {args.iters})"
            )
        clash = sorted({v.label for v in variants} & set(names))
        if clash:
            raise UsageError(f"udp variant label(s) {', '.join(clash)} also in --backends")
        return cls(
            collectives=collectives,
            minbytes=args.minbytes,
            maxbytes=args.maxbytes,
            stepfactor=args.stepfactor,
            iters=args.iters,
            warmup_iters=args.warmup_iters,
            op=args.op,
            datatype=_DTYPE_NAMES[args.datatype],
            check=bool(args.check),
            root=args.root,
            backends=torch_backends,
            udp_variants=variants,
            mpi=MPI in names,
            mpi_position=names.index(MPI) if MPI in names else len(names),
            stat=args.stat,
            rounds=args.rounds,
            device=args.device,
            nproc=args.nproc,
            timeout=args.timeout,
            json=os.path.abspath(args.json) if args.json else None,
            plot=os.path.abspath(args.plot) if args.plot else None,
            verbose=args.verbose,
        )

    @property
    def dtype(self) -> torch.dtype:
        return _TORCH_DTYPES[self.datatype]

    @property
    def elsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def sizes(self) -> list[int]:
        return size_sweep(self.minbytes, self.maxbytes, self.stepfactor)

    def columns(self, mpi_available: bool) -> tuple[str, ...]:
        """Columns shown: the udp variants, then the backends in --backends order (mpi only
        when it could be measured)."""
        cols = list(self.backends)
        if self.mpi and mpi_available:
            cols.insert(self.mpi_position, MPI)
        return (*self.variant_labels, *cols)

    @property
    def variant_labels(self) -> tuple[str, ...]:
        return tuple(v.label for v in self.udp_variants)

    def udp_columns(self) -> frozenset[str]:
        """The columns measured on udp groups (their transport statistics are reported)."""
        return frozenset({*self.variant_labels, *(b for b in self.backends if b == UDP)})

    def measured(self) -> tuple[str, ...]:
        """The columns with a torch group: the variants, then the backends."""
        return (*self.variant_labels, *self.backends)

    def to_argv(self) -> list[str]:
        """The ``bench`` arguments that reproduce these options (for the ranks we start)."""
        backends = list(self.backends)
        if self.mpi:
            backends.insert(self.mpi_position, MPI)
        argv = [
            ",".join(self.collectives),
            f"--minbytes={self.minbytes}",
            f"--maxbytes={self.maxbytes}",
            f"--stepfactor={self.stepfactor}",
            f"--iters={self.iters}",
            f"--warmup_iters={self.warmup_iters}",
            f"--op={self.op}",
            f"--datatype={self.datatype}",
            f"--check={int(self.check)}",
            f"--root={self.root}",
            f"--stat={self.stat}",
            f"--rounds={self.rounds}",
            f"--device={self.device}",
            f"--timeout={self.timeout}",
        ]
        if backends or not self.udp_variants:
            argv.append(f"--backends={','.join(backends)}")
        argv += [f"--udp-variant={v.spec()}" for v in self.udp_variants]
        if self.nproc is not None:
            argv.append(f"--nproc={self.nproc}")
        if self.json:
            argv.append(f"--json={self.json}")
        if self.plot:
            argv.append(f"--plot={self.plot}")
        if self.verbose:
            argv.append("--verbose")
        return argv

    def describe(self) -> dict[str, Any]:
        return {
            "collectives": list(self.collectives),
            "minbytes": self.minbytes,
            "maxbytes": self.maxbytes,
            "stepfactor": self.stepfactor,
            "iters": self.iters,
            "warmup_iters": self.warmup_iters,
            "op": self.op,
            "datatype": self.datatype,
            "check": int(self.check),
            "root": self.root,
            "backends": list(self.columns(True)),
            "udp_variants": [v.describe() for v in self.udp_variants],
            "stat": self.stat,
            "rounds": self.rounds,
            "device": self.device,
            "timeout": self.timeout,
        }


def _backend_problem(name: str, device: str) -> str | None:
    """Why backend ``name`` cannot be measured here (None when it can)."""
    import ucxbackend

    known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
    if name not in known:
        choices = ", ".join(sorted({*known, MPI}))
        return f"unknown backend {name!r}; known: {choices}"
    if name in (ucxbackend.BACKEND_NAME, UDP) and not ucxbackend.is_available():
        return (
            f"the {name} backend's native extension could not be loaded "
            f"({ucxbackend.load_error()}); run `make build` and see `python -m ucxbackend info`"
        )
    available: Mapping[str, Callable[[], bool]] = {
        "gloo": dist.is_gloo_available,
        "nccl": dist.is_nccl_available,
        "ucc": dist.is_ucc_available,
    }
    if name in available and not available[name]():
        return f"backend {name!r} is not available in this torch build"
    if name == "nccl" and device != "cuda":
        return "backend 'nccl' needs --device cuda"
    return None


def validate_environment(opts: BenchOptions, world: int | None) -> None:
    """Checks that need torch or the machine; raises UsageError."""
    for name in (*opts.backends, *((UDP,) if opts.udp_variants else ())):
        problem = _backend_problem(name, opts.device)
        if problem is not None:
            raise UsageError(problem)
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available (torch.cuda.is_available() False)")
    if world is not None and opts.root >= world:
        raise UsageError(f"--root {opts.root} is not a rank of a world of size {world}")
    if opts.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install matplotlib")
    if opts.plot and set(opts.collectives) == {"barrier"}:
        raise UsageError("--plot: nothing to plot (barrier moves no data)")
    for path in (opts.json, opts.plot):
        if path and not os.path.isdir(os.path.dirname(path)):
            raise UsageError(f"cannot write {path}: directory {os.path.dirname(path)} not found")


# --------------------------------------------------------------------------- data and checks

# Largest integer every value of a reduction must stay below, so that sums are exact whatever
# the order of the additions (bf16 has 8 significant bits, half 11; int8/uint8 must not wrap).
_EXACT_LIMIT: Final[Mapping[torch.dtype, int]] = {
    torch.int8: 127,
    torch.uint8: 255,
    torch.bfloat16: 256,
    torch.float16: 2048,
}
_DATA_MODULUS: Final = 101  # non-reducing collectives and min/max: values 0..100 (or -50..50)
_AVG_TOLERANCE: Final[Mapping[torch.dtype, float]] = {
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float32: 1e-6,
    torch.float64: 1e-12,
}


def sum_modulus(dtype: torch.dtype, world: int) -> int:
    """Inputs of sum/avg are in ``[0, m)`` with ``world * (m - 1)`` below the exact limit."""
    limit = _EXACT_LIMIT.get(dtype, 1 << 24)
    return max(2, min(_DATA_MODULUS, (limit - 1) // world + 1))


def input_values(
    kind: str, dtype: torch.dtype, rank: int, world: int, start: int, count: int
) -> torch.Tensor:
    """Rank ``rank``'s input elements ``start .. start+count`` as int64 (small integers, exact
    in every dtype). ``kind`` is the reduce op, or ``data`` for collectives that only move data.

    prod: 1 or 2 (a 2 for at most every third rank per element; negated here and there for
    signed dtypes), so products stay exact powers of two; sum/avg: ``[0, sum_modulus)``;
    min/max and data: 0..100 (-50..50 for signed dtypes under min/max).
    """
    idx = torch.arange(start, start + count, dtype=torch.int64)
    if kind == "prod":
        values = torch.where((idx + rank) % 3 == 0, 2, 1)
        if dtype.is_signed:
            values = torch.where((idx + 2 * rank) % 5 == 0, -values, values)
        return values
    if kind in ("sum", "avg"):
        return (idx + 37 * rank) % sum_modulus(dtype, world)
    values = (idx + 37 * rank) % _DATA_MODULUS
    if kind in ("min", "max") and dtype.is_signed:
        values -= _DATA_MODULUS // 2
    return values


def reduce_values(op: str, parts: Iterable[torch.Tensor], world: int) -> torch.Tensor:
    """The exact reduction of int64 inputs (float64 for avg)."""
    acc: torch.Tensor | None = None
    for part in parts:
        if acc is None:
            acc = part.clone()
        elif op in ("sum", "avg"):
            acc += part
        elif op == "prod":
            acc *= part
        elif op == "min":
            torch.minimum(acc, part, out=acc)
        elif op == "max":
            torch.maximum(acc, part, out=acc)
        else:
            raise ValueError(f"unknown reduce op {op!r}")
    if acc is None:
        raise ValueError("nothing to reduce")
    return acc.to(torch.float64) / world if op == "avg" else acc


@dataclass
class CaseData:
    """One rank's input and expected output for one collective and size, on the CPU."""

    send: torch.Tensor | None  # the input (the in/out tensor of in-place collectives)
    recv_numel: int  # elements of a separate output tensor; 0: the output is ``send``
    expected: torch.Tensor | None  # None: nothing to check on this rank


def make_case_data(
    collective: str,
    layout: Layout,
    dtype: torch.dtype,
    op: str,
    rank: int,
    world: int,
    root: int,
    *,
    with_expected: bool = True,
) -> CaseData:
    """Inputs from :func:`input_values` and the expected result, computed independently."""
    c = layout.count
    kind = op if collective in _REDUCING else "data"

    def vals(q: int, start: int, n: int) -> torch.Tensor:
        return input_values(kind, dtype, q, world, start, n)

    def reduced(start: int) -> torch.Tensor:
        return reduce_values(op, (vals(q, start, c) for q in range(world)), world)

    if collective == "barrier":
        return CaseData(None, 0, None)
    if collective in ("all_reduce", "reduce", "broadcast", "sendrecv", "all_gather"):
        send = vals(rank, 0, c)
    else:  # reduce_scatter, all_to_all: one chunk per rank
        send = vals(rank, 0, c * world)
    recv_numel = {"all_gather": c * world, "reduce_scatter": c, "all_to_all": c * world}.get(
        collective, c if collective == "sendrecv" else 0
    )
    expected: torch.Tensor | None = None
    if with_expected:
        if collective == "all_reduce" or (collective == "reduce" and rank == root):
            expected = reduced(0)
        elif collective == "broadcast":
            expected = vals(root, 0, c)
        elif collective == "all_gather":
            expected = torch.cat([vals(q, 0, c) for q in range(world)])
        elif collective == "reduce_scatter":
            expected = reduced(rank * c)
        elif collective == "all_to_all":
            expected = torch.cat([vals(q, rank * c, c) for q in range(world)])
        elif collective == "sendrecv":
            expected = vals((rank - 1) % world, 0, c)
    return CaseData(
        send.to(dtype),
        recv_numel,
        None if expected is None else expected.to(dtype),
    )


def poison_value(dtype: torch.dtype) -> float | int:
    """A value no correct output holds: NaN, or the dtype's maximum (inputs stay below it)."""
    return math.nan if dtype.is_floating_point else torch.iinfo(dtype).max


def count_wrong(output: torch.Tensor, expected: torch.Tensor, op: str) -> int:
    """Elements of ``output`` that differ from ``expected`` (within a tolerance for avg)."""
    out = output.detach().to("cpu").reshape(-1)
    exp = expected.reshape(-1)
    if out.numel() != exp.numel():
        raise BenchError(f"output has {out.numel()} elements, expected {exp.numel()}")
    wide = torch.float64 if exp.dtype.is_floating_point else torch.int64
    a, b = out.to(wide), exp.to(wide)
    if op == "avg" and exp.dtype.is_floating_point:
        tol = _AVG_TOLERANCE[exp.dtype]
        return int((~torch.isclose(a, b, rtol=tol, atol=tol)).sum().item())
    return int((a != b).sum().item())


# --------------------------------------------------------------------------- ops and timing


@dataclass
class Buffers:
    send: torch.Tensor | None
    recv: torch.Tensor | None  # the checked output (``send`` itself for in-place collectives)


def make_buffers(data: CaseData, device: torch.device) -> Buffers:
    """Fresh tensors on ``device`` (once per size and backend, reused by every iteration)."""
    if data.send is None:
        return Buffers(None, None)
    send = data.send.to(device, copy=True)
    if not data.recv_numel:
        return Buffers(send, send)
    recv = torch.empty(data.recv_numel, dtype=send.dtype, device=device)
    recv.fill_(poison_value(send.dtype))
    return Buffers(send, recv)


def _all_gather_fn() -> Callable[..., Any]:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_fn() -> Callable[..., Any]:
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def make_op(
    collective: str,
    bufs: Buffers,
    group: dist.ProcessGroup,
    op: str,
    root: int,
    rank: int,
    world: int,
) -> Callable[[], None]:
    """One blocking call of ``collective`` on ``bufs`` (the groups span all ranks, so group
    ranks are global ranks)."""
    send, recv = bufs.send, bufs.recv
    reduce_op = _REDUCE_OPS[op]
    if collective == "barrier":
        return lambda: dist.barrier(group=group)
    assert send is not None and recv is not None
    if collective == "all_reduce":
        return lambda: dist.all_reduce(send, op=reduce_op, group=group)
    if collective == "reduce":
        return lambda: dist.reduce(send, dst=root, op=reduce_op, group=group)
    if collective == "broadcast":
        return lambda: dist.broadcast(send, src=root, group=group)
    if collective == "all_gather":
        all_gather = _all_gather_fn()
        return lambda: all_gather(recv, send, group=group)
    if collective == "reduce_scatter":
        reduce_scatter = _reduce_scatter_fn()
        return lambda: reduce_scatter(recv, send, op=reduce_op, group=group)
    if collective == "all_to_all":
        return lambda: dist.all_to_all_single(recv, send, group=group)
    if collective == "sendrecv":
        # isend/irecv rather than batch_isend_irecv: a batch whose op fails validation leaves
        # torch's coalescing state open on a group that supports coalescing, and later
        # collectives on that group would then be queued instead of run.
        nxt, prev = (rank + 1) % world, (rank - 1) % world

        def sendrecv() -> None:
            sent = dist.isend(send, nxt, group=group)
            received = dist.irecv(recv, prev, group=group)
            for work in (sent, received):
                if work is not None:
                    work.wait()

        return sendrecv
    raise ValueError(f"unknown collective {collective!r}")


@dataclass
class Measurement:
    """One backend at one size: times in microseconds (max over ranks), #wrong summed."""

    supported: bool
    error: str | None = None
    time_us: dict[str, float] | None = None  # mean, median, min, max
    wrong: int | None = None  # None: not checked
    transport: dict[str, Any] | None = None  # udp columns: see udp_transport_stats()

    def time(self, stat: str) -> float | None:
        return None if self.time_us is None else self.time_us[stat]


def _short_error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _attempt(fn: Callable[[], None]) -> str | None:
    """None, or why ``fn`` was rejected (an unsupported dtype/op: shown as n/a). A failure
    of the communication itself (``DistError``: a dead peer, a timeout) is not that: it
    propagates and fails the run."""
    try:
        fn()
    except dist.DistError:
        raise
    except Exception as exc:
        return _short_error(exc)
    return None


@dataclass
class RankContext:
    """What every measurement on this rank needs."""

    opts: BenchOptions
    rank: int
    world: int
    device: torch.device
    ctrl: dist.ProcessGroup
    groups: Mapping[str, dist.ProcessGroup]
    sync: Callable[[], None]
    udp_columns: frozenset[str] = frozenset()  # columns whose transport statistics we take

    def all_ok(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.ctrl)
        return bool(flag.item())

    def sum(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.ctrl)
        return int(t.item())

    def max_stats(self, stats: Sequence[float]) -> list[float]:
        t = torch.tensor(list(stats), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return [float(x) for x in t.tolist()]

    def sum_stats(self, stats: Sequence[float]) -> list[float]:
        t = torch.tensor(list(stats), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.ctrl)
        return [float(x) for x in t.tolist()]


def udp_counters(group: dist.ProcessGroup) -> dict[str, int]:
    """This rank's UDP_COUNTERS and UDP_GAUGES of a udp group (``ucxbackend.stats``), and
    the sequence number of the last op whose counters were published."""
    import ucxbackend

    st = ucxbackend.stats(group)
    merged = {**st["transport"], **st["total"]}
    out = {name: int(merged.get(name, 0)) for name in (*UDP_COUNTERS, *UDP_GAUGES)}
    out["last_op_seq"] = int(st["ops"][-1]["seq"]) if st["ops"] else -1
    return out


_SETTLE_FIRST_S: Final = 0.002
_SETTLE_STEP_S: Final = 0.001
_SETTLE_MAX_S: Final = 0.05


def settled_udp_counters(group: dist.ProcessGroup) -> dict[str, int]:
    """:func:`udp_counters` once they stop changing (at most ``_SETTLE_MAX_S``).

    The progress thread publishes an op's counters just after completing its Work, and again
    when it goes idle (late ACKs and retransmissions of the op's tail), so a read right after
    ``wait()`` can miss the last op. Sleeping hands the core to that thread."""
    deadline = time.monotonic() + _SETTLE_MAX_S
    time.sleep(_SETTLE_FIRST_S)
    prev = udp_counters(group)
    while True:
        time.sleep(_SETTLE_STEP_S)
        cur = udp_counters(group)
        if cur == prev or time.monotonic() >= deadline:
            return cur
        prev = cur


def udp_transport_stats(
    ctx: RankContext, before: Mapping[str, int], after: Mapping[str, int], iters: int
) -> dict[str, Any]:
    """Per op over the timed iterations: each counter's change summed over ranks over
    ``iters``; the gauges after them, max over ranks. Collective over the control group."""
    sums = ctx.sum_stats([after[c] - before[c] for c in UDP_COUNTERS])
    gauges = ctx.max_stats([after[g] for g in UDP_GAUGES])
    return {
        "iters": iters,
        "per_op": {c: v / iters for c, v in zip(UDP_COUNTERS, sums, strict=True)},
        **dict(zip(UDP_GAUGES, gauges, strict=True)),
    }


def _corrupt_rank(collective: str, root: int) -> int:
    return root if collective == "reduce" else 0


def _maybe_corrupt(
    ctx: RankContext, backend: str, collective: str, bufs: Buffers, data: CaseData
) -> None:
    """The test-only hook of the module docstring."""
    if os.environ.get(CORRUPT_ENV) != backend or data.expected is None or bufs.recv is None:
        return
    if ctx.rank != _corrupt_rank(collective, ctx.opts.root) or bufs.recv.numel() == 0:
        return
    logger.warning("%s=%s: corrupting one output element (test hook)", CORRUPT_ENV, backend)
    bufs.recv.view(-1)[:1].fill_(poison_value(bufs.recv.dtype))


def time_stats(times: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, median, min, max) of per-iteration times."""
    ordered = sorted(times)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return sum(ordered) / len(ordered), median, ordered[0], ordered[-1]


def _time_iterations(fn: Callable[[], None], sync: Callable[[], None], iters: int) -> list[float]:
    """Seconds of each of ``iters`` iterations, each op blocking like a training loop's."""
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def round_lengths(iters: int, rounds: int) -> list[int]:
    """``iters`` timed iterations cut into ``rounds`` rounds as even as can be, longer first."""
    base, extra = divmod(iters, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


@dataclass
class Timed:
    """One backend at one size, checked and warmed up, timed over one or more rounds."""

    backend: str
    group: Any
    fn: Callable[[], None]
    wrong: int | None
    udp: bool
    times: list[float] = field(default_factory=list)
    counted: dict[str, int] = field(default_factory=dict)  # udp counters' change in rounds
    gauges: dict[str, int] = field(default_factory=dict)  # udp gauges after the last round


def prepare(ctx: RankContext, backend: str, layout: Layout, data: CaseData) -> Measurement | Timed:
    """Check once (untimed) and warm up: a Timed ready for time_round(), or the
    Measurement of a backend that cannot run this case."""
    opts, collective = ctx.opts, layout.collective
    if collective == "sendrecv" and ctx.world < 2:
        return Measurement(False, "sendrecv needs at least 2 ranks")
    group = ctx.groups[backend]
    bufs = make_buffers(data, ctx.device)
    fn = make_op(collective, bufs, group, opts.op, opts.root, ctx.rank, ctx.world)

    def checked() -> None:
        fn()
        ctx.sync()

    error = _attempt(checked)
    if not ctx.all_ok(error is None):
        return Measurement(False, error or "failed on another rank")
    wrong = None
    if opts.check:
        _maybe_corrupt(ctx, backend, collective, bufs, data)
        local = 0
        if data.expected is not None and bufs.recv is not None:
            local = count_wrong(bufs.recv, data.expected, opts.op)
        wrong = ctx.sum(local)
    if collective in ("all_reduce", "reduce") and bufs.send is not None:
        bufs.send.zero_()  # in place: keep repeated reductions from overflowing
    for _ in range(opts.warmup_iters):
        fn()
    ctx.sync()
    return Timed(backend, group, fn, wrong, udp=backend in ctx.udp_columns)


def time_round(ctx: RankContext, timed: Timed, iters: int, rewarm: bool) -> None:
    """Barrier, then time ``iters`` iterations; ``rewarm`` runs one untimed iteration first
    (another backend's round ran since this one's warm-up). The udp counters count only
    the timed iterations."""
    if rewarm:
        timed.fn()
        ctx.sync()
    dist.barrier(group=timed.group)
    before = settled_udp_counters(timed.group) if timed.udp else None
    timed.times += _time_iterations(timed.fn, ctx.sync, iters)
    if before is not None:
        after = settled_udp_counters(timed.group)
        for c in UDP_COUNTERS:
            timed.counted[c] = timed.counted.get(c, 0) + after[c] - before[c]
        timed.gauges = {g: after[g] for g in UDP_GAUGES}


def finish(ctx: RankContext, timed: Timed) -> Measurement:
    """The Measurement of every round together (times: max over ranks)."""
    stats = ctx.max_stats(time_stats(timed.times))
    time_us = dict(zip(("mean", "median", "min", "max"), (x * 1e6 for x in stats), strict=True))
    transport = None
    if timed.udp:
        zero = dict.fromkeys(UDP_COUNTERS, 0)
        transport = udp_transport_stats(
            ctx, zero, {**timed.counted, **timed.gauges}, len(timed.times)
        )
    return Measurement(True, None, time_us, timed.wrong, transport)


def measure(ctx: RankContext, backend: str, layout: Layout, data: CaseData) -> Measurement:
    """Check once (untimed), warm up, barrier, time ``iters`` iterations in one round."""
    timed = prepare(ctx, backend, layout, data)
    if isinstance(timed, Measurement):
        return timed
    time_round(ctx, timed, ctx.opts.iters, rewarm=False)
    return finish(ctx, timed)


# --------------------------------------------------------------------------- table and JSON


@dataclass
class Row:
    """One size of one collective: a measurement per backend column."""

    layout: Layout
    dtype: str
    op: str  # "none" for collectives that do not reduce
    root: int  # -1 for collectives without a root
    results: dict[str, Measurement] = field(default_factory=dict)

    @property
    def collective(self) -> str:
        return self.layout.collective


def row_for(layout: Layout, opts: BenchOptions) -> Row:
    collective = layout.collective
    return Row(
        layout,
        opts.datatype,
        opts.op if collective in _REDUCING else "none",
        opts.root if collective in _ROOTED else -1,
    )


_FIXED = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}"
_BLOCK = "  {:>9}  {:>7}  {:>7}"
_WRONG = "  {:>6}"


def _block_width(check: bool) -> int:
    return len(_BLOCK.format("", "", "")) + (len(_WRONG.format("")) if check else 0)


def ratio_columns(columns: Sequence[str]) -> list[str]:
    return [f"{columns[0]}/{other}" for other in columns[1:]]


def format_header(collective: str, columns: Sequence[str], check: bool, stat: str) -> list[str]:
    """nccl-tests' three header lines, with one block of columns per backend."""
    width = _block_width(check)
    fixed = len(_FIXED.format(*[""] * 5))
    names = "#" + " " * (fixed - 1) + "".join(c.center(width) for c in columns)
    head = "#" + _FIXED.format("size", "count", "type", "redop", "root")[1:]
    unit = "#" + _FIXED.format("(B)", "(elements)", "", "", "")[1:]
    for _ in columns:
        head += _BLOCK.format("time", "algbw", "busbw") + (_WRONG.format("#wrong") if check else "")
        unit += _BLOCK.format(f"({stat} us)" if stat != "mean" else "(us)", "(GB/s)", "(GB/s)")
        unit += _WRONG.format("") if check else ""
    for ratio in ratio_columns(columns):
        head += _ratio_cell(ratio, ratio)
        unit += _ratio_cell(ratio, "busbw")
    return [f"# {collective}", names.rstrip(), head, unit.rstrip()]


def _ratio_cell(name: str, text: str) -> str:
    """A ratio column's cell: 12 wide, wider for a long ``first/other`` name (labels)."""
    return f"  {text:>{max(12, len(name))}}"


def _fmt_time(us: float) -> str:
    return f"{us:.2f}" if us < 1e5 else f"{us:.0f}"


def ratio(first: Measurement, other: Measurement, stat: str) -> float | None:
    """first's busbw over other's, i.e. other's time over first's (same size)."""
    a, b = first.time(stat), other.time(stat)
    if a is None or b is None or a <= 0:
        return None
    return b / a


def format_row(row: Row, columns: Sequence[str], check: bool, stat: str, world: int) -> str:
    layout = row.layout
    line = _FIXED.format(layout.nbytes, layout.count, row.dtype, row.op, row.root)
    for name in columns:
        m = row.results.get(name)
        t = None if m is None else m.time(stat)
        if m is None or t is None:
            line += _BLOCK.format("n/a", "n/a", "n/a") + (_WRONG.format("n/a") if check else "")
            continue
        algbw, busbw = bandwidths(layout.collective, layout.nbytes, t / 1e6, world)
        line += _BLOCK.format(_fmt_time(t), f"{algbw:.2f}", f"{busbw:.2f}")
        if check:
            line += _WRONG.format("n/a" if m.wrong is None else m.wrong)
    first = row.results.get(columns[0])
    for name, other_name in zip(ratio_columns(columns), columns[1:], strict=True):
        other = row.results.get(other_name)
        r = None if first is None or other is None else ratio(first, other, stat)
        line += _ratio_cell(name, "n/a" if r is None else f"{r:.2f}")
    return line


def _transport(row: Row, column: str) -> dict[str, Any] | None:
    m = row.results.get(column)
    return None if m is None else m.transport


# The transport statistics block: (heading, UDP_COUNTERS key or gauge, format).
_UDP_BLOCK: Final = (
    ("retrans/op", "retransmitted_packets", "{:.2f}"),
    ("lost/op", "declared_lost", "{:.2f}"),
    ("rto/op", "rto_expiries", "{:.2f}"),
    ("drops/op", "faults_dropped", "{:.2f}"),
    ("data/op", "data_packets_sent", "{:.1f}"),
    ("srtt(us)", "rtt_smoothed_us", "{:.0f}"),
)


def format_transport_block(
    collective: str, rows: Sequence[Row], columns: Sequence[str]
) -> list[str]:
    """The ``# udp transport statistics`` block: one line per size and udp column, every
    line a comment (the data lines of the file stay those of the main table). Empty when no
    column has statistics."""
    cols = [c for c in columns if any(_transport(row, c) for row in rows)]
    if not cols:
        return []
    width = max(8, *(len(c) for c in cols))
    fmt = "#{:>11}  {:<" + str(width) + "}" + "".join("  {:>10}" for _ in _UDP_BLOCK)
    lines = [
        f"# udp transport statistics ({collective}): per op over the timed iterations, summed "
        "over ranks (drops: injected; data: data packets, resends included); srtt: max over ranks",
        fmt.format("size", "column", *(h for h, _, _ in _UDP_BLOCK)),
    ]
    for row in rows:
        for col in cols:
            st = _transport(row, col)
            if st is None:
                cells = ["n/a"] * len(_UDP_BLOCK)
            else:
                cells = [
                    f.format(st["per_op"][key] if key in st["per_op"] else st[key])
                    for _, key, f in _UDP_BLOCK
                ]
            lines.append(fmt.format(row.layout.nbytes, col, *cells))
    return [*lines, "#"]


def avg_busbw(rows: Sequence[Row], backend: str, stat: str, world: int) -> float | None:
    """nccl-tests' "Avg bus bandwidth": the mean busbw over the sizes measured."""
    values = []
    for row in rows:
        m = row.results.get(backend)
        t = None if m is None else m.time(stat)
        if t is not None and row.layout.nbytes:
            values.append(bandwidths(row.collective, row.layout.nbytes, t / 1e6, world)[1])
    return sum(values) / len(values) if values else None


def total_wrong(rows: Iterable[Row]) -> int:
    return sum(m.wrong or 0 for row in rows for m in row.results.values())


def format_footer(
    rows: Sequence[Row], columns: Sequence[str], check: bool, stat: str, world: int
) -> list[str]:
    parts = []
    for name in columns:
        bw = avg_busbw(rows, name, stat, world)
        parts.append(f"{name} {'n/a' if bw is None else f'{bw:.4g}'}")
    lines = [f"# Avg bus bandwidth    : {'  '.join(parts)}"]
    if check:
        wrong = total_wrong(rows)
        lines.append(f"# #wrong (all columns) : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    reasons: dict[str, str] = {}  # the first reason per backend (they name tensor sizes)
    for row in rows:
        for name, m in row.results.items():
            if not m.supported and m.error:
                reasons.setdefault(name, m.error)
    lines += [f"# n/a {name}: {error}" for name, error in reasons.items()]
    return [*lines, "#"]


def row_records(rows: Sequence[Row], stat: str, world: int) -> list[dict[str, Any]]:
    """The JSON records of ``rows``: one per collective, backend and size."""
    records = []
    for row in rows:
        for backend, m in row.results.items():
            t = m.time(stat)
            algbw, busbw = (
                bandwidths(row.collective, row.layout.nbytes, t / 1e6, world)
                if t is not None
                else (None, None)
            )
            records.append(
                {
                    "collective": row.collective,
                    "backend": backend,
                    "bytes": row.layout.nbytes,
                    "count": row.layout.count,
                    "dtype": row.dtype,
                    "op": row.op,
                    "root": row.root,
                    "supported": m.supported,
                    "error": m.error,
                    "time_us": m.time_us,
                    "algbw": algbw,
                    "busbw": busbw,
                    "wrong": m.wrong,
                    "transport": m.transport,
                }
            )
    return records


def build_report(
    *,
    opts: BenchOptions,
    world: int,
    rows_by_collective: Mapping[str, Sequence[Row]],
    columns: Sequence[str],
    versions: Mapping[str, Any],
    command: Sequence[str],
    mpi: Mapping[str, Any],
) -> dict[str, Any]:
    """The ``--json`` document."""
    summary = [
        {"collective": coll, "backend": name, "avg_busbw": avg_busbw(rows, name, opts.stat, world)}
        for coll, rows in rows_by_collective.items()
        for name in columns
    ]
    all_rows = [row for rows in rows_by_collective.values() for row in rows]
    wrong = total_wrong(all_rows)
    return {
        "schema": "ucxbackend-bench/1",
        "command": list(command),
        "world_size": world,
        "device": opts.device,
        "stat": opts.stat,
        "units": {"time_us": "microseconds", "algbw": "GB/s (1e9 B/s)", "busbw": "GB/s (1e9 B/s)"},
        "versions": dict(versions),
        "options": opts.describe(),
        "columns": list(columns),
        "udp_variants": [v.describe() for v in opts.udp_variants],
        "mpi": dict(mpi),
        "results": row_records(all_rows, opts.stat, world),
        "summary": summary,
        "wrong_total": wrong if opts.check else None,
        "ok": wrong == 0,
    }


def write_plot(report: Mapping[str, Any], path: str) -> None:
    """busbw vs size per backend, one subplot per collective (barrier, which moves no data,
    is left out), log2 x-axis; matplotlib with the Agg backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError(f"--plot needs matplotlib ({exc}): pip install matplotlib") from None
    collectives = [c for c in report["options"]["collectives"] if c != "barrier"]
    if not collectives:
        raise BenchError("--plot: nothing to plot (barrier moves no data)")
    ncols = min(3, len(collectives))
    nrows = -(-len(collectives) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), squeeze=False)
    for ax, coll in zip(axes.flat, collectives, strict=False):
        for backend in report["columns"]:
            points = [
                (r["bytes"], r["busbw"])
                for r in report["results"]
                if r["collective"] == coll and r["backend"] == backend and r["busbw"] is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=backend)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{coll} ({report['options']['datatype']}, {report['world_size']} ranks)")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(f"busbw (GB/s, {report['stat']} time)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[len(collectives) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------- progress


class Progress:
    """``[bench] all_reduce ucx 16M (12/24)`` on stderr: rewritten in place on a TTY, plain
    lines with --verbose otherwise, nothing else (logs and piped output stay clean)."""

    def __init__(self, stream: TextIO, *, enabled: bool, verbose: bool) -> None:
        self._stream = stream
        self._tty = enabled and _isatty(stream)
        self._lines = enabled and verbose and not self._tty
        self._width = 0

    def update(self, text: str) -> None:
        line = f"[bench] {text}"
        if self._tty:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = max(self._width, len(line))
            self._stream.flush()
        elif self._lines:
            self._stream.write(line + "\n")
            self._stream.flush()

    def clear(self) -> None:
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------- MPI reference


def mpi_skip_reason() -> str | None:
    """Why the mpi column cannot be measured here (None when it can)."""
    if shutil.which("mpirun") is None:
        return "mpirun not found on PATH (e.g. apt-get install openmpi-bin)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


def mpi_command(opts: BenchOptions, world: int, sizes: Sequence[int], out: str) -> list[str]:
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        str(world),
        "--mca",
        "btl",
        "self,vader",
        sys.executable,
        "-m",
        "ucxbackend.bench_mpi",
        f"--sizes={','.join(str(s) for s in sizes)}",
        f"--iters={opts.iters}",
        f"--warmup_iters={opts.warmup_iters}",
        f"--datatype={opts.datatype}",
        f"--op={opts.op}",
        f"--check={int(opts.check)}",
        f"--out={out}",
    ]


def _mpi_env() -> dict[str, str]:
    """The environment without torchrun's rendezvous variables (they mean nothing to MPI)."""
    drop = (*_LAUNCH_ENV, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", _ARGV_ENV)
    return {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCHELASTIC")
    }


@dataclass
class MpiOutcome:
    status: str  # "ok", "skipped", "failed", "not requested"
    reason: str | None = None
    library: str | None = None
    mpi4py: str | None = None
    rows: dict[int, Measurement] = field(default_factory=dict)  # by bytes

    def describe(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "library": self.library,
            "mpi4py": self.mpi4py,
        }


def run_mpi_reference(
    opts: BenchOptions, world: int, layouts: Sequence[Layout], timeout: float
) -> MpiOutcome:
    """mpi4py Allreduce over the same sizes, in a child ``mpirun`` (rank 0 only)."""
    reason = mpi_skip_reason()
    if reason is not None:
        return MpiOutcome("skipped", reason)
    with tempfile.TemporaryDirectory(prefix="ucxbench_mpi_") as tmp:
        out = os.path.join(tmp, "mpi.json")
        cmd = mpi_command(opts, world, [lay.nbytes for lay in layouts], out)
        logger.info("mpi reference: %s", " ".join(cmd))
        try:
            proc = subprocess.run(
                cmd, env=_mpi_env(), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return MpiOutcome("failed", f"mpirun did not finish within {timeout:.0f}s")
        except OSError as exc:
            return MpiOutcome("failed", f"mpirun could not be started: {exc}")
        if proc.returncode != 0 or not os.path.exists(out):
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            return MpiOutcome("failed", f"mpirun exited with status {proc.returncode}: {tail}")
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
    rows = {
        int(r["bytes"]): Measurement(r["supported"], r.get("error"), r.get("time_us"), r["wrong"])
        for r in doc["rows"]
    }
    return MpiOutcome("ok", None, doc.get("library"), doc.get("mpi4py"), rows)


# --------------------------------------------------------------------------- one rank


def _versions(mpi: MpiOutcome) -> dict[str, Any]:
    import ucxbackend

    native = ucxbackend._C
    ucx_version = None
    if native is not None:
        try:
            ucx_version = native.ucx_version()
        except Exception as exc:
            logger.debug("ucx_version() failed: %s", exc)
    return {
        "ucxbackend": ucxbackend.__version__,
        "torch": torch.__version__,
        "ucx": ucx_version,
        "python": platform.python_version(),
        "mpi": mpi.library,
        "mpi4py": mpi.mpi4py,
    }


def _command() -> list[str]:
    raw = os.environ.get(_ARGV_ENV)
    if raw:
        try:
            return [str(x) for x in json.loads(raw)]
        except ValueError:
            pass
    return _invocation()


def _invocation() -> list[str]:
    argv = list(sys.argv)
    if argv and os.path.basename(argv[0]) == "__main__.py":
        return ["python", "-m", "ucxbackend", *argv[1:]]
    return argv


def _header_lines(
    opts: BenchOptions,
    world: int,
    versions: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    mpi: MpiOutcome,
) -> list[str]:
    lines = [
        f"# ucxbackend bench {versions['ucxbackend']}: torch {versions['torch']}, "
        f"UCX {versions['ucx']}, Python {versions['python']}",
        f"# nRanks {world} device {opts.device} minBytes {opts.minbytes} maxBytes "
        f"{opts.maxbytes} step: {opts.stepfactor}(factor) warmup iters: {opts.warmup_iters} "
        f"iters: {opts.iters} rounds: {opts.rounds} validation: {int(opts.check)} "
        f"stat: {opts.stat}",
        f"# backends: {', '.join(opts.measured())} (new_group over all ranks, sizes "
        "interleaved; time: per iteration, max over ranks)",
    ]
    lines += [
        f"# udp variant {v.label}: udp_config={v.udp_config!r} udp_faults={v.udp_faults!r}"
        for v in opts.udp_variants
    ]
    if mpi.status == "ok":
        lines.append(
            f"# mpi: {mpi.library} via mpi4py {mpi.mpi4py} (all_reduce only, {world} ranks "
            "on rank 0's host, measured before the torch sweep)"
        )
    elif mpi.status != "not requested":
        lines.append(f"# mpi column {mpi.status}: {mpi.reason}")
    lines.append("#")
    lines += [
        f"#  Rank {r['rank']:>2} Pid {r['pid']:>7} on {r['host']} device {r['device']}"
        for r in ranks
    ]
    lines.append("#")
    return lines


def _init_logging(who: str, verbose: bool) -> None:
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(f"[bench {who}] %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)


def _rank_env() -> tuple[int, int, int]:
    env = os.environ
    missing = [k for k in _LAUNCH_ENV if k not in env]
    if missing:
        raise UsageError(f"RANK is set but {', '.join(missing)} are not (launch with torchrun)")
    try:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"]))
    except ValueError as exc:
        raise UsageError(f"bad RANK/WORLD_SIZE/LOCAL_RANK in the environment: {exc}") from None


def _device(opts: BenchOptions, local_rank: int) -> tuple[torch.device, Callable[[], None]]:
    if opts.device == "cpu":
        return torch.device("cpu"), lambda: None
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UsageError(f"local rank {local_rank} has no GPU (this host has {count})")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device, lambda: torch.cuda.synchronize(device)


def _start_watchdog(timeout: float, rank: int, err: TextIO) -> threading.Timer:
    def expire() -> None:
        err.write(f"bench: rank {rank}: timed out after {timeout:g}s (--timeout); exiting\n")
        err.flush()
        os._exit(EXIT_FAILED)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    return timer


class _Sweep:
    """The measurement loop of one rank; rank 0 prints."""

    def __init__(self, ctx: RankContext, out: TextIO, err: TextIO, mpi: MpiOutcome) -> None:
        self.ctx = ctx
        self.out = out
        self.mpi = mpi
        self.lead = ctx.rank == 0
        self.columns = ctx.opts.columns(mpi.status == "ok")
        self.progress = Progress(err, enabled=self.lead, verbose=ctx.opts.verbose)
        elsize, sizes = ctx.opts.elsize, ctx.opts.sizes()
        self.layouts = {c: layouts_for(c, sizes, elsize, ctx.world) for c in ctx.opts.collectives}
        self.steps = sum(len(v) for v in self.layouts.values()) * len(ctx.opts.measured())
        self.step = 0

    def emit(self, lines: Iterable[str]) -> None:
        if self.lead:
            self.progress.clear()
            for line in lines:
                self.out.write(line + "\n")
            self.out.flush()

    def run(self) -> dict[str, list[Row]]:
        return {coll: self.collective(coll) for coll in self.ctx.opts.collectives}

    def collective(self, coll: str) -> list[Row]:
        opts = self.ctx.opts
        self.emit(format_header(coll, self.columns, opts.check, opts.stat))
        rows = [self.size(layout) for layout in self.layouts[coll]]
        self.emit(format_footer(rows, self.columns, opts.check, opts.stat, self.ctx.world))
        self.emit(format_transport_block(coll, rows, self.columns))
        return rows

    def size(self, layout: Layout) -> Row:
        ctx, opts = self.ctx, self.ctx.opts
        data = make_case_data(
            layout.collective,
            layout,
            opts.dtype,
            opts.op,
            ctx.rank,
            ctx.world,
            opts.root,
            with_expected=opts.check,
        )
        row = row_for(layout, opts)
        size = format_size(layout.nbytes) if layout.collective != "barrier" else "-"
        timed: list[Timed] = []
        for backend in self.columns:
            if backend == MPI:
                row.results[MPI] = self.mpi_result(layout)
                continue
            self.step += 1
            self.progress.update(f"{layout.collective} {backend} {size} ({self.step}/{self.steps})")
            ready = prepare(ctx, backend, layout, data)
            if isinstance(ready, Measurement):
                row.results[backend] = ready
            else:
                timed.append(ready)
        # Backends take turns round by round, so that a machine that slows down for a while
        # (a busy host; see the README) slows every column alike and the ratios hold.
        for n in round_lengths(opts.iters, opts.rounds):
            for t in timed:
                time_round(ctx, t, n, rewarm=opts.rounds > 1)
        for t in timed:
            row.results[t.backend] = finish(ctx, t)
        self.emit([format_row(row, self.columns, opts.check, opts.stat, ctx.world)])
        return row

    def mpi_result(self, layout: Layout) -> Measurement:
        if layout.collective != "all_reduce":
            return Measurement(False, None)
        return self.mpi.rows.get(layout.nbytes, Measurement(False, "not measured by mpi"))


def _gather_rank_info(ctx: RankContext) -> list[dict[str, Any]]:
    mine = {"rank": ctx.rank, "pid": os.getpid(), "host": socket.gethostname()}
    mine["device"] = str(ctx.device)
    infos: list[Any] = [None] * ctx.world
    dist.all_gather_object(infos, mine, group=ctx.ctrl)
    return [dict(i) for i in infos]


def _mpi_phase(ctx: RankContext, err: TextIO) -> MpiOutcome:
    """Rank 0 runs the mpi reference while the others wait on the control group."""
    opts = ctx.opts
    outcome = MpiOutcome("not requested")
    if opts.mpi and ctx.rank == 0:
        if "all_reduce" not in opts.collectives:
            outcome = MpiOutcome("skipped", "the mpi reference measures all_reduce only")
        else:
            Progress(err, enabled=True, verbose=opts.verbose).update(
                f"mpi all_reduce reference (mpirun -n {ctx.world})"
            )
            layouts = layouts_for("all_reduce", opts.sizes(), opts.elsize, ctx.world)
            outcome = run_mpi_reference(opts, ctx.world, layouts, opts.timeout)
    dist.barrier(group=ctx.ctrl)
    return outcome


def _finish(ctx: RankContext, report: dict[str, Any]) -> None:
    opts = ctx.opts
    if ctx.rank != 0:
        return
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if opts.plot:
        write_plot(report, opts.plot)


def run_rank(opts: BenchOptions, out: TextIO, err: TextIO) -> int:
    """The bench on one rank of a job launched by torchrun (or by :func:`launch`)."""
    rank, world, local_rank = _rank_env()
    _init_logging(f"rank {rank}", opts.verbose)
    if opts.nproc is not None and opts.nproc != world and _ARGV_ENV not in os.environ:
        logger.warning("--nproc %d ignored: the launcher started %d ranks", opts.nproc, world)
    validate_environment(opts, world)  # importing this module registered "ucx"
    _start_watchdog(opts.timeout, rank, err)
    device, sync = _device(opts, local_rank)
    timeout = timedelta(seconds=opts.timeout)
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    try:
        groups = {
            v.label: dist.new_group(backend=UDP, timeout=timeout, pg_options=v.pg_options())
            for v in opts.udp_variants
        }
        groups.update(
            {name: dist.new_group(backend=name, timeout=timeout) for name in opts.backends}
        )
        ctx = RankContext(
            opts, rank, world, device, dist.group.WORLD, groups, sync, opts.udp_columns()
        )
        ranks = _gather_rank_info(ctx)
        mpi = _mpi_phase(ctx, err)
        sweep = _Sweep(ctx, out, err, mpi)
        versions = _versions(mpi)
        sweep.emit(_header_lines(opts, world, versions, ranks, mpi))
        rows = sweep.run()
        report = build_report(
            opts=opts,
            world=world,
            rows_by_collective=rows,
            columns=sweep.columns,
            versions=versions,
            command=_command(),
            mpi=mpi.describe(),
        )
        _finish(ctx, report)
        dist.barrier(group=ctx.ctrl)
    finally:
        dist.destroy_process_group()
    return EXIT_OK if report["ok"] else EXIT_WRONG


def _run_rank_reporting(opts: BenchOptions, out: TextIO, err: TextIO) -> int:
    rank = os.environ.get("RANK", "?")
    try:
        return run_rank(opts, out, err)
    except UsageError as exc:
        if rank == "0":
            err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    except BenchError as exc:
        err.write(f"bench: rank {rank}: error: {exc}\n")
        return EXIT_FAILED
    except Exception:
        logger.exception("bench: rank %s failed", rank)
        return EXIT_FAILED


# --------------------------------------------------------------------------- launcher


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(base: Mapping[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """The environment of rank ``rank`` as torchrun would set it, plus OMP_NUM_THREADS=1
    unless set, and the path this ucxbackend was imported from."""
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parent.parent)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root if not old else f"{root}{os.pathsep}{old}"
    env.setdefault(_ARGV_ENV, json.dumps(_invocation()))
    return env


def _kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def supervise(procs: Sequence[subprocess.Popen[bytes]], timeout: float, err: TextIO) -> int:
    """Wait for the ranks; kill them all past the deadline, or when one failed and the others
    have not exited ``_FAIL_GRACE_S`` later. Returns the bench's exit status."""
    deadline = time.monotonic() + timeout
    grace_end = math.inf  # set once a rank has failed
    timed_out = False
    try:
        while True:
            codes = [p.poll() for p in procs]  # every one: poll() also reaps
            if None not in codes:
                break
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= grace_end:
                break
            if grace_end == math.inf and any(c not in (None, EXIT_OK, EXIT_WRONG) for c in codes):
                grace_end = now + _FAIL_GRACE_S
            time.sleep(0.05)
    finally:
        alive = [r for r, p in enumerate(procs) if p.poll() is None]
        _kill_all(procs)
    if timed_out:
        err.write(f"bench: error: timed out after {timeout:g}s; killed ranks {alive}\n")
        return EXIT_FAILED
    codes = [p.returncode for p in procs]
    if all(c == EXIT_OK for c in codes):
        return EXIT_OK
    if all(c in (EXIT_OK, EXIT_WRONG) for c in codes):
        return EXIT_WRONG
    if all(c == EXIT_USAGE for c in codes):
        return EXIT_USAGE
    for rank, code in enumerate(codes):
        if code not in (EXIT_OK, EXIT_WRONG):
            what = "was killed" if rank in alive else f"exited with status {code}"
            err.write(f"bench: error: rank {rank} {what}\n")
    return EXIT_FAILED


def launch(opts: BenchOptions, err: TextIO) -> int:
    """Start ``--nproc`` ranks on this host (a free port picked now) and supervise them."""
    world = opts.nproc or 2
    validate_environment(opts, world)
    port = free_port()
    cmd = [sys.executable, "-m", "ucxbackend", "bench", *opts.to_argv()]
    logger.info("starting %d ranks: %s", world, " ".join(cmd))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world):
            procs.append(subprocess.Popen(cmd, env=child_env(os.environ, rank, world, port)))
    except OSError as exc:
        _kill_all(procs)
        raise BenchError(f"could not start rank {len(procs)}: {exc}") from exc
    # The ranks stop themselves at --timeout; the margin lets them say so first.
    return supervise(procs, opts.timeout + 5.0, err)


def under_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Whether rank and world size come from the environment (torchrun or our own launch)."""
    env = os.environ if env is None else env
    return "RANK" in env


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The ``bench`` command."""
    try:
        opts = BenchOptions.from_args(args)
    except UsageError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    if under_launcher():
        code = _run_rank_reporting(opts, out, err)
        out.flush()
        err.flush()
        # Skip interpreter teardown: gloo worker threads can abort a finalizing interpreter
        # (see README, Known issues) and would turn a good run into a failed one.
        os._exit(code)
    if opts.verbose:
        _init_logging("launcher", True)
    try:
        return launch(opts, err)
    except UsageError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    except BenchError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_FAILED
