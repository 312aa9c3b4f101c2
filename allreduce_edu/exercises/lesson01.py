"""Lesson 01 · ranks and messages: predict with α and β, then write a ping-pong on real ranks."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import choice

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
    hints=('Branch on comm.rank: rank 0 does one half, rank 1 the other. Rank 0 starts with '
           'comm.send(1, np.arange(5), tag="ping").',
           'Rank 1 waits for that message with x = comm.recv(0, tag="ping") — the same tag — and '
           'sends 2 * x back to rank 0 with a tag of its own, say "pong".',
           'The key idea: a message arrives only where a recv names its sender and its tag. Rank 0'
           ' must end by receiving from rank 1, with exactly the tag rank 1 used for its answer.'),
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


check_small_message_answer = choice(
    "01.3", "small messages on a faster network", module=__name__,
    checker="check_small_message_answer",
    question="On this laptop an 8-byte and a 4 KiB message take about the same time. On an "
             "InfiniBand cluster with α = 2 µs and 1/β = 25 GB/s, how do they compare?",
    options={
        "a": "4 KiB takes far longer there: a fast link makes α negligible for any message.",
        "b": "about the same again: there α/β is 50 KB, and 4 KiB is far below it.",
        "c": "both take no measurable time: at 25 GB/s messages under 1 MiB are free.",
        "d": "8 bytes takes longer: small messages wait to be batched with others.",
    },
    right="b",
    slips={
        "a": "α fell from about 0.3 ms to 2 µs, but β fell too. Compare the two terms of "
             "α + n·β at n = 4096: 2 µs against 4096 / 25e9 s.",
        "c": "a message still pays α, the fixed cost, before its first byte moves: 2 µs is "
             "small but it is most of what a 4 KiB message costs there.",
        "d": "the α-β model has no batching: each message costs α + n·β on its own. Which "
             "term is larger at 8 bytes, and at 4 KiB?",
    },
    why="the bytes cost as much as the fixed part at n = α/β = 2e-6 × 25e9 = 50 KB (here about "
        "0.3 ms × 1.5 GB/s ≈ 450 KB). Below that size every message costs about α, on any "
        "network: small messages are latency-bound, and batching them is the cure.",
    hints=("Write t(n) = α + n·β for both sizes on the cluster and compare the two terms.",
           "The size where the two terms are equal is n = α/β. Work it out for the cluster; is "
           "4 KiB below or above it?"))
