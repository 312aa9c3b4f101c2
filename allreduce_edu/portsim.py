"""Per-rank programs of sends and receives, run on one full-duplex port per rank exactly as the
emulated links (comm.links) run them: the model of algorithms whose ranks keep several messages
in flight, such as the pipelined double binary tree. Introduced in lessons/16.

A program is each rank's operations in the order it issues them:

    ("send", dst, key, nbytes)    isend: holds the rank until the bytes have left its port
    ("recv", src, key, reduced)   waits until message `key` has arrived, then reduces `reduced`
                                  bytes (γ per byte)

Every key is sent once and received once. Ports are booked first come, first served in time order,
as comm.links.Ports books them; a message's time on each port and its arrival follow its Link
(store and forward: α + n·β on both ports; in flight: n·β on each, arriving α later).
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
            link = link_of(r, dst)
            hold = link.port_seconds(nbytes)
            latency = link.alpha if link.in_flight else 0.0
            start = _start(t, egress[r], ingress, dst, link)
            egress[r] = start + hold
            ingress[dst] = arrived[key] = start + hold + latency
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

        starts = {k: _start(t, egress[r], ingress, messages[k][1], link_of(r, messages[k][1]))
                  for k in ready}
        key = min(ready, key=starts.get)  # the first that can start; ties: in key order
        start = starts[key]
        todo[r].remove(key)
        _, dst, nbytes, _ = messages[key]
        link = link_of(r, dst)
        latency = link.alpha if link.in_flight else 0.0
        egress[r] = clock[r] = start + link.port_seconds(nbytes)
        ingress[dst] = arrival = egress[r] + latency
        programs[r].append(("send", dst, key, nbytes))
        heapq.heappush(inbox[dst], (arrival, key))
        heapq.heappush(events, (arrival, dst))
        heapq.heappush(events, (clock[r], r))
    if any(todo):
        raise ValueError("some messages can never be sent: their inputs never arrive")
    return programs


def _start(now: float, egress: float, ingress: list, dst: int, link) -> float:
    """The first moment a message to `dst` finds both ports free (in flight: the receiver's port
    is needed α later)."""
    return max(now, egress, ingress[dst] - (link.alpha if link.in_flight else 0.0))
