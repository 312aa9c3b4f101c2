"""Data parallel, ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP) with Adam, over any Communicator.
Introduced in lessons/11_sharded_data_parallel.

Each layer's W and b are one flat *unit*, padded to a multiple of N and cut into N equal shards;
rank r owns shard r of every unit.

- dp: every rank holds everything; all-reduce each unit's gradient; every rank runs all of Adam.
- zero1: optimizer state sharded. Reduce-scatter each gradient (rank r gets the sum of shard r),
  update shard r with its own Adam state, all-gather the updated shards into the full weights.
- zero2: gradients sharded too: each layer's gradient is reduce-scattered as soon as backward
  produces it and the full gradient dropped, so no rank ever holds all of them.
- zero3 (FSDP): parameters sharded too: a layer's weights are all-gathered just before forward
  uses them, dropped, and all-gathered again for backward; the update needs no all-gather.

Same arithmetic everywhere — sums in the same ring order, Adam elementwise — so all four end with
the same weights. Traffic per rank per step: dp 2(N−1)/N·Ψ (one all-reduce), zero1 and zero2 the
same (a reduce-scatter and an all-gather), zero3 3(N−1)/N·Ψ (two all-gathers, a reduce-scatter).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ...collectives import all_gather, allreduce, reduce_scatter
from ..data_parallel import global_batch
from .adam import adam
from .layers import loss_and_grads_by_layer, split_unit, units
from .memory import STAGES, Ledger

DTYPES = {"fp32": (np.float32, np.float32), "mixed": (np.float16, np.float32)}  # stored, master


class Rank:
    """One rank's model states for `stage`: what it holds, counted in `ledger`."""

    def __init__(self, comm, params: list, stage: str, precision: str = "fp32"):
        if stage not in STAGES or precision not in DTYPES:
            raise ValueError(f"stage must be one of {STAGES}, precision fp32 or mixed; "
                             f"got {stage!r}, {precision!r}")
        self.comm, self.stage, self.precision = comm, stage, precision
        self.stored, master = DTYPES[precision]
        n, r = comm.world_size, comm.rank
        self.shapes = [W.shape for W in params[::2]]
        self.ledger = Ledger()
        self._gathered = None  # zero3: the one unit of parameters gathered for now
        padded = [np.pad(u, (0, -len(u) % n)) for u in units(params)]
        self.shard = [len(u) // n for u in padded]
        mine = [u[r * s:(r + 1) * s] for u, s in zip(padded, self.shard, strict=True)]
        owned = padded if stage == "dp" else mine  # what the optimizer updates
        # fp32: the stored weights are the master weights; mixed: an fp32 master copy besides
        self.master = [u.astype(master) for u in owned]
        self.m = [np.zeros_like(u) for u in self.master]
        self.v = [np.zeros_like(u) for u in self.master]
        for a in self.m + self.v + (self.master if precision == "mixed" else []):
            self.ledger.hold("optimizer", a)
        keep = mine if stage == "zero3" else padded
        self.weights = [u.astype(self.stored) for u in keep]  # full units, or shards (zero3)
        for w in self.weights:
            self.ledger.hold("params", w)
        self.step = 0

    @property
    def psi(self) -> int:
        """Parameters in the model (padding included)."""
        return sum(s * self.comm.world_size for s in self.shard)

    # --- one layer's weights, when the pass needs them ---------------------------------------
    def layer(self, index: int):
        if self.stage != "zero3":
            unit = self.weights[index]
        else:  # FSDP: gather the layer now; the one gathered before it is dropped
            unit = all_gather(self.comm, self.weights[index])
            self._drop_gathered()
            self._gathered = unit
            self.ledger.hold("params", unit)
        return split_unit(unit.astype(np.float32), self.shapes[index])

    def _drop_gathered(self) -> None:
        if self._gathered is not None:
            self.ledger.free("params", self._gathered)
            self._gathered = None

    # --- one layer's gradient, as soon as backward has it --------------------------------------
    def _gradient(self, index: int, gW, gb, weight: float) -> np.ndarray:
        flat = np.concatenate([gW.reshape(-1), gb]) * weight
        full = np.pad(flat, (0, -len(flat) % self.comm.world_size)).astype(self.stored)
        self.ledger.hold("grads", full)
        return full

    def train_step(self, X, y, weight: float, lr: float) -> float:
        """Forward, backward, communicate, update: one step of this rank's stage."""
        self.step += 1
        held = {}  # zero2/zero3: the gradient shards, as backward produces them

        def ready(index, gW, gb):
            if self.stage in ("zero2", "zero3"):
                full = self._gradient(index, gW, gb, weight)
                held[index] = reduce_scatter(self.comm, full)
                self.ledger.hold("grads", held[index])
                self.ledger.free("grads", full)  # the full gradient is dropped at once

        loss, grads = loss_and_grads_by_layer(self.layer, X, y, ready, layers=len(self.shapes))
        self._drop_gathered()
        if self.stage in ("dp", "zero1"):
            full = [self._gradient(i, grads[2 * i], grads[2 * i + 1], weight)
                    for i in range(len(self.shapes))]
            if self.stage == "dp":
                held = dict(enumerate(allreduce(self.comm, g, "sum", "ring") for g in full))
            else:
                held = {i: reduce_scatter(self.comm, g) for i, g in enumerate(full)}
                for g in held.values():
                    self.ledger.hold("grads", g)
        for i in range(len(self.shapes)):  # Adam on what this rank owns
            adam(self.master[i], held[i].astype(self.master[i].dtype), self.m[i], self.v[i],
                 self.step, lr)
        if self.stage == "zero3":
            for i, w in enumerate(self.weights):
                w[...] = self.master[i]
        elif self.stage == "dp":
            self.weights = [m.astype(self.stored) for m in self.master]
        else:  # zero1, zero2: gather everyone's updated shard into the full weights
            self.weights = [all_gather(self.comm, m.astype(self.stored)) for m in self.master]
        self.ledger.now["grads"] = 0  # the step's gradients are dropped with `grads` and `held`
        return weight * loss

    def full_params(self) -> list[np.ndarray]:
        """The model as training.MLP holds it: [W0, b0, ...] in float64 (zero3 gathers it)."""
        out = []
        for i, shape in enumerate(self.shapes):
            unit = (all_gather(self.comm, self.weights[i]) if self.stage == "zero3"
                    else self.weights[i])
            W, b = split_unit(unit.astype(np.float64), shape)
            out += [W.copy(), b.copy()]
        return out


def train(comm, params: list, X, y, stage: str = "zero1", steps: int = 5, lr: float = 1e-2,
          batch: int = 64, seed: int = 0, precision: str = "fp32") -> dict:
    """Run on every rank: `steps` Adam steps of `stage` on lesson 08's global batches.

    Returns losses (this rank's share), the final params, the memory ledger (bytes held now and at
    the peak) and the bytes this rank sent per step by collective, counted from its trace."""
    rank = Rank(comm, params, stage, precision)
    losses, traffic = [], []
    for step in range(steps):
        idx = np.array_split(global_batch(step, len(y), batch, seed), comm.world_size)[comm.rank]
        first = len(comm.trace.events)
        losses.append(rank.train_step(X[idx], y[idx], len(idx) / batch, lr))
        sent = Counter()
        for event in comm.trace.events[first:]:
            sent[event.collective.split("/")[0]] += event.nbytes
        traffic.append(dict(sent))
    return {"losses": losses, "params": rank.full_params(), "memory": rank.ledger.report(),
            "traffic": traffic, "psi": rank.psi, "itemsize": np.dtype(rank.stored).itemsize}
