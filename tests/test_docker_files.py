"""The Docker rig (docker/) without a Docker engine: the files parse and agree with each other,
the build context (.dockerignore) leaves build outputs out, no `python -m ucxbackend` runs next
to a source tree in the image, and the entrypoint runs on two "hosts" of the namespace rig in
the image's directory layout (rebuilt from the Dockerfile's COPY/WORKDIR/RUN rm lines) with
the in-tree build standing in for the installed package.

What this cannot show (no Docker engine here): that the image builds and that compose starts
the containers; see docs/multi-node.md.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml  # PyYAML: a test dependency (pyproject's "test" extra, `make deps`)
from dist_harness import free_port
from rig_harness import REPO, available, fresh_rig, run_on_hosts

DOCKER = REPO / "docker"

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Resolve ``${VAR:-default}`` as compose does (``env`` first, then the default)."""
    env = env or {}
    if isinstance(value, str):
        return _VAR.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    return value


def load(name: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / name).read_text())
    assert isinstance(data, dict) and "services" in data, f"{name}: no services"
    return interpolate(data, env)


def merge(base: Any, over: Any) -> Any:
    """Compose's merge of an override file: mappings merge key by key, the rest is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base[k], v) if k in base else v
        return out
    return over


def check_nodes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert sorted(services) == ["node0", "node1"]
    envs = {name: svc["environment"] for name, svc in services.items()}
    addrs = {name: svc["networks"]["ucxnet"]["ipv4_address"] for name, svc in services.items()}
    subnet = ipaddress.ip_network(compose["networks"]["ucxnet"]["ipam"]["config"][0]["subnet"])
    assert len(set(addrs.values())) == 2, addrs
    for name, addr in addrs.items():
        assert ipaddress.ip_address(addr) in subnet, f"{name}: {addr} not in {subnet}"
    # every node agrees on the job and on where node 0 is
    shared = ("NNODES", "MASTER_ADDR", "MASTER_PORT", "BACKEND", "UCX_TLS", "UCX_NET_DEVICES")
    for key in shared:
        assert len({str(e.get(key)) for e in envs.values()}) == 1, f"{key} differs: {envs}"
    env0 = envs["node0"]
    assert int(env0["NNODES"]) == len(services)
    assert env0["MASTER_ADDR"] == addrs["node0"]
    assert 0 < int(env0["MASTER_PORT"]) < 65536
    assert sorted(int(e["NODE_RANK"]) for e in envs.values()) == list(range(len(services)))
    assert services["node0"]["image"] == services["node1"]["image"]


def test_compose_nodes_agree() -> None:
    compose = load("compose.yaml")
    check_nodes(compose)
    env = compose["services"]["node0"]["environment"]
    assert env["UCX_TLS"].split(",")[0] == "tcp" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert compose["networks"]["ucxnet"]["driver"] == "bridge"


def test_compose_variables_move_every_address_together() -> None:
    env = {"NODE0_ADDR": "10.5.0.2", "NODE1_ADDR": "10.5.0.3", "SUBNET": "10.5.0.0/24"}
    compose = load("compose.yaml", env)
    check_nodes(compose)
    assert compose["services"]["node0"]["environment"]["MASTER_ADDR"] == "10.5.0.2"


def test_roce_overlay() -> None:
    compose = merge(load("compose.yaml"), load("compose.roce.yaml"))
    check_nodes(compose)
    assert compose["networks"]["ucxnet"]["driver"] == "macvlan"
    assert compose["networks"]["ucxnet"]["driver_opts"]["parent"]
    for name, svc in compose["services"].items():
        assert "/dev/infiniband:/dev/infiniband" in svc["devices"], name
        assert "IPC_LOCK" in svc["cap_add"], name
        assert svc["ulimits"]["memlock"] == {"soft": -1, "hard": -1}, name
        env = svc["environment"]
        assert re.fullmatch(r"\w+:\d+", env["UCX_NET_DEVICES"]), env["UCX_NET_DEVICES"]
        assert env["UCX_IB_GID_INDEX"].isdigit()
        assert "rc" in env["UCX_TLS"].split(",")
        assert env["NODE_RANK"] in {"0", "1"}  # kept from the base file


def test_dockerfile_builds_against_system_ucx() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim-bookworm", text, re.M)
    for pkg in ("rdma-core", "libucx-dev", "ibverbs-utils"):
        assert pkg in text
    assert re.search(r"UCX_HOME=/usr\b.*pip install[^\n]*--no-build-isolation", text)
    assert "download.pytorch.org/whl/cpu" in text
    entry = re.search(r'^ENTRYPOINT \["([^"]+)"\]', text, re.M)
    assert entry and entry.group(1) == "/opt/ucxbackend/docker/entrypoint.sh"
    assert (DOCKER / "entrypoint.sh").stat().st_mode & 0o111, "entrypoint.sh not executable"


# -- the build context and the image's layout --------------------------------------------------


def build_context() -> tuple[Path, Path]:
    """The build context and Dockerfile compose uses (the same for both services)."""
    builds = {
        json.dumps(svc["build"], sort_keys=True)
        for svc in load("compose.yaml")["services"].values()
    }
    assert len(builds) == 1, builds
    build = json.loads(builds.pop())
    context = (DOCKER / build["context"]).resolve()
    return context, context / build["dockerfile"]


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Docker compiles it (moby/patternmatcher)."""
    out, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        elif ch == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out + "$")


def load_dockerignore(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in (context / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = os.path.normpath(line[1:] if negate else line).lstrip("/")
        rules.append((negate, _ignore_regex(line)))
    return rules


def ignored(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves ``rel`` out of the context: the last rule that matches it or one
    of its parent directories decides."""
    parts = PurePosixPath(rel).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            result = not negate
    return result


def context_files(
    context: Path, rules: list[tuple[bool, re.Pattern[str]]], sub: str
) -> Iterator[str]:
    """Files of the context under ``sub`` (relative paths), as the daemon would receive them."""
    top = context / sub
    if top.is_file():
        if not ignored(sub, rules):
            yield sub
        return
    for root, dirs, files in os.walk(top):
        rel_root = os.path.relpath(root, context)
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not ignored(rel_root + d, rules)]
        for name in files:
            if not ignored(rel_root + name, rules):
                yield rel_root + name


@dataclass
class Image:
    """What the Dockerfile puts where, modelled from its instructions (no engine): files copied
    from the context (image path -> context path, minus what RUN's `rm -rf` removes), the
    directories `python -m ucxbackend` runs in during the build, and the final settings."""

    files: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    python_m: list[tuple[str, bool]] = field(default_factory=list)  # (cwd, source tree there)

    def has_source_tree(self, directory: str) -> bool:
        return f"{directory.rstrip('/')}/ucxbackend/__init__.py" in self.files


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    logical = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        cmd, _, args = logical.strip().partition(" ")
        yield cmd.upper(), args.strip()
        logical = ""


def _abs(path: str, cwd: str) -> str:
    return os.path.normpath(path if path.startswith("/") else os.path.join(cwd, path))


def model_image(context: Path, dockerfile: Path) -> Image:
    rules = load_dockerignore(context)
    image = Image()
    for cmd, args in _instructions(dockerfile.read_text()):
        if cmd == "WORKDIR":
            image.workdir = _abs(args, image.workdir)
        elif cmd == "ENV":
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                image.env[key] = value
        elif cmd == "ENTRYPOINT":
            image.entrypoint = json.loads(args)
        elif cmd in {"COPY", "ADD"}:
            words = json.loads(args) if args.startswith("[") else shlex.split(args)
            words = [w for w in words if not w.startswith("--")]
            *sources, dest = words
            for src in sources:
                src = os.path.normpath(src)
                into = dest.endswith("/") or len(sources) > 1 or (context / src).is_dir()
                for rel in context_files(context, rules, src):
                    inner = (
                        os.path.relpath(rel, src) if (context / src).is_dir() else Path(rel).name
                    )
                    target = os.path.join(dest, inner) if into else dest
                    image.files[_abs(target, image.workdir)] = rel
        elif cmd == "RUN":
            cwd = image.workdir
            for step in re.split(r"&&|\|\||;|\n", args):
                words = shlex.split(step)
                if words[:1] == ["cd"]:
                    cwd = _abs(words[1] if len(words) > 1 else "/", cwd)
                elif words[:1] == ["rm"]:
                    for path in (_abs(w, cwd) for w in words[1:] if not w.startswith("-")):
                        image.files = {
                            k: v
                            for k, v in image.files.items()
                            if k != path and not k.startswith(path.rstrip("/") + "/")
                        }
                elif re.search(r"\bpython3?\b.*\s-m\s+ucxbackend\b", step):
                    image.python_m.append((cwd, image.has_source_tree(cwd)))
    return image


def test_build_context_keeps_build_outputs_out() -> None:
    """.dockerignore sits at the root of the context compose builds from and leaves out what a
    used working tree holds (build/, the in-place _C*.so built against the wheel's UCX, caches,
    .git), but nothing the build needs."""
    context, dockerfile = build_context()
    assert context == REPO and dockerfile == DOCKER / "Dockerfile"
    assert (context / ".dockerignore").is_file(), "no .dockerignore at the build context's root"
    # BuildKit would use a Dockerfile-specific ignore file instead of the root one
    assert not (DOCKER / "Dockerfile.dockerignore").exists()
    rules = load_dockerignore(context)
    for path in (
        "build/temp.linux-x86_64-cpython-311/csrc/process_group_ucx.o",
        "build/lib.linux-x86_64-cpython-311/ucxbackend/_C.cpython-311-x86_64-linux-gnu.so",
        "ucxbackend/_C.cpython-311-x86_64-linux-gnu.so",
        "ucxbackend/__pycache__/netif.cpython-311.pyc",
        "tests/__pycache__/conftest.cpython-311-pytest-8.3.3.pyc",
        "tests/cpp/build/udp_core_test",
        "dist/ucxbackend-0.1.0-cp311-cp311-linux_x86_64.whl",
        "ucxbackend.egg-info/PKG-INFO",
        ".git/HEAD",
        ".pytest_cache/v/cache/nodeids",
        ".venv/bin/python",
    ):
        assert ignored(path, rules), f"{path} would be copied into the image"
    for path in (
        "setup.py",
        "pyproject.toml",
        "README.md",
        "csrc/transport_backend.cpp",
        "ucxbackend/__init__.py",
        "examples/train_ddp.py",
        "docker/entrypoint.sh",
    ):
        assert not ignored(path, rules), f"{path} would be left out of the image"


def _git(*args: str) -> list[str] | None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    proc = subprocess.run(
        ["git", "-C", str(REPO), *args, "-z"], capture_output=True, text=True, timeout=60
    )
    return [p for p in proc.stdout.split("\0") if p] if proc.returncode == 0 else None


def test_build_context_matches_this_working_tree() -> None:
    """Every tracked file goes into the context; every file git ignores here (this working
    tree's build outputs, whatever they are) stays out."""
    rules = load_dockerignore(REPO)
    tracked = _git("ls-files")
    if tracked is None:
        pytest.skip("not a git checkout")
    assert tracked
    left_out = [p for p in tracked if ignored(p, rules) and (REPO / p).exists()]
    assert not left_out, f"tracked files .dockerignore leaves out: {left_out[:10]}"
    outputs = _git("ls-files", "--others", "--ignored", "--exclude-standard") or []
    copied = [p for p in outputs if not ignored(p, rules)]
    assert not copied, f"git-ignored files that would be copied into the image: {copied[:10]}"


def test_python_m_never_runs_next_to_a_source_tree() -> None:
    """`python -m` puts the working directory first on sys.path: where the build runs
    `python -m ucxbackend` and where the container starts (WORKDIR), a ucxbackend/ source
    directory (no _C) would shadow the installed package."""
    image = model_image(*build_context())
    assert image.python_m, "the build never checks `python -m ucxbackend info`"
    for cwd, shadowed in image.python_m:
        assert not shadowed, f"`python -m ucxbackend` runs in {cwd}, which holds a source tree"
    assert not image.has_source_tree(image.workdir), (
        f"WORKDIR {image.workdir} holds a ucxbackend/ source tree"
    )
    assert not [p for p in image.files if p.endswith(".so")]
    # what the entrypoint needs is in the image where it looks for it
    assert image.files.get(image.entrypoint[0]) == "docker/entrypoint.sh", image.entrypoint
    app = image.env["APP_DIR"]
    assert image.files.get(f"{app}/examples/train_ddp.py") == "examples/train_ddp.py"


def test_soft_roce_recipe_is_there() -> None:
    text = (DOCKER / "rxe.md").read_text()
    assert "rdma link add rxe0 type rxe netdev" in text and "UCX_IB_GID_INDEX" in text


_OK, _WHY = available()


def _result(out: str) -> dict[str, str]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, "no RESULT line:\n" + out[-3000:]
    return dict(kv.split("=", 1) for kv in lines[-1].split()[1:])


def materialize(image: Image, root: Path, *under: str) -> None:
    """Copy the image's files below the directories ``under`` to ``root`` + their image path."""
    dirs = [d.rstrip("/") + "/" for d in under]
    for dest, rel in image.files.items():
        if any(dest.startswith(d) for d in dirs):
            target = root / dest.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, target)


@pytest.mark.skipif(not _OK, reason=f"namespace rig unavailable: {_WHY}")
def test_entrypoint_runs_across_the_namespace_rig(tmp_path: Path) -> None:
    """docker/entrypoint.sh on two rig hosts, in the image's layout (its WORKDIR and APP_DIR,
    as the Dockerfile fills them, under tmp_path) with the in-tree build on PYTHONPATH for the
    installed package (after the working directory on sys.path, like site-packages): ucx then
    gloo, with the environment compose.yaml gives, and the two trained models compared. The
    doctor preflight runs before the ucx run only: what it checks (the host, not the backend)
    is the same for both, and each of its runs costs a host a torch import (DOCTOR=0 for gloo)."""
    compose = load("compose.yaml")
    image = model_image(*build_context())
    app_dir = image.env["APP_DIR"]
    materialize(image, tmp_path, app_dir, image.workdir)
    entrypoint = tmp_path / image.entrypoint[0].lstrip("/")
    workdir = tmp_path / image.workdir.lstrip("/")
    assert entrypoint.is_file() and workdir.is_dir()
    results = {}
    with fresh_rig() as rig:
        for backend in ("ucx", "gloo"):
            port = str(free_port())
            env = {}
            for rank, host in enumerate(("a", "b")):
                e = {
                    str(k): str(v)
                    for k, v in compose["services"][f"node{rank}"]["environment"].items()
                }
                iface = rig.ifname(host)  # type: ignore[arg-type]
                e.update(
                    MASTER_ADDR=rig.addr_a,
                    MASTER_PORT=port,
                    BACKEND=backend,
                    APP_DIR=str(tmp_path / app_dir.lstrip("/")),
                    UCX_NET_DEVICES=iface,
                    UCXBACKEND_IFNAME=iface,
                    GLOO_SOCKET_IFNAME=iface,
                    UCXBACKEND_LOG_LEVEL="WARNING",
                )
                if backend == "gloo":
                    e["DOCTOR"] = "0"
                env[host] = e
            argv = [str(entrypoint)]  # its own shebang and mode, as ENTRYPOINT runs it
            out = run_on_hosts(rig, {"a": argv, "b": argv}, env=env, timeout=90, cwd=workdir)
            for host, res in out.items():
                assert res.rc == 0, f"{backend} host {host}: exit {res.rc}\n{res.output[-3000:]}"
            if backend == "ucx":
                assert "[OK  ] interface" in out["a"].output, out["a"].output[-2000:]
            assert f"[entrypoint] ucxbackend: {REPO}/ucxbackend/" in out["a"].output
            results[backend] = _result(out["a"].output)
    ucx, gloo = results["ucx"], results["gloo"]
    assert ucx["world_size"] == gloo["world_size"] == "2" and ucx["in_sync"] == "1"
    for key in ("final_loss", "param_checksum"):
        assert math.isclose(float(ucx[key]), float(gloo[key]), rel_tol=1e-6), (key, ucx, gloo)
