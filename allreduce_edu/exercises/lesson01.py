"""Lesson 01 · ranks and messages: predict with α and β, then write a ping-pong on real ranks."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, multiple_choice, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's

ECHO_SOLUTION = """def echo_doubled(comm):
    if comm.rank != 0:                         # rank 1: receive, and send back twice it
        x = comm.recv(0, tag="ping")
        comm.send(0, 2 * x, tag="pong")
        return x
    comm.send(1, np.arange(5), tag="ping")     # rank 0: send, then wait for the answer
    return comm.recv(1, tag="pong")"""


@exercise(
    "01.1", "predict one 64 MiB message", kind="number",
    todo="replace None with the seconds one 64 MiB message takes by the α-β model (from your "
         "alpha and beta), then run this cell again.",
    hints=("This lesson's model prices one message of n bytes at t(n) = α + n·β, and the cells "
           "above left your α and β in the variables alpha and beta (seconds, and seconds per "
           "byte).",
           "64 MiB is 64 × 2^20 = 67108864 bytes, 64 << 20 in Python. β is seconds per byte, so "
           "the bytes cost n·β seconds; add the fixed α once."),
    solution="""The model says t(n) = α + n·β. With n = 64 MiB = 67108864 bytes:
    predicted = alpha + 67108864 * beta      # seconds
For α ≈ 0.3 ms and 1/β ≈ 1.5 GB/s that is about 0.0003 + 0.045 = 0.045 s: bandwidth dominates.""",
    key="""from allreduce_edu.exercises.lesson01 import check_prediction, hint, solution

my_seconds = alpha + (64 << 20) * beta   # t(n) = α + n·β with n = 64 MiB
check_prediction(my_seconds, alpha, beta)""")
def check_prediction(seconds: float, alpha: float, beta: float, nbytes: int = 64 << 20) -> Feedback:
    """Exercise 01.1: the α-β model's time for one message of `nbytes`, from your fitted α and β."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return failed("answer with a number of seconds (a number, or an expression using alpha "
                      "and beta).")
    expected = alpha + nbytes * beta
    if not np.isfinite(seconds) or seconds <= 0:
        return failed("a time must be a positive number of seconds.")
    if abs(seconds - expected) <= 0.05 * expected:
        return passed(f"{seconds * 1e3:.1f} ms: α is {alpha / expected:.1%} of it, n·β the rest — "
                      f"bandwidth-bound.")
    if abs(seconds - expected * 1e3) <= 0.05 * expected * 1e3:
        return failed("that looks like milliseconds: the checker wants seconds.")
    if abs(seconds - alpha) <= 0.05 * alpha:
        return failed("that is α alone: add the time to push the bytes through, n·β.")
    if (abs(seconds - nbytes / beta) <= 0.05 * nbytes / beta
            or abs(seconds - beta * nbytes / 1e9) < 0.05 * expected):
        return failed("check your units: β is seconds per byte, so the bytes term is n·β "
                      "(a multiplication).")
    return failed(f"the model says α + n·β with n = {nbytes} bytes; you are off by a factor "
                  f"{seconds / expected:.2f}.")


@exercise(
    "01.2", "write a ping-pong", kind="code", function="echo_doubled", solution=ECHO_SOLUTION,
    explanation="Rank 1 returns what it received; the checker looks at rank 0's result, and at "
                "the two messages in the trace.",
    hints=("Branch on comm.rank: rank 0 does one half, rank 1 the other. Rank 0 starts with "
           'comm.send(1, np.arange(5), tag="ping").',
           'Rank 1 waits for that message with x = comm.recv(0, tag="ping") — the same tag — and '
           'sends 2 * x back to rank 0 with a tag of its own, say "pong".',
           'Rank 0 ends with return comm.recv(1, tag="pong"): it receives from rank 1, with the '
           "tag rank 1 used."),
    key="""from allreduce_edu.exercises.lesson01 import check_echo

""" + ECHO_SOLUTION + """

check_echo(echo_doubled)""")
def check_echo(fn) -> Feedback:
    """Exercise 01.2: rank 0 sends np.arange(5) to rank 1, which sends back twice it (gRPC)."""
    with Cluster(2, timeout=5) as cluster:
        try:
            results = cluster.run(fn)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            deadline = "deadline" in str(e)
            hint = " Do both ranks use the same tag for each message?" if deadline else ""
            return failed(f"your function raised {type(e).__name__}: {e}{hint}")
        tags = {(ev.src, ev.dst) for ev in cluster.trace.events}
    if (0, 1) not in tags:
        return failed("rank 0 never sent anything to rank 1: use comm.send(1, np.arange(5), "
                      "tag=...).")
    if (1, 0) not in tags:
        return failed("rank 1 never answered: after comm.recv(0, ...), send 2 * x back to "
                      "rank 0.")
    got = None if results[0] is None else np.asarray(results[0]).tolist()
    if got == list(range(5)):
        return failed("rank 0 got [0, 1, 2, 3, 4] back: rank 1 must send 2 * x, not x.")
    if got != [0, 2, 4, 6, 8]:
        return failed(f"rank 0 returned {got}; it should return what rank 1 sent back: "
                      f"[0, 2, 4, 6, 8].")
    return passed("two messages crossed the wire: 40 bytes each way (5 int64), and rank 0 holds "
                  "[0, 2, 4, 6, 8].")


@exercise(
    "01.3", "why small messages cost the same", kind="choice",
    hints=("Both messages take about the same few hundred µs. Which term of t(n) = α + n·β does "
           "not depend on n at all?",
           "Work out the bytes' share for 4 KiB with your numbers: 4096 * beta is a few µs. What "
           "is the rest of the time?"),
    solution="""b: at 8 bytes and at 4 KiB almost all of the time is α, the fixed cost of one
message (the gRPC call path, thread hand-offs, the kernel's loopback). The bytes themselves,
n·β, add only a few µs at 4 KiB: nothing you can see next to α.""",
    key="""from allreduce_edu.exercises.lesson01 import check_small_message_answer

my_choice = "b"   # the fixed cost of every message, α, dominates small ones
check_small_message_answer(my_choice)""")
def check_small_message_answer(choice: str) -> Feedback:
    """Exercise 01.3: why does an 8-byte message take as long as a 4 KiB one? (a, b or c)"""
    answers = {
        "a": ("no: 4 KiB at ~1 GB/s takes about 4 µs, far below the hundreds of µs you measured. "
              "Look at the y-intercept."),
        "b": "",
        "c": "no: the data is copied once or twice, but copying 4 KiB takes about a microsecond.",
    }
    success = ("the fixed per-message cost α dominates small messages; bandwidth only matters "
               "once n·β approaches α (here around tens to hundreds of KiB).")
    return multiple_choice(choice, answers, right="b", success=success)
