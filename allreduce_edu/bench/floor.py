"""The mechanism's floor: a bare blocking ping-pong of 8 bytes between two Python processes over
`os.pipe` (lesson 18; `allreduce-edu bench` prints it beside the transport's point-to-point line).

Nothing of the package is on this path: no header, no mailbox, no thread; one `os.write` and one
`os.read` each way. Whatever a transport's 8-byte one-way time adds to this is its own per-message
cost. Windows has no descriptors to pass to a child: there the two ends are a
`multiprocessing` pipe (a named pipe), the nearest bare mechanism it has.

Two more lines split that cost: a symmetric window's put + signal (the shared-memory mechanism,
driven from Python: `window_one_way`) and the Communicator's contract alone (`contract_us`: send
and recv between two thread ranks of one process, no wire and no wait). A transport's send/recv
costs at least the contract, plus its own wire.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from ..comm.transports.local import LocalWorld
from ..comm.window import TRANSPORTS as WINDOW_TRANSPORTS
from ..comm.window import rendezvous

ECHO = """
import os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3:
    os.sched_setaffinity(0, {int(sys.argv[3])})
while True:
    b = os.read(r, 8)
    if not b:
        break
    os.write(w, b)
"""


def _echo_windows(conn):  # pragma: no cover - Windows only
    while True:
        try:
            conn.send_bytes(conn.recv_bytes())
        except EOFError:
            return


def pipe_one_way_us(rounds: int = 1000, warmup: int = 100, tries: int = 3) -> float:
    """The floor: the lowest of `tries` medians of an 8-byte ping-pong over a pipe, one way, in µs
    (half a round trip). Lowest, because the same ping-pong measured 3 µs or 20–30 µs here
    from one run to the next: two processes on one core pay a context switch, on two cores the
    wake-up of an idle (virtual) core as well."""
    return min(_pipe_one_way_us(rounds, warmup) for _ in range(tries))


def pinned_floors(rounds: int = 1000, warmup: int = 100) -> dict | None:
    """The same ping-pong with both processes pinned to one core, then to two different ones:
    {"one core": µs, "two cores": µs}. On one core a message is a hand-over of that core (3 µs
    here); on two, the reader's core has gone idle and must wake (25–35 µs on this virtual
    machine). None where a process cannot be pinned (macOS, Windows) or has one core."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or sys.platform == "win32":
        return None
    return {"one core": _pipe_one_way_us(rounds, warmup, (cpus[0], cpus[0])),
            "two cores": _pipe_one_way_us(rounds, warmup, (cpus[0], cpus[1]))}


def _pipe_one_way_us(rounds: int, warmup: int, cpus: tuple | None = None) -> float:
    if sys.platform == "win32":  # pragma: no cover - no pass_fds on Windows
        return _windows_one_way_us(rounds, warmup)
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    pin = [str(cpus[1])] if cpus else []
    child = subprocess.Popen([sys.executable, "-c", ECHO, str(to_child), str(to_parent), *pin],
                             pass_fds=(to_child, to_parent))
    os.close(to_child)
    os.close(to_parent)
    mine = os.sched_getaffinity(0) if cpus else None
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    times = np.empty(rounds)
    try:
        for i in range(warmup + rounds):
            t = time.perf_counter()
            os.write(from_parent, b"12345678")
            os.read(from_child, 8)
            if i >= warmup:
                times[i - warmup] = time.perf_counter() - t
    finally:
        if mine is not None:
            os.sched_setaffinity(0, mine)
        os.close(from_parent)
        os.close(from_child)
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
    return float(np.median(times)) / 2 * 1e6


def _windows_one_way_us(rounds: int, warmup: int) -> float:  # pragma: no cover - Windows only
    import multiprocessing as mp
    here, there = mp.get_context("spawn").Pipe()
    child = mp.get_context("spawn").Process(target=_echo_windows, args=(there,), daemon=True)
    child.start()
    times = np.empty(rounds)
    try:
        for i in range(warmup + rounds):
            t = time.perf_counter()
            here.send_bytes(b"12345678")
            here.recv_bytes()
            if i >= warmup:
                times[i - warmup] = time.perf_counter() - t
    finally:
        here.close()
        child.join(10)
    return float(np.median(times)) / 2 * 1e6


def contract_us(rounds: int = 2000, warmup: int = 200) -> float:
    """What the Communicator's contract costs one 8-byte message, in µs (a median): `send` then
    `recv` between two thread ranks of one process, on one thread, so nothing crosses a wire and
    nothing waits. What is left is what every transport does for every message: the checks of the
    arguments, the Message and the Request, matching its tag in the mailbox, and the trace's send
    and receive; and, standing in for the wire, one 8-byte copy."""
    world = LocalWorld(2)
    a, b = world.comms
    x, times = np.zeros(8, np.uint8), np.empty(rounds)
    for i in range(warmup + rounds):
        t = time.perf_counter()
        a.send(1, x, "ping")
        b.recv(0, "ping")
        if i >= warmup:
            times[i - warmup] = time.perf_counter() - t
    return float(np.median(times)) * 1e6


def window_one_way(comm, rounds: int = 500, warmup: int = 50) -> float | None:
    """On every rank: the median one-way time, in µs, of an 8-byte put + put_signal ping-pong
    between ranks 0 and 1 on a symmetric window (comm.window); None where there are no windows."""
    if comm.world_size < 2 or getattr(comm, "transport", "") not in WINDOW_TRANSPORTS:
        return None
    window = rendezvous(comm, 64)
    try:
        return _window_pingpong(comm, window, rounds, warmup)
    finally:
        window.close()


def _window_pingpong(comm, window, rounds: int, warmup: int) -> float | None:
    value, times = np.ones(1), np.empty(rounds)
    for i in range(warmup + rounds if comm.rank < 2 else 0):
        t = time.perf_counter()
        if comm.rank == 0:
            window.put(1, value)
            window.put_signal(1)
            window.wait_signal(1)
        else:
            window.wait_signal(0)
            window.put(0, value)
            window.put_signal(0)
        if i >= warmup:
            times[i - warmup] = time.perf_counter() - t
    window.barrier()
    return float(np.median(times)) / 2 * 1e6 if comm.rank == 0 else None
