"""The ``soak`` command (:func:`run`), as ``ucxbackend.cli`` calls it: options checked (bad
ones exit 2); under a launcher (torchrun, or the ranks the bench's launcher forks) this process
is one rank (:mod:`.rank`) and leaves without interpreter teardown, as a bench rank does;
otherwise it starts and supervises ``--nproc`` ranks."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TextIO

from ..bench.common import EXIT_FAILED, EXIT_USAGE, BenchError, UsageError
from ..bench.launcher import launch_ranks, under_launcher
from .options import SoakOptions
from .rank import run_rank


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The ``soak`` command."""
    try:
        opts = SoakOptions.from_args(args)
    except UsageError as exc:
        err.write(f"soak: error: {exc}\n")
        return EXIT_USAGE
    if opts.verbose and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[soak] %(levelname)s: %(message)s")
    if under_launcher():
        code = run_rank(opts, out, err)
        out.flush()
        err.flush()
        os._exit(code)  # see bench.main: gloo threads can abort a finalizing interpreter
    try:
        return launch_ranks("soak", opts.to_argv(), opts.nproc, opts.timeout, err)
    except BenchError as exc:
        err.write(f"soak: error: {exc}\n")
        return EXIT_FAILED
