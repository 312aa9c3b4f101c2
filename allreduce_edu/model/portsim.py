"""Per-rank programs of sends and receives, run on one full-duplex port per rank exactly as the
emulated links (links.py) run them: the model of algorithms whose ranks keep several messages
in flight, such as the pipelined double binary tree. Introduced in lessons/16.

A program is each rank's operations in the order it issues them:

    ("send", dst, key, nbytes)    isend: holds the rank until the bytes have left its port
    ("recv", src, key, reduced)   waits until message `key` has arrived, then reduces `reduced`
                                  bytes (γ per byte)

Every key is sent once and received once. Ports are booked first come, first served in time order,
as links.Ports books them; a message's time on each port and its arrival follow its Link
(store and forward: α + n·β on both ports at once; in flight: n·β on each, the receiver's from α
later or when it is free, whichever is later).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


def run(programs, link_of: Callable, gamma: float = 0.0) -> float:
    """Seconds from the start until the last rank has done its last operation;
    `link_of(src, dst)` is the Link a message crosses."""
    n = len(programs)
    egress, ingress, clock, done = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    arrived: dict = {}  # key -> when the message is whole at its receiver
    parked: dict = {}  # key -> the rank waiting for it
    ready = [(0.0, r) for r in range(n)]
    while ready:
        t, r = heapq.heappop(ready)
        if done[r] == len(programs[r]):
            continue
        op = programs[r][done[r]]
        if op[0] == "send":
            _, dst, key, nbytes = op
            egress[r], ingress[dst] = _book(t, egress[r], ingress[dst], link_of(r, dst), nbytes)
            arrived[key] = ingress[dst]
            if key in parked:
                waiter = parked.pop(key)
                heapq.heappush(ready, (max(clock[waiter], arrived[key]), waiter))
            clock[r] = egress[r]
        else:
            _, src, key, reduced = op
            if key not in arrived:
                clock[r], parked[key] = t, r
                continue
            clock[r] = max(t, arrived[key]) + reduced * gamma
        done[r] += 1
        heapq.heappush(ready, (clock[r], r))
    stuck = [r for r in range(n) if done[r] < len(programs[r])]
    if stuck:
        raise ValueError(f"ranks {stuck} wait for messages no rank sends: the programs deadlock")
    return max(clock, default=0.0)


def greedy(ranks: int, messages: dict, needs: dict, link_of: Callable) -> list[list[tuple]]:
    """Programs (as `run` reads them) in which every rank, whenever its port is free, takes in what
    has arrived and sends the first message whose inputs it has: `messages` maps a key to
    (src, dst, nbytes, reduced), `needs` a key to the keys its sender must have received first.

    The programs are a schedule that really happens on these links, so a rank following its
    program never waits for a rank that waits for it (each receive follows its send in time).
    """
    programs: list[list[tuple]] = [[] for _ in range(ranks)]
    todo = [sorted(k for k, m in messages.items() if m[0] == r) for r in range(ranks)]
    have: list[set] = [set() for _ in range(ranks)]
    inbox: list[list] = [[] for _ in range(ranks)]  # (arrival, key) heaps
    egress, ingress, clock = [0.0] * ranks, [0.0] * ranks, [0.0] * ranks
    events = [(0.0, r) for r in range(ranks)]
    while events:
        t, r = heapq.heappop(events)
        if t < clock[r]:
            continue  # busy sending: it acts at clock[r]
        while inbox[r] and inbox[r][0][0] <= t:
            _, key = heapq.heappop(inbox[r])
            src, _, _, reduced = messages[key]
            programs[r].append(("recv", src, key, reduced))
            have[r].add(key)
        ready = [k for k in todo[r] if needs.get(k, set()) <= have[r]]
        if not ready:
            continue  # idle until the next arrival wakes it

        booked = {k: _book(t, egress[r], ingress[messages[k][1]], link_of(r, messages[k][1]),
                           messages[k][2]) for k in ready}
        key = min(ready, key=lambda k: booked[k][::-1])  # the first to arrive; ties: key order
        todo[r].remove(key)
        _, dst, nbytes, _ = messages[key]
        egress[r], ingress[dst] = clock[r], arrival = booked[key]
        programs[r].append(("send", dst, key, nbytes))
        heapq.heappush(inbox[dst], (arrival, key))
        heapq.heappush(events, (arrival, dst))
        heapq.heappush(events, (clock[r], r))
    if any(todo):
        raise ValueError("some messages can never be sent: their inputs never arrive")
    return programs


def _book(now: float, egress: float, ingress: float, link, nbytes) -> tuple[float, float]:
    """(when the sender's port is free again, when the message has arrived), as links.Ports
    books them: store and forward holds both ports at once; in flight the sender's port sends
    at once and the receiver's takes the bytes in when they arrive and it is free."""
    hold = link.port_seconds(nbytes)
    if not link.in_flight:
        start = max(now, egress, ingress)
        return start + hold, start + hold
    start = max(now, egress)
    return start + hold, max(start + link.alpha, ingress) + hold
