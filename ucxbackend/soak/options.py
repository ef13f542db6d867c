"""The ``soak`` command line: :func:`add_arguments` declares the options and
:meth:`SoakOptions.from_args` checks what argparse cannot (a run long enough for a verdict);
:meth:`SoakOptions.to_argv` hands the same options to the ranks the launcher starts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from ..bench.common import UsageError, split_list
from .verdict import MIN_SAMPLES

BACKENDS: Final = ("ucx", "udp")
DEFAULT_INTERVAL_S: Final = 10.0
# Group creation, the first ops and the verdict on top of the soak itself.
_SETUP_MARGIN_S: Final = 120.0


@dataclass(frozen=True)
class SoakOptions:
    seconds: float
    backends: tuple[str, ...]
    nproc: int
    interval: float
    op_timeout: float
    timeout: float
    verbose: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SoakOptions:
        if (args.minutes is None) == (args.seconds is None):
            raise UsageError("give exactly one of --minutes and --seconds")
        seconds = args.minutes * 60.0 if args.minutes is not None else float(args.seconds)
        if seconds <= 0:
            raise UsageError(f"the soak must last more than 0 s (got {seconds:g})")
        names = split_list(args.backend)
        if "both" in names:
            names = list(BACKENDS)
        unknown = [n for n in names if n not in BACKENDS]
        if unknown or not names:
            raise UsageError(
                f"--backend {args.backend!r}: choose ucx, udp or both (unknown: {unknown})"
            )
        if args.nproc < 2:
            raise UsageError(f"--nproc {args.nproc}: the soak needs at least 2 ranks")
        interval = DEFAULT_INTERVAL_S if args.interval is None else float(args.interval)
        if interval <= 0:
            raise UsageError(f"--interval {interval:g}: must be more than 0 s")
        if seconds / interval < MIN_SAMPLES:
            raise UsageError(
                f"{seconds:g} s at one sample every {interval:g} s gives fewer than "
                f"{MIN_SAMPLES} samples, too few for a verdict: lower --interval or soak longer"
            )
        timeout = seconds + _SETUP_MARGIN_S if args.timeout is None else float(args.timeout)
        return cls(
            seconds=seconds,
            backends=tuple(dict.fromkeys(names)),
            nproc=args.nproc,
            interval=interval,
            op_timeout=float(args.op_timeout),
            timeout=timeout,
            verbose=bool(args.verbose),
        )

    def to_argv(self) -> list[str]:
        argv = [
            "--seconds",
            f"{self.seconds:g}",
            "--backend",
            ",".join(self.backends),
            "--nproc",
            str(self.nproc),
            "--interval",
            f"{self.interval:g}",
            "--op-timeout",
            f"{self.op_timeout:g}",
            "--timeout",
            f"{self.timeout:g}",
        ]
        return argv + (["--verbose"] if self.verbose else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``soak`` command's options."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "Every interval, rank 0 prints the max over ranks of open fds, threads, RSS and the\n"
        "/dev/shm/ucxb-* segments a rank created or maps, with the ops done so far; at the end\n"
        "a verdict, flat or growing (docs/operations.md#soak).\n"
        "exit status: 0 flat, 1 growing or a wrong result, 2 bad options,\n"
        "3 a rank failed (an op raised) or the run went past --timeout"
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="how long to soak, in minutes")
    length.add_argument("--seconds", type=float, help="how long to soak, in seconds")
    parser.add_argument(
        "--backend",
        default="both",
        help="ucx, udp or both (comma-separated also works; default: both)",
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks started here (2)")
    parser.add_argument(
        "--interval",
        type=float,
        help=f"seconds between two samples (default {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--op-timeout",
        type=float,
        default=60.0,
        help="timeout of every group, in seconds (60): a hung op fails the soak",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help=f"kill the ranks after this many seconds (default: the soak + {_SETUP_MARGIN_S:g})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what each rank does")
