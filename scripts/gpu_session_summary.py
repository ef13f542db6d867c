"""The verdicts of a GPU session (scripts/gpu_session.sh) in one short Markdown page.

    python scripts/gpu_session_summary.py OUT_DIR [SCRATCH_DIR]

Reads what the session left in OUT_DIR: ``steps.tsv`` (step, exit status, seconds),
``junit.xml`` (tests/gpu), ``bench.json`` (the bench's all_reduce on cuda), ``smoke.log``
(scripts/gpu_smoke.py) and ``session.log`` (the timeline step's runs of
scripts/gpu_timeline.py); and ``bench_mps.json`` (the same bench with ``--mps``) from OUT_DIR
or else SCRATCH_DIR (where the session leaves it: the device tool brings back 8 files of
OUT_DIR). Prints, with whatever of them exists:

* each step's exit status and time;
* the tests' counts per file, every failure with the first lines of its message, and the
  properties tests recorded (``record_property``: what a test measured without judging it);
* issue #20's "Done means" figures at the largest size the bench ran (64 MiB): ucx's busbw
  against Gloo's on the same tensors (target: at least 5x) and against the device-to-device
  copy's bandwidth (target: at least 0.5x), for the bench and for the bench under MPS, with
  whether MPS was on (the bench's ``mps`` record) and ucx under MPS against ucx without; and
  how long ``wait()`` held the host in the smoke, per ``cuda_wait`` mode;
* the timeline step's headlines: per setting, the latency per size, each op's waits for the
  transport and the device, and the contention probe.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

GLOO_TARGET = 5.0
COPY_TARGET = 0.5
MAX_FAILURES = 25


def steps(out: Path) -> list[str]:
    path = out / "steps.tsv"
    if not path.exists():
        return ["(no steps.tsv)"]
    lines = ["| step | exit | seconds |", "| --- | --- | --- |"]
    for row in path.read_text().splitlines():
        name, rc, secs = [*row.split("\t"), "", "", ""][:3]
        lines.append(f"| {name} | {rc} | {secs} |")
    return lines


def _outcome(case: ET.Element) -> tuple[str, str]:
    if case.get("name") is None:  # what pytest writes for a test an interrupt stopped
        return "interrupted", ""
    for kind in ("failure", "error"):
        found = case.find(kind)
        if found is not None:
            text = (found.get("message") or found.text or "").strip()
            return kind, " / ".join(text.splitlines()[:3])[:400]
    if case.find("skipped") is not None:
        return "skipped", ""
    return "passed", ""


def tests(out: Path) -> list[str]:
    path = out / "junit.xml"
    if not path.exists():
        return ["(no junit.xml: the tests did not run or were killed before they ended)"]
    root = ET.parse(path).getroot()
    per_file: dict[str, Counter[str]] = {}
    failures: list[str] = []
    props: list[str] = []
    for case in root.iter("testcase"):
        where = (case.get("classname") or "?").rsplit(".", 1)[-1]
        kind, text = _outcome(case)
        per_file.setdefault(where, Counter())[kind] += 1
        if kind in ("failure", "error"):
            failures.append(f"- `{where}::{case.get('name')}` ({kind}): {text}")
        for prop in case.iter("property"):
            props.append(f"- `{case.get('name')}`: {prop.get('name')} = {prop.get('value')}")
    total: Counter[str] = sum(per_file.values(), Counter())
    stopped = total["interrupted"]
    lines = [
        f"{total['passed']} passed, {total['failure']} failed, {total['error']} errors, "
        f"{total['skipped']} skipped"
        + (f", {stopped} interrupted (the time ran out)" if stopped else ""),
        "",
        "| file | passed | failed | errors | skipped |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, c in per_file.items():
        lines.append(f"| {name} | {c['passed']} | {c['failure']} | {c['error']} | {c['skipped']} |")
    if failures:
        lines += ["", f"Failures ({len(failures)}; the first {MAX_FAILURES}):"]
        lines += failures[:MAX_FAILURES]
    if props:
        lines += ["", "Recorded by the tests:", *props]
    return lines


def _largest(records: list[dict[str, Any]], key: str = "bytes") -> int | None:
    sizes = [r[key] for r in records if r.get(key) is not None]
    return max(sizes) if sizes else None


def _wait_split(record: dict[str, Any]) -> str:
    """What a ucx or udp column's ops waited for, per op summed over ranks (bench/waits.py):
    the transport's requests and the device (docs/cuda.md); empty for other columns."""
    per_op = (record.get("waits") or {}).get("per_op") or {}
    if "transport_wait_us" not in per_op:
        return ""
    return (f"; waits per op (both ranks): transport {per_op['transport_wait_us']:.0f} us, "
            f"device {per_op.get('device_wait_us', 0):.0f} us")


def _mps(doc: dict[str, Any]) -> str:
    """Whether the bench ran under an MPS server (its ``mps`` record; absent before it had
    one)."""
    mps = doc.get("mps")
    if not mps:
        return "MPS: not recorded"
    if not mps.get("on"):
        return "MPS: off"
    return "MPS: on" + (", a private server (--mps)" if mps.get("private") else "")


def _ucx_busbw(path: Path) -> tuple[int, float] | None:
    """ucx's all_reduce busbw at the largest size of a bench document."""
    if not path.exists():
        return None
    results = [r for r in json.loads(path.read_text()).get("results", [])
               if r.get("collective") == "all_reduce" and r.get("backend") == "ucx"]
    size = _largest(results)
    busbw = next((r.get("busbw") for r in results if r["bytes"] == size), None)
    return None if size is None or busbw is None else (size, busbw)


def find(name: str, dirs: list[Path]) -> Path:
    """``name`` in the first of ``dirs`` that has it (else in the first)."""
    return next((d / name for d in dirs if (d / name).exists()), dirs[0] / name)


def bench(path: Path) -> list[str]:
    if not path.exists():
        return [f"(no {path.name})"]
    doc = json.loads(path.read_text())
    results = [r for r in doc.get("results", []) if r.get("collective") == "all_reduce"]
    size = _largest(results)
    if size is None:
        return [f"({path.name} holds no all_reduce result)"]
    at = {r["backend"]: r for r in results if r["bytes"] == size}
    copy = next((r for r in doc.get("limits", []) if r.get("bytes") == size), None)
    lines = [f"all_reduce of {size / (1 << 20):g} MiB, {doc.get('world_size')} ranks, "
             f"{_mps(doc)}:"]
    for name, r in at.items():
        busbw = r.get("busbw")
        shown = f"{busbw:.2f} GB/s" if busbw is not None else f"none ({r.get('error')})"
        wrong = r.get("wrong")
        lines.append(f"- {name}: busbw {shown}, {'unchecked' if wrong is None else wrong} wrong"
                     + _wait_split(r))
    copy_bw = copy.get("bandwidth") if copy else None
    lines.append(f"- d2d copy: {copy_bw:.2f} GB/s" if copy_bw else "- d2d copy: not measured")
    ucx = (at.get("ucx") or {}).get("busbw")
    gloo = next((r.get("busbw") for name, r in at.items() if name.startswith("gloo")), None)
    if ucx and gloo:
        ratio = ucx / gloo
        met = "met" if ratio >= GLOO_TARGET else "NOT met"
        lines.append(f"- ucx / Gloo: {ratio:.1f}x (target {GLOO_TARGET:g}x: {met})")
    if ucx and copy_bw:
        ratio = ucx / copy_bw
        met = "met" if ratio >= COPY_TARGET else "NOT met"
        lines.append(f"- ucx / d2d copy: {ratio:.2f}x (target {COPY_TARGET:g}x: {met})")
    return lines


def mps_gain(plain: Path, under_mps: Path) -> list[str]:
    """ucx's busbw under MPS over ucx's without, at the largest size both ran."""
    a, b = _ucx_busbw(plain), _ucx_busbw(under_mps)
    if a is None or b is None or a[0] != b[0] or a[1] <= 0:
        return []
    return [f"- ucx under MPS / without, at {a[0] / (1 << 20):g} MiB: {b[1] / a[1]:.1f}x "
            f"({a[1]:.2f} -> {b[1]:.2f} GB/s)"]


def smoke(out: Path) -> list[str]:
    path = out / "smoke.log"
    if not path.exists():
        return ["(no smoke.log)"]
    text = path.read_text(errors="replace").splitlines()
    wanted = ("wait() blocked the host", "busbw", "gpu_smoke:")
    picked = [line.strip() for line in text if any(w in line for w in wanted)]
    return [f"    {line}" for line in picked] or ["(the smoke printed no timing or verdict)"]


def timeline(out: Path) -> list[str]:
    """The timeline step's headlines from session.log: each run's setting, rank 0's latency per
    size, both ranks' waits per op and the contention probe (the device timelines stay in
    session.log)."""
    path = out / "session.log"
    if not path.exists():
        return ["(no session.log)"]
    text = path.read_text(errors="replace").splitlines()
    try:
        begin = next(i for i, line in enumerate(text) if line.startswith("== timeline (cap"))
    except StopIteration:
        return ["(the timeline step did not run)"]
    starts = ("-- timeline ", "size ", "[rank 0] size", "[rank 1] size")
    contains = ("contention probe", "still running after")
    picked = []
    for line in text[begin + 1 :]:
        if line.startswith("== timeline:"):
            break
        if line.startswith(starts) or any(c in line for c in contains):
            picked.append(f"    {line.strip()}")
    return picked or ["(the timeline printed no timing)"]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = Path(argv[1])
    dirs = [out, *(Path(d) for d in argv[2:])]
    plain, under_mps = out / "bench.json", find("bench_mps.json", dirs)
    sections = [
        ("Steps", steps(out)),
        ("tests/gpu", tests(out)),
        ("Bench (issue #20's table)", bench(plain)),
        ("Bench under MPS (bench --mps)", bench(under_mps) + mps_gain(plain, under_mps)),
        ("Smoke: busbw and wait()'s host block per cuda_wait mode", smoke(out)),
        ("Timeline: latency and waits per op, per setting (docs/cuda.md)", timeline(out)),
    ]
    for title, lines in sections:
        print(f"## {title}\n")
        print("\n".join(lines))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
