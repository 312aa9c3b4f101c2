"""The chaos run: replicas train under a Lighthouse while a seeded schedule SIGKILLs one at a
phase (forward, all-reduce, commit), and a spare replaces it at the next quorum.

The spares are started with the others and wait (hot spares, as a scheduler keeps them), so a
replacement costs its quorum and its healing, not an interpreter's start. The result holds what
the lesson plots and what the tests check: every step's records, the quorums, the deaths.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.connection
import time
from dataclasses import dataclass, field

import numpy as np

from ...runtime.processes import GUARD_HINT
from .lighthouse import Lighthouse
from .quorum import quorum
from .replica import PHASES, ReplicaStart, main


@dataclass(frozen=True)
class Kill:
    """The replica in `slot` SIGKILLs itself at `phase` of the first step >= `step` (one slot's
    kills fire in schedule order: the second kills its replacement)."""

    step: int
    slot: int
    phase: str


def chaos_schedule(steps: int = 50, replicas: int = 4, failures: int = 3,
                   seed: int = 0) -> list[Kill]:
    """`failures` kills, one in each of equal windows between step 5 and steps - 10."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(5, max(steps - 10, 6), failures + 1).astype(int)
    return [Kill(int(rng.integers(lo, max(hi, lo + 1))), int(rng.integers(replicas)),
                 PHASES[int(rng.integers(len(PHASES)))])
            for lo, hi in itertools.pairwise(edges)]


@dataclass
class ChaosResult:
    """What happened: every replica's step records, the deaths, the quorums, the wall time."""

    steps: int
    min_replicas: int
    heartbeat_timeout: float
    schedule: list[Kill]
    records: list[dict] = field(default_factory=list)  # one per replica per step (replica.py)
    deaths: list[tuple] = field(default_factory=list)  # (replica_id, step, phase, t)
    quorums: list[tuple] = field(default_factory=list)  # (t, quorum_id, members), as formed
    ports: list[int] = field(default_factory=list)  # every port a replica or Lighthouse used
    wall_seconds: float = 0.0
    t0: float = 0.0

    def committed(self) -> dict[int, list[dict]]:
        """Step -> the records of the replicas that committed it."""
        out: dict[int, list[dict]] = {}
        for r in self.records:
            if r["committed"]:
                out.setdefault(r["step"], []).append(r)
        return dict(sorted(out.items()))

    @property
    def committed_steps(self) -> int:
        return max(self.committed(), default=0)

    @property
    def goodput(self) -> float:
        """Useful (committed) steps per second of wall time."""
        return self.committed_steps / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def mtbf_seconds(self) -> float:
        """Mean time between failures, as this run saw them (inf without any)."""
        return self.wall_seconds / len(self.deaths) if self.deaths else float("inf")

    def loss_curve(self) -> np.ndarray:
        """The loss of each committed step: the mean over the replicas that computed it."""
        return np.array([np.mean([r["loss"] for r in rs if not r["healing"]])
                         for rs in self.committed().values()])


def run_chaos(steps: int = 50, replicas: int = 4, failures: int = 3, seed: int = 0,
              min_replicas: int = 2, heartbeat_timeout: float = 0.3,
              compute_seconds: float = 0.01, algorithm: str = "ring", timeout: float = 60.0,
              schedule: list[Kill] | None = None, quorum_rule=quorum) -> ChaosResult:
    """Train `replicas` replicas for `steps` committed steps through `schedule`'s kills (default:
    chaos_schedule(steps, replicas, failures, seed)), the Lighthouse forming quorums by
    `quorum_rule` (quorum.quorum's signature); every process ends before this returns."""
    schedule = chaos_schedule(steps, replicas, failures, seed) if schedule is None else schedule
    result = ChaosResult(steps, min_replicas, heartbeat_timeout, list(schedule))
    ctx = multiprocessing.get_context("spawn")  # never fork: gRPC's threads are not fork-safe
    with Lighthouse(min_replicas, heartbeat_timeout, rule=quorum_rule) as lighthouse:
        result.ports.append(int(lighthouse.address.rpartition(":")[2]))
        procs, conns = [], []
        try:
            for i in range(replicas + len(schedule)):  # the replicas, then a spare per kill
                parent_end, child_end = ctx.Pipe()
                start = ReplicaStart(child_end, lighthouse.address, lighthouse.token, replicas,
                                     steps, seed, compute_seconds=compute_seconds,
                                     algorithm=algorithm)
                proc = ctx.Process(target=main, args=(start,), daemon=True,
                                   name=f"allreduce-edu-replica-{i}")
                proc.start()
                child_end.close()
                procs.append(proc)
                conns.append(parent_end)
            _run(result, procs, conns, replicas, timeout)
        finally:
            _stop(procs, conns)
        result.quorums = [(t, q.quorum_id, q.members) for t, q in lighthouse.history]
    return result


def _run(result: ChaosResult, procs, conns, replicas: int, timeout: float) -> None:
    """Start the replicas, replace each that dies with a spare, until every active one ended."""
    deadline = time.monotonic() + timeout
    for i, conn in enumerate(conns):  # every process has imported what it needs
        try:
            if not conn.poll(max(deadline - time.monotonic(), 0)):
                raise TimeoutError(f"replica process {i} did not start within {timeout:g} s")
            conn.recv()
        except EOFError:
            raise RuntimeError(f"replica process {i} exited while starting (exit code "
                               f"{procs[i].exitcode}). " + GUARD_HINT) from None
    pending = list(result.schedule)  # kills not yet fired

    def go(i: int, slot: int, fresh: bool) -> None:
        kills = [(k.step, k.phase) for k in pending if k.slot == slot]
        conns[i].send(("go", (f"replica-{i}", slot, kills, fresh)))

    for i in range(replicas):
        go(i, i, fresh=False)
    for i in range(replicas):  # each has heartbeat once: the first quorum has them all
        _expect(conns[i], "joined", deadline)
    result.t0 = time.monotonic()
    for i in range(replicas):
        conns[i].send(("begin", None))
    active, slot_of, spares = set(range(replicas)), {i: i for i in range(replicas)}, replicas
    finished = 0.0  # when the last step was committed
    while active and time.monotonic() < deadline:
        ready = multiprocessing.connection.wait([conns[i] for i in active]
                                                + [procs[i].sentinel for i in active], 0.1)
        for i in sorted(active):
            alive = procs[i].is_alive()  # before reading: what it sent before exiting counts
            if conns[i] in ready or not alive:
                _read(result, conns[i], pending, slot_of[i])
            if alive:
                continue
            active.discard(i)
            if procs[i].exitcode != 0 and not finished and spares < len(procs):
                slot_of[spares] = slot_of[i]  # a spare takes the dead replica's slot
                go(spares, slot_of[i], fresh=True)
                _expect(conns[spares], "joined", deadline)
                conns[spares].send(("begin", None))
                active.add(spares)
                spares += 1
        finished = finished or _last_step(result)
        if finished:  # the last step is committed: those behind stop too (or are stopped)
            for i in active:
                _send(conns[i], ("stop", None))
                if time.monotonic() - finished > 1.0:
                    procs[i].kill()
    result.wall_seconds = time.monotonic() - result.t0
    if active:
        raise TimeoutError(f"the chaos run did not end within {timeout:g} s")


def _expect(conn, kind: str, deadline: float) -> None:
    """Wait for one message of `kind` from a replica that has not begun yet."""
    if not conn.poll(max(deadline - time.monotonic(), 0)) or conn.recv()[0] != kind:
        raise RuntimeError(f"a replica did not report {kind!r} in time")


def _read(result: ChaosResult, conn, pending: list[Kill], slot: int) -> None:
    """Take every message waiting from one replica into `result`."""
    while True:
        try:
            if not conn.poll():
                return
            kind, body = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "step":
            result.records.append(body)
            result.ports.extend(body["ports"])
        elif kind == "dying":
            result.deaths.append(body[:4])
            result.ports.extend(body[4])
            pending.remove(next(k for k in pending if k.slot == slot))
        elif kind == "done":
            result.ports.extend(body[1])


def _last_step(result: ChaosResult) -> float:
    """When the last step was committed (0.0: not yet)."""
    return next((r["t"] for r in result.records
                 if r["committed"] and r["step"] >= result.steps), 0.0)


def _send(conn, item) -> None:
    try:
        conn.send(item)
    except (OSError, ValueError):
        pass  # it is gone


def _stop(procs, conns) -> None:
    """End every replica process (the spares never started: tell them to close)."""
    for conn in conns:
        _send(conn, ("close", None))
    deadline = time.monotonic() + 5.0
    for proc in procs:
        proc.join(max(deadline - time.monotonic(), 0.1))
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)
    for conn in conns:
        conn.close()
