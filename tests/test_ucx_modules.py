"""UCX's device modules in a torch without device memory (transports/ucx/ucx_context.h,
``kDeviceModules``; ucxbackend/__init__.py): a ucx group made there keeps UCX from looking
for its CUDA modules, which only cost start-up; a UCX_MODULES of the user's keeps UCX's own
choice. UCX loads its modules once per process, so each case is a fresh process, and the
dynamic loader (LD_DEBUG=files) says which files UCX asked it for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import skip_unless_ucx
from dist_harness import free_port

import ucxbackend

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not ucxbackend.is_available(), reason="ucxbackend's native module is not built"
)

# A one-rank ucx group and an all_reduce checked against the expected value, in a process of
# its own.
_ONE_RANK = """
import sys
import torch
import torch.distributed as dist
import ucxbackend
dist.init_process_group("ucx", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
x = torch.full((4,), 3, dtype=torch.int64)
dist.all_reduce(x)
assert x.tolist() == [3, 3, 3, 3], x
dist.destroy_process_group()
print("ok")
"""


def _ucx_module_lookups(extra_env: dict[str, str]) -> list[str]:
    """The UCX module files (lib/ucx/libuc*) the dynamic loader was asked for while a fresh
    process made a one-rank ucx group."""
    env = {k: v for k, v in os.environ.items() if k != "UCX_MODULES"}
    env.update({"LD_DEBUG": "files", "PYTHONPATH": str(REPO), **extra_env})
    done = subprocess.run(
        [sys.executable, "-c", _ONE_RANK, str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    return sorted(
        {
            line.split("file=", 1)[1].split()[0].rsplit("/", 1)[-1]
            for line in done.stderr.splitlines()
            if "file=" in line and "/ucx/libuc" in line
        }
    )


def _wheel_ships_cuda_modules() -> bool:
    """Whether the UCX this build uses has CUDA modules to leave out (the libucx-cu12 wheel
    does; a distribution's UCX may not)."""
    home = ucxbackend._C.build_info()["ucx_home"] if ucxbackend._C is not None else ""
    return any((Path(home) / "lib" / "ucx").glob("libuct_cuda*.so*"))


def test_torch_without_device_memory_leaves_cuda_modules_out() -> None:
    skip_unless_ucx("UCX's modules are the ucx transport's")
    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("this torch holds device memory: UCX keeps its device modules")
    if not _wheel_ships_cuda_modules():
        pytest.skip("this UCX has no CUDA modules to leave out")
    looked_up = _ucx_module_lookups({})
    assert looked_up, "UCX loaded no module at all: LD_DEBUG said nothing?"
    assert not [m for m in looked_up if "cuda" in m], looked_up
    # The user's UCX_MODULES wins: UCX then looks for every module it ships.
    assert [m for m in _ucx_module_lookups({"UCX_MODULES": "all"}) if "cuda" in m]
