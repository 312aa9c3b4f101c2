"""Lesson 14's questions as data (exercises 14.2, 14.3); lesson14.py re-exports the checkers."""

from __future__ import annotations

from .spec import choice

LESSON = "allreduce_edu.exercises.lesson14"  # where the notebook imports them from

check_barrier_order_answer = choice(
    "14.2", "why the lockstep checker catches every missing barrier", module=LESSON,
    checker="check_barrier_order_answer",
    question="The checker runs a block's threads one after another in ascending order, each up "
             "to its next syncthreads(). Leave the barrier out, and thread 0 runs its whole loop "
             "before thread 1 starts. At stride s, thread 0 reads shared[s]",
    options={
        "a": "before thread s added its partner's partial: stale, every time.",
        "b": "after thread s has finished its loop: right, so the sum comes out.",
        "c": "not at all: without a barrier the checker skips the addition.",
        "d": "from a random slot: without a barrier thread indices get mixed up.",
    },
    right="a",
    slips={
        "b": "in ascending order thread s runs after thread 0, so when thread 0 reads shared[s] "
             "thread s has not run yet. Which value is in the slot then?",
        "c": "the addition runs as written; what changes without a barrier is when it runs "
             "compared with the write it depends on.",
        "d": "cuda.threadIdx.x is fixed for a thread; the barrier orders reads after writes, it "
             "does not assign slots.",
    },
    why="a thread at stride s reads the slot a higher thread writes at stride 2s. Running threads "
        "in ascending order puts every such read before the write it needs, so each missing "
        "barrier gives a stale partial on every run — on the simulator's Python threads, or on a "
        "GPU's warps, it shows only when the timing happens to be bad.",
    hints=("In the tree, which thread writes the slot shared[s] that thread 0 reads at stride s, "
           "and at which step?",
           "With no barrier and threads in ascending order, has that higher thread run yet when "
           "thread 0 reads?"))

check_block_size_answer = choice(
    "14.3", "why a small block loses little", module=LESSON, checker="check_block_size_answer",
    question="On a GPU, `allreduce-edu bench --op layernorm --device cuda --rows 8192 --hidden "
             "4096` shows layernorm near the copy's GB/s. With gpu.layernorm(x, threads=128) it "
             "is nearly as fast as with threads=1024. Why?",
    options={
        "a": "LayerNorm is compute-bound there, so the block size never matters.",
        "b": "the GPU pads every block to 1024 threads, so both run the same way.",
        "c": "an SM runs several small blocks at once: as many loads in flight.",
        "d": "the smaller block's tree has fewer steps, and that pays for the rest.",
    },
    right="c",
    slips={
        "a": "near the copy's GB/s means the kernel is bound by memory, not arithmetic: it moves "
             "bytes as fast as a copy does.",
        "b": "a block has exactly the threads you launch; the hardware groups them in warps of "
             "32, not blocks of 1024.",
        "d": "the tree is log2(threads) steps over one row's partials, a small part of the time; "
             "the bytes read and written are the same for any block size.",
    },
    why="a memory-bound kernel is fast when enough loads are in flight to cover the memory's "
        "latency. An SM keeps several blocks resident at once, so eight 128-thread blocks keep "
        "about as many loads going as one of 1024: what matters is the threads per SM, not per "
        "block (CUDA's occupancy).",
    hints=("Is this kernel bound by arithmetic or by memory? Compare its GB/s with the copy's.",
           "How many blocks can one SM run at once, and what does that do to the number of loads "
           "in flight?"))
