"""Lesson 01 · ranks and messages: predict with α and β, then write a ping-pong on real ranks."""

from __future__ import annotations

import numpy as np

from ..comm.errors import CollectiveTimeout
from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import REQUIRED, Blank, Slip, choice, number

# a laptop's raw gRPC transport, typically (lessons 00-02 quote this pair; 01 measures your own)
TYPICAL_ALPHA, TYPICAL_BETA = 0.5e-3, 1 / 1e9  # 0.5 ms per message, 1 GB/s

ECHO_SOLUTION = """def echo_doubled(comm):
    if comm.rank != 0:                         # rank 1: receive, and send back twice it
        x = comm.recv(0, tag="ping")
        comm.send(0, 2 * x, tag="pong")
        return x
    comm.send(1, np.arange(5), tag="ping")     # rank 0: send, then wait for the answer
    return comm.recv(1, tag="pong")"""


check_prediction = number(
    "01.1", "predict 64 messages of 1 MiB", module=__name__, checker="check_prediction",
    question="Using your `alpha` and `beta`, how many **seconds** does it take to send 64 MiB as "
             "64 messages of 1 MiB each, one after another? (Then compare it with one 64 MiB "
             "message.)",
    blanks=(Blank("my_seconds", "seconds: a number, or an expression with alpha and beta",
                  "64 * (alpha + (1 << 20) * beta)"),),
    inputs={"alpha": REQUIRED, "beta": REQUIRED, "messages": 64, "nbytes": 1 << 20},
    call="alpha, beta", unit="seconds",
    answer=lambda d: d.messages * (d.alpha + d.nbytes * d.beta),
    slips=lambda d: [
        Slip(d.alpha + d.messages * d.nbytes * d.beta, "that is one message of 64 MiB: α once. "
             "Here each of the 64 messages pays its own α."),
        Slip(d.alpha + d.nbytes * d.beta, "that is one message of 1 MiB; there are 64 of them, "
             "one after another."),
        Slip(1e3 * d.messages * (d.alpha + d.nbytes * d.beta),
             "that looks like milliseconds: the checker wants seconds."),
        Slip(d.messages * d.alpha, "that is the 64 α's alone: add the time to push the bytes "
             "through, n·β per message."),
        Slip(d.alpha, "that is α alone: every message also pays n·β, and there are 64 of them."),
        Slip(d.messages * d.nbytes / d.beta, "check your units: β is seconds per byte, so the "
             "bytes term is n·β (a multiplication)."),
    ],
    otherwise=lambda d, name, got: f"one message costs α + n·β; you are off by a factor "
                                   f"{got / (d.messages * (d.alpha + d.nbytes * d.beta)):.2f}.",
    success=lambda d: f"{d.messages * (d.alpha + d.nbytes * d.beta) * 1e3:.1f} ms: the bytes cost "
                      f"the same as in one 64 MiB message, plus {d.messages - 1} more α "
                      f"({(d.messages - 1) * d.alpha * 1e3:.1f} ms) — the price of cutting a "
                      f"message into pieces.",
    hints=("This lesson's model prices one message of n bytes at t(n) = α + n·β, and the cells "
           "above left your α and β in the variables alpha and beta (seconds, and seconds per "
           "byte).",
           "Price one 1 MiB message first (1 MiB = 1 << 20 bytes), then count how many of them "
           "go, one after another."),
    solution="""Each 1 MiB message costs α + n·β with n = 1 MiB = 1048576 bytes, and 64 of them go
one after another:
    predicted = 64 * (alpha + 1048576 * beta)      # seconds
The bytes cost the same as one 64 MiB message (α + 64 MiB·β); the pieces add 63 more α. For
a laptop's typical α ≈ 0.5 ms and 1/β ≈ 1 GB/s that is 0.032 s of α beside 0.067 s of bytes.""")


@exercise(
    "01.2", "write a ping-pong", kind="code", function="echo_doubled", solution=ECHO_SOLUTION,
    library=("bench.allreduce:latency",),
    explanation="Rank 1 returns what it received; the checker looks at rank 0's result, and at "
                "the two messages in the trace.",
    hints=("The same function runs on both ranks, but they play different parts, as in the "
           "picture: rank 0 starts the exchange, rank 1 answers. Your rank tells you which part "
           "you play.",
           "Rank 0 sends the five numbers 0 … 4 to rank 1, then waits for the answer. Rank 1 "
           "receives from rank 0, doubles what it got and sends that back. Every message "
           "carries a tag: give the question one tag and the answer another.",
           "A receive names both the sender and the tag. Rank 1's receive must use the tag rank 0 "
           "sent with; rank 0's receive the tag rank 1 answers with. Rank 0 returns what comes "
           "back.",
           'The key idea: a message arrives only where a recv names its sender and its tag. Rank 0'
           ' must end by receiving from rank 1, with exactly the tag rank 1 used for its answer.'),
    key="""from allreduce_edu.exercises.lesson01 import check_echo

""" + ECHO_SOLUTION + """

check_echo(echo_doubled)""")
def check_echo(fn) -> Feedback:
    """Exercise 01.2: rank 0 sends np.arange(5) to rank 1, which sends back twice it (gRPC)."""
    with Cluster(2, timeout=5) as cluster:
        results, failure = run_on_ranks(cluster, fn)
        if failure:
            e = failure.error
            hint = (" Do both ranks use the same tag for each message?"
                    if isinstance(e, CollectiveTimeout) else "")
            rank = "" if failure.rank is None else f" on {failure.on}"
            return failed(f"your function raised {type(e).__name__}{rank}: {e}{hint}")
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


def _laptop(alpha: float, beta: float, yours: bool) -> str:
    """α/β on the laptop: the learner's measured pair, or the typical one."""
    whose = "on your laptop it is" if yours else "on a laptop it is typically"
    return (f"{whose} {alpha * 1e3:.2f} ms × {1 / beta / 1e9:.2f} GB/s ≈ "
            f"{alpha / beta / 1024:,.0f} KiB")


_TYPICAL = _laptop(TYPICAL_ALPHA, TYPICAL_BETA, yours=False)
_TYPICAL_ALPHA_TEXT = f"a laptop's typical {TYPICAL_ALPHA * 1e3:.1f} ms"

_small_message_spec = choice(
    "01.3", "small messages on a faster network", module=__name__,
    checker="check_small_message_answer",
    question="On this laptop an 8-byte and a 4 KiB message take about the same time. On an "
             "InfiniBand cluster with α = 2 µs and 1/β = 25 GB/s, how do they compare?",
    options={
        "a": "4 KiB takes about twice as long: its bytes cost there about as much as α.",
        "b": "about the same again: there α/β is about 49 KiB, far above 4 KiB.",
        "c": "both are as good as free: 4 KiB crosses a 25 GB/s link in 0.16 µs.",
        "d": "8 bytes takes longer: messages this small wait about 2 µs to be batched.",
    },
    right="b",
    slips={
        "a": f"α fell from {_TYPICAL_ALPHA_TEXT} to 2 µs, but β fell too. Compare the two terms "
             f"of α + n·β at n = 4096: 2 µs against 4096 / 25e9 s, about a tenth of it.",
        "c": "a message still pays α, the fixed cost, before its first byte moves: 2 µs is "
             "small but it is most of what a 4 KiB message costs there.",
        "d": "the α-β model has no batching: each message costs α + n·β on its own. Which "
             "term is larger at 8 bytes, and at 4 KiB?",
    },
    why=f"the bytes cost as much as the fixed part at n = α/β = 2e-6 × 25e9 = 50,000 bytes "
        f"≈ 49 KiB "
        f"({_TYPICAL}). Below that size every message costs about α, on any network: small "
        f"messages are latency-bound, and batching them is the cure.",
    hints=("Write t(n) = α + n·β for both sizes on the cluster and compare the two terms.",
           "The size where the two terms are equal is n = α/β. Work it out for the cluster; is "
           "4 KiB below or above it?"))
# the cell passes the alpha and beta it measured, as 01.1's does (spec.choice has no `call=`)
_small_message_spec.exercise.spec.cell.call = "alpha, beta"
_small_message_spec.exercise.key = _small_message_spec.exercise.spec.cell.key.strip("\n")


def check_small_message_answer(choice, alpha: float | None = None,
                               beta: float | None = None) -> Feedback:
    """Exercise 01.3, its feedback in your measured alpha and beta (the typical pair without)."""
    feedback = _small_message_spec(choice)
    if alpha is None or beta is None or feedback.status not in ("passed", "failed"):
        return feedback
    mine = (feedback.message.replace(_TYPICAL, _laptop(alpha, beta, yours=True))
            .replace(_TYPICAL_ALPHA_TEXT, f"your {alpha * 1e3:.2f} ms"))
    return Feedback(feedback.passed, mine, feedback.status)


check_small_message_answer.exercise = _small_message_spec.exercise
check_small_message_answer.demo = _small_message_spec.demo
