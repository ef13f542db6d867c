"""`make deps` and pyproject's extras install what the tests import, so that a clean machine
runs them instead of skipping them (PyYAML, imported as ``yaml``, was missing once).

`make deps` runs here with a stand-in ``PYTHON`` that reports modules as missing and records
what pip would be asked for: nothing is installed.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A stand-in for python: `-c "import MOD"` fails for the modules in $MISSING ("all": every
# -c fails); `-m pip install ARGS` writes ARGS to $PIP_LOG.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; echo "$@" > "$PIP_LOG"; exit 0; fi
if [ "$1" = -c ]; then
    [ "$MISSING" = all ] && exit 1
    for mod in $MISSING; do
        case "$2" in "import $mod") exit 1;; esac
    done
fi
exit 0
"""


def deps_modules() -> dict[str, str]:
    """Makefile's DEPS_MODULES: import name -> pip name."""
    text = (REPO / "Makefile").read_text()
    m = re.search(r"^DEPS_MODULES\s*:?=\s*(.+)$", text, re.M)
    assert m, "no DEPS_MODULES in the Makefile"
    return {s.split(":")[0]: s.split(":")[-1] for s in m.group(1).split()}


def make_deps(tmp_path: Path, missing: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        ["make", "-s", "-C", str(REPO), "deps", f"PYTHON={fake}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "MISSING": missing, "PIP_LOG": str(log)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return log.read_text().split() if log.exists() else []


def test_make_deps_installs_pyyaml_under_its_pip_name(tmp_path: Path) -> None:
    assert make_deps(tmp_path, "yaml") == ["install", "pyyaml"]
    assert make_deps(tmp_path, "") == []  # nothing missing: pip is not run


def test_make_deps_installs_every_module_by_its_pip_name(tmp_path: Path) -> None:
    args = make_deps(tmp_path, "all")
    assert args[0] == "install"
    assert args[1].startswith("torch==") and args[2].startswith("libucx-cu12==")
    assert args[3:] == list(deps_modules().values())
    assert "yaml" not in args


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:  # module level only: imports in try/functions are optional
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_module_the_tests_import_is_a_dependency() -> None:
    local = {p.stem for d in ("tests", "scripts", "examples") for p in (REPO / d).glob("*.py")}
    local |= {"ucxbackend", "torch"}  # torch: installed separately, never replaced
    imported = set()
    for path in sorted((REPO / "tests").glob("*.py")):
        imported |= _top_level_imports(path)
    third_party = {m for m in imported - local if m not in sys.stdlib_module_names}
    missing = third_party - set(deps_modules())
    assert not missing, f"imported by tests but not installed by `make deps`: {sorted(missing)}"


def test_pyproject_extras_match_make_deps() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pip_names = set(deps_modules().values())
    test_only = pip_names - {"ninja", "ruff"}  # build and lint tools (mypy runs in the suite)
    assert set(extras["test"]) == test_only, extras["test"]
    assert set(extras["dev"]) == test_only | {"ruff"}, extras["dev"]
