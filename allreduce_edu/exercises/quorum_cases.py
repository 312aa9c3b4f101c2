"""Exercise 15.1's property test, without hypothesis: every small membership (smallest first),
the properties any quorum rule must have, and the first counterexample said in words."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..training.elastic.quorum import Quorum, quorum

NOW, TIMEOUT = 100.0, 1.0
SEEN = {"alive": NOW - 0.4, "dead": NOW - 2.5}  # heartbeat 0.4 s ago; 2.5 s ago (timeout 1 s)


@dataclass(frozen=True)
class Case:
    """One call of the rule: who heartbeats (alive or dead), who asked, min_replicas, previous."""

    states: tuple[tuple[str, str], ...]  # (replica id, "alive" | "dead")
    joined: tuple[str, ...]  # in reverse order on purpose: members must come back sorted
    min_replicas: int
    previous: Quorum | None

    @property
    def heartbeats(self) -> dict[str, float]:
        return {r: SEEN[state] for r, state in self.states}

    def call(self, fn):
        return fn(self.heartbeats, self.previous, self.min_replicas, list(self.joined), NOW,
                  TIMEOUT)

    def __str__(self) -> str:
        alive = [r for r, s in self.states if s == "alive"]
        dead = [r for r, s in self.states if s == "dead"]
        said = [f"{_names(alive)} heartbeat{'s' if len(alive) == 1 else ''} (0.4 s ago)"
                if alive else "no replica heartbeats"]
        if dead:
            said.append(f"{_names(dead)} {'is' if len(dead) == 1 else 'are'} dead (last "
                        f"heartbeat 2.5 s ago, timeout 1 s)")
        said.append(f"joined = {sorted(self.joined)}")
        said.append(f"min_replicas = {self.min_replicas}, previous = {self.previous}")
        return "; ".join(said)


def _names(ids) -> str:
    return ", ".join(ids) if ids else "none"


def cases(max_replicas: int = 5):
    """Every membership of up to `max_replicas` replicas: each alive or dead, each asked or not,
    three min_replicas and three previous quorums (none, the one that forms, everyone's)."""
    for n in range(max_replicas + 1):
        ids = [f"r{i}" for i in range(n)]
        for kinds in itertools.product(("alive", "dead"), repeat=n):
            for asked in itertools.product((True, False), repeat=n):
                joined = tuple(r for r, a in zip(ids[::-1], asked[::-1], strict=True) if a)
                states = tuple(zip(ids, kinds, strict=True))
                for min_replicas in (1, 2, 3):
                    want = quorum(dict((r, SEEN[s]) for r, s in states), None, min_replicas,
                                  joined, NOW, TIMEOUT)
                    everyone = Quorum(3, tuple(ids)) if ids else None
                    same = Quorum(3, want.members) if want else None
                    for previous in dict.fromkeys((None, same, everyone)):
                        yield Case(states, joined, min_replicas, previous)


def splits(max_replicas: int = 6):
    """Every split of up to `max_replicas` heartbeating replicas into two groups that ask."""
    for n in range(1, max_replicas + 1):
        ids = [f"r{i}" for i in range(n)]
        for left in itertools.product((True, False), repeat=n):
            a = tuple(r for r, x in zip(ids, left, strict=True) if x)
            b = tuple(r for r, x in zip(ids, left, strict=True) if not x)
            for previous in (None, Quorum(3, tuple(ids))):
                states = tuple((r, "alive") for r in ids)
                yield Case(states, a, 1, previous), Case(states, b, 1, previous)


def shape_problem(got) -> str:
    """Why `got` is not a rule's answer ("" when it is None or a well-formed Quorum)."""
    if got is None:
        return ""
    if not isinstance(got, Quorum):
        return (f"your rule returned {got!r}: return Quorum(quorum_id, members) (from "
                f"allreduce_edu.training.elastic) or None.")
    if not isinstance(got.members, tuple):
        return (f"your Quorum's members are a {type(got.members).__name__}: make them a tuple "
                f"(a Quorum is frozen and compared by value, so a list never equals the "
                f"previous quorum's tuple).")
    if isinstance(got.quorum_id, bool) or not isinstance(got.quorum_id, int):
        return f"your Quorum's quorum_id is {got.quorum_id!r}: make it an int."
    return ""


def members_problem(case: Case, got: Quorum, want: Quorum) -> str:
    """Why the learner's members differ from the rule's."""
    alive = {r for r, s in case.states if s == "alive"}
    extra = [r for r in got.members if r not in want.members]
    missing = [r for r in want.members if r not in got.members]
    where = f"with {case}, your quorum's members are {got.members}, want {want.members}: "
    if [r for r in extra if r not in alive]:
        dead = next(r for r in extra if r not in alive)
        return where + (f"{dead}'s last heartbeat is older than the timeout, so it is dead: a "
                        f"quorum has only replicas that heartbeat (alive(heartbeats, now, "
                        f"heartbeat_timeout) gives them).")
    if extra:
        return where + (f"{extra[0]} heartbeats but did not ask for this quorum (it is not in "
                        f"joined): only replicas that asked train this step; it joins the next.")
    if missing:
        return where + f"{missing[0]} heartbeats and asked: it belongs in the quorum."
    return where + ("the right replicas, not sorted: rank r is members[r] on every replica, so "
                    "all of them must see one order: sort the ids.")


def none_problem(case: Case, want: Quorum) -> str:
    """Why a quorum forms where the learner's rule formed none."""
    alive = [r for r, s in case.states if s == "alive"]
    dead = [r for r, s in case.states if s == "dead"]
    why = (f"with {case}, you returned None, but {len(want.members)} of the {len(alive)} "
           f"replicas heartbeating asked — more than half, and at least min_replicas — so "
           f"{want} forms")
    if dead and 2 * len(want.members) <= len(case.states):
        return why + (f". The dead ({_names(dead)}) no longer count: take the majority among "
                      f"the replicas that heartbeat now, or a job that lost half its replicas "
                      f"could never train again.")
    return why + "."


def id_problem(case: Case, got: Quorum, want: Quorum) -> str:
    """Why the learner's quorum id differs (the members are right)."""
    where = f"with {case}, your quorum has id {got.quorum_id}, want {want.quorum_id}: "
    if case.previous is None:
        return where + "the first quorum (previous is None) is number 1."
    if case.previous.members == want.members:
        return where + ("the same members as the previous quorum asked again, so it keeps its "
                        "id: a fast quorum, in which every replica keeps its communicator and "
                        "nothing is re-formed. Return previous itself.")
    return where + (f"the members changed from {case.previous.members}, so the quorum needs the "
                    f"next id, previous.quorum_id + 1: a new id tells every member to build a "
                    f"fresh communicator (the old one has a replica in it that left).")


def refused_problem(case: Case, got: Quorum) -> str:
    """Why no quorum may form where the learner's rule formed one."""
    alive = [r for r, s in case.states if s == "alive"]
    members = [r for r in case.joined if r in alive]
    where = f"with {case}, you formed {got}, but no quorum may form: "
    if len(members) < case.min_replicas:
        return where + (f"only {len(members)} replica(s) that heartbeat asked and min_replicas "
                        f"is {case.min_replicas} (torchft's min_replicas keeps a few survivors "
                        f"from training on alone).")
    if not members:
        return where + "no replica that heartbeats asked: a quorum is never empty."
    return where + (f"{len(members)} of the {len(alive)} replicas heartbeating asked, which is "
                    f"not more than half: the rest may be forming a quorum of their own, and "
                    f"two quorums must never train side by side.")


def split_problem(a: Case, b: Case, qa: Quorum, qb: Quorum) -> str:
    """Split brain: two disjoint groups both formed a quorum."""
    n, small = len(a.states), min(len(a.joined), len(b.joined))
    return (f"split brain: with {n} replicas heartbeating ({_names([r for r, _ in a.states])}), "
            f"previous = {a.previous}, the group {sorted(a.joined)} formed {qa} and the group "
            f"{sorted(b.joined)} formed {qb}: two worlds would train apart, each thinking it is "
            f"the job. A quorum needs more than half of the replicas heartbeating "
            f"({small} of {n} is not more than half).")
