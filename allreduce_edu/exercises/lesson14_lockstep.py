"""Lesson 14's block in lockstep: your tree_sum on one block whose threads run one at a time
between barriers (lesson14.py says why), recording every thread's partials after each barrier and
which thread reads and writes which shared-memory slot between two barriers."""

from __future__ import annotations

import operator
import sys
import threading
import time
import types

import numpy as np

from .texts import message

try:
    from ..kernels.gpu import cuda
except ImportError:  # lesson14.py says why; nothing here runs without it
    cuda = None

LESSON = "allreduce_edu.exercises.lesson14"  # the data file whose texts these are

TIMEOUT = 10.0  # seconds a block may take in lockstep before the checker gives up on it


class _Abort(Exception):
    """Raised in the learner's threads to stop them (a barrier only some threads reached)."""


class Block:
    """One block of `threads` run in lockstep: thread t runs until its next syncthreads() (or its
    end), then thread t + 1; when all wait at the barrier, shared memory is snapshotted."""

    def __init__(self, threads: int, shared: np.ndarray):
        self.threads, self.shared = threads, shared
        self.turn, self.state = 0, ["run"] * threads
        self.snapshots = [shared.copy()]  # shared memory before the tree, then after each barrier
        self.barriers, self.problem = [0] * threads, ""
        self.phase = 0  # barriers the whole block has passed: slots touched between two of them
        self.accesses: list[tuple[int, int, int, str]] = []  # (phase, thread, slot, "read"/...)
        self._cond, self._me = threading.Condition(), threading.local()
        self.view = _Shared(self)  # what your function gets as `shared`: reads and writes noted
        self.api = types.SimpleNamespace(  # what `cuda.` means inside your function, here
            syncthreads=self.syncthreads,
            threadIdx=_Index(self._me), blockDim=types.SimpleNamespace(x=threads))

    def run(self, fn) -> None:
        self._code = fn.__code__
        workers = [threading.Thread(target=self._thread, args=(t, fn), daemon=True)
                   for t in range(self.threads)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + TIMEOUT  # one deadline for the whole block
        for w in workers:
            w.join(max(deadline - time.monotonic(), 0))
        if any(w.is_alive() for w in workers):
            self.problem = self.problem or (message(LESSON, "14.1", "block-had-finished",
                                                    TIMEOUT=TIMEOUT))
            with self._cond:  # stop every thread: at its next barrier, or its next line
                self.turn = -1
                self._cond.notify_all()
            for w in workers:
                w.join(1.0)
        if self.shared.tolist() != self.snapshots[-1].tolist():
            self.snapshots.append(self.shared.copy())  # after the last step

    def syncthreads(self) -> None:
        t = self._me.t
        with self._cond:
            self.barriers[t] += 1
            self._pass(t, "barrier")
            self._cond.wait_for(lambda: self.turn in (t, -1))
            if self.turn == -1:
                raise _Abort

    def _stop_when_aborted(self, frame, event, arg):
        """A trace function on the learner's thread: once the block is stopped, the next line
        raises, so even a loop that never reaches a barrier ends (nothing keeps running)."""
        if frame.f_code is not self._code:
            return None  # only your function's lines: the checker's and threading's run on
        if self.turn == -1 and event == "line":
            raise _Abort
        return self._stop_when_aborted

    def _thread(self, t: int, fn) -> None:
        self._me.t = t
        sys.settrace(self._stop_when_aborted)
        with self._cond:
            self._cond.wait_for(lambda: self.turn in (t, -1))
        try:
            if self.turn != -1:
                fn(self.view)
                self.view.read_by_caller(0)  # the caller's broadcast: every thread reads the sum
        except _Abort:
            return
        except Exception as e:  # noqa: BLE001 - the learner's code: report it, don't crash
            self.problem = self.problem or (f"thread {t} raised {type(e).__name__}: {e} "
                                            f"(after {self.barriers[t]} syncthreads)")
        with self._cond:
            self._pass(t, "done")

    def _pass(self, t: int, state: str) -> None:
        """Thread t stops (at a barrier, or done): the next thread runs, or the round ends."""
        self.state[t] = state
        if self.turn == -1:  # the block was stopped: it stays stopped
            pass
        elif t + 1 < self.threads:
            self.turn = t + 1
        elif all(s == "barrier" for s in self.state):  # everyone waits: the step is over
            self.snapshots.append(self.shared.copy())
            self.phase += 1
            self.state, self.turn = ["run"] * self.threads, 0
            if len(self.snapshots) > 2 * self.threads.bit_length() + 4:  # far more than log2(T)
                self.problem = self.problem or (
                    message(LESSON, "14.1", "endless-loop",
                            barriers=len(self.snapshots) - 1))
                self.turn = -1
        else:  # all done, or a barrier that only some threads reached
            waiting = [i for i, s in enumerate(self.state) if s == "barrier"]
            if waiting:
                done = [i for i, s in enumerate(self.state) if s == "done"]
                self.problem = self.problem or (
                    message(LESSON, "14.1", "threads-wait-at", threads=threads_text(waiting),
                            threads2=threads_text(done)))
            self.turn = -1
        self._cond.notify_all()


class _Shared:
    """Shared memory as your function sees it in lockstep: the block's array, each read and write
    noted with the thread and the barriers passed so far."""

    def __init__(self, block: Block):
        self._block = block

    def _note(self, index, kind: str) -> None:
        b = self._block
        slots = range(len(b.shared))[index] if isinstance(index, slice) else \
            [range(len(b.shared))[operator.index(index)]]  # IndexError as NumPy's, out of range
        b.accesses += [(b.phase, b._me.t, slot, kind) for slot in slots]

    def __getitem__(self, index):
        value = self._block.shared[index]
        self._note(index, "read")
        return value

    def __setitem__(self, index, value) -> None:
        self._block.shared[index] = value
        self._note(index, "write")

    def read_by_caller(self, slot: int) -> None:
        self._note(slot, "caller")

    def __len__(self) -> int:
        return len(self._block.shared)

    def __getattr__(self, name):  # shape, dtype, size: the array's
        return getattr(self._block.shared, name)


class _Index:
    """threadIdx, read by each lockstep thread as its own."""

    def __init__(self, me):
        self._me = me

    @property
    def x(self) -> int:
        return self._me.t


def threads_text(ts) -> str:
    """'thread 3', 'threads 0, 1', 'threads 4..31'."""
    if len(ts) == 1:
        return f"thread {ts[0]}"
    return "threads " + (", ".join(map(str, ts)) if len(ts) <= 4 else f"{ts[0]}..{ts[-1]}")


def run_in_lockstep(tree_sum, threads: int = 8) -> Block:
    """Your tree_sum on one block whose thread t starts with shared[t] = 2**t (a partial sum then
    says which threads it contains), run as `Block` describes."""
    fn = getattr(tree_sum, "py_func", tree_sum)  # the Python function under @cuda.jit
    block = Block(threads, 2.0 ** np.arange(threads))
    names = {name for name, value in fn.__globals__.items()
             if value is cuda or getattr(value, "__name__", "") == "numba.cuda"}
    fake = types.FunctionType(fn.__code__, {**fn.__globals__, **dict.fromkeys(names | {"cuda"},
                                                                              block.api)},
                              fn.__name__, fn.__defaults__, fn.__closure__)
    block.run(fake)
    return block
