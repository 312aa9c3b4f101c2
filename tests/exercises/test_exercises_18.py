"""Lesson 18's checker: the solution passes; a two-shot that reads before its signal, one that
forgets a signal and one that reads the wrong slice each fail with the rank and the slot named;
the lesson's helpers show the torn read and the stale flag the same way every run."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.comm.window import rendezvous
from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson18 import (
    check_two_shot,
    ll_word,
    reads_between_stores,
    two_rounds,
)


def _two_shot(comm, x, wait_first=True, signal_all=True, start_of=lambda r, n: r, slow=-1,
              own=True):
    """The solution, with one slip switched on by the arguments."""
    n, r, item = comm.world_size, comm.rank, x.itemsize
    edges = np.concatenate([[0], np.cumsum([len(p) for p in np.array_split(x, n)])])
    win = rendezvous(comm, 2 * x.nbytes)
    win.put(r, x)
    for k in range(1, n if signal_all else n - 1):
        win.put_signal((r + k) % n)
    lo, hi = edges[r], edges[r + 1]
    acc = np.zeros(hi - lo)
    for src in range(n) if own else [s for s in range(n) if s != r]:
        if src != r and wait_first:
            win.wait_signal(src)
        acc += win.get_buffer(src, hi - lo, x.dtype, edges[start_of(r, n)] * item)
    if r == slow:
        time.sleep(0.05)  # rank `slow` writes its reduced slice late
    win.put(r, acc, offset=x.nbytes + lo * item)
    for k in range(1, n):
        win.put_signal((r + k) % n)
    out = np.empty_like(x)
    for src in range(n):
        if src != r:
            win.wait_signal(src)
        a, b = edges[src], edges[src + 1]
        out[a:b] = win.get_buffer(src, b - a, x.dtype, x.nbytes + a * item)
    return out


def no_wait_before_reading(comm, x):
    return _two_shot(comm, x, wait_first=False)


def one_put_signal_missing(comm, x):
    return _two_shot(comm, x, signal_all=False)


def reads_the_next_slice(comm, x):
    """Rank r reduces its slice's length from where slice r + 1 starts."""
    return _two_shot(comm, x, start_of=lambda r, n: (r + 1) % n)


def my_two_shot(comm, x):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def test_the_solution_passes_and_the_scaffold_is_not_attempted():
    assert check_two_shot(reference("18.1"))
    assert check_two_shot(my_two_shot).status == "not attempted"


def no_wait_and_a_slow_rank_1(comm, x):
    """No wait before the first reads, and rank 1 slow to reduce: with every rank on time, rank 0
    reads rank 1's reduced slice before it is written."""
    return _two_shot(comm, x, wait_first=False, slow=1)


@pytest.mark.parametrize("fn", [no_wait_before_reading, no_wait_and_a_slow_rank_1])
def test_reading_before_the_signal_names_the_late_rank_and_the_slice(fn):
    """On time it may pass by luck, or fail where a slow rank happens to be; with each rank in
    turn late it fails the same way every run, and that is the failure named."""
    feedback = check_two_shot(fn)
    assert not feedback
    found = re.search(r"rank (\d) reduced slice \1 \(elements \d+:\d+, as rank \d holds it\) "
                      r"without rank (\d)'s data .*: rank \1 read slice \1 from rank \2's window "
                      r"before rank \2 signalled: wait_signal\(\2\) first", feedback.message)
    assert found, feedback.message


def test_a_race_seen_only_with_every_rank_on_time_is_named_as_seen():
    """Here slice 1 comes back empty at 10 elements only, which no late run (at 1001) shows."""
    solution = reference("18.1")

    def empty_slice_1_at_10(comm, x):
        y = solution(comm, x)
        if x.size == 10:
            y[4:7] = 0
        return y

    feedback = check_two_shot(empty_slice_1_at_10)
    assert not feedback
    assert feedback.message.startswith("3 ranks, x of shape (10,): rank 0's slice 1 (elements 4:7) "
                                       "is all zeros"), feedback.message


def test_a_rank_that_leaves_out_its_own_slice_is_told_so_not_to_wait():
    feedback = check_two_shot(lambda comm, x: _two_shot(comm, x, own=False))
    assert not feedback
    assert feedback.message.startswith("3 ranks, x of shape (10,): rank 0 reduced slice 0 (elements "
                                       "0:4, as rank 0 holds it) without its own data"), feedback.message

    def own_slice_empty(comm, x):
        y = reference("18.1")(comm, x)
        n, r = comm.world_size, comm.rank
        edges = np.concatenate([[0], np.cumsum([len(p) for p in np.array_split(x, n)])])
        y[edges[r]:edges[r + 1]] = 0
        return y

    feedback = check_two_shot(own_slice_empty)
    assert not feedback and "rank 0's own slice 0 (elements 0:4) is all zeros" in feedback.message
    assert "wait_signal" not in feedback.message


def test_a_missing_put_signal_names_the_rank_and_the_pad_slot_and_does_not_hang():
    feedback = check_two_shot(one_put_signal_missing, timeout=1.0)
    assert not feedback
    # rank r signals every peer but (r - 1) % n, so rank 0 waits for rank 1's first signal
    found = re.search(r"rank 0 never got signal (\d) from rank 1 on channel 0: "
                      r"slot \[0, 1\] of its pad stayed at (\d)", feedback.message)
    assert found and int(found[2]) == int(found[1]) - 1, feedback.message
    assert "put_signal to every peer" in feedback.message


def test_reading_the_wrong_slice_names_the_rank_and_the_slice():
    feedback = check_two_shot(reads_the_next_slice)
    assert not feedback
    assert "rank 0's slice 0 (elements 0:4) holds the elements of slice 1" in feedback.message


def test_a_function_that_sends_messages_is_told_to_use_the_window():
    feedback = check_two_shot(lambda comm, x: comm.sendrecv(0, x, 0, "t"), world_sizes=(3,))
    assert not feedback and "not available in exercise 18.1" in feedback.message


def test_the_torn_read_shows_only_when_data_and_flag_are_two_stores():
    def read_two(memory):  # (data, flag): a reader trusts the data once the flag is 1
        return int(memory[0]), int(memory[1])

    def read_ll(memory):
        word = int(memory.view(np.uint64)[0])
        return word & 0xFFFFFFFF, word >> 32

    def data(m):
        m[0] = 42

    def flag(m):
        m[1] = 1

    def line(m):
        m.view(np.uint64)[0] = ll_word(42, 1)

    def torn(seen):
        return [(d, f) for d, f in seen if f == 1 and d != 42]

    assert not torn(reads_between_stores([data, flag], read_two))
    assert torn(reads_between_stores([flag, data], read_two)) == [(0, 1)]
    assert not torn(reads_between_stores([line], read_ll))


def test_a_reused_flag_reads_round_one_and_a_count_does_not():
    cluster = cluster_for("local", 2)
    assert cluster.run(two_rounds, "0/1")[1] == [1.0, 1.0]
    assert cluster.run(two_rounds, "count")[1] == [1.0, 2.0]
