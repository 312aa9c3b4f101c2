"""The quorum rule and the heal decision: pure functions the Lighthouse and the Manager call.

torchft's Lighthouse (meta-pytorch/torchft, src/lighthouse.rs) forms a quorum every step from the
replicas that asked for one and still heartbeat. It needs `min_replicas` of them, and more than
half of every replica heartbeating: two disjoint groups can never both have that, so no two
quorums train side by side (no split brain). An unchanged membership keeps its quorum id (a fast
quorum: the replicas keep their communicator); a changed one gets the next id, and its members
build a fresh communicator among themselves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Quorum:
    """The replicas that train the next step together; rank r is `members[r]` (sorted ids)."""

    quorum_id: int
    members: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return len(self.members)


def alive(heartbeats: Mapping[str, float], now: float, heartbeat_timeout: float) -> set[str]:
    """The replicas whose last heartbeat (a time.monotonic() reading) is younger than the
    timeout."""
    return {r for r, seen in heartbeats.items() if now - seen < heartbeat_timeout}


def quorum(heartbeats: Mapping[str, float], previous: Quorum | None, min_replicas: int,
           joined: Collection[str], now: float, heartbeat_timeout: float) -> Quorum | None:
    """The quorum of the replicas in `joined` that heartbeat, or None when there is none.

    None when fewer than `min_replicas` joined, or when those that joined are not more than half
    of the replicas heartbeating (a majority stays away: it may be forming its own). The previous
    quorum (id and all) when its members are exactly the new ones; else the next id.
    """
    healthy = alive(heartbeats, now, heartbeat_timeout)
    members = tuple(sorted(healthy & set(joined)))
    if len(members) < max(min_replicas, 1) or 2 * len(members) <= len(healthy):
        return None
    if previous is not None and previous.members == members:
        return previous  # fast quorum: same world, same communicator
    return Quorum((previous.quorum_id if previous else 0) + 1, members)


def heal_plan(steps: Mapping[int, int]) -> dict[int, int]:
    """Which up-to-date rank sends its state to each rank behind `max_step`: {dst: src}.

    `steps` is every member's committed step by rank. The ranks behind are served by the
    up-to-date ones in turn (so one sender does not carry every transfer); a rank being healed
    contributes zero gradients that step, and the all-reduce divides by the up-to-date count.
    """
    top = max(steps.values())
    sources = sorted(r for r, s in steps.items() if s == top)
    behind = sorted(r for r, s in steps.items() if s < top)
    return {dst: sources[i % len(sources)] for i, dst in enumerate(behind)}
