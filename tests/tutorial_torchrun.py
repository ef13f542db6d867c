"""One torchrun worker that runs several example scripts in turn, each as torchrun would run it
alone: as ``__main__``, with its own command line, on env:// through torchrun's store
(tests/test_tutorials.py: a torchrun job costs the launcher and every worker a torch import,
more than the examples' own work).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/tutorial_torchrun.py \\
        <examples dir> <backend> <result root> <script>...

Each script writes its RESULT files under ``<result root>/<script>``. Before each one this
prints ``TUTORIAL_BEGIN <script>``, after it ``TUTORIAL_END <script> rc=<status>``; the first
that fails ends the worker with its status (torchrun then ends the others), so a later script
has no END line.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from torch.distributed import distributed_c10d

BEGIN = "TUTORIAL_BEGIN "
END = "TUTORIAL_END "
# Each script's default group gets its store keys' prefix from torch's group count, which
# destroy_process_group resets to 0: every script starts from a count of its own, so that none
# can read the keys the one before left in torchrun's store (the three tutorial scripts also
# ran without it, on 2026-11-27; nothing in torch or ucxbackend promises that they must).
GROUP_COUNT_STRIDE = 1000


def run_script(path: str, argv: list[str]) -> int:
    """The script's exit status, as ``python <path> <argv>`` would end."""
    sys.argv = [path, *argv]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr, flush=True)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> int:
    examples, backend, result_root, *scripts = sys.argv[1:]
    sys.path.insert(0, examples)  # as for a script run by path: its folder first
    for i, script in enumerate(scripts):
        print(f"{BEGIN}{script}", flush=True)
        distributed_c10d._world.group_count = GROUP_COUNT_STRIDE * (i + 1)
        result_dir = os.path.join(result_root, script)
        os.makedirs(result_dir, exist_ok=True)
        argv = ["--backend", backend, "--result-dir", result_dir]
        rc = run_script(os.path.join(examples, script), argv)
        print(f"{END}{script} rc={rc}", flush=True)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
