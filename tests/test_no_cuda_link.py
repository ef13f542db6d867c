"""How the built extension links: no CUDA library, and libstdc++ as a shared library.

``ucxbackend._C`` must load on a machine without the CUDA runtime or driver (a CPU-only torch,
a node without GPUs): whatever CUDA support it has reaches CUDA through torch and UCX at run
time, never through an ELF ``NEEDED`` entry of its own.

It must also share torch's libstdc++: ``libstdc++.so.6`` among its ``NEEDED`` entries, and no
libstdc++ of its own inside it. A compiler that links libstdc++ statically (the GPU image's
``CXX`` wrapper does, with ``-static-libstdc++``) gives the extension a second copy, and every
process then crashed at the first ``std::ostringstream`` inside it (two ``std::locale``
singletons, one never initialised). Such a copy shows as ``std::locale`` symbols
(``_ZNSt6locale...``) that the extension defines in its dynamic symbol table.

The checks read the ``NEEDED`` entries with pyelftools when it is installed, else with
``readelf -d`` or ``objdump -p``, and the dynamic symbols with pyelftools, else
``readelf --dyn-syms``, ``objdump -T`` or ``nm -D --defined-only``; they skip (with a reason)
when none of them is there or the extension is not built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Libraries the extension must not name: the CUDA runtime and driver, torch's CUDA parts, NCCL.
FORBIDDEN = re.compile(r"^lib(?:cudart|cuda|c10_cuda|torch_cuda|nccl)(?:[._-]|$)")


def forbidden(needed: list[str]) -> list[str]:
    """The entries of ``needed`` that are CUDA libraries."""
    return [name for name in needed if FORBIDDEN.match(name)]


_READELF_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library:\s+\[([^\]]+)\]")
_OBJDUMP_NEEDED = re.compile(r"^\s*NEEDED\s+(\S+)\s*$", re.M)


def parse_readelf(text: str) -> list[str]:
    return _READELF_NEEDED.findall(text)


def parse_objdump(text: str) -> list[str]:
    return _OBJDUMP_NEEDED.findall(text)


def needed_entries(path: Path) -> tuple[list[str], str]:
    """(the NEEDED entries of ``path``, the tool that read them); skips without a tool."""
    try:
        from elftools.elf.dynamic import DynamicSection
        from elftools.elf.elffile import ELFFile
    except ImportError:
        pass
    else:
        with path.open("rb") as f:
            names = [
                tag.needed
                for section in ELFFile(f).iter_sections()
                if isinstance(section, DynamicSection)
                for tag in section.iter_tags()
                if tag.entry.d_tag == "DT_NEEDED"
            ]
        return names, "pyelftools"
    for tool, args, parse in (
        ("readelf", ["-d", "-W"], parse_readelf),
        ("objdump", ["-p"], parse_objdump),
    ):
        exe = shutil.which(tool)
        if exe is None:
            continue
        proc = subprocess.run(
            [exe, *args, str(path)], capture_output=True, text=True, timeout=60, check=True
        )
        return parse(proc.stdout), tool
    pytest.skip("no ELF reader: neither pyelftools nor readelf nor objdump is installed")


# The libstdc++ that torch loads; the extension must use that one.
LIBSTDCXX = "libstdc++.so.6"
# std::locale's members (mangled): defined only by a libstdc++ linked into the extension.
_LOCALE_PREFIX = "_ZNSt6locale"


def _unversioned(name: str) -> str:
    """``name`` without the ``@VERSION`` (or ``@@VERSION``) suffix some tools print."""
    return name.split("@", 1)[0]


# readelf --dyn-syms -W: "   840: 0000000000297654     4 OBJECT  GLOBAL DEFAULT   16 name";
# the section index is UND for an undefined symbol; the visibility may carry "[<other>: 88]".
_READELF_SYM = re.compile(
    r"^\s*\d+:\s+[0-9a-fA-F]+\s+\S+\s+\S+\s+\S+\s+\S+(?:\s+\[[^\]]*\])?\s+(\S+)\s+(\S+)",
    re.M,
)


def parse_readelf_dynsyms(text: str) -> list[str]:
    """The symbols ``readelf --dyn-syms -W`` shows as defined (section index not ``UND``)."""
    return [_unversioned(name) for ndx, name in _READELF_SYM.findall(text) if ndx != "UND"]


def parse_objdump_dynsyms(text: str) -> list[str]:
    """The symbols ``objdump -T`` shows as defined (section not ``*UND*``)."""
    names = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or not re.fullmatch(r"[0-9a-fA-F]{8,}", fields[0]):
            continue
        if "*UND*" not in fields:
            names.append(_unversioned(fields[-1]))
    return names


def parse_nm_defined(text: str) -> list[str]:
    """The symbols of ``nm -D --defined-only`` ("address type name" lines)."""
    names = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] not in ("U", "w", "v"):
            names.append(_unversioned(fields[2]))
    return names


def defined_dynamic_symbols(path: Path) -> tuple[list[str], str]:
    """(the symbols ``path``'s dynamic symbol table defines, the tool that read them)."""
    try:
        from elftools.elf.elffile import ELFFile
        from elftools.elf.sections import SymbolTableSection
    except ImportError:
        pass
    else:
        with path.open("rb") as f:
            section = ELFFile(f).get_section_by_name(".dynsym")
            assert isinstance(section, SymbolTableSection), f"{path.name} has no .dynsym"
            names = [
                sym.name
                for sym in section.iter_symbols()
                if sym.name and sym["st_shndx"] != "SHN_UNDEF"
            ]
        return names, "pyelftools"
    for tool, args, parse in (
        ("readelf", ["--dyn-syms", "-W"], parse_readelf_dynsyms),
        ("objdump", ["-T"], parse_objdump_dynsyms),
        ("nm", ["-D", "--defined-only"], parse_nm_defined),
    ):
        exe = shutil.which(tool)
        if exe is None:
            continue
        proc = subprocess.run(
            [exe, *args, str(path)], capture_output=True, text=True, timeout=60, check=True
        )
        return parse(proc.stdout), tool
    pytest.skip("no ELF reader: neither pyelftools nor readelf, objdump or nm is installed")


def static_libstdcxx(needed: list[str], defined: list[str]) -> list[str]:
    """What shows that libstdc++ was linked in statically (empty: linked as a shared library)."""
    signs = []
    if LIBSTDCXX not in needed:
        signs.append(f"{LIBSTDCXX} is not among its NEEDED entries {needed}")
    locale = sorted(name for name in defined if name.startswith(_LOCALE_PREFIX))
    if locale:
        shown = ", ".join(locale[:3]) + (", ..." if len(locale) > 3 else "")
        signs.append(f"it defines {len(locale)} std::locale symbols of its own ({shown})")
    return signs


def libstdcxx_problem(so: Path) -> str | None:
    """Why ``so`` does not share the process's libstdc++, with the fix; None when it does."""
    needed, needed_tool = needed_entries(so)
    defined, sym_tool = defined_dynamic_symbols(so)
    # The symbol reader works: the extension defines its module init function.
    assert "PyInit__C" in defined, (sym_tool, len(defined), defined[:20])
    signs = static_libstdcxx(needed, defined)
    if not signs:
        return None
    cxx = os.environ.get("CXX") or "not set here"
    tools = needed_tool if needed_tool == sym_tool else f"{needed_tool} and {sym_tool}"
    return (
        f"{so} carries its own libstdc++: {'; '.join(signs)} (read with {tools}); next to "
        "torch's libstdc++ it crashes at its first std::ostringstream. "
        f"The compiler (CXX={cxx}) linked libstdc++ statically; rebuild with the system g++, "
        "e.g. CXX=g++ make build (make gpu-check builds with GPU_CXX, g++ by default)"
    )


def _extension() -> Path:
    built = sorted((REPO / "ucxbackend").glob("_C*.so"))
    if not built:
        pytest.skip("ucxbackend/_C*.so is not built; run `make build`")
    return built[0]


def test_extension_has_no_cuda_needed_entries() -> None:
    so = _extension()
    needed, tool = needed_entries(so)
    # The reader works: the extension links UCX and torch, so an empty list means a broken parse.
    assert any(n.startswith("libucp") for n in needed), (tool, needed)
    assert any(n.startswith(("libtorch", "libc10")) for n in needed), (tool, needed)
    bad = forbidden(needed)
    assert not bad, f"{so.name} links CUDA libraries ({tool}): {bad}; all NEEDED: {needed}"


def test_extension_links_libstdcxx_dynamically() -> None:
    problem = libstdcxx_problem(_extension())
    assert problem is None, problem


def test_the_check_rejects_a_static_libstdcxx() -> None:
    # What the GPU image's CXX wrapper (-static-libstdc++) produced: no libstdc++.so.6 among
    # the NEEDED entries, and libstdc++'s own std::locale defined inside the extension.
    needed = ["libucp.so.0", "libc10.so", "libtorch_cpu.so", "libgcc_s.so.1", "libc.so.6"]
    defined = ["PyInit__C", "_ZNSt6locale10_S_classicE", "_ZNSt6localeC2Ev"]
    signs = static_libstdcxx(needed, defined)
    assert len(signs) == 2, signs
    assert "libstdc++.so.6 is not among its NEEDED entries" in signs[0]
    assert "defines 2 std::locale symbols" in signs[1]
    # Either sign alone is enough.
    assert len(static_libstdcxx([*needed, LIBSTDCXX], defined)) == 1
    assert len(static_libstdcxx(needed, ["PyInit__C"])) == 1
    # A shared libstdc++ whose symbols the extension only uses (undefined in it) is fine.
    assert static_libstdcxx([*needed, LIBSTDCXX], ["PyInit__C", "_ZNSt3foo"]) == []


def test_the_check_rejects_cuda_libraries() -> None:
    # What a CUDAExtension build, or a link against torch's CUDA libraries, would record.
    needed = [
        "libucp.so.0",
        "libc10.so",
        "libc10_cuda.so",
        "libtorch_cuda.so",
        "libcudart.so.13",
        "libcuda.so.1",
        "libnccl.so.2",
        "libtorch_python.so",
    ]
    assert forbidden(needed) == [
        "libc10_cuda.so",
        "libtorch_cuda.so",
        "libcudart.so.13",
        "libcuda.so.1",
        "libnccl.so.2",
    ]
    # Names that merely share a prefix are fine.
    assert forbidden(["libcudaz.so", "libucs.so.0", "libtorch.so", "libcudnn_fake.so"]) == []


READELF_SAMPLE = """
Dynamic section at offset 0x2d9e38 contains 33 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libucp.so.0]
 0x0000000000000001 (NEEDED)             Shared library: [libc10_cuda.so]
 0x000000000000001d (RUNPATH)            Library runpath: [/x/lib]
"""
OBJDUMP_SAMPLE = """
Dynamic Section:
  NEEDED               libucp.so.0
  NEEDED               libcudart.so.12
  RUNPATH              /x/lib
"""


def test_parsers() -> None:
    assert parse_readelf(READELF_SAMPLE) == ["libucp.so.0", "libc10_cuda.so"]
    assert parse_objdump(OBJDUMP_SAMPLE) == ["libucp.so.0", "libcudart.so.12"]
    assert forbidden(parse_readelf(READELF_SAMPLE)) == ["libc10_cuda.so"]
    assert forbidden(parse_objdump(OBJDUMP_SAMPLE)) == ["libcudart.so.12"]


# The dynamic symbol tables of a build with libstdc++ linked in statically: std::locale defined
# (object, function) and undefined (a versioned reference to the shared libstdc++), plus the
# module's init function.
READELF_DYNSYMS_SAMPLE = """
Symbol table '.dynsym' contains 1502 entries:
   Num:    Value          Size Type    Bind   Vis      Ndx Name
     0: 0000000000000000     0 NOTYPE  LOCAL  DEFAULT  UND
   367: 0000000000000000     0 FUNC    GLOBAL DEFAULT  UND _ZNSt6localeC1Ev@GLIBCXX_3.4 (2)
   840: 0000000000297654     4 OBJECT  GLOBAL DEFAULT   16 _ZNSt6locale3allE
   885: 00000000001e41f0   227 FUNC    GLOBAL DEFAULT   14 _ZNSt6localeC2Ev
   900: 00000000001e4200    10 FUNC    GLOBAL PROTECTED [<other>: 13]   14 PyInit__C
"""
OBJDUMP_DYNSYMS_SAMPLE = """
_C.so:     file format elf64-x86-64

DYNAMIC SYMBOL TABLE:
0000000000000000      DF *UND*	0000000000000000 (GLIBCXX_3.4) _ZNSt6localeC1Ev
0000000000000000  w   D  *UND*	0000000000000000  Base        __gmon_start__
0000000000297654 g    DO .rodata	0000000000000004  Base        _ZNSt6locale3allE
00000000001e41f0 g    DF .text	00000000000000e3  Base        _ZNSt6localeC2Ev
00000000001e4200 g    DF .text	000000000000000a  Base        PyInit__C
"""
NM_DEFINED_SAMPLE = """
00000000002fd710 B _ZNSt6locale10_S_classicE
00000000001e4190 T _ZNSt6locale13_S_initializeEv
00000000001e4200 T PyInit__C
"""


def test_symbol_parsers() -> None:
    assert parse_readelf_dynsyms(READELF_DYNSYMS_SAMPLE) == [
        "_ZNSt6locale3allE",
        "_ZNSt6localeC2Ev",
        "PyInit__C",
    ]
    assert parse_objdump_dynsyms(OBJDUMP_DYNSYMS_SAMPLE) == [
        "_ZNSt6locale3allE",
        "_ZNSt6localeC2Ev",
        "PyInit__C",
    ]
    assert parse_nm_defined(NM_DEFINED_SAMPLE) == [
        "_ZNSt6locale10_S_classicE",
        "_ZNSt6locale13_S_initializeEv",
        "PyInit__C",
    ]
    # Each sample is a static libstdc++ with libstdc++.so.6 among the NEEDED entries: one sign.
    for parsed in (
        parse_readelf_dynsyms(READELF_DYNSYMS_SAMPLE),
        parse_objdump_dynsyms(OBJDUMP_DYNSYMS_SAMPLE),
        parse_nm_defined(NM_DEFINED_SAMPLE),
    ):
        signs = static_libstdcxx(["libucp.so.0", LIBSTDCXX], parsed)
        assert len(signs) == 1 and "std::locale" in signs[0], signs
