"""The built extension has no link-time dependency on CUDA.

``ucxbackend._C`` must load on a machine without the CUDA runtime or driver (a CPU-only torch,
a node without GPUs): whatever CUDA support it has reaches CUDA through torch and UCX at run
time, never through an ELF ``NEEDED`` entry of its own. The check reads the extension's
``NEEDED`` entries with pyelftools when it is installed, else with ``readelf -d`` or
``objdump -p``, and skips (with a reason) when none of them is there or the extension is not
built.
"""

from __future__ import annotations

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
