"""Lesson 15 · training through failures: write the quorum rule (`check_quorum`: a property test
over every membership of up to five replicas and every split of up to six, naming the first
counterexample), the heal decision (`check_heal`: who copies from whom, what a healing rank
contributes, what the sum is divided by), and predict restart-from-checkpoint's goodput
(`check_goodput`: Young/Daly's interval, then the lost work).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ..training.elastic.quorum import Quorum, alive, quorum
from .feedback import Feedback, failed, passed
from .quorum_cases import (
    Case,
    cases,
    id_problem,
    members_problem,
    none_problem,
    refused_problem,
    shape_problem,
    split_problem,
    splits,
)
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, number

# --- 15.1 ------------------------------------------------------------------------------------


class _Raised(Exception):
    """The learner's rule raised on a case: the sentence that says so."""


def _call(fn, case: Case):
    try:
        got = case.call(fn)
    except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
        raise _Raised(f"with {case}, your my_quorum raised {type(e).__name__}: {e}") from None
    problem = shape_problem(got)
    if problem:
        raise _Raised(f"with {case}, {problem}")
    return got


@exercise("15.1", kind="code", function="my_quorum", needs={"alive": alive, "Quorum": Quorum},
          library=("training.elastic.quorum:quorum",),
          before=('from allreduce_edu.training.elastic import Quorum, alive',), gaps=(2, 2))
def check_quorum(fn, max_replicas: int = 5) -> Feedback:
    """Exercise 15.1: `fn` has the properties of quorum.quorum on every small membership."""
    try:
        results = [(case, _call(fn, case), case.call(quorum)) for case in cases(max_replicas)]
        for case, got, want in results:  # forms where it should, with the right members
            if want is not None and got is None:
                return failed(none_problem(case, want))
            if want is not None and got.members != want.members:
                return failed(members_problem(case, got, want))
        pairs = 0
        for a, b in splits(max_replicas + 1):  # no split brain
            qa, qb = _call(fn, a), _call(fn, b)
            pairs += 1
            if qa is not None and qb is not None:
                return failed(split_problem(a, b, qa, qb))
    except _Raised as e:
        return failed(str(e))
    for case, got, want in results:  # a lost majority, or too few, forms none
        if want is None and got is not None:
            return failed(refused_problem(case, got))
    for case, got, want in results:
        if want is not None and got.quorum_id != want.quorum_id:
            return failed(id_problem(case, got, want))
    return passed(f"{len(results):,} memberships of up to {max_replicas} replicas and {pairs:,} "
                  f"splits of up to {max_replicas + 1}: two disjoint groups never both form a "
                  f"quorum, an unchanged membership keeps its id, a lost majority forms none. "
                  f"The chaos run below forms every quorum with your rule.")


# --- 15.2 ------------------------------------------------------------------------------------

HEAL_CASES = (  # each rank's committed step: a replacement, two behind, uneven, ...
    {0: 14, 1: 14, 2: 0, 3: 14},
    {0: 5, 1: 5, 2: 5, 3: 5},
    {0: 7, 1: 3, 2: 7, 3: 3},
    {0: 4, 1: 2, 2: 3},
    {0: 0, 1: 1},
    {0: 9, 1: 9, 2: 9, 3: 2, 4: 0, 5: 9, 6: 1},
    {0: 8, 1: 0, 2: 0, 3: 0, 4: 0},
)


def _grads(steps) -> dict[int, np.ndarray]:
    """Rank r's gradient: (r + 1) · [1, 10, 100] (each rank's own, told apart in any sum)."""
    return {r: (r + 1) * np.array([1.0, 10.0, 100.0]) for r in steps}


@exercise("15.2", kind="code", function="my_heal", library=("training.elastic.quorum:heal_plan",),
          gaps=(2, 2))
def check_heal(fn) -> Feedback:
    """Exercise 15.2: `fn(steps, grads)` -> (plan, contributions, participants) on every case."""
    for steps in HEAL_CASES:
        grads = _grads(steps)
        try:
            got = fn(dict(steps), {r: g.copy() for r, g in grads.items()})
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"with steps = {steps}, your my_heal raised {type(e).__name__}: {e}")
        problem = _heal_problem(steps, grads, got)
        if problem:
            return failed(f"with steps = {steps} (rank: committed step): {problem}")
    return passed("on all seven quorums every rank behind copies an up-to-date peer, the "
                  "transfers spread over the senders, a healing rank adds zeros and the sum is "
                  "divided by the ranks that sent a gradient: every rank takes the same step, "
                  "the up-to-date ranks' average.")


def _heal_problem(steps: dict, grads: dict, got) -> str:
    """What is wrong with one answer ("" if nothing)."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return f"you returned {got!r}: return (plan, contributions, participants)."
    plan, contributions, participants = got
    top = max(steps.values())
    sources = [r for r, s in steps.items() if s == top]
    behind = [r for r, s in steps.items() if s < top]
    if not isinstance(plan, dict):
        return f"plan is a {type(plan).__name__}: make it a dict {{rank behind: source rank}}."
    for r in behind:
        if r not in plan:
            return (f"rank {r} is at step {steps[r]}, behind the quorum's max step {top}: it "
                    f"must copy an up-to-date rank's state first (plan[{r}] = a rank at {top}).")
    for dst, src in plan.items():
        if dst not in behind:
            return f"rank {dst} is at the max step {top}: it is up to date and copies from no one."
        if src not in sources:
            at = f"at step {steps[src]}, behind too" if src in steps else "not in the quorum"
            return (f"rank {dst} would copy from rank {src}, {at}: copy from a rank at the max "
                    f"step {top} (here {', '.join(map(str, sources))}).")
    cap = -(-len(behind) // len(sources))
    busiest, sends = Counter(plan.values()).most_common(1)[0] if plan else (None, 0)
    if sends > cap:
        return (f"rank {busiest} sends its whole state to {sends} ranks while other up-to-date "
                f"ranks send less: take the sources in turn, at most {cap} transfers each.")
    if not isinstance(contributions, dict) or set(contributions) != set(steps):
        return ("contributions must be a dict with an array for every rank of the quorum: every "
                "member joins the all-reduce, or the others wait for it.")
    for r, g in grads.items():
        c = np.asarray(contributions[r])
        if r in behind and not (c.shape == g.shape and np.all(c == 0)):
            what = "its own gradient" if np.array_equal(c, g) else "something other than zeros"
            return (f"rank {r} is healing, yet it contributes {what}: its gradient was computed "
                    f"on the weights it had before the heal (a replacement's fresh ones) and "
                    f"would pull every replica off course. It contributes zeros this step.")
        if r in sources and not np.array_equal(c, g):
            return f"rank {r} is up to date: it contributes its gradient grads[{r}] unchanged."
    if participants != len(sources):
        if participants == len(steps):
            return (f"you divide the sum by {len(steps)}, every rank of the quorum, but only "
                    f"{len(sources)} sent a gradient (the healing ranks sent zeros): the average "
                    f"would be {len(sources)}/{len(steps)} of the true one. Divide by the ranks "
                    f"that contributed (torchft's num_participants).")
        return (f"participants = {participants!r}: the sum holds {len(sources)} real gradients, "
                f"so divide it by {len(sources)}.")
    return ""


# --- 15.3 ------------------------------------------------------------------------------------
def _useful(mtbf: float, c: float, r: float, tau: float, lost: float = 0.5) -> float:
    """Useful share of the time with checkpoints every `tau`: 1 − C/τ − (R + lost·τ)/MTBF."""
    return 1 - c / tau - (r + lost * tau) / mtbf


def _tau(d) -> float:
    """Young/Daly's checkpoint interval √(2·C·MTBF), seconds."""
    return math.sqrt(2 * d.checkpoint * d.mtbf)


def _goodput(d) -> float:
    return _useful(d.mtbf, d.checkpoint, d.restart, _tau(d))


def _goodput_slips(d) -> list[Slip]:
    mtbf, c, r, tau, want = d.mtbf, d.checkpoint, d.restart, _tau(d), _goodput(d)
    return [
        Slip(tau, "that is the interval τ (step 1): now count what it loses, in steps per second."),
        Slip(tau / 60, "that is the interval τ in minutes (step 1): now count what it loses."),
        Slip(1 - want, "that is the share lost: the question asks for the useful steps per "
             "second."),
        Slip(100 * want, "that looks like a percentage: answer in steps per second (at most 1)."),
        Slip(1 - c / tau - tau / (2 * mtbf), "you left out the restart: each failure also costs R "
             "before any step runs again."),
        Slip(_useful(mtbf, c, r, tau, lost=1.0), "a failure strikes on average halfway through an "
             "interval: it loses τ/2 of work, not a whole τ."),
        Slip(1 - (r + tau / 2) / mtbf, "writing a checkpoint every τ seconds costs C each time: "
             "C/τ of the time goes to checkpoints."),
        Slip(_useful(mtbf, c, r, math.sqrt(c * mtbf)), "Young/Daly's interval is √(2·C·MTBF), "
             "with the 2."),
        Slip(1 - tau / (2 * mtbf), "that counts only the redone work: add the checkpoints' C/τ "
             "and the restart R per failure."),
    ]


def _goodput_success(d) -> str:
    tau, lost = _tau(d), d.restart + _tau(d) / 2
    return (f"{_goodput(d):.3f} steps/s: τ = √(2·C·MTBF) = {tau:,.0f} s; checkpoints take "
            f"C/τ = {d.checkpoint / tau:.1%} of the time, and each failure costs R + τ/2 = "
            f"{lost:,.0f} s, {lost / d.mtbf:.1%} of an MTBF. Quorum training pays neither the "
            f"checkpoints nor the redone work: a failure costs it a heal.")


number("15.3", module=__name__,
       blanks=(Blank("my_goodput", key="1 - C / (2 * C * mtbf) ** 0.5 "
                                       "- (R + (2 * C * mtbf) ** 0.5 / 2) / mtbf"),),
       inputs={"mtbf": 4 * 3600, "checkpoint": 60, "restart": 300},
       setup="mtbf, C, R = 4 * 3600, 60, 300   "
             "# seconds: between failures, a checkpoint, a restart",
       call="mtbf, C, R", unit="useful steps per second", tolerance=0.003, answer=_goodput,
       slips=_goodput_slips, success=_goodput_success,
       otherwise=lambda d, name, got: (f"off by {got - _goodput(d):+.3f} steps/s: find τ first, "
                                    f"then subtract the two losses (hint(\"15.3\"))."))
