"""Lesson 01 · ranks and messages: predict with α and β, then write a ping-pong on real ranks."""

from __future__ import annotations

import numpy as np

from ..comm.errors import CollectiveTimeout
from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import REQUIRED, Blank, Slip, choice, number
from .texts import message

# a laptop's raw gRPC transport, typically (lessons 00-02 quote this pair; 01 measures your own)
TYPICAL_ALPHA, TYPICAL_BETA = 0.5e-3, 1 / 1e9  # 0.5 ms per message, 1 GB/s



number("01.1", module=__name__,
       blanks=(Blank("my_seconds", key="64 * (alpha + (1 << 20) * beta)"),),
       inputs={"alpha": REQUIRED, "beta": REQUIRED, "messages": 64, "nbytes": 1 << 20},
       call="alpha, beta", unit="seconds",
       answer=lambda d: d.messages * (d.alpha + d.nbytes * d.beta),
       slips=lambda d: [
        Slip(d.alpha + d.messages * d.nbytes * d.beta, "one-message-64"),
        Slip(d.alpha + d.nbytes * d.beta, "one-message"),
        Slip(1e3 * d.messages * (d.alpha + d.nbytes * d.beta),
             "looks-like-milliseconds"),
        Slip(d.messages * d.alpha, "alphas-alone"),
        Slip(d.alpha, "alone-every-message"),
        Slip(d.messages * d.nbytes / d.beta, "check-units-seconds"),
    ],
       otherwise=lambda d, name, got: message(
           __name__, "01.1", "one-message-costs",
           factor=got / (d.messages * (d.alpha + d.nbytes * d.beta))),
       values=lambda d: {"ms": d.messages * (d.alpha + d.nbytes * d.beta) * 1e3,
                         "extra": d.messages - 1, "extra_ms": (d.messages - 1) * d.alpha * 1e3})


@exercise("01.2", kind="code", function="echo_doubled", library=("bench.allreduce:latency",),
          imports="")
def check_echo(fn) -> Feedback:
    """Exercise 01.2: rank 0 sends np.arange(5) to rank 1, which sends back twice it (gRPC)."""
    with Cluster(2, timeout=5) as cluster:
        results, failure = run_on_ranks(cluster, fn)
        if failure:
            e = failure.error
            hint = (message(__name__, "01.2", "do-both-ranks")
                    if isinstance(e, CollectiveTimeout) else "")
            rank = "" if failure.rank is None else f" on {failure.on}"
            return failed(f"your function raised {type(e).__name__}{rank}: {e}{hint}")
        tags = {(ev.src, ev.dst) for ev in cluster.trace.events}
    if (0, 1) not in tags:
        return failed(message(__name__, "01.2", "rank-0-never"))
    if (1, 0) not in tags:
        return failed(message(__name__, "01.2", "rank-1-never"))
    got = None if results[0] is None else np.asarray(results[0]).tolist()
    if got == list(range(5)):
        return failed(message(__name__, "01.2", "rank-0-got"))
    if got != [0, 2, 4, 6, 8]:
        return failed(message(__name__, "01.2", "rank-0-returned", got=got))
    return passed(message(__name__, "01.2", "two-messages-crossed"))


def _laptop(alpha: float, beta: float, yours: bool) -> str:
    """α/β on the laptop: the learner's measured pair, or the typical one."""
    whose = "on your laptop it is" if yours else "on a laptop it is typically"
    return (f"{whose} {alpha * 1e3:.2f} ms × {1 / beta / 1e9:.2f} GB/s ≈ "
            f"{alpha / beta / 1024:,.0f} KiB")


_TYPICAL = _laptop(TYPICAL_ALPHA, TYPICAL_BETA, yours=False)
_TYPICAL_ALPHA_TEXT = f"a laptop's typical {TYPICAL_ALPHA * 1e3:.1f} ms"

_small_message_spec = choice("01.3", module=__name__,
                             values={"typical": _TYPICAL, "typical_alpha": _TYPICAL_ALPHA_TEXT})
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
