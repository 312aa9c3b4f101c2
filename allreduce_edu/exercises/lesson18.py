"""Lesson 18 · symmetric memory: the torn read and the stale flag run step by step
(`reads_between_stores`, `two_rounds`), and `check_two_shot`, which runs your two-shot all-reduce
on thread ranks, late ranks included, and names the rank and the slice or pad slot that went wrong.
"""

from __future__ import annotations

import re
import time

import numpy as np

from ..comm.errors import CollectiveTimeout
from ..comm.window import CHANNELS, rendezvous
from .feedback import Feedback, failed, passed
from .harness import decode, encoded_input, explain_error, ranks_text, run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .texts import message

# --- the torn read: a reader that looks between two stores --------------------------------------


def reads_between_stores(stores, read, size: int = 2) -> list:
    """What `read(memory)` sees before the writer's stores, between each two, and after them all:
    every moment a reader on another core could look (memory: `size` uint32 words, zeroed)."""
    memory = np.zeros(size, np.uint32)
    seen = [read(memory)]
    for store in stores:
        store(memory)
        seen.append(read(memory))
    return seen


def ll_word(data: int, flag: int) -> np.uint64:
    """NCCL's LL line: 4 bytes of data and a 4-byte flag in one 8-byte word, stored at once."""
    return np.uint64((int(flag) << 32) | int(data))


# --- the stale flag: a 0/1 flag reused against a count ------------------------------------------


def two_rounds(comm, flag: str) -> list[float]:
    """Run on 2 ranks: rank 0 hands rank 1 the values 1.0 then 2.0 through one slot of rank 1's
    window, and writes round 2 late, after rank 1 has looked. flag="0/1": rank 1 waits until a
    flag word is 1 (set, never reset); flag="count": until rank 0's signal count reaches the
    round (`wait_signal`). Rank 1 returns what it read each round; rank 0, []."""
    win = rendezvous(comm, 16)  # byte 0: the value (float64); byte 8: the 0/1 flag (uint64)
    value, ready = win.get_buffer(1, 1, np.float64), win.get_buffer(1, 1, np.uint64, 8)
    reads = []
    for round_ in (1, 2):
        if comm.rank == 0:
            if round_ == 2 and flag == "0/1":
                win.wait_signal(1, channel=1)  # rank 1 has looked for round 2 already
            elif round_ == 2:
                time.sleep(0.05)  # late, too: wait_signal below waits for it
            value[0] = float(round_)
            if flag == "0/1":
                ready[0] = 1
            else:
                win.put_signal(1)
        else:
            if flag == "0/1":
                while ready[0] != 1:
                    time.sleep(1e-4)
            else:
                win.wait_signal(0)
            reads.append(float(value[0]))
            if round_ == 2 and flag == "0/1":
                win.put_signal(0, channel=1)  # "I have read round 2": now rank 0 writes it
    win.barrier(channel=2)
    win.close()
    return reads


# --- measuring: α and β of the windows, from one-shot's and two-shot's own times ----------------


def fit_rounds(times: dict, sizes, world_size: int, small: int = 1024, large: int = 1 << 20):
    """(α, β) for t = rounds·α + bytes read·β, fitted to one-shot's (1 round, (N − 1)·S) and
    two-shot's (2 rounds, 2(N − 1)/N·S) times {(algorithm, bytes): seconds}: α is the median
    per round at sizes up to `small`, β the median per byte read, less the rounds, from `large`
    up (medians: one slow run on a busy machine does not move them)."""
    n = world_size
    shape = {"one_shot": (1, n - 1), "two_shot": (2, 2 * (n - 1) / n)}  # rounds, bytes read / S
    alpha = float(np.median([times[a, s] / rounds for a, (rounds, _) in shape.items()
                             for s in sizes if s <= small]))
    beta = float(np.median([(times[a, s] - rounds * alpha) / (share * s)
                            for a, (rounds, share) in shape.items() for s in sizes if s >= large]))
    return alpha, max(beta, 1e-15)


# --- 18.1 ------------------------------------------------------------------------------------


class _Ranks:
    """The comm your function gets: rank, world_size and what `rendezvous` needs; a rank can be
    made late (it leaves rendezvous `late` seconds after the others), and every window's signal
    pad on this rank is kept for the diagnosis."""

    _REFUSED = ("send", "recv", "sendrecv", "isend", "irecv", "barrier", "collective")

    def __init__(self, comm, late: float, timeout: float):
        self._comm, self._late, self.timeout = comm, late, timeout
        self.rank, self.world_size = comm.rank, comm.world_size
        self.pads: list[np.ndarray] = []

    def open_window(self, nbytes: int):
        number, buffers, settled = self._comm.open_window(nbytes)
        n = self.world_size
        self.pads.append(buffers[self.rank][:CHANNELS * n * 8].view(np.uint64).reshape(CHANNELS, n))

        def settled_late():
            settled()
            time.sleep(self._late)
        return number, buffers, settled_late

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._REFUSED:
            raise AttributeError(f"comm.{name}, which is not available in exercise 18.1: no "
                                 f"messages; write into and read from the window (rendezvous)")
        return getattr(self._comm, name)


def _on_rank(comm, fn, shape, late_rank: int, late: float, timeout: float) -> dict:
    """Run on every rank: your fn on this rank's encoded input; what it returned, or where it
    stopped waiting (the pad slot it waited on)."""
    ranks = _Ranks(comm, late if comm.rank == late_rank else 0.0, timeout)
    x = encoded_input(comm.rank, shape)
    try:
        result = fn(ranks, x.copy())
    except CollectiveTimeout as e:
        text = str(e)
        channel = re.search(r"on channel (\d+)", text)
        wanted = re.search(r"for signal (\d+)", text)
        src = e.waiting_for if e.waiting_for is not None else -1
        c = int(channel[1]) if channel else 0
        held = int(ranks.pads[-1][c, src]) if ranks.pads and src >= 0 else -1
        return {"kind": "timeout", "src": src, "channel": c, "held": held,
                "wanted": int(wanted[1]) if wanted else held + 1}
    if result is None:
        return {"kind": "none"}
    y = np.asarray(result)
    if y.shape != tuple(shape) or y.dtype != np.float64:
        return {"kind": "shape", "shape": y.shape, "dtype": y.dtype.name}
    return {"kind": "array", "array": y}


def _problem(reports, n: int, shape) -> tuple[bool, str]:
    """The first wrong rank and slot, in words ("" when every rank holds the sum), and whether it
    is a race: a read that came before the write it needed."""
    for r, report in enumerate(reports):
        kind = report["kind"]
        if kind == "timeout":
            return False, message(__name__, "18.1", "no-signal", rank=r, src=report["src"],
                                  channel=report["channel"], held=report["held"],
                                  wanted=report["wanted"])
        if kind == "none":
            return False, message(__name__, "18.1", "returned-none", rank=r)
        if kind == "shape":
            return False, message(__name__, "18.1", "wrong-shape", rank=r, shape=report["shape"],
                                  dtype=report["dtype"], want=tuple(shape))
    count = int(np.prod(shape))
    bounds = np.concatenate([[0], np.cumsum([len(p) for p in np.array_split(range(count), n)])])
    for r, report in enumerate(reports):
        flat = report["array"].reshape(-1)
        for k in range(n):
            piece = flat[bounds[k]:bounds[k + 1]]
            if piece.size == 0:
                continue
            position, counts = decode(piece, n)
            if position == bounds[k] and counts == (1,) * n:
                continue
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            if not np.any(piece):
                if r == k:
                    return False, message(__name__, "18.1", "own-slice-empty", rank=r, slice=k,
                                          lo=lo, hi=hi)
                return True, message(__name__, "18.1", "slice-empty", rank=r, slice=k, lo=lo,
                                     hi=hi, owner=k)
            if counts is None:  # pieces of two writes, or a read across a write
                return True, message(__name__, "18.1", "slice-garbled", rank=r, slice=k, lo=lo,
                                     hi=hi)
            if position != bounds[k]:
                other = int(np.searchsorted(bounds, position, side="right") - 1)
                return False, message(__name__, "18.1", "wrong-slice", rank=r, slice=k, lo=lo,
                                      hi=hi, owner=k, other=other)
            missing = [s for s, c in enumerate(counts) if c == 0]
            if k in missing:
                return False, message(__name__, "18.1", "missing-own", rank=r, slice=k, lo=lo,
                                      hi=hi, owner=k, held=ranks_text(counts))
            if missing:
                return True, message(__name__, "18.1", "missing-peer", rank=r, slice=k, lo=lo,
                                     hi=hi, owner=k, src=missing[0], held=ranks_text(counts))
            return False, message(__name__, "18.1", "counted-twice", rank=r, slice=k, lo=lo,
                                  hi=hi, held=ranks_text(counts))
    return False, ""


@exercise("18.1", kind="code", function="my_two_shot",
          library=("collectives.symmetric:allreduce_two_shot",),
          needs={"rendezvous": rendezvous},
          after=("from allreduce_edu.comm.window import rendezvous",), gaps=(2, 2))
def check_two_shot(my_two_shot, world_sizes=(3, 4), counts=(10, 1001), late: float = 0.2,
                   timeout: float = 2.0, transport: str = "local") -> Feedback:
    """Exercise 18.1: `my_two_shot(comm, x)` must sum x over the ranks through one window, with
    every read after its signal. It runs on each world size and count, first with every rank on
    time, then with each rank in turn late out of rendezvous (a reader that does not wait reads
    that rank's window before it is written); a wait that never ends stops after `timeout`. A
    read before its write seen with every rank on time is named as a late rank shows it (where
    it lands on time is luck, and the feedback should not change from run to run), or as seen
    when no late rank shows it."""
    from ..runtime import Cluster

    for n in world_sizes:
        hunch = ""  # a read before its write, with every rank on time: luck decides where
        with Cluster(n, transport, timeout=5 * timeout + late) as cluster:
            # every rank on time at each count; then each rank in turn late, at the last count
            runs = [(c, None) for c in counts] + [(counts[-1], r) for r in range(n)]
            for count, late_rank in runs:
                if hunch and late_rank is None:
                    continue  # a late rank shows the same race the same way every run
                shape = (count,)
                reports, failure = run_on_ranks(cluster, _on_rank, my_two_shot, shape,
                                                -1 if late_rank is None else late_rank,
                                                late, timeout)
                at = (f"{n} ranks, x of shape {shape}"
                      + ("" if late_rank is None else f", rank {late_rank} late"))
                if failure is not None:
                    return failed(explain_error(failure, shape,
                                                message(__name__, "18.1", "raised")))
                race, problem = _problem(reports, n, shape)
                if race and late_rank is None:
                    hunch = f"{at}: {problem}"  # the on-time runs after it are skipped
                elif problem:
                    return failed(f"{at}: {problem}")
        if hunch:
            return failed(hunch)
    return passed(message(__name__, "18.1", "passed", sizes=" and ".join(map(str, world_sizes)),
                          counts=" and ".join(map(str, counts))))
