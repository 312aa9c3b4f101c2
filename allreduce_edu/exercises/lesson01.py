"""Lesson 01 · ranks and messages: predict with α and β, then write a ping-pong on real ranks."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, multiple_choice, passed  # noqa: F401
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - for the notebook

SOLUTIONS: dict[str, str] = {}  # TODO(issue 10): move into @exercise registrations

SOLUTIONS["01.1"] = """The model says t(n) = α + n·β. With n = 64 MiB = 67108864 bytes:
    predicted = alpha + 67108864 * beta      # seconds
For α ≈ 0.3 ms and 1/β ≈ 1.5 GB/s that is about 0.0003 + 0.045 = 0.045 s: bandwidth dominates."""

SOLUTIONS["01.2"] = """def echo_doubled(comm):
    if comm.rank == 0:
        comm.send(1, np.arange(5), tag="ping")
        return comm.recv(1, tag="pong")
    if comm.rank == 1:
        x = comm.recv(0, tag="ping")
        comm.send(0, 2 * x, tag="pong")
        return x"""

SOLUTIONS["01.3"] = """b: at 8 bytes almost all of the time is α, the fixed cost of one message (the gRPC call path,
thread hand-offs, the kernel's loopback), so doubling the bytes changes nothing measurable."""


def check_prediction(seconds: float, alpha: float, beta: float, nbytes: int = 64 << 20) -> Feedback:
    """Exercise 01.1: the α-β model's time for one message of `nbytes`, from your fitted α and β."""
    expected = alpha + nbytes * beta
    if not np.isfinite(seconds) or seconds <= 0:
        return failed("a time must be a positive number of seconds.")
    if abs(seconds - expected) <= 0.05 * expected:
        return passed(f"{seconds * 1e3:.1f} ms: α is {alpha / expected:.1%} of it, n·β the rest — bandwidth-bound.")
    if abs(seconds - expected * 1e3) <= 0.05 * expected * 1e3:
        return failed("that looks like milliseconds: the checker wants seconds.")
    if abs(seconds - alpha) <= 0.05 * alpha:
        return failed("that is α alone: add the time to push the bytes through, n·β.")
    if abs(seconds - nbytes / beta) <= 0.05 * nbytes / beta or abs(seconds - beta * nbytes / 1e9) < 0.05 * expected:
        return failed("check your units: β is seconds per byte, so the bytes term is n·β (a multiplication).")
    return failed(f"the model says α + n·β with n = {nbytes} bytes; you are off by a factor {seconds / expected:.2f}.")


def check_echo(fn) -> Feedback:
    """Exercise 01.2: rank 0 sends np.arange(5) to rank 1, rank 1 sends back twice it; on 2 gRPC ranks."""
    with Cluster(2, timeout=5) as cluster:
        try:
            results = cluster.run(fn)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            hint = " Do both ranks use the same tag for each message?" if "deadline" in str(e) else ""
            return failed(f"your function raised {type(e).__name__}: {e}{hint}")
        tags = {(ev.src, ev.dst) for ev in cluster.trace.events}
    if (0, 1) not in tags:
        return failed("rank 0 never sent anything to rank 1: use comm.send(1, np.arange(5), tag=...).")
    if (1, 0) not in tags:
        return failed("rank 1 never answered: after comm.recv(0, ...), send 2 * x back to rank 0.")
    got = None if results[0] is None else np.asarray(results[0]).tolist()
    if got == list(range(5)):
        return failed("rank 0 got [0, 1, 2, 3, 4] back: rank 1 must send 2 * x, not x.")
    if got != [0, 2, 4, 6, 8]:
        return failed(f"rank 0 returned {got}; it should return what rank 1 sent back: [0, 2, 4, 6, 8].")
    return passed("two messages crossed the wire: 40 bytes each way (5 int64), and rank 0 holds [0, 2, 4, 6, 8].")


def check_small_message_answer(choice: str) -> Feedback:
    """Exercise 01.3: why does an 8-byte message take as long as a 1 KiB one? (a, b or c)"""
    answers = {
        "a": "no: 1 KiB at ~1 GB/s takes about 1 µs, far below what you measured. Look at the y-intercept.",
        "b": "",
        "c": "no: the data is copied once or twice, but copying 1 KiB takes well under a microsecond.",
    }
    success = ("the fixed per-message cost α dominates small messages; bandwidth only matters once "
               "n·β approaches α (here around tens to hundreds of KiB).")
    return multiple_choice(choice, answers, right="b", success=success)
