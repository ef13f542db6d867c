"""The start-up mode's command line (``bench startup``, :mod:`.startup`): its options, declared
with the bench's own by :func:`add_startup_arguments`, and validated by
:meth:`StartupOptions.from_args` (the backends' availability is checked by :mod:`.startup`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Final

from .common import UsageError, split_list

STARTUP: Final = "startup"  # the positional word that selects this mode
DEFAULT_WORLD_SIZES: Final = (2, 4, 8, 16, 32)
DEFAULT_BACKENDS: Final = ("ucx", "udp", "gloo")
DEFAULT_REPEATS: Final = 3


def startup_requested(args: argparse.Namespace) -> bool:
    """Whether the command line asks for this mode (``bench startup``)."""
    return STARTUP in [w for text in (args.collectives or []) for w in split_list(text)]


def add_startup_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "start-up mode (bench startup)",
        "init_process_group + first 8-byte all_reduce per world size and backend, from a "
        "synchronized start; --backends (default ucx,udp,gloo), --timeout (per start), "
        "--json, --plot and -v apply too",
    )
    group.add_argument(
        "--world-sizes",
        metavar="N,...",
        help="world sizes, comma-separated (2,4,8,16,32)",
    )
    group.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        help=f"starts per world size and backend (median, min, max) ({DEFAULT_REPEATS})",
    )


def _world_sizes(text: str | None) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_WORLD_SIZES
    try:
        sizes = tuple(int(w, 10) for w in split_list(text))
    except ValueError:
        raise UsageError(f"--world-sizes: expected integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--world-sizes: expected integers >= 1, got {text!r}")
    return tuple(dict.fromkeys(sizes))


@dataclass(frozen=True)
class StartupOptions:
    """Validated options of one ``bench startup`` run."""

    world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES
    backends: tuple[str, ...] = DEFAULT_BACKENDS
    repeats: int = DEFAULT_REPEATS
    timeout: float = 600.0
    json: str | None = None
    plot: str | None = None
    verbose: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StartupOptions:
        words = [w for text in (args.collectives or []) for w in split_list(text)]
        others = [w for w in words if w != STARTUP]
        if others:
            raise UsageError(f"bench startup measures no collectives, got {', '.join(others)}")
        if args.repeats < 1:
            raise UsageError(f"--repeats: expected an integer >= 1, got {args.repeats}")
        backends = tuple(args.backends) if args.backends else DEFAULT_BACKENDS
        if "mpi" in backends:
            raise UsageError("bench startup measures torch.distributed backends, not mpi")
        return cls(
            world_sizes=_world_sizes(args.world_sizes),
            backends=backends,
            repeats=args.repeats,
            timeout=args.timeout,
            json=os.path.abspath(args.json) if args.json else None,
            plot=os.path.abspath(args.plot) if args.plot else None,
            verbose=args.verbose,
        )
