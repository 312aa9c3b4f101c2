"""The baseline: restart from a checkpoint (torchelastic's model) on the same failure schedule.

Every `checkpoint_every` steps the ranks save their state (rank 0 writes; all wait
`checkpoint_seconds`, the cost C of a real model's checkpoint); a death stops every rank,
`Cluster.restart()` brings up a whole new world, and training resumes from the last checkpoint,
redoing the steps since. Young (1974) and Daly (2006): the interval that loses least is about
sqrt(2·C·MTBF).
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...collectives import allreduce
from ...comm.errors import RankFailure
from ...runtime.cluster import Cluster
from ...runtime.osfacts import die_now
from ..data_parallel import MLP, global_batch, loss_and_grads, make_dataset, sgd_step, unbucket
from .chaos import Kill, chaos_schedule
from .replica import PHASES, _DieMidAllreduce


def young_daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval (seconds) that wastes least: sqrt(2·C·MTBF) (Young 1974, Daly
    2006), for C much smaller than the MTBF."""
    return math.sqrt(2 * checkpoint_seconds * mtbf_seconds)


@dataclass
class RestartResult:
    """What the restart-from-checkpoint run did, on the same schedule as the chaos run."""

    steps: int
    checkpoint_every: int
    wall_seconds: float
    restarts: int
    steps_run: int  # steps computed, counting those redone after a restart
    losses: np.ndarray  # the loss of every step, as finally kept

    @property
    def goodput(self) -> float:
        """Useful steps per second of wall time."""
        return self.steps / self.wall_seconds if self.wall_seconds else 0.0


def run_restart(steps: int = 50, replicas: int = 4, failures: int = 3, seed: int = 0,
                schedule: list[Kill] | None = None, checkpoint_every: int = 10,
                checkpoint_seconds: float = 0.05, compute_seconds: float = 0.01,
                lr: float = 0.1, batch: int = 64) -> RestartResult:
    """Data-parallel training on a Cluster of `replicas` ranks through the schedule's kills,
    each answered by a full restart from the last checkpoint."""
    schedule = chaos_schedule(steps, replicas, failures, seed) if schedule is None else schedule
    # a kill while healing has no counterpart here: nothing heals, everything restarts
    pending = sorted((k for k in schedule if k.phase in PHASES), key=lambda k: k.step)
    with tempfile.TemporaryDirectory(prefix="allreduce-edu-ckpt-") as folder:
        path = Path(folder) / "checkpoint.npz"
        _save(path, 0, MLP(seed=seed).params, [])
        restarts = steps_run = 0
        with Cluster(replicas) as cluster:
            t0 = time.monotonic()
            while True:
                start = int(np.load(path)["step"])
                kill = (pending[0].step, pending[0].slot, pending[0].phase) if pending else None
                try:
                    losses = cluster.run(train_from_checkpoint, str(path), steps, kill,
                                         checkpoint_every, checkpoint_seconds, compute_seconds,
                                         seed, lr, batch)[0]
                    steps_run += steps - start
                    break
                except RankFailure:
                    steps_run += max(pending.pop(0).step - start, 0)
                    restarts += 1
                    cluster.restart()  # a whole new world: every process, every connection
            wall = time.monotonic() - t0
    return RestartResult(steps, checkpoint_every, wall, restarts, steps_run, np.asarray(losses))


def train_from_checkpoint(comm, path: str, steps: int, kill, checkpoint_every: int,
                          checkpoint_seconds: float, compute_seconds: float, seed: int, lr: float,
                          batch: int) -> list[float]:
    """Run on every rank: resume at the checkpoint, train to `steps`, checkpoint on the way;
    SIGKILL this process where `kill` (step, rank, phase) says. Returns every step's loss."""
    saved = np.load(path)
    start, losses = int(saved["step"]), list(saved["losses"])
    params = [saved[f"p{i}"] for i in range(len(saved.files) - 2)]
    X, y = make_dataset(seed=seed)

    def due(step: int, phase: str) -> bool:
        return kill is not None and kill[1] == comm.rank and kill[2] == phase and step >= kill[0]

    for step in range(start, steps):
        if due(step, "forward"):
            die_now()
        idx = np.array_split(global_batch(step, len(y), batch, seed), comm.world_size)[comm.rank]
        loss, grads = loss_and_grads(params, X[idx], y[idx])
        time.sleep(compute_seconds)
        flat = np.concatenate([g.ravel() for g in grads])
        on = _DieMidAllreduce(comm, 1, die_now) if due(step, "allreduce") else comm
        total = allreduce(on, flat, op="sum")
        losses.append(float(allreduce(comm, np.array([loss]), op="sum")[0]) / comm.world_size)
        if due(step, "commit"):
            die_now()
        params = sgd_step(params, unbucket([total / comm.world_size], grads), lr)
        if (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            if comm.rank == 0:
                _save(Path(path), step + 1, params, losses)
            time.sleep(checkpoint_seconds)  # every rank waits for the checkpoint
            comm.barrier()
    return losses


def _save(path: Path, step: int, params: list, losses: list) -> None:
    """Write the checkpoint whole or not at all (a rank killed mid-write leaves the old one)."""
    tmp = path.with_name("next.npz")
    np.savez(tmp, step=step, losses=np.array(losses, dtype=float),
             **{f"p{i}": p for i, p in enumerate(params)})
    tmp.replace(path)
