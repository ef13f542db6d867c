"""``python -m ucxbackend soak``: a long mixed run of both backends that checks every result and
watches each rank's resources for leaks.

Examples::

    # ten minutes, ucx and udp, 2 ranks started here, a row every 10 s
    OMP_NUM_THREADS=1 python -m ucxbackend soak --minutes 10

    # udp only, 4 ranks, a row every 5 s
    python -m ucxbackend soak --minutes 30 --backend udp --nproc 4 --interval 5

    # under torchrun
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m ucxbackend soak --minutes 5

Exit status: 0 flat; 1 growing, or a wrong result (named on the rank that saw it); 2 bad
options; 3 a rank failed (an op raised) or the run went past ``--timeout``.

Test-only hook: ``UCXBACKEND_SOAK_TEST_LEAK`` (:mod:`.testhook`).

The package, one job a module, in the order a run uses them::

    main      the ``soak`` command: options, then one rank or the bench's launcher
    options   the command line: argparse options, SoakOptions
    rank      one rank: the groups, the loop of steps, sampling, the verdict on rank 0
    workload  the mixed ops of a step, each checked against numpy
    testhook  the leak a test injects to see the verdict fail
    probes    one rank's fds, threads, RSS and /dev/shm segments
    report    the rows rank 0 prints
    verdict   flat or growing: the thirds compared, the tolerances and why
"""

from __future__ import annotations

from .main import run
from .options import SoakOptions, add_arguments
from .verdict import TOLERANCES, Verdict, judge

__all__ = ["TOLERANCES", "SoakOptions", "Verdict", "add_arguments", "judge", "run"]
