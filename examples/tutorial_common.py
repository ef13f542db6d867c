"""What the tutorial programs share: their command line, loading the backend, reporting."""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(doc: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--backend", default="ucx")
    parser.add_argument("--init-method", default="env://")
    parser.add_argument("--result-dir", help="also write each rank's RESULT to a JSON file here")
    args = parser.parse_args()
    if "ucx" in args.backend:
        import_ucxbackend()
    return args


def import_ucxbackend() -> None:
    """Register the "ucx" backend; from a source checkout if the package is not installed."""
    try:
        import ucxbackend
    except ModuleNotFoundError as e:
        if e.name != "ucxbackend":
            raise
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import ucxbackend  # noqa: F401


def emit_result(result: dict, rank: int, result_dir: str | None) -> None:
    """One ``RESULT {json}`` line on stdout (and a per-rank file: stdout lines interleave)."""
    line = "RESULT " + json.dumps(result)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if result_dir:
        with open(os.path.join(result_dir, f"result_rank{rank}.json"), "w") as f:
            f.write(json.dumps(result))
