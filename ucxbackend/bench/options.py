"""The ``bench`` command line: :func:`add_arguments` declares the options (nccl-tests'
short options where they exist) and :meth:`BenchOptions.from_args` validates what argparse
cannot; :func:`validate_environment` then checks what needs torch or the machine (backends
available, CUDA, matplotlib, output directories).

Call order: ``cli`` calls :func:`add_arguments`; :mod:`.main` calls
:meth:`BenchOptions.from_args` (UsageError: exit 2), then the launcher or each rank calls
:func:`validate_environment`. :meth:`BenchOptions.to_argv` hands the same options to the
ranks the launcher starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
import torch.distributed as dist

from .common import (
    COLLECTIVES,
    DTYPE_NAMES,
    FAKE,
    FAKE_MODULE,
    MPI,
    NCCL,
    OPS,
    STATS,
    TORCH_DTYPES,
    UsageError,
    split_list,
)
from .sizes import parse_size, size_sweep
from .startup_options import STARTUP, add_startup_arguments
from .udp import (
    DEFAULT_UDP_POLICY,
    DEFAULT_UDP_SEED,
    UDP,
    UDP_POLICIES,
    UdpVariant,
    parse_drops,
    parse_policies,
    parse_udp_settings,
    parse_udp_variants,
    udp_sweep,
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
DEFAULT_BACKENDS: Final = ("ucx", "gloo")
DEFAULT_CUDA_BACKENDS: Final = ("ucx", "gloo", NCCL)  # --device cuda


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


def parse_collectives(words: Iterable[str]) -> tuple[str, ...]:
    """``["all_reduce,all_gather", "barrier"]`` -> the collectives, in order, deduplicated;
    ``all`` is every collective. Raises ValueError naming the unknown ones."""
    chosen: list[str] = []
    for word in words:
        for name in split_list(word):
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
    if STARTUP in split_list(text):
        return text  # the start-up mode (.startup) validates its own words
    try:
        parse_collectives([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _backends_arg(text: str) -> tuple[str, ...]:
    names = split_list(text)
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of backends")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise argparse.ArgumentTypeError(f"backend(s) listed twice: {', '.join(duplicates)}")
    return tuple(names)


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
        "collectives: " + ", ".join(COLLECTIVES) + ", or all (default: all_reduce); "
        "'startup' instead times init_process_group + the first all_reduce (see below)\n"
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
        choices=tuple(DTYPE_NAMES),
        default="float",
        metavar="TYPE",
        help=f"{', '.join(DTYPE_NAMES)} (float)",
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
        "the ratio columns; 'mpi' adds an mpi4py Allreduce column, 'fake' torch's dispatch floor "
        "(its fake backend, which moves nothing) (default: ucx,gloo; "
        "ucx,gloo,nccl with --device cuda; with udp variants: none, give it to add columns "
        "after the variants)",
    )
    udp = parser.add_argument_group(
        "udp protocol variants",
        "Each variant is a column of its own: a udp group created with its own pg_options "
        "(udp_config, udp_faults and secret_file; UCXBACKEND_UDP_CONFIG/_FAULTS/SECRET_FILE "
        "do not reach it). Variant "
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
        "or separate them with ';' ('lossless:;sr1:drop=0.01'); 'auth:secret_file=PATH' "
        "measures the authenticated mode",
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
        "backends in turn, mpi included (ucx, gloo, mpi, ucx, gloo, mpi, ...), each after one "
        "untimed iteration, so "
        "that a machine whose speed drifts skews no ratio; 1 (default) times each backend "
        "in one block, as nccl-tests",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="tensor device (cpu); cuda: cuda:<local rank %% GPUs> (ranks may share a GPU), "
        "a d2d copy limit column; nccl is skipped, with the reason, where ranks share a GPU "
        "or torch has no NCCL",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="with --device cuda: start a private NVIDIA MPS control daemon for the run "
        "(nvidia-cuda-mps-control; its pipe and log directories in a temporary directory, "
        "handed to the ranks) and stop it afterwards, so that ranks sharing a GPU share one "
        "CUDA context instead of the GPU switching between theirs (docs/cuda.md)",
    )
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
        "--trace",
        metavar="DIR",
        help="udp columns: write per-op, per-peer and per-path time series, and samples "
        "within each op (window, RTT, in flight, bottleneck queue), to "
        "DIR/trace-rank<R>.jsonl and plot them to DIR/trace-*.png (matplotlib)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="progress lines and log messages on stderr"
    )
    add_startup_arguments(parser)


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
    mps: bool = False  # --mps: the launcher runs the ranks under a private MPS server
    nproc: int | None = None
    timeout: float = 600.0
    json: str | None = None
    plot: str | None = None
    trace: str | None = None  # --trace DIR (bench/trace.py)
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
            default = DEFAULT_CUDA_BACKENDS if args.device == "cuda" else DEFAULT_BACKENDS
            names: tuple[str, ...] = () if variants else default
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
        mps = bool(getattr(args, "mps", False))
        if mps and args.device != "cuda":
            raise UsageError(
                "--mps needs --device cuda: MPS lets ranks that share a GPU share one CUDA "
                f"context, and --device {args.device} uses none"
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
            datatype=DTYPE_NAMES[args.datatype],
            check=bool(args.check),
            root=args.root,
            backends=torch_backends,
            udp_variants=variants,
            mpi=MPI in names,
            mpi_position=names.index(MPI) if MPI in names else len(names),
            stat=args.stat,
            rounds=args.rounds,
            device=args.device,
            mps=mps,
            nproc=args.nproc,
            timeout=args.timeout,
            json=os.path.abspath(args.json) if args.json else None,
            plot=os.path.abspath(args.plot) if args.plot else None,
            trace=os.path.abspath(args.trace) if getattr(args, "trace", None) else None,
            verbose=args.verbose,
        )

    @property
    def dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.datatype]

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
        if self.mps:
            argv.append("--mps")  # the ranks' header says so; the launcher started the server
        if self.nproc is not None:
            argv.append(f"--nproc={self.nproc}")
        if self.json:
            argv.append(f"--json={self.json}")
        if self.plot:
            argv.append(f"--plot={self.plot}")
        if self.trace:
            argv.append(f"--trace={self.trace}")
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
            "mps": self.mps,
            "timeout": self.timeout,
        }


def backend_problem(name: str, device: str) -> str | None:
    """Why backend ``name`` cannot be measured here (None when it can)."""
    import ucxbackend

    known = [b for b in dist.Backend.backend_list if b != "undefined"]
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
    if name == NCCL and device == "cuda":
        return None  # where it cannot run, the runner skips the column with the reason
    if name in available and not available[name]():
        return f"backend {name!r} is not available in this torch build"
    if name == NCCL:
        return "backend 'nccl' needs --device cuda"
    if name == FAKE and importlib.util.find_spec(FAKE_MODULE.rpartition(".")[0]) is None:
        return f"backend 'fake' needs {FAKE_MODULE} (part of torch's test utilities)"
    return None


def validate_environment(opts: BenchOptions, world: int | None) -> None:
    """Checks that need torch or the machine; raises UsageError."""
    for name in (*opts.backends, *((UDP,) if opts.udp_variants else ())):
        problem = backend_problem(name, opts.device)
        if problem is not None:
            raise UsageError(problem)
    # device_count(), not is_available(): it asks NVML and leaves CUDA uninitialised, so the
    # launcher can still fork the ranks (a forked child cannot use a parent's CUDA).
    if opts.device == "cuda" and torch.cuda.device_count() == 0:
        raise UsageError("--device cuda: CUDA is not available (torch.cuda.device_count() 0)")
    if world is not None and opts.root >= world:
        raise UsageError(f"--root {opts.root} is not a rank of a world of size {world}")
    if opts.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install matplotlib")
    if opts.plot and set(opts.collectives) == {"barrier"}:
        raise UsageError("--plot: nothing to plot (barrier moves no data)")
    if opts.trace and not os.path.isdir(opts.trace):
        raise UsageError(f"--trace {opts.trace}: not a directory (create it first)")
    for path in (opts.json, opts.plot):
        if path and not os.path.isdir(os.path.dirname(path)):
            raise UsageError(f"cannot write {path}: directory {os.path.dirname(path)} not found")
