"""Lesson 14 · the fused kernel on a GPU: `check_tree_sum` runs your block tree reduction on one
block, one thread at a time between barriers, records every thread's partial sum after each
`syncthreads()`, and names the first thread and step that hold the wrong one; it also records
which thread reads and writes which shared-memory slot between two barriers, and names a slot
that one thread writes while another reads it with no barrier between (a race, whatever order the
threads happen to run in); then it runs your function inside a real kernel (on the simulator, or
the GPU).

Why in lockstep and not only on the simulator: the simulator runs threads as Python threads, so a
missing `syncthreads()` gives a wrong sum only when the threads happen to interleave badly. Here
the threads of a step run in ascending order, each until its next barrier: a thread always runs
before the higher thread whose partial it reads, so a missing barrier inside the tree is a stale
read, every time. A barrier missing after the last step is not: thread 0 writes the sum, and the
other threads read it only after your function returns (block_sum's broadcast, which this
checker's caller does too) — the record of reads and writes catches that one.
"""

from __future__ import annotations

import operator
import sys
import threading
import time
import types

import numpy as np

from .feedback import Feedback, failed, not_attempted, passed
from .registry import exercise, hint, is_stub, solution  # noqa: F401 - notebook
from .spec import choice
from .texts import message

try:
    from ..kernels import gpu
    from ..kernels.gpu import cuda
    GPU_MISSING = ""
except ImportError as e:  # the lesson still runs; its kernel cells say what to install
    gpu, cuda, GPU_MISSING = None, None, str(e)

TIMEOUT = 10.0  # seconds a block may take in lockstep before the checker gives up on it


class _Abort(Exception):
    """Raised in the learner's threads to stop them (a barrier only some threads reached)."""


class _Block:
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
            self.problem = self.problem or (message(__name__, "14.1", "block-had-finished",
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
                    message(__name__, "14.1", "endless-loop",
                            barriers=len(self.snapshots) - 1))
                self.turn = -1
        else:  # all done, or a barrier that only some threads reached
            waiting = [i for i, s in enumerate(self.state) if s == "barrier"]
            if waiting:
                done = [i for i, s in enumerate(self.state) if s == "done"]
                self.problem = self.problem or (
                    message(__name__, "14.1", "threads-wait-at", threads=_threads(waiting),
                            threads2=_threads(done)))
            self.turn = -1
        self._cond.notify_all()


class _Shared:
    """Shared memory as your function sees it in lockstep: the block's array, each read and write
    noted with the thread and the barriers passed so far."""

    def __init__(self, block: _Block):
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


def _threads(ts) -> str:
    """'thread 3', 'threads 0, 1', 'threads 4..31'."""
    if len(ts) == 1:
        return f"thread {ts[0]}"
    return "threads " + (", ".join(map(str, ts)) if len(ts) <= 4 else f"{ts[0]}..{ts[-1]}")


def run_in_lockstep(tree_sum, threads: int = 8) -> _Block:
    """Your tree_sum on one block whose thread t starts with shared[t] = 2**t (a partial sum then
    says which threads it contains), run as `_Block` describes."""
    fn = getattr(tree_sum, "py_func", tree_sum)  # the Python function under @cuda.jit
    block = _Block(threads, 2.0 ** np.arange(threads))
    names = {name for name, value in fn.__globals__.items()
             if value is cuda or getattr(value, "__name__", "") == "numba.cuda"}
    fake = types.FunctionType(fn.__code__, {**fn.__globals__, **dict.fromkeys(names | {"cuda"},
                                                                              block.api)},
                              fn.__name__, fn.__defaults__, fn.__closure__)
    block.run(fake)
    return block


def _who(value: float, threads: int) -> str:
    """The threads whose 2**t make up `value`: {0, 4} for 17.0."""
    bits = int(value) if float(value).is_integer() and 0 <= value < 2 ** threads else None
    if bits is None:
        return f"{value!r} (not a sum of distinct partials)"
    return "{" + ", ".join(str(t) for t in range(threads) if bits >> t & 1) + "}"


def _race(block: _Block) -> str:
    """The first slot that one thread writes and another reads (or writes) between the same two
    barriers, as a sentence ("" if none): nothing orders those two on a GPU."""
    touched: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for phase, t, slot, kind in block.accesses:
        touched.setdefault((phase, slot), []).append((t, kind))
    for (phase, slot), uses in sorted(touched.items()):
        writers = sorted({t for t, kind in uses if kind == "write"})
        others = sorted({t for t, kind in uses if t != writers[0]}) if writers else []
        if not others:
            continue
        w, t = writers[0], others[0]
        kind = next(k for u, k in uses if u == t)
        after = (message(__name__, "14.1", "before-first-barrier") if phase == 0 else
                 message(__name__, "14.1", "after-last-barrier") if phase == max(block.barriers)
                 else message(__name__, "14.1", "after-barrier", k=phase))
        if kind == "caller":
            return message(__name__, "14.1", "sum-read-before-written", threads=block.threads,
                           after=after, w=w, slot=slot, t=t, readers=_threads(others))
        return message(__name__, "14.1", "slot-race", threads=block.threads, after=after, w=w,
                       slot=slot, t=t, does="writes" if kind == "write" else "reads")


def _problem(tree_sum, threads: int) -> str:
    """What is wrong with tree_sum on a block of `threads` ("" if nothing)."""
    block = run_in_lockstep(tree_sum, threads)
    if block.problem:
        return f"with {threads} threads: {block.problem}."
    got = [s for i, s in enumerate(block.snapshots)
           if i == 0 or s.tolist() != block.snapshots[i - 1].tolist()]  # extra barriers: no step
    want = gpu.block.partials(2.0 ** np.arange(threads))
    if len(got) == len(want) and all((g == w).all() for g, w in zip(got, want, strict=True)):
        return _race(block)
    interleaved = gpu.block.partials(2.0 ** np.arange(threads), "interleaved")
    if len(got) == len(interleaved) and all((g == w).all()
                                            for g, w in zip(got, interleaved, strict=True)):
        return (message(__name__, "14.1", "interleaved-tree-stride"))
    barriers, steps = max(block.barriers), len(want) - 1
    # (step, what the block held, what the tree holds): the block's last state beside the tree's
    pairs = [(k, got[k], want[k]) for k in range(1, min(len(got) - 1, steps))]
    for k, g, w in pairs + [(steps, got[-1], want[-1])]:
        wrong = np.flatnonzero(g != w)
        if len(wrong):
            t = int(wrong[0])
            when = f"after step {k} of {steps}" if k < steps else "when the block has finished"
            text = message(__name__, "14.1", "wrong-partials", threads=threads,
                           when=when, t=t, who=_who(g[t], threads), who2=_who(w[t], threads))
            if barriers < steps - 1:
                calls = f"call syncthreads() {barriers} times" if barriers else \
                    "never call syncthreads()"
                text += message(__name__, "14.1", "threads-calls-each", calls=calls, steps=steps,
                                t=t)
            return text + "."
    return message(__name__, "14.1", "with-threads-threads", threads=threads)




@exercise("14.1", kind="code", function="tree_sum", library=("kernels.gpu.block:block_sum",),
          needs={"cuda": cuda}, imports="cuda, hint, solution", gaps=(2, 2))
def check_tree_sum(tree_sum) -> Feedback:
    """Exercise 14.1: tree_sum leaves the sum of shared[0:blockDim.x] in shared[0], step by step
    as the tree does, on blocks of 2, 8 and 32 threads; then inside a kernel on this target."""
    if GPU_MISSING:
        return failed(message(__name__, "14.1", "exercise-runs-on", GPU_MISSING=GPU_MISSING))
    if is_stub(getattr(tree_sum, "py_func", tree_sum)):
        return not_attempted(message(__name__, "14.1", "write-body-tree"))
    if not hasattr(tree_sum, "py_func"):
        return failed(message(__name__, "14.1", "decorate-tree-sum"))
    for threads in (8, 2, 32):
        problem = _problem(tree_sum, threads)
        if problem:
            return failed(problem)
    values = np.random.default_rng(14).standard_normal(32)
    try:
        got = block_total(tree_sum, values)
    except Exception as e:  # noqa: BLE001 - e.g. numba cannot compile it for the device
        return failed(message(__name__, "14.1", "tree-sum-passed", name=type(e).__name__,
                              error=str(e).splitlines()[0] if str(e) else ''))
    if not np.isclose(got, values.sum(), rtol=1e-12):
        return failed(message(__name__, "14.1", "in-real-kernel", got=got, sum=values.sum()))
    where = "the CUDA simulator" if gpu.simulated() else "this GPU"
    return passed(message(__name__, "14.1", "every-thread-holds", where=where, got=got))


def block_total(tree_sum, values) -> float:
    """Run tree_sum in a kernel of one block, thread t starting from values[t]; return shared[0]."""
    kernel = _kernel_with(tree_sum)
    out = np.zeros(1)
    kernel[1, len(values)](np.asarray(values, dtype=np.float64), out)
    return float(out[0])


def _kernel_with(tree_sum):
    @cuda.jit
    def kernel(values, out):
        shared = cuda.shared.array(1024, np.float64)
        t = cuda.threadIdx.x
        shared[t] = values[t]
        cuda.syncthreads()  # every partial written before the tree reads it
        tree_sum(shared)
        if t == 0:
            out[0] = shared[0]
    return kernel


choice("14.2", module=__name__)

choice("14.3", module=__name__)
