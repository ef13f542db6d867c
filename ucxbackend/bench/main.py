"""The ``bench`` command (:func:`run`), as ``ucxbackend.cli`` calls it.

Call order: the options validated (:mod:`.options`; bad ones exit 2); under a launcher
(torchrun, or the ranks :mod:`.launcher` starts) this process is one rank (:mod:`.runner`)
and leaves without interpreter teardown; otherwise it starts and supervises the ranks.
"""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from .common import EXIT_FAILED, EXIT_USAGE, BenchError, UsageError
from .launcher import launch, under_launcher
from .options import BenchOptions
from .runner import init_logging, run_rank_reporting
from .startup_options import startup_requested


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The ``bench`` command."""
    if startup_requested(args):
        return _run_startup(args, out, err)
    try:
        opts = BenchOptions.from_args(args)
    except UsageError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    if under_launcher():
        code = run_rank_reporting(opts, out, err)
        out.flush()
        err.flush()
        # Skip interpreter teardown: gloo worker threads can abort a finalizing interpreter
        # (see docs/known-issues.md) and would turn a good run into a failed one.
        os._exit(code)
    if opts.verbose:
        init_logging("launcher", True)
    try:
        return launch(opts, err)
    except UsageError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_USAGE
    except BenchError as exc:
        err.write(f"bench: error: {exc}\n")
        return EXIT_FAILED


def _run_startup(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``bench startup``: the launcher, or one rank of one start (which leaves as a bench rank
    does, without interpreter teardown)."""
    from . import startup

    if not under_launcher():
        return startup.run(args, out, err)
    code = EXIT_FAILED
    try:
        code = startup.run_rank()
    finally:
        out.flush()
        err.flush()
        os._exit(code)
