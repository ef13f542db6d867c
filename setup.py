"""Builds ucxbackend._C against the installed torch and a UCX install.

UCX comes from the `libucx-cu12` wheel unless UCX_HOME names another prefix (Debian's
libucx-dev at /usr, a cluster's HPC-X/MLNX UCX with verbs). The extension records that
prefix's lib directory as its RUNPATH, so it loads exactly the UCX it was compiled against.

Build in place (incremental: ninja recompiles only changed sources):
    python setup.py build_ext --inplace
Install against the torch already installed (never let pip fetch another torch):
    pip install --no-build-isolation .
"""

from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def ucx_home() -> Path:
    explicit = os.environ.get("UCX_HOME")
    if explicit:
        home = Path(explicit)
    else:
        try:
            import libucx  # the libucx-cu12 wheel
        except ImportError:
            sys.exit(
                "setup.py: UCX not found. Install the wheel (pip install libucx-cu12) "
                "or set UCX_HOME to a UCX prefix with include/ucp/api/ucp.h"
            )
        home = Path(libucx.__file__).resolve().parent
    if not (home / "include" / "ucp" / "api" / "ucp.h").is_file():
        sys.exit(f"setup.py: {home}/include/ucp/api/ucp.h not found (UCX_HOME={home})")
    return home


def ucx_libdir(home: Path) -> Path:
    for candidate in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
        if (home / candidate / "libucp.so").exists():
            return home / candidate
    sys.exit(f"setup.py: libucp.so not found under {home}")


def openssl_found(include_dirs: list[str]) -> bool:
    """Whether the compiler finds <openssl/evp.h> (Debian libssl-dev, RHEL openssl-devel)
    with the extension's include directories, as transports/udp/have_openssl.h will: then the
    extension links libcrypto and the udp backend's authenticated mode (the secret_file knob)
    works; without it the extension still builds and that mode says how to get it.
    UCXB_WITHOUT_OPENSSL=1 builds without it on purpose (to test that build)."""
    if os.environ.get("UCXB_WITHOUT_OPENSSL") == "1":
        return False
    compiler = os.environ.get("CXX", "c++")
    try:
        probe = subprocess.run(
            [
                *shlex.split(compiler),
                *(f"-I{d}" for d in include_dirs),
                "-x",
                "c++",
                "-E",
                "-",
                "-o",
                os.devnull,
            ],
            input="#include <openssl/evp.h>\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def main() -> None:
    import torch
    import torch.utils.cpp_extension
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    home = ucx_home()
    libdir = ucx_libdir(home)
    sources = sorted(
        os.path.relpath(p, ROOT)
        for pattern in ("transports/**/*.cpp", "csrc/**/*.cpp")
        for p in glob.glob(str(ROOT / pattern), recursive=True)
    )
    include_dirs = [str(ROOT), str(home / "include")]
    openssl = openssl_found([*include_dirs, *torch.utils.cpp_extension.include_paths()])
    if not openssl:
        print(
            "setup.py: <openssl/evp.h> not found: building without the udp backend's "
            "authenticated mode (install libssl-dev or openssl-devel and rebuild to have it)",
            file=sys.stderr,
        )
    ext = CppExtension(
        name="ucxbackend._C",
        sources=sources,
        # torch's bundled pybind11 comes first (through CppExtension); never the pip one.
        include_dirs=include_dirs,
        library_dirs=[str(libdir)],
        libraries=["ucp", "uct", "ucs", *(["crypto"] if openssl else [])],
        define_macros=[
            ("UCXB_UCX_HOME", f'"{home}"'),
            ("UCXB_TORCH_VERSION", f'"{torch.__version__}"'),
            *([] if openssl else [("UCXB_WITHOUT_OPENSSL", "1")]),
        ],
        # C++20 named explicitly: torch 2.13's BuildExtension defaults to it, older ones (the
        # GPU machines' torch 2.11) to C++17, and it adds its default only when none is given.
        # No debug info unless UCXB_DEBUG_INFO=1: Python's own CFLAGS carry -g, which doubles
        # the compile time of every unit that includes ATen (tensor_checks.cpp: 8.5 s instead
        # of 16.7 s) and makes the extension ~10x larger; symbols stay for backtraces.
        extra_compile_args=[
            "-O3",
            "-Wall",
            "-Wextra",
            "-Wno-unused-parameter",
            "-std=c++20",
            *([] if os.environ.get("UCXB_DEBUG_INFO") == "1" else ["-g0"]),
        ],
        # RUNPATH (new dtags) to the UCX we compiled against; LD_LIBRARY_PATH can still
        # override it deliberately, a stray system libucp cannot.
        extra_link_args=[f"-Wl,-rpath,{libdir}", "-Wl,--enable-new-dtags"],
    )
    setup(
        name="ucxbackend",
        # packages and package data: pyproject.toml's [tool.setuptools] (one list, not two)
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    )


if __name__ == "__main__":
    main()
