"""Lesson 14's checker: the right tree passes; a missing syncthreads, a stride that skips threads,
a barrier inside the `if`, the interleaved order, an index out of range, a loop that ends early and
a barrier before each step instead of after it (the last step's sum read unordered) each fail,
naming the thread, the step and the slot."""

from __future__ import annotations

import pytest

from allreduce_edu.exercises import lesson14_lockstep, reference

lesson14 = pytest.importorskip("allreduce_edu.exercises.lesson14")
if lesson14.GPU_MISSING:
    pytest.skip(f"numba-cuda is not installed: {lesson14.GPU_MISSING}", allow_module_level=True)

from allreduce_edu.exercises.lesson14 import (  # noqa: E402 - after the skip
    block_total,
    check_tree_sum,
    cuda,
    run_in_lockstep,
)


@cuda.jit(device=True)
def no_syncthreads(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            shared[t] += shared[t + s]
        s //= 2


@cuda.jit(device=True)
def skips_the_upper_half(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 4  # starts at a quarter: threads n/2.. never read
    while s > 0:
        if t < s:
            shared[t] += shared[t + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def stops_before_stride_one(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 1:
        if t < s:
            shared[t] += shared[t + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def syncthreads_inside_the_if(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            shared[t] += shared[t + s]
            cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def interleaved(shared):
    t, s = cuda.threadIdx.x, 1
    while s < cuda.blockDim.x:
        if t % (2 * s) == 0:
            shared[t] += shared[t + s]
        cuda.syncthreads()
        s *= 2


@cuda.jit(device=True)
def every_thread_adds(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        shared[t] += shared[t + s]  # no `if t < s`: the upper threads read past the block
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def syncthreads_before_each_step(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        cuda.syncthreads()  # the partials are right in lockstep, but nothing orders the last
        if t < s:           # step's write of shared[0] before the other threads read the sum
            shared[t] += shared[t + s]
        s //= 2


@cuda.jit(device=True)
def syncthreads_after_each_step_and_before(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        cuda.syncthreads()  # one barrier too many (the caller's covers the first step): right
        if t < s:
            shared[t] += shared[t + s]
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def peeks_at_a_neighbour(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            shared[t] += shared[t + s]
        elif t == s:
            print(shared[t - 1])  # reads slot s - 1 while thread s - 1 writes it: a race
        cuda.syncthreads()
        s //= 2


@cuda.jit(device=True)
def tree_sum(shared):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def test_the_solution_passes():
    feedback = check_tree_sum.demo(reference("14.1"))
    assert feedback.passed, feedback
    assert check_tree_sum.demo(syncthreads_after_each_step_and_before).passed


def test_the_scaffold_is_not_attempted():
    assert check_tree_sum.demo(tree_sum).status == "not attempted"


@pytest.mark.parametrize("wrong, says", [
    (no_syncthreads, ["thread 0 holds the partials of threads {0, 1, 2, 4}",
                      "never call syncthreads()", "ran ahead"]),
    (skips_the_upper_half, ["after step 1 of 3 thread 0", "threads {0, 2}", "gives it {0, 4}"]),
    (stops_before_stride_one, ["when the block has finished thread 0", "{0, 2, 4, 6}"]),
    (syncthreads_inside_the_if, ["threads 0, 1, 2, 3 wait", "threads 4, 5, 6, 7",
                                 "outside the `if`"]),
    (interleaved, ["interleaved tree", "blockDim.x // 2"]),
    (every_thread_adds, ["thread 4 raised IndexError"]),
    (syncthreads_before_each_step, ["with 8 threads, after your last syncthreads() thread 0",
                                    "writes shared[0]", "threads 1..7 read the sum",
                                    "thread 1 can read a stale partial"]),
    (peeks_at_a_neighbour, ["before your first syncthreads() thread 3 writes shared[3]",
                            "thread 4 reads it"]),
])
def test_typical_mistakes_name_the_thread_and_step(wrong, says):
    feedback = check_tree_sum.demo(wrong)
    assert feedback.status == "failed", feedback
    for text in says:
        assert text in feedback.message, feedback.message


def test_a_plain_function_is_asked_to_be_a_device_function():
    feedback = check_tree_sum.demo(no_syncthreads.py_func)
    assert not feedback.passed and "@cuda.jit(device=True)" in feedback.message


def test_lockstep_records_every_barrier_and_is_deterministic():
    for _ in range(3):  # the same order every time: a missing barrier fails every run
        block = run_in_lockstep(no_syncthreads, 8)
        assert block.barriers == [0] * 8 and block.snapshots[-1][0] == 1 + 2 + 4 + 16
    block = run_in_lockstep(reference("14.1"), 8)
    assert block.barriers == [3] * 8 and len(block.snapshots) == 4
    assert block.snapshots[-1][0] == 255


def test_a_race_is_named_every_run_whatever_the_lockstep_order_shows():
    """The barrier before each step gives the right partials in lockstep (thread 0's last step
    runs before the others return), so only the record of reads and writes sees the race."""
    for _ in range(3):
        block = run_in_lockstep(syncthreads_before_each_step, 8)
        assert block.snapshots[-1][0] == 255 and not block.problem
        last = max(block.barriers)
        assert (last, 0, 0, "write") in block.accesses
        assert {(last, t, 0, "caller") for t in range(1, 8)} <= set(block.accesses)
    assert "stale partial" in check_tree_sum.demo(syncthreads_before_each_step).message


def test_the_solution_sums_in_a_kernel():
    assert block_total(reference("14.1"), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == 36.0


@cuda.jit(device=True)
def never_halves(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            shared[t] += shared[t + s]
        cuda.syncthreads()


@cuda.jit(device=True)
def spins_without_a_barrier(shared):
    t, s = cuda.threadIdx.x, cuda.blockDim.x // 2
    while s > 0:
        if t < s:
            shared[t] += 0.0


@pytest.mark.parametrize("endless, says", [(never_halves, "barriers and was still going"),
                                           (spins_without_a_barrier, "had not finished after 1 s")])
def test_a_loop_that_never_ends_is_stopped_and_leaves_no_thread(endless, says, monkeypatch):
    import threading
    import time

    monkeypatch.setattr(lesson14_lockstep, "TIMEOUT", 1.0)
    before = threading.active_count()
    feedback = check_tree_sum.demo(endless)
    assert feedback.status == "failed" and says in feedback.message and "stride must reach 0" in feedback.message
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == before  # every lockstep thread ended: nothing runs on


def test_no_cell_above_the_exercise_shows_the_tree_in_code():
    """The learner writes the block tree before seeing one: block_sum's listing, the warp shuffle's
    loop and the solution's lines come after 14.1's cell, not before (issue 24)."""
    from allreduce_edu import course

    [path] = [p for p in course.lesson_files() if p.name.startswith("14")]
    cells = course.read(path)["cells"]
    at = next(i for i, c in enumerate(cells) if c.get("metadata", {}).get("exercise") == "14.1")
    shown = "\n".join(course.source(c) + "".join(str(o) for o in c.get("outputs", []))
                      for c in cells[:at])
    for giveaway in ("shared[t] += shared[t + s]", "s //= 2", "while s > 0", "block_sum.py_func",
                     "shfl_down", "offset //= 2"):
        assert giveaway not in shown, giveaway
    later = "\n".join(course.source(c) for c in cells[at + 1:])
    assert "block_sum.py_func" in later and "shfl_down" in later
