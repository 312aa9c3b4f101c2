"""One replica of the chaos run: a process that trains lesson 08's MLP under a Manager, and
SIGKILLs itself where its schedule says (forward, all-reduce, commit) — a real death, at a
known phase. Started by elastic.chaos; a spare waits for "go" before it joins.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import numpy as np

from ...collectives import allreduce
from ...runtime.osfacts import die_now
from ...runtime.worker import become_rank
from ..data_parallel import MLP, global_batch, loss_and_grads, make_dataset, sgd_step, unbucket
from .manager import Manager, state_digest

PHASES = ("forward", "allreduce", "commit")  # where a random schedule kills
HEAL = "heal"  # a replacement's death as its healed state arrives (only scheduled by hand)


@dataclass
class ReplicaStart:
    """What a replica process is told at spawn; `go` (over `conn`) tells it its id, slot, kills."""

    conn: object  # its end of the pipe to the runner
    lighthouse: str
    token: str
    replicas: int  # the full world: how the global batch is cut into slots
    steps: int
    seed: int = 0
    lr: float = 0.1
    batch: int = 64
    compute_seconds: float = 0.0  # a forward pass as long as a bigger model's (time.sleep)
    algorithm: str = "ring"
    timeout: float = 2.0
    heartbeat_interval: float = 0.05


class _DieMidAllreduce:
    """The communicator, except that this process is SIGKILLed before its `after`+1-th send."""

    def __init__(self, comm, after: int, dying):
        self._comm, self._left, self._dying = comm, after, dying

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _count(self) -> None:
        if self._left <= 0:
            self._dying()
        self._left -= 1

    def isend(self, *args, **kwargs):
        self._count()
        return self._comm.isend(*args, **kwargs)

    def send(self, *args, **kwargs):
        self._count()
        return self._comm.send(*args, **kwargs)

    def sendrecv(self, *args, **kwargs):
        self._count()
        return self._comm.sendrecv(*args, **kwargs)


def main(start: ReplicaStart) -> None:
    """Wait for go, then train until `steps` are committed, the runner says stop, or death."""
    conn = start.conn
    conn.send(("ready", os.getpid()))
    kind, body = conn.recv()
    if kind != "go":
        return
    replica_id, slot, kills, fresh = body
    become_rank(slot, start.replicas, os.getppid(), f"elastic replica {replica_id}")
    X, y = make_dataset(seed=start.seed)
    # a replacement starts from weights of its own: it must heal to train with the others
    params = MLP(seed=start.seed + (1 + slot if fresh else 0)).params
    state = {"params": params}

    def load(arrays):
        if due(HEAL):
            dying(HEAL)
        state["params"] = [np.array(a) for a in arrays]

    manager = Manager(replica_id, start.lighthouse, start.token, lambda: state["params"], load,
                      algorithm=start.algorithm, timeout=start.timeout,
                      heartbeat_interval=start.heartbeat_interval)
    kill = kills[0] if kills else None
    conn.send(("joined", replica_id))
    if conn.recv()[0] != "begin":  # the first replicas begin together: one first quorum
        return

    def dying(phase: str):
        conn.send(("dying", (replica_id, manager.step, phase, time.monotonic(), manager.ports)))
        die_now()  # SIGKILL (Windows: TerminateProcess)

    def due(phase: str) -> bool:
        return kill is not None and kill[1] == phase and manager.step >= kill[0]

    try:
        while manager.step < start.steps and not conn.poll():
            manager.start_quorum()
            if due("forward"):
                dying("forward")
            idx = np.array_split(global_batch(manager.step, len(y), start.batch, start.seed),
                                 start.replicas)[slot]  # this slot's shard of the global batch
            loss, grads = loss_and_grads(state["params"], X[idx], y[idx])
            time.sleep(start.compute_seconds)
            flat = np.concatenate([g.ravel() for g in grads])
            if due("allreduce"):  # SIGKILLed after its first message of the all-reduce
                manager.algorithm = functools.partial(_dying_sum, algorithm=manager.algorithm,
                                                      dying=functools.partial(dying, "allreduce"))
            avg = manager.allreduce(flat)
            if due("commit"):
                dying("commit")
            committed = manager.should_commit()
            if committed:
                state["params"] = sgd_step(state["params"], unbucket([avg], grads), start.lr)
            conn.send(("step", {
                "replica_id": replica_id, "slot": slot, "step": manager.step,
                "committed": committed, "quorum_id": manager.quorum_id,
                "members": list(manager.members), "participants": manager.num_participants,
                "healing": manager.healing, "healed_from": manager.healed_from,
                "loss": loss, "digest": state_digest(state["params"]).tobytes().hex()[:16],
                "errors": [f"{type(e).__name__}: {e}"[:200] for e in manager.errors],
                "ports": list(manager.ports), "t": time.monotonic()}))
    finally:
        manager.close()
        conn.send(("done", (replica_id, manager.ports)))


def _dying_sum(comm, x, algorithm, dying):
    """The sum all-reduce over a communicator that kills this process after one message."""
    comm = _DieMidAllreduce(comm, 1, dying)
    return algorithm(comm, x) if callable(algorithm) else allreduce(comm, x, algorithm=algorithm)
