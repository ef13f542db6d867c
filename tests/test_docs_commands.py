"""Every ``python -m ucxbackend ...`` command the README and docs/ show is one the command line
accepts: its options exist and take the values given (argparse), and a bench sweep's options
pass bench's own validation. Nothing is run. Placeholder commands (``--minutes N``, ``$VAR``,
``...``) are left out. The checks need the extension (sizes and udp variants are parsed by its
schema) and skip without it; finding the commands does not."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from test_docs import _FENCE, REPO, pages

import ucxbackend
from ucxbackend.cli import build_parser

needs_native = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"native extension not built: {ucxbackend.load_error()}",
)

# A code block a reader pastes into a shell (```sh, ```bash, or no language).
_SHELL_FENCE = re.compile(r"^\s*(```|~~~)\s*(sh|bash|shell|console)?\s*$")
_INLINE_CODE = re.compile(r"`((?:[^`\n]|\n(?![ \t]*\n))+)`")
_COMMAND = re.compile(r"-m ucxbackend\s+((?:info|bench|soak|config|doctor)\b.*)", re.S)
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")"}
# An argument standing for a value the reader fills in.
_PLACEHOLDER = re.compile(r"^[A-Z]{1,4}$|\$|^\.\.\.$|\.\.\.$")


def _shell_snippets(text: str) -> list[tuple[int, str]]:
    """(line, text) of each shell command line of a fenced block (continuations joined, not
    comments) and of each inline code span of the prose (joined over its line breaks)."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    fence: str | None = None  # the language of the open block, "" for none
    prose: list[str] = []
    pending, start = "", 0
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            if fence is None:
                m = _SHELL_FENCE.match(line)
                fence = (m.group(2) or "") if m else "other"
            else:
                fence = None
            prose.append("")
            continue
        if fence is None:
            prose.append(line)
            continue
        prose.append("")
        if fence == "other":
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    body = "\n".join(prose)
    for m in _INLINE_CODE.finditer(body):
        out.append((body.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " ")))
    return out


def _argv(snippet: str) -> list[str] | None:
    """The arguments after ``-m ucxbackend`` up to the end of that shell command; None where
    there is no such command or it holds a placeholder."""
    m = _COMMAND.search(snippet)
    if not m:
        return None
    lexer = shlex.shlex(m.group(1), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: prose quoting part of a command
        return None
    argv: list[str] = []
    for token in tokens:
        if token in _SEPARATORS:
            break
        argv.append(token)
    if any(_PLACEHOLDER.search(a) for a in argv):
        return None
    return argv


def documented_commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for page in pages():
        for number, snippet in _shell_snippets(page.read_text(encoding="utf-8")):
            argv = _argv(snippet)
            if argv is not None:
                found.append((f"{page.relative_to(REPO)}:{number}", argv))
    return found


def problem(argv: list[str]) -> str | None:
    """Why the command line refuses `argv` (argparse's message, or bench's), else None."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    if args.command != "bench":
        return None
    from ucxbackend.bench.common import UsageError
    from ucxbackend.bench.options import BenchOptions
    from ucxbackend.bench.startup_options import startup_requested

    if startup_requested(args):
        return None
    try:
        BenchOptions.from_args(args)
    except UsageError as exc:
        return f"bench: {exc}"
    return None


def test_docs_show_commands() -> None:
    """The extraction finds the commands it is meant to check (a regex gone wrong would make
    the test below pass by checking nothing)."""
    commands = documented_commands()
    assert len(commands) >= 30, commands
    assert {argv[0] for _, argv in commands} >= {"bench", "soak", "info", "doctor", "config"}


@needs_native
def test_extraction_and_check_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```sh\n"
        "OMP_NUM_THREADS=1 python -m ucxbackend bench -n 2 -c all_reduce \\\n"
        '    --udp-variant "a:;b:drop=1%" && echo done   # a comment\n'
        "python -m ucxbackend soak --minutes N\n```\n\n"
        "Inline, wrapped: `python -m ucxbackend bench all_reduce\n--backends ucx,gloo`.\n"
        "```python\nsubprocess.run('python -m ucxbackend nosuch')\n```\n"
    )
    snippets = _shell_snippets(page.read_text())
    argvs = [(n, _argv(s)) for n, s in snippets]
    assert argvs == [
        (4, ["bench", "-n", "2", "-c", "all_reduce", "--udp-variant", "a:;b:drop=1%"]),
        (6, None),
        (9, ["bench", "all_reduce", "--backends", "ucx,gloo"]),
    ], argvs
    bad, good = argvs[0][1], argvs[2][1]
    assert bad is not None and good is not None
    assert "invalid int value: 'all_reduce'" in (problem(bad) or "")
    assert problem(good) is None


@needs_native
@pytest.mark.parametrize(
    "where,argv", documented_commands(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_documented_command_is_accepted(where: str, argv: list[str]) -> None:
    why = problem(argv)
    assert why is None, f"{where}: python -m ucxbackend {shlex.join(argv)}\n  {why}"
