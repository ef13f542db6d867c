"""Parts of UCX a ucx group's process never uses, left out of its start
(transports/ucx/ucx_context.h): in a torch without device memory, UCX's GPU modules
(``kDeviceModules``; ucxbackend/__init__.py decides); where every UCX component copies with the
CPU (``kCopyOnlyComponents``), UCP's registration cache. A UCX_MODULES or UCX_RCACHE_ENABLE of
the user's keeps UCX's own choice. UCX loads its modules once per process, so each case is a
fresh process: the dynamic loader (LD_DEBUG=files) says which files UCX asked it for, and
UCX's debug log whether it made its registration cache."""

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


def _one_rank_output(extra_env: dict[str, str]) -> str:
    """What a fresh process that made a one-rank ucx group wrote (stdout, where UCX logs, then
    stderr), in an environment without the user's UCX_MODULES, UCX_RCACHE_ENABLE and
    UCX_LOG_LEVEL, over UCX whatever the default one-host transport."""
    mine = ("UCX_MODULES", "UCX_RCACHE_ENABLE", "UCX_LOG_LEVEL")
    env = {k: v for k, v in os.environ.items() if k not in mine}
    # UCX's own set-up is what these tests read: the one-host transport would make none.
    env.update({"PYTHONPATH": str(REPO), "UCXBACKEND_ONE_HOST_TRANSPORT": "ucx", **extra_env})
    done = subprocess.run(
        [sys.executable, "-c", _ONE_RANK, str(free_port())],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    return done.stdout + done.stderr


def _ucx_module_lookups(extra_env: dict[str, str]) -> list[str]:
    """The UCX module files (lib/ucx/libuc*) the dynamic loader was asked for while a fresh
    process made a one-rank ucx group."""
    output = _one_rank_output({"LD_DEBUG": "files", **extra_env})
    return sorted(
        {
            line.split("file=", 1)[1].split()[0].rsplit("/", 1)[-1]
            for line in output.splitlines()
            if "file=" in line and "/ucx/libuc" in line
        }
    )


def _registration_cache_made(extra_env: dict[str, str]) -> bool:
    """Whether UCX made its registration cache's memory pool (its debug log names it
    ``rcache_mp``) while a fresh process made a one-rank ucx group."""
    output = _one_rank_output({"UCX_LOG_LEVEL": "debug", **extra_env})
    assert "UCX  DEBUG" in output, "no debug log from UCX"
    return "rcache_mp" in output


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


def test_copy_only_components_go_without_the_registration_cache() -> None:
    skip_unless_ucx("the registration cache is UCX's")
    if ucxbackend._C is None or not set(_components()) <= {"self", "tcp", "sysv", "posix", "cma"}:
        pytest.skip(f"this UCX has components that register memory: {_components()}")
    assert not _registration_cache_made({})
    # The user's UCX_RCACHE_ENABLE wins: UCX then makes it as it would.
    assert _registration_cache_made({"UCX_RCACHE_ENABLE": "try"})


def _components() -> list[str]:
    """The transports of every memory domain this UCX can open (as ``info`` lists them): a
    component with no device to open is missing, which only makes the test skip less."""
    assert ucxbackend._C is not None
    return sorted({tl for tl, _ in ucxbackend._C.ucx_transports()})
