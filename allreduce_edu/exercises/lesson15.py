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
from .texts import message

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
    return passed(message(__name__, "15.1", "count-memberships-up", count=len(results),
                          max_replicas=max_replicas, pairs=pairs,
                          two=max_replicas + 1))


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
    return passed(message(__name__, "15.2", "on-all-seven"))


def _heal_problem(steps: dict, grads: dict, got) -> str:
    """What is wrong with one answer ("" if nothing)."""
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return message(__name__, "15.2", "returned-got-r", got=got)
    plan, contributions, participants = got
    top = max(steps.values())
    sources = [r for r, s in steps.items() if s == top]
    behind = [r for r, s in steps.items() if s < top]
    if not isinstance(plan, dict):
        return message(__name__, "15.2", "plan-name-make", name=type(plan).__name__)
    for r in behind:
        if r not in plan:
            return (message(__name__, "15.2", "rank-r-at", r=r, steps=steps[r], top=top))
    for dst, src in plan.items():
        if dst not in behind:
            return message(__name__, "15.2", "rank-dst-at", dst=dst, top=top)
        if src not in sources:
            at = f"at step {steps[src]}, behind too" if src in steps else "not in the quorum"
            return (message(__name__, "15.2", "rank-dst-would", dst=dst, src=src, at=at, top=top,
                            listed=', '.join(map(str, sources))))
    cap = -(-len(behind) // len(sources))
    busiest, sends = Counter(plan.values()).most_common(1)[0] if plan else (None, 0)
    if sends > cap:
        return (message(__name__, "15.2", "rank-busiest-sends", busiest=busiest, sends=sends,
                        cap=cap))
    if not isinstance(contributions, dict) or set(contributions) != set(steps):
        return (message(__name__, "15.2", "contributions-must-be"))
    for r, g in grads.items():
        c = np.asarray(contributions[r])
        if r in behind and not (c.shape == g.shape and np.all(c == 0)):
            what = "its own gradient" if np.array_equal(c, g) else "something other than zeros"
            return (message(__name__, "15.2", "rank-r-healing", r=r, what=what))
        if r in sources and not np.array_equal(c, g):
            return message(__name__, "15.2", "rank-r-up", r=r)
    if participants != len(sources):
        if participants == len(steps):
            return (message(__name__, "15.2", "divide-sum-by", count=len(steps),
                            count2=len(sources)))
        return (message(__name__, "15.2", "participants-participants-r", participants=participants,
                        count=len(sources)))
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
        Slip(tau, "interval-only"),
        Slip(tau / 60, "interval-in-minutes"),
        Slip(1 - want, "share-lost-question"),
        Slip(100 * want, "looks-like-percentage"),
        Slip(1 - c / tau - tau / (2 * mtbf), "left-out-restart"),
        Slip(_useful(mtbf, c, r, tau, lost=1.0), "failure-strikes-on"),
        Slip(1 - (r + tau / 2) / mtbf, "writing-checkpoint-every"),
        Slip(_useful(mtbf, c, r, math.sqrt(c * mtbf)), "young-daly-interval"),
        Slip(1 - tau / (2 * mtbf), "counts-only-redone"),
    ]


def _goodput_success(d) -> str:
    tau, lost = _tau(d), d.restart + _tau(d) / 2
    return (message(__name__, "15.3", "goodput-3f-steps", goodput=_goodput(d), tau=tau,
                    checkpointing=d.checkpoint / tau, lost=lost, failures=lost / d.mtbf))


number("15.3", module=__name__,
       blanks=(Blank("my_goodput", key="1 - C / (2 * C * mtbf) ** 0.5 "
                                       "- (R + (2 * C * mtbf) ** 0.5 / 2) / mtbf"),),
       inputs={"mtbf": 4 * 3600, "checkpoint": 60, "restart": 300},
       setup="mtbf, C, R = 4 * 3600, 60, 300   "
             "# seconds: between failures, a checkpoint, a restart",
       call="mtbf, C, R", unit="useful steps per second", tolerance=0.003, answer=_goodput,
       slips=_goodput_slips, success=_goodput_success,
       otherwise=lambda d, name, got: (message(__name__, "15.3", "off-by",
                                               gap=got - _goodput(d))))
