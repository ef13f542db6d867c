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
# Who hosts the TCPStore: "agent", the launcher, before the ranks start, as torchrun's agent
# does (TORCHELASTIC_USE_AGENT_STORE); "rank0", rank 0 inside init_process_group, as a job
# launched without torchrun (env:// with MASTER_ADDR/MASTER_PORT) does.
STORE_HOSTS: Final = ("agent", "rank0")
DEFAULT_STORE_HOST: Final = "agent"


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
    group.add_argument(
        "--store-host",
        choices=STORE_HOSTS,
        default=DEFAULT_STORE_HOST,
        help="who hosts the TCPStore: the launcher before the ranks start, as torchrun does "
        "(agent), or rank 0 inside init_process_group, as env:// without torchrun does "
        f"(rank0) ({DEFAULT_STORE_HOST})",
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
    store_host: str = DEFAULT_STORE_HOST
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
            store_host=args.store_host,
            timeout=args.timeout,
            json=os.path.abspath(args.json) if args.json else None,
            plot=os.path.abspath(args.plot) if args.plot else None,
            verbose=args.verbose,
        )
