"""The kernel's TCP both ways at once across the namespace rig, from and into buffers of a
tensor's size: what two opposite iperf3 transfers measure, but with every byte sent from and
received into a buffer of ``--buffer`` bytes (64 MiB: larger than the 32 MiB L3 here, like the
all_reduce's tensor) instead of iperf3's 128 KiB, which stays in cache. It tells how much of
the gap between a 64 MB all_reduce and iperf3 (scripts/rig_plain_allreduce.py --iperf) the
tensor's memory itself costs the kernel.

Usage (root, iproute2; iperf3 for the reference row)::

    python scripts/rig_tensor_tcp.py [--rounds 2] [--seconds 5] [--buffer 67108864]

Per round it prints iperf3's two directions, then the same transfer from Python with 128 KiB
and with ``--buffer`` buffers (one process per sender and per receiver, 512 KiB per system
call): each direction's rate in GB/s and the CPU seconds of its sender and receiver per GB.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns_rig import NetnsRig
from rig_plain_allreduce import iperf_both_ways

CALL_BYTES = 512 << 10  # what the backend's UCX moves per system call over TCP
HOSTS = ("a", "b")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _serve(addr: str, port: int, size: int) -> None:
    """Receives one connection's bytes into a `size`-byte buffer, round and round; prints
    bytes and CPU seconds."""
    with socket.create_server((addr, port)) as listener:
        conn, _ = listener.accept()
    view = memoryview(bytearray(size))
    total = at = 0
    start = _cpu()
    while n := conn.recv_into(view[at : at + min(CALL_BYTES, size - at)]):
        total += n
        at = (at + n) % size
    print(json.dumps({"bytes": total, "cpu": _cpu() - start}), flush=True)


def _send(addr: str, port: int, size: int, seconds: float) -> None:
    """Sends from a `size`-byte buffer, round and round, for `seconds`; prints CPU seconds."""
    conn = socket.create_connection((addr, port))
    view = memoryview(bytearray(b"\x01" * size))
    at = 0
    start, deadline = _cpu(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        at = (at + conn.send(view[at : at + min(CALL_BYTES, size - at)])) % size
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the receiver has read everything once it closes
    print(json.dumps({"cpu": _cpu() - start, "seconds": seconds}), flush=True)


def _both_ways(rig: NetnsRig, port: int, size: int, seconds: float) -> list[str]:
    me = str(Path(__file__).resolve())
    servers = [
        rig.popen(
            h,
            [sys.executable, me, "--serve", rig.addr(h), str(port), str(size)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for h in HOSTS
    ]
    time.sleep(0.7)  # the servers listen
    senders = [
        rig.popen(
            src,
            [sys.executable, me, "--send", rig.addr(dst), str(port), str(size), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for src, dst in (HOSTS, HOSTS[::-1])
    ]
    sent = [json.loads(p.communicate(timeout=seconds + 60)[0]) for p in senders]
    got = [json.loads(p.communicate(timeout=60)[0]) for p in servers]
    rows = []
    for direction in range(2):  # a->b is received on b
        rx, tx = got[1 - direction], sent[direction]
        gb = rx["bytes"] / 1e9
        rows.append(f"{gb / tx['seconds']:.2f} GB/s ({(rx['cpu'] + tx['cpu']) / gb:.2f} s/GB)")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--buffer", type=int, default=64 << 20)
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--send", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]), int(args.serve[2]))
        return 0
    if args.send:
        _send(args.send[0], int(args.send[1]), int(args.send[2]), float(args.send[3]))
        return 0
    port = random.randrange(40000, 60000)
    with NetnsRig.create() as rig:
        print(f"# rig {rig.ns_a}={rig.addr_a} {rig.ns_b}={rig.addr_b}; a->b, b->a", flush=True)
        for rnd in range(1, args.rounds + 1):
            port += 1
            iperf = iperf_both_ways(rig, int(args.seconds), port)
            rows = [f"{gbs:.2f} GB/s ({cpu:.2f} s/GB)" for gbs, cpu in iperf]
            print(f"round {rnd} iperf3 (128 KiB): {rows}", flush=True)
            for size in (128 << 10, args.buffer):
                port += 1
                rows = _both_ways(rig, port, size, args.seconds)
                print(f"round {rnd} python {size >> 10} KiB: {rows}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
