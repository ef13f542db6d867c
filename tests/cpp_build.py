"""The one way the Python tests compile the C++ test programs under tests/cpp (and the UDP
simulator and fuzzer): a program is its own source plus named groups of the project's sources
(SOURCE_GROUPS), never a hand-written list of files.

Each translation unit is compiled once into tests/cpp/build/obj/, keyed by a hash of its text,
its flags and every header of the project, so a later session (or another test file asking for
the same unit with the same flags) reuses it; groups go into a static archive, so a program
links only the members it uses. The program itself lands in tests/cpp/build/<name>, rebuilt
only when one of its objects or its link flags changed. The standard headers most units
include are precompiled once per flag set (PCH_HEADERS).

    exe = cpp_build.build("algorithms_test", "tests/cpp/algorithms_test.cpp",
                          groups=["collectives", "shm", "inproc"], flags=["-O1", "-Werror"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "tests" / "cpp" / "build"  # ignored by git (build/) and docker (.dockerignore)

# Flags of every unit; callers add the optimisation level, -Werror, sanitizers, defines.
BASE_FLAGS = ["-std=c++20", "-Wall", "-Wextra", "-I."]
# What the plain (unsanitized) test programs add, the same for all so that they share objects
# and precompiled headers; the kernels' own test builds them -O3, as shipped, instead.
PLAIN = ["-O1", "-Werror", "-pthread"]
# AddressSanitizer and UndefinedBehaviorSanitizer: one flag set for every program run under
# them (the UDP core's test program and its fuzzer), so that they share the core's objects.
# -g1: the line tables a report's stacks need, at two thirds of -g's compile time.
ASAN_UBSAN = [
    "-O1",
    "-g1",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
]
# The fuzzer's coverage feedback (tests/fuzz/standalone_driver.cpp), on the code under test.
# Another program linking such objects links tests/cpp/no_coverage.cpp instead of the driver.
COVERAGE = ["-fsanitize-coverage=trace-pc"]
COMPILE_TIMEOUT_S = 300  # one translation unit, on a busy two-core machine
# Parallel compiles: the machines these tests run on have two cores shared with other work.
# UCXB_CPP_JOBS=1 compiles one unit at a time (to measure what a build costs, docs/testing.md).
JOBS = int(os.environ.get("UCXB_CPP_JOBS", "0")) or max(1, min(2, os.cpu_count() or 1))
# Parsing these is most of what a small unit costs to compile (a plain build of the
# algorithms' units takes 40 % less with them precompiled). They are precompiled into
# obj/pch-<key>/std.h.gch for a flag set once PCH_MIN_UNITS units with those flags are to be
# compiled, and included ahead of each of them (-include). Not ahead of a unit with a
# "#pragma GCC": reduce_kernels.cpp's optimize pragma must precede the headers it includes
# after it, as it does in the shipped build.
PCH_HEADERS = [
    "algorithm",
    "array",
    "chrono",
    "cstddef",
    "cstdint",
    "cstdio",
    "cstdlib",
    "cstring",
    "deque",
    "functional",
    "map",
    "memory",
    "mutex",
    "optional",
    "span",
    "stdexcept",
    "string",
    "string_view",
    "utility",
    "vector",
]
PCH_MIN_UNITS = 6

# The socket loop around the UDP core (not sans-IO): the fuzzer leaves it out.
_UDP_SOCKET_LOOP = {"udp_socket.cpp", "udp_transport.cpp"}


def _glob(folder: str, keep: Callable[[Path], bool] = lambda p: True) -> list[str]:
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / folder).glob("*.cpp") if keep(p))


# Named groups of sources a test program may link with. Globs, so a file added to a folder
# joins its group without an edit here.
SOURCE_GROUPS: dict[str, Callable[[], list[str]]] = {
    # The reduction kernels alone (torch-free).
    "reduce_kernels": lambda: ["csrc/collectives/reduce_kernels.cpp"],
    # Every collective algorithm, Comm and the kernels (torch-free, UCX-free), with the
    # non-temporal copy Comm's streamed receives store through.
    "collectives": lambda: [*_glob("csrc/collectives"), "csrc/engine/streaming_copy.cpp"],
    # Shared-memory segments, the one-host transport on them, and the staging slots'
    # streaming stores.
    "shm": lambda: [*_glob("transports/shm"), "csrc/engine/streaming_copy.cpp"],
    # The in-memory transport and its thread driver (tests/cpp/inproc/), with the FoldTarget
    # it folds receives through (transports/fold_target.cpp).
    "inproc": lambda: [*_glob("tests/cpp/inproc"), "transports/fold_target.cpp"],
    # algorithms_test's groups and the worlds they run in (tests/cpp/algorithms/).
    "algorithm_checks": lambda: _glob("tests/cpp/algorithms"),
    # The UDP transport: its sans-IO core, and that with the socket loop; both with the
    # settings schema they are declared in (transports/config/), the socket loop with the
    # FoldTarget its folding receives go through (transports/fold_target.cpp).
    "udp_sans_io": lambda: [
        *_glob("transports/config"),
        *_glob("transports/udp", lambda p: p.name not in _UDP_SOCKET_LOOP),
    ],
    "udp": lambda: [
        *_glob("transports/config"),
        *_glob("transports/udp"),
        "transports/fold_target.cpp",
    ],
    # The deterministic network simulator the UDP core tests run in.
    "udp_sim": lambda: _glob("tests/udp_sim"),
}


def sources(groups: Sequence[str]) -> list[str]:
    """The groups' sources, repo-relative, each once, in group order."""
    seen: dict[str, None] = {}
    for g in groups:
        if g not in SOURCE_GROUPS:
            raise ValueError(f"unknown source group {g!r}; known: {sorted(SOURCE_GROUPS)}")
        seen.update(dict.fromkeys(SOURCE_GROUPS[g]()))
    return list(seen)


@functools.cache
def _compiler() -> str:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed: this test compiles a C++ program")
    return compiler


@functools.cache
def link_libraries() -> list[str]:
    """What every program links after the project's objects: libcrypto when g++ finds
    <openssl/evp.h>, as the udp transport's authentication does (transports/udp/have_openssl.h
    decides from the same header, so the two never disagree)."""
    probe = subprocess.run(
        [_compiler(), "-x", "c++", "-E", "-", "-o", os.devnull],
        input="#include <openssl/evp.h>\n",
        capture_output=True,
        text=True,
    )
    return ["-lcrypto"] if probe.returncode == 0 else []


@functools.cache
def _compiler_identity() -> str:
    """Part of every object's key: another compiler gives other objects."""
    version = subprocess.run([_compiler(), "--version"], capture_output=True, text=True).stdout
    return _compiler() + " " + (version.splitlines() or [""])[0]


@functools.cache
def _headers_digest() -> str:
    """Every header a unit may include. Hashing them all (a few hundred KB) is cheaper than
    asking the compiler for each unit's dependencies, and errs on the side of recompiling."""
    h = hashlib.sha256()
    for folder in ("csrc", "transports", "tests/cpp", "tests/udp_sim", "tests/fuzz"):
        for p in sorted((REPO / folder).rglob("*")):
            if p.suffix in (".h", ".hpp") and "build" not in p.relative_to(REPO).parts:
                h.update(p.relative_to(REPO).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _run(cmd: list[str], what: str) -> None:
    try:
        result = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} took over {COMPILE_TIMEOUT_S} s:\n{' '.join(cmd)}")
    if result.returncode != 0:
        pytest.fail(f"{what} failed:\n{' '.join(cmd)}\n{result.stderr}")


def _replace_atomically(build: Callable[[Path], None], target: Path) -> None:
    """Builds into a temporary file beside `target`, then renames it: a concurrent test run
    sees the old file or the new one, never half of one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        build(Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Holds `target`.lock: make test runs test files in two worker processes, and two files
    may want the same object or header at once; the second waits for the first's instead of
    compiling it again."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _object_path(source: str, flags: list[str]) -> Path:
    """Where `source` compiled with `flags` is cached (with or without the precompiled
    headers, which change nothing but the time it takes)."""
    key = hashlib.sha256(
        "\0".join([_compiler_identity(), *flags, source, _headers_digest()]).encode()
        + (REPO / source).read_bytes()
    ).hexdigest()[:20]
    return BUILD / "obj" / f"{Path(source).stem}-{key}.o"


def _takes_pch(source: str) -> bool:
    return b"#pragma GCC" not in (REPO / source).read_bytes()


def _pch_paths(flags: list[str]) -> tuple[Path, Path]:
    """Where PCH_HEADERS precompiled with `flags` are cached: the header to -include, and
    its .gch beside it."""
    key = hashlib.sha256(
        "\0".join([_compiler_identity(), *flags, "|", *PCH_HEADERS]).encode()
    ).hexdigest()[:20]
    header = BUILD / "obj" / f"pch-{key}" / "std.h"
    return header, header.with_name("std.h.gch")


def _write_pch_header(out: Path) -> None:
    out.write_text("".join(f"#include <{h}>\n" for h in PCH_HEADERS))


def _pch(flags: list[str]) -> Path:
    """PCH_HEADERS precompiled with `flags`: the header to -include (its .gch beside it)."""
    header, gch = _pch_paths(flags)
    with _locked(gch):
        if gch.exists():
            return header
        _replace_atomically(_write_pch_header, header)
        _replace_atomically(
            lambda out: _run(
                [_compiler(), *flags, "-x", "c++-header", str(header), "-o", str(out)],
                "precompiling the standard headers",
            ),
            gch,
        )
    return header


def _compile(source: str, flags: list[str], obj: Path, pch: Path | None) -> None:
    """Compiles `source` into `obj`, with the precompiled headers `pch` if given. Whether a
    unit compiles is never theirs to say: GCC 12 reports some warnings inside the standard
    headers only when they come precompiled (-Warray-bounds in std::string under
    ThreadSanitizer), so a unit that fails with them is compiled again without."""

    def command(out: Path, include: Sequence[str] = ()) -> list[str]:
        return [_compiler(), *flags, *include, "-c", source, "-o", str(out)]

    def with_pch(out: Path) -> None:
        assert pch is not None
        subprocess.run(
            command(out, ["-include", str(pch)]),
            cwd=REPO,
            capture_output=True,
            timeout=COMPILE_TIMEOUT_S,
            check=True,
        )

    with _locked(obj):
        if obj.exists():  # another process compiled it meanwhile
            return
        if pch is not None:
            try:
                _replace_atomically(with_pch, obj)
                return
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                pass
        _replace_atomically(lambda out: _run(command(out), f"compiling {source}"), obj)


def _archive(objects: list[Path], out: Path) -> None:
    out.unlink()  # ar wants to create the file itself
    _run(["ar", "rcs", str(out), *map(str, objects)], f"archiving {out.name}")


def _plan(
    main: str,
    groups: Sequence[str],
    flags: Sequence[str],
    extra_sources: Sequence[str],
    unit_flags: Callable[[str], Sequence[str]],
) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """A program's own sources, its groups' other sources, and every unit's compile flags."""
    common = [*BASE_FLAGS, *flags]
    own = [main, *extra_sources]
    library = [s for s in sources(groups) if s not in own]
    return own, library, {s: [*common, *unit_flags(s)] for s in [*own, *library]}


def _pchs(unit: dict[str, list[str]], missing: list[str]) -> dict[tuple[str, ...], Path]:
    """The precompiled headers the `missing` units take (PCH_MIN_UNITS of one flag set)."""
    sharing = Counter(tuple(unit[s]) for s in missing if _takes_pch(s))
    return {f: _pch(list(f)) for f, n in sharing.items() if n >= PCH_MIN_UNITS}


def build(
    name: str,
    main: str,
    groups: Sequence[str] = (),
    flags: Sequence[str] = (),
    *,
    extra_sources: Sequence[str] = (),
    unit_flags: Callable[[str], Sequence[str]] = lambda source: (),
) -> Path:
    """tests/cpp/build/<name>: `main` (and `extra_sources`) linked with the sources of
    `groups`, every unit compiled with BASE_FLAGS + `flags` + unit_flags(source) and linked
    with BASE_FLAGS + `flags`. Compiled at most once per change of what goes into it."""
    common = [*BASE_FLAGS, *flags]
    own, library, unit = _plan(main, groups, flags, extra_sources, unit_flags)
    objects = {s: _object_path(s, f) for s, f in unit.items()}
    missing = [s for s in unit if not objects[s].exists()]
    pchs = _pchs(unit, missing)
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        done = pool.map(
            lambda s: _compile(
                s, unit[s], objects[s], pchs.get(tuple(unit[s])) if _takes_pch(s) else None
            ),
            missing,
        )
        list(done)  # raises what a compile raised
    own_objects = [objects[s] for s in own]
    library_objects = [objects[s] for s in library]
    key = hashlib.sha256(
        "\0".join(
            [
                *common,
                *link_libraries(),
                *(o.name for o in own_objects),
                "|",
                *(o.name for o in library_objects),
            ]
        ).encode()
    ).hexdigest()[:20]
    archive = BUILD / "obj" / f"lib{name}-{key}.a"
    if library_objects and not archive.exists():
        _replace_atomically(lambda out: _archive(library_objects, out), archive)
    exe = BUILD / name
    stamp = BUILD / f"{name}.key"
    if exe.exists() and stamp.exists() and stamp.read_text() == key:
        return exe
    link = [*map(str, own_objects), *([str(archive)] if library_objects else [])]
    _replace_atomically(
        lambda out: _run(
            [_compiler(), *common, *link, *link_libraries(), "-o", str(out)], f"linking {name}"
        ),
        exe,
    )
    stamp.write_text(key)
    return exe


def _held(target: Path) -> bool:
    """Whether another process holds `target`'s lock (is compiling it now)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False


def _install(make: Callable[[Path], None], target: Path, scratch: Path) -> bool:
    """Makes `target` in `scratch` without holding its lock, then moves it in unless another
    process made it meanwhile. False when `make` failed (the test that needs it says why)."""
    out = scratch / target.name
    try:
        make(out)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        return False
    with _locked(target):
        if not target.exists():
            os.replace(out, target)
    out.unlink(missing_ok=True)
    return True


@dataclasses.dataclass(frozen=True)
class Program:
    """A program's arguments to build(), for a program that is also prebuilt (prebuild())."""

    name: str
    main: str
    groups: Sequence[str] = ()
    flags: Sequence[str] = ()
    extra_sources: Sequence[str] = ()
    unit_flags: Callable[[str], Sequence[str]] = lambda source: ()

    def build(self) -> Path:
        return build(
            self.name,
            self.main,
            self.groups,
            self.flags,
            extra_sources=self.extra_sources,
            unit_flags=self.unit_flags,
        )


def prebuild_scratch(pid: int) -> Path:
    """The folder a prebuild process compiles into before it moves each object in."""
    return BUILD / f"prebuild-{pid}"


def prebuild(program: Program) -> None:
    """Compiles into the cache the units that program.build() would compile, one at a time
    and without a lock held while compiling (tests/cpp_prebuild.py runs this at the lowest
    priority, on the CPU the tests leave idle). A unit that a build() is compiling now, or has
    compiled, is skipped; one that a build() wants while this compiles it, that build()
    compiles itself rather than wait for a compile at low priority. Archiving and linking are
    left to build()."""
    p = program
    _, _, unit = _plan(p.main, p.groups, p.flags, p.extra_sources, p.unit_flags)
    objects = {s: _object_path(s, f) for s, f in unit.items()}
    missing = [s for s in unit if not objects[s].exists()]
    scratch = prebuild_scratch(os.getpid())  # tests/conftest.py removes it if killed
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        _prebuild(unit, objects, missing, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _prebuild(
    unit: dict[str, list[str]], objects: dict[str, Path], missing: list[str], scratch: Path
) -> None:
    def run(*cmd: str) -> Callable[[Path], None]:
        return lambda out: subprocess.run(
            [_compiler(), *cmd, "-o", str(out)],
            cwd=REPO,
            capture_output=True,
            timeout=COMPILE_TIMEOUT_S,
            check=True,
        )

    sharing = Counter(tuple(unit[s]) for s in missing if _takes_pch(s))
    pchs: dict[tuple[str, ...], Path] = {}
    for f, n in sharing.items():
        if n < PCH_MIN_UNITS:
            continue
        header, gch = _pch_paths(list(f))
        if not gch.exists() and not _held(gch):
            _replace_atomically(_write_pch_header, header)
            _install(run(*f, "-x", "c++-header", str(header)), gch, scratch)
        if gch.exists():
            pchs[f] = header
    for s in missing:
        obj = objects[s]
        if obj.exists() or _held(obj):
            continue
        pch = pchs.get(tuple(unit[s])) if _takes_pch(s) else None
        with_pch = ["-include", str(pch)] if pch else []
        # Without the precompiled headers when a unit fails with them (_compile says why).
        if not (with_pch and _install(run(*unit[s], *with_pch, "-c", s), obj, scratch)):
            _install(run(*unit[s], "-c", s), obj, scratch)


def run_checks(exe: Path, timeout: float = 60.0, program: str | None = None) -> str:
    """Runs a check program (tests/cpp/check.h) built by build(): asserts that it exited 0 and
    that its last line, "<program>: N checks, 0 failed, ...", counts no failure (`program`:
    the name it prints, the file's by default); returns its output."""
    run = subprocess.run([exe], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{program or exe.name}: " in run.stdout and " 0 failed" in run.stdout, run.stdout
    return run.stdout


def check_unit(name: str, extra_sources: Sequence[str] = (), groups: Sequence[str] = ()) -> str:
    """Builds tests/cpp/<name>.cpp with the plain flags (PLAIN), linked with `extra_sources`
    and `groups`, and runs it as run_checks does: a torch-free unit's test in one call."""
    exe = build(name, f"tests/cpp/{name}.cpp", groups, flags=PLAIN, extra_sources=extra_sources)
    return run_checks(exe)
