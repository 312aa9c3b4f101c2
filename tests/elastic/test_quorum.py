"""The quorum rule and the heal plan: properties that must hold for any heartbeats."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from allreduce_edu.training.elastic import Quorum, heal_plan, quorum

NOW, TIMEOUT = 100.0, 1.0
IDS = st.lists(st.sampled_from([f"r{i}" for i in range(9)]), unique=True, max_size=9)


def fresh(ids) -> dict[str, float]:
    return {r: NOW - 0.5 for r in ids}  # every one heartbeat half a timeout ago


@given(IDS, st.data(), st.integers(1, 5))
def test_two_disjoint_halves_never_both_form_a_quorum(ids, data, min_replicas):
    split = data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
    a = [r for r, left in zip(ids, split, strict=True) if left]
    b = [r for r, left in zip(ids, split, strict=True) if not left]
    beats = fresh(ids)
    previous = data.draw(st.none() | st.just(Quorum(3, tuple(sorted(ids)))))
    formed = [quorum(beats, previous, min_replicas, half, NOW, TIMEOUT) for half in (a, b)]
    assert None in formed, f"both {a} and {b} formed a quorum"


@given(IDS.filter(lambda ids: len(ids) >= 1), st.integers(0, 50))
def test_an_unchanged_membership_keeps_its_id(ids, quorum_id):
    previous = Quorum(quorum_id, tuple(sorted(ids)))
    again = quorum(fresh(ids), previous, 1, ids, NOW, TIMEOUT)
    assert again == previous


@given(IDS, st.data())
def test_a_changed_membership_gets_the_next_id(ids, data):
    joined = data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    previous = Quorum(7, ("someone-else",))
    q = quorum(fresh(ids), previous, 1, joined, NOW, TIMEOUT)
    if q is not None:
        assert q.quorum_id == 8 and q.members == tuple(sorted(joined))


@given(IDS, st.data())
def test_a_lost_majority_forms_none(ids, data):
    joined = data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else []
    if 2 * len(joined) <= len(ids):  # the replicas that asked are no majority of the living
        assert quorum(fresh(ids), Quorum(1, tuple(sorted(ids))), 1, joined, NOW, TIMEOUT) is None


@given(IDS, st.integers(1, 9))
def test_min_replicas_and_dead_heartbeats(ids, min_replicas):
    beats = {r: NOW - (0.5 if i % 2 else 2.0) for i, r in enumerate(ids)}  # even ones are dead
    q = quorum(beats, None, min_replicas, ids, NOW, TIMEOUT)
    living = sorted(r for i, r in enumerate(ids) if i % 2)
    if q is None:
        assert len(living) < min_replicas or not living
    else:
        assert q.members == tuple(living) and len(q.members) >= min_replicas


def test_the_first_quorum_is_number_one_and_sorted():
    assert quorum(fresh(["b", "a"]), None, 2, ["b", "a"], NOW, TIMEOUT) == Quorum(1, ("a", "b"))


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_heal_plan_sends_to_every_rank_behind_from_one_up_to_date(steps):
    by_rank = dict(enumerate(steps))
    plan = heal_plan(by_rank)
    top = max(steps)
    assert set(plan) == {r for r, s in by_rank.items() if s < top}
    assert all(by_rank[src] == top for src in plan.values())
    senders = [src for src in plan.values()]
    assert max(map(senders.count, set(senders)), default=0) <= -(-len(plan) // steps.count(top))
