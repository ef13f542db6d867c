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

    # CUDA tensors: 2 ranks sharing one GPU; ucx, gloo, nccl (skipped: ranks share the GPU)
    # and the device-to-device copy limit (docs/bench.md, "GPU")
    python -m ucxbackend bench all_reduce --device cuda --nproc 2 -b 1M -e 64M --timeout 120
    # the same under a private NVIDIA MPS server (one CUDA context for both ranks, no
    # switching between two: docs/cuda.md, "Ranks sharing a GPU: run MPS")
    python -m ucxbackend bench all_reduce --device cuda --mps --nproc 2 -b 1M -e 64M

    # under torchrun (rank, world size and rendezvous from the environment)
    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 -m ucxbackend bench all_gather

    # udp protocol variants, each a column on a udp group of its own with its own pg_options
    # (the first, lossless, is the reference of the ratio columns)
    python -m ucxbackend bench -b 1M -f 4 --udp-variant "lossless:;gbn5:drop=5%,loss_recovery=gbn"

    # a sweep: selective repeat and go-back-N at 0, 1 and 10% drop (six columns)
    python -m ucxbackend bench -b 1M -f 4 --udp-drop 0,1%,10% --udp-policy sr,gbn

    # start-up: init_process_group + first all_reduce at 2..32 ranks, ucx, udp and gloo
    OMP_NUM_THREADS=1 python -m ucxbackend bench startup --world-sizes 2,4,8,16,32

Exit status: 0 success; 1 wrong results (``#wrong`` > 0); 2 bad options; 3 a rank failed or
the run went past ``--timeout``.

Test-only hook: ``UCXBACKEND_BENCH_CORRUPT=<backend>`` makes the bench overwrite one element of
the checked output of every op of that backend (on rank 0; on the root for ``reduce`` and
``gather``) right after the op, so that ``#wrong`` is non-zero and the bench exits 1. It
exists to prove that ``-c 1`` can fail; never set it for a real measurement.

The package, one job a module, in the order a run uses them (gloo/benchmark's main, options,
runner)::

    main       the ``bench`` command: options, then one rank or the launcher
    options    the command line: argparse options, BenchOptions, environment checks
    common     the shared vocabulary: collectives, dtypes, ops, exit statuses, errors
    sizes      parse_size, the size sweep, layouts (size/count columns), algbw and busbw
    udp        udp columns: --udp-variant specs and the drop x policy sweep
    launcher   without torchrun: start --nproc ranks (free port, child env), supervise them
    runner     one rank: groups, the measurement loop over collectives, sizes and columns
    cases      each rank's input data, the expected output, the #wrong check
    ops        a case's tensors on the device and one blocking call of the collective
    timing     check, warm-up, timed rounds, max over ranks; udp transport counters
    mpi        the mpi column on rank 0: mpirun the worker, read its results
    mpi_worker the program mpirun starts: mpi4py Allreduce timed as the bench times a backend
    report     the table (header, rows, footer, udp statistics) and the --json document
    progress   the progress line on rank 0's stderr
    plot       --plot: busbw vs size from the JSON document (and start-up time vs ranks)
    trace      --trace: udp time series per op, peer and path as JSON lines, and their plots
    startup_options  ``bench startup``: its options
    startup    ``bench startup``: each rank's timed start, the launcher's loop, table, breakdown
"""

from __future__ import annotations

from .common import COLLECTIVES, BenchError, UsageError
from .main import run
from .options import BenchOptions, add_arguments
from .plot import write_plot
from .report import Row, build_report, format_footer, format_header, format_row
from .sizes import Layout, bandwidths, bus_factor, layouts_for, parse_size, size_sweep
from .timing import Measurement

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
