"""What `pip install --no-build-isolation .` (README, Install) puts in place: every module of
the package, and a command line that starts from the installed copy alone. setuptools'
build_py lays out the pure-Python part as an install would, in seconds and without
compiling; the native extension is not needed for `--help`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ucxbackend"


def _build_py(out: Path) -> Path:
    """The package as setuptools installs it, under out/lib; egg-info kept out of the tree."""
    egg_info = ["egg_info", "--egg-base", str(out)]
    build_py = ["build_py", "--build-lib", str(out / "lib")]
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", *egg_info, *build_py],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "lib" / "ucxbackend"


def _modules(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.py") if "__pycache__" not in p.parts}


def test_installed_package_has_every_module_and_its_cli_starts(tmp_path: Path) -> None:
    built = _build_py(tmp_path)
    missing = _modules(PACKAGE) - _modules(built)
    assert not missing, f"modules setuptools would not install: {sorted(missing)}"
    assert (built / "py.typed").is_file()
    # From another directory, with only the built copy importable (`python -m` puts the
    # working directory first, so the source tree must not be it).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(built.parent)
    # --help builds every command's parser, which imports each command's subpackage.
    proc = subprocess.run(
        [sys.executable, "-m", "ucxbackend", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    for command in ("info", "bench", "soak", "config", "doctor"):
        assert command in proc.stdout, (command, proc.stdout)
