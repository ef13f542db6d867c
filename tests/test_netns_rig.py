"""The namespace rig (scripts/netns_rig.py) leaves nothing behind: after a normal exit, an
exception, a failing `run` command, and (through the dead-pid sweep) a SIGKILLed creator;
the sweep never touches the rig of a live process or one kept on purpose by `create`.

Only names of the rigs made here are checked: other rigs (a test session next to this one)
may exist at the same time and are left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from rig_harness import REPO, NetnsRig, available, cleanup_dead, cleanup_stale

_OK, _WHY = available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"namespace rig unavailable: {_WHY}")

SCRIPT = str(REPO / "scripts" / "netns_rig.py")
# Above PID_MAX_LIMIT (2**22): no process ever has this pid, so its rig counts as dead.
NO_SUCH_PID = 9999990


def leftovers(tag: object) -> list[str]:
    """Namespaces (``ip netns list``) and root-namespace links (``ip link``) of rig ``tag``."""
    names = {f"ucxb{tag}{suffix}" for suffix in ("a", "b", "probe")}
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    found = [line.split()[0] for line in ns.stdout.splitlines() if line.strip()]
    found += [line.split(":")[1].strip().split("@")[0] for line in links.stdout.splitlines()]
    return sorted(n for n in found if n in names)


def assert_complete(rig: NetnsRig) -> None:
    """Both namespaces exist, each with its veth end (and nothing of the rig in the root)."""
    assert leftovers(rig.tag) == [rig.ns_a, rig.ns_b]
    for ns, ifname in ((rig.ns_a, rig.if_a), (rig.ns_b, rig.if_b)):
        argv = ["ip", "-n", ns, "-d", "-o", "link", "show", ifname]
        out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        assert "veth" in out, out


def test_normal_exit_removes_everything() -> None:
    tag = f"{os.getpid()}n"
    with NetnsRig.create(tag) as rig:
        assert_complete(rig)
    assert leftovers(tag) == []


def test_exception_removes_everything() -> None:
    tag = f"{os.getpid()}e"
    with pytest.raises(RuntimeError, match="boom"), NetnsRig.create(tag) as rig:
        assert_complete(rig)
        raise RuntimeError("boom")
    assert leftovers(tag) == []


def _run_script(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=timeout
    )


def _rig_json(stderr: str) -> dict[str, object]:
    line = next((s for s in stderr.splitlines() if s.startswith("{")), None)
    assert line is not None, stderr
    return json.loads(line)  # type: ignore[no-any-return]


def test_run_with_a_failing_command_exits_non_zero_and_cleans_up() -> None:
    proc = _run_script("run", "--", "false")
    assert proc.returncode != 0, proc
    tag = _rig_json(proc.stderr)["tag"]
    assert leftovers(tag) == []
    # the command's own status comes back, and the rig did exist while it ran
    proc = _run_script("run", "--", "sh", "-c", 'ip netns list | grep "^$RIG_NS_B"; exit 3')
    assert proc.returncode == 3, proc
    rig = _rig_json(proc.stderr)
    assert proc.stdout.split()[0] == rig["ns_b"], proc.stdout
    assert leftovers(rig["tag"]) == []


def test_exec_under_run_uses_runs_rig_not_the_newest() -> None:
    """`exec` inside `run` goes to the rig `run` made (its RIG_* variables), even when a newer
    rig exists (another session's): it used to pick the newest, so commands and their traffic
    landed in someone else's namespaces."""
    with NetnsRig.create() as mine, NetnsRig.create(tag=f"{os.getpid()}z") as newer:
        assert sorted([mine.ns_a, newer.ns_a])[-1] == newer.ns_a  # the one `newest` picks
        env = {**os.environ, **mine.env()}
        proc = subprocess.run(
            [sys.executable, SCRIPT, "exec", "a", "--", "hostname"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert proc.returncode == 0, proc
        assert proc.stdout.strip() == mine.ns_a, (proc.stdout, mine.ns_a, newer.ns_a)


def test_newest_is_the_rig_made_last_not_the_largest_name() -> None:
    """`exec` outside `run` goes to the newest rig. Tags are pids, so names do not sort by
    age (ucxb999a > ucxb1000a): the rig made second, whose name sorts first, must win."""
    from netns_rig import newest_name  # importable once rig_harness has put scripts/ on the path

    assert newest_name(["ucxb999a", "ucxb1000a"], {"ucxb999a": 1, "ucxb1000a": 2}.get) == (
        "ucxb1000a"
    )
    with (
        NetnsRig.create(tag=f"{os.getpid()}z") as older,
        NetnsRig.create(tag=f"{os.getpid()}k") as newer,
    ):
        assert sorted([older.ns_a, newer.ns_a])[-1] == older.ns_a
        assert newest_name([older.ns_a, newer.ns_a]) == newer.ns_a


def test_dead_sweep_removes_a_killed_runs_rig_only() -> None:
    # A `run` SIGKILLed while its command runs leaves its rig: nothing ran its cleanup.
    killed = subprocess.Popen(
        [sys.executable, SCRIPT, "run", "--", "sleep", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    live = subprocess.Popen(["sleep", "60"])
    kept = None
    try:
        deadline = time.monotonic() + 30
        while len(leftovers(killed.pid)) < 2:
            assert time.monotonic() < deadline, "the rig of `run` did not appear"
            assert killed.poll() is None, "`run` exited early"
            time.sleep(0.1)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=10)  # reaped: the pid no longer exists
        assert len(leftovers(killed.pid)) == 2

        live_rig = NetnsRig.create(str(live.pid))  # the rig of a process that is alive
        created = _run_script("create")  # kept on purpose; its creator has exited
        assert created.returncode == 0, created
        kept = json.loads(created.stdout)["tag"]
        assert str(kept).endswith("k") and len(leftovers(kept)) == 2
        # a prefix of a dead pid's tag is not that rig: destroy TAG matches names exactly
        stale = NetnsRig.create(str(NO_SUCH_PID))
        assert cleanup_stale(str(NO_SUCH_PID)[:-1]) == []
        assert len(leftovers(NO_SUCH_PID)) == 2

        removed = cleanup_dead()
        assert set(leftovers(killed.pid)) | set(leftovers(NO_SUCH_PID)) == set()
        assert {f"ucxb{killed.pid}a", f"ucxb{killed.pid}b", stale.ns_a, stale.ns_b} <= set(removed)
        assert leftovers(live.pid) == [live_rig.ns_a, live_rig.ns_b]
        assert len(leftovers(kept)) == 2

        live.kill()
        live.wait(timeout=10)
        assert live_rig.ns_a in cleanup_dead() and leftovers(live.pid) == []
        assert len(leftovers(kept)) == 2  # only `destroy TAG` (or `cleanup`) removes it
        destroyed = _run_script("destroy", str(kept))
        assert destroyed.returncode == 0 and leftovers(kept) == [], destroyed
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for tag in (killed.pid, live.pid, NO_SUCH_PID, kept):
            if tag is not None:
                cleanup_stale(tag)
