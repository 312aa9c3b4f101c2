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

import numpy as np

from .feedback import Feedback, failed, not_attempted, passed
from .lesson14_lockstep import Block, run_in_lockstep, threads_text
from .registry import exercise, hint, is_stub, solution  # noqa: F401 - notebook
from .spec import choice
from .texts import message

try:
    from ..kernels import gpu
    from ..kernels.gpu import cuda
    GPU_MISSING = ""
except ImportError as e:  # the lesson still runs; its kernel cells say what to install
    gpu, cuda, GPU_MISSING = None, None, str(e)

def _who(value: float, threads: int) -> str:
    """The threads whose 2**t make up `value`: {0, 4} for 17.0."""
    bits = int(value) if float(value).is_integer() and 0 <= value < 2 ** threads else None
    if bits is None:
        return f"{value!r} (not a sum of distinct partials)"
    return "{" + ", ".join(str(t) for t in range(threads) if bits >> t & 1) + "}"


def _race(block: Block) -> str:
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
                           after=after, w=w, slot=slot, t=t, readers=threads_text(others))
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
