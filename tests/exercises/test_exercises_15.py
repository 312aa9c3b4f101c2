"""Lesson 15's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import math

import numpy as np
import pytest

from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson15 import check_goodput, check_heal, check_quorum
from allreduce_edu.training.elastic import Lighthouse, LighthouseClient, Quorum, alive, quorum
from allreduce_edu.training.elastic.chaos import Kill
from allreduce_edu.viz.elastic import restart_path


# --- 15.1: quorum rules, each wrong in one way ------------------------------------------------
def _rule(members_of, majority, new_id):
    def my_quorum(heartbeats, previous, min_replicas, joined, now, heartbeat_timeout):
        healthy = alive(heartbeats, now, heartbeat_timeout)
        members = members_of(healthy, joined, heartbeats)
        if len(members) < max(min_replicas, 1) or not majority(members, healthy, heartbeats):
            return None
        return new_id(previous, members)
    return my_quorum


def sorted_live(healthy, joined, heartbeats):
    return tuple(sorted(healthy & set(joined)))


def strict(members, healthy, heartbeats):
    return 2 * len(members) > len(healthy)


def keep_or_next(previous, members):
    if previous is not None and previous.members == members:
        return previous
    return Quorum((previous.quorum_id if previous else 0) + 1, members)


WRONG_RULES = {
    "half is enough": (_rule(sorted_live, lambda m, h, b: 2 * len(m) >= len(h), keep_or_next),
                       "split brain"),
    "no majority at all": (_rule(sorted_live, lambda m, h, b: True, keep_or_next), "split brain"),
    "the dead still count": (_rule(sorted_live, lambda m, h, b: 2 * len(m) > len(b),
                                   keep_or_next), "The dead (r1) no longer count"),
    "dead replicas kept": (_rule(lambda h, j, b: tuple(sorted(j)), strict, keep_or_next),
                           "is dead"),
    "not sorted": (_rule(lambda h, j, b: tuple(r for r in j if r in h), strict, keep_or_next),
                   "not sorted"),
    "a list of members": (_rule(lambda h, j, b: sorted(h & set(j)), strict,
                                lambda p, m: Quorum(1, m)), "make them a tuple"),
    "every quorum is new": (_rule(sorted_live, strict,
                                  lambda p, m: Quorum((p.quorum_id if p else 0) + 1, m)),
                            "keeps its id"),
    "the id never changes": (_rule(sorted_live, strict,
                                   lambda p, m: Quorum(p.quorum_id if p else 1, m)),
                             "the members changed"),
    "the first quorum is 0": (_rule(sorted_live, strict,
                                    lambda p, m: p if p and p.members == m else
                                    Quorum(p.quorum_id + 1 if p else 0, m)), "number 1"),
}


def test_the_reference_quorum_rule_passes():
    feedback = check_quorum(reference("15.1"))
    assert feedback, feedback
    assert "never both form a quorum" in feedback.message


@pytest.mark.parametrize("name", sorted(WRONG_RULES))
def test_a_wrong_quorum_rule_fails_with_its_own_message(name):
    fn, words = WRONG_RULES[name]
    feedback = check_quorum(fn)
    assert not feedback and feedback.attempted
    assert words in feedback.message, feedback.message


def test_min_replicas_ignored_is_named():
    def my_quorum(heartbeats, previous, min_replicas, joined, now, heartbeat_timeout):
        return quorum(heartbeats, previous, 1, joined, now, heartbeat_timeout)
    feedback = check_quorum(my_quorum)
    assert not feedback and "min_replicas is 2" in feedback.message, feedback.message


def test_a_rule_that_raises_or_returns_junk_is_told_so():
    def raises(heartbeats, previous, min_replicas, joined, now, heartbeat_timeout):
        return max(heartbeats.values())
    feedback = check_quorum(raises)
    assert not feedback and "raised ValueError" in feedback.message

    def junk(heartbeats, previous, min_replicas, joined, now, heartbeat_timeout):
        return sorted(joined)
    assert "return Quorum(quorum_id, members)" in check_quorum(junk).message


def test_the_counterexample_is_the_smallest():
    fn, _ = WRONG_RULES["half is enough"]
    assert "with 2 replicas heartbeating (r0, r1)" in check_quorum(fn).message


def test_the_lighthouse_forms_quorums_with_the_rule_it_is_given():
    calls = []

    def spy(*args):
        calls.append(args)
        return quorum(*args)

    with Lighthouse(min_replicas=1, heartbeat_timeout=1.0, rule=spy) as lighthouse:
        client = LighthouseClient(lighthouse.address, lighthouse.token, "r0")
        client.call("Heartbeat", 5.0)
        reply = client.call("Quorum", 5.0, step=0)
        client.close()
    assert reply == {"quorum_id": 1, "members": [["r0", 0]]}
    assert calls and all(isinstance(c[0], dict) for c in calls)


# --- 15.2 ------------------------------------------------------------------------------------
def _heal(plan_of=None, zero=True, divide=None):
    """The solution, except for one piece."""
    def my_heal(steps, grads):
        top = max(steps.values())
        sources = sorted(r for r, s in steps.items() if s == top)
        behind = sorted(r for r, s in steps.items() if s < top)
        plan = (plan_of or (lambda b, s, st: {d: s[i % len(s)] for i, d in enumerate(b)}))(
            behind, sources, steps)
        contributions = {r: np.zeros_like(g) if zero and r in behind else g
                         for r, g in grads.items()}
        return plan, contributions, (divide or (lambda s, st: len(s)))(sources, steps)
    return my_heal


WRONG_HEALS = {
    "the stale gradient goes in": (_heal(zero=False), "yet it contributes its own gradient"),
    "divided by the world size": (_heal(divide=lambda s, st: len(st)),
                                  "every rank of the quorum"),
    "one sender for all": (_heal(plan_of=lambda b, s, st: dict.fromkeys(b, s[0])),
                           "take the sources in turn"),
    "copies from a rank behind": (_heal(plan_of=lambda b, s, st: {d: (d + 1) % len(st)
                                                                  for d in b}),
                                  "behind too"),
    "up-to-date ranks in the plan": (_heal(plan_of=lambda b, s, st: {r: s[0] for r in st}),
                                     "copies from no one"),
    "nobody heals": (_heal(plan_of=lambda b, s, st: {}), "must copy an up-to-date rank"),
}


def test_the_reference_heal_passes():
    assert check_heal(reference("15.2"))


@pytest.mark.parametrize("name", sorted(WRONG_HEALS))
def test_a_wrong_heal_fails_with_its_own_message(name):
    fn, words = WRONG_HEALS[name]
    feedback = check_heal(fn)
    assert not feedback and words in feedback.message, feedback.message


def test_a_heal_that_returns_one_thing_is_told_the_shape():
    feedback = check_heal(lambda steps, grads: {})
    assert not feedback and "return (plan, contributions, participants)" in feedback.message


# --- 15.3 ------------------------------------------------------------------------------------
MTBF, C, R = 4 * 3600, 60, 300
TAU = math.sqrt(2 * C * MTBF)
RIGHT = 1 - C / TAU - (R + TAU / 2) / MTBF


def test_the_goodput_passes_and_says_why():
    feedback = check_goodput(RIGHT, MTBF, C, R)
    assert feedback and "0.888" in feedback.message


@pytest.mark.parametrize("answer, words", [
    (TAU, "interval τ (step 1)"),
    (1 - RIGHT, "share lost"),
    (100 * RIGHT, "percentage"),
    (1 - C / TAU - TAU / (2 * MTBF), "left out the restart"),
    (1 - C / TAU - (R + TAU) / MTBF, "halfway"),
    (1 - (R + TAU / 2) / MTBF, "C/τ of the time"),
    (1 - C / math.sqrt(C * MTBF) - (R + math.sqrt(C * MTBF) / 2) / MTBF, "with the 2"),
    (0.5, "off by"),
    ("0.888", "answer with a number"),
])
def test_a_wrong_goodput_is_told_its_slip(answer, words):
    feedback = check_goodput(answer, MTBF, C, R)
    assert not feedback and words in feedback.message, feedback.message


def test_the_restart_path_counts_the_runs_redone_steps():
    kills = [Kill(14, 2, "allreduce"), Kill(19, 1, "forward"), Kill(28, 0, "forward")]
    path = restart_path(50, kills, 10)
    assert len(path) == 71 and path[-1] == 49  # 50 + (14 - 10) + (19 - 10) + (28 - 20)
    assert list(path[14:18]) == [10, 11, 12, 13]
