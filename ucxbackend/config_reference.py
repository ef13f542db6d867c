"""The knob reference in ``docs/configuration.md``, rendered from the native schema.

The schema (``csrc/backend_options.cpp``, ``transports/udp/udp_config.cpp``,
``transports/udp/faults.cpp``) is the one place a knob is declared; this renders it as
Markdown tables so that the docs can never drift from it. ``python -m ucxbackend config
--write docs/configuration.md`` replaces the text between the two markers below, and a test
checks that the file holds what this renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from .config import ENV_PREFIX, _native

BEGIN: Final = "<!-- knobs:begin -->"
NOTE: Final = (
    "<!-- Generated from the schema by `python -m ucxbackend config --write "
    "docs/configuration.md`: edit the help in csrc/backend_options.cpp, "
    "transports/udp/udp_config.cpp or transports/udp/faults.cpp, not here. -->"
)
END: Final = "<!-- knobs:end -->"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(row: Mapping[str, Any]) -> str:
    value = str(row["default"])
    return f"`{value}`" if value else "''"


def _agree(row: Mapping[str, Any]) -> str:
    """The "same on every rank" cell: the schema's must-agree flag (FieldInfo::mustAgree)."""
    if not row["must_agree"]:
        return "no"
    return "the keys marked so below" if row["agreed_keys"] else "yes"


def _table(rows: Iterable[Mapping[str, Any]], *, env: bool) -> list[str]:
    head = (
        "| knob | environment variable | default | same on every rank | allowed | what it does |"
        if env
        else "| key | default | same on every rank | allowed | what it does |"
    )
    lines = [head, _rule(head)]
    for row in rows:
        if row["internal"]:
            continue
        cells = [f"`{row['name']}`"]
        if env:
            cells.append(f"`{ENV_PREFIX}{str(row['name']).upper()}`")
        cells += [_default(row), _agree(row), _cell(row["allowed"]), _cell(row["help"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rule(head: str) -> str:
    return "|" + " --- |" * (head.count("|") - 1)


def render() -> str:
    """The reference as Markdown, between the markers."""
    native = _native()
    lines = [BEGIN, NOTE, "", "### Knobs of a group (`pg_options` or `UCXBACKEND_*`)", ""]
    lines += _table(native.config.schema(), env=True)
    lines += ["", "### `udp_config` keys (`key=value,...`)", ""]
    lines += _table(native.udp.config_schema(), env=False)
    lines += ["", "### `udp_faults` keys (`key=value,...`)", ""]
    lines += _table(native.udp.fault_schema(), env=False)
    lines += ["", END]
    return "\n".join(lines) + "\n"


def splice(document: str, reference: str) -> str:
    """``document`` with the text between the markers (inclusive) replaced by ``reference``."""
    start = document.find(BEGIN)
    end = document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the document has no {BEGIN!r} ... {END!r} block")
    return document[:start] + reference.rstrip("\n") + document[end + len(END) :]


def write(path: Path) -> bool:
    """Regenerates the block in ``path``; whether the file changed."""
    before = path.read_text()
    after = splice(before, render())
    if after != before:
        path.write_text(after)
    return after != before
