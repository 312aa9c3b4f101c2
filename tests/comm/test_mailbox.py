"""The mailbox: what a recv waits on. A recv with no pump sleeps on its condition; a delivery wakes it
only while one sleeps (waking nobody cost a microsecond and a half a message), and a lost wake-up would
turn into a timeout, which these tests would see."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from allreduce_edu.comm.errors import CollectiveAborted, CollectiveTimeout, RankFailure
from allreduce_edu.comm.mailbox import Mailbox, Message


def _take_on_a_thread(mailbox: Mailbox, tag: str, seconds: float = 20.0) -> tuple[threading.Thread, list]:
    got: list = []

    def take():
        try:
            got.append(mailbox.take(0, tag, 0, 0, None, time.monotonic() + seconds))
        except Exception as e:  # noqa: BLE001 - the test reads it
            got.append(e)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    limit = time.monotonic() + 10
    while not mailbox._sleeping:  # asleep on the condition before anything is delivered
        assert thread.is_alive() and time.monotonic() < limit, f"take never slept: {got}"
        time.sleep(0.001)
    return thread, got


def test_a_sleeping_recv_is_woken_by_the_delivery_it_waits_for():
    mailbox = Mailbox(1, 2)
    thread, got = _take_on_a_thread(mailbox, "x")
    mailbox.deliver(Message(0, "x", np.arange(3)))
    thread.join(10)
    assert not thread.is_alive() and isinstance(got[0], Message), got  # not a timeout 20 s later
    assert got[0].array.tolist() == [0, 1, 2] and mailbox._sleeping == 0


def test_a_delivery_for_another_tag_wakes_the_sleeper_who_sleeps_again_until_its_own():
    mailbox = Mailbox(1, 2)
    thread, got = _take_on_a_thread(mailbox, "mine")
    mailbox.deliver(Message(0, "other", np.zeros(1)))
    time.sleep(0.05)
    with mailbox._lock:  # the woken sleeper is back in its wait, or not yet awake: either counts
        assert thread.is_alive() and mailbox._sleeping == 1 and not got
    mailbox.deliver(Message(0, "mine", np.ones(1)))
    thread.join(10)
    assert isinstance(got[0], Message) and got[0].tag == "mine"
    assert mailbox.pending() == 1  # "other" still waits for its own recv


def test_deliveries_with_nobody_asleep_are_kept_for_the_next_take():
    mailbox = Mailbox(1, 2)
    for i in range(3):
        mailbox.deliver(Message(0, "x", np.full(1, i)))
    assert mailbox._sleeping == 0 and mailbox.pending() == 3
    taken = [mailbox.take(0, "x", 0, 0, None, time.monotonic() + 1).array[0] for _ in range(3)]
    assert taken == [0, 1, 2] and mailbox.pending() == 0


def test_a_failed_peer_wakes_its_sleeper_with_rank_failure():
    mailbox = Mailbox(1, 2)
    thread, got = _take_on_a_thread(mailbox, "x")
    mailbox.peer_failed(0, "its process exited")
    thread.join(10)
    assert isinstance(got[0], RankFailure) and "its process exited" in str(got[0])


def test_an_abort_wakes_its_sleeper_with_the_abort():
    mailbox = Mailbox(1, 2)
    thread, got = _take_on_a_thread(mailbox, "x")
    mailbox.abort(CollectiveAborted("rank 3 failed: stop", ranks=(3,)))
    thread.join(10)
    assert isinstance(got[0], CollectiveAborted) and "rank 3 failed" in str(got[0])


def test_a_sleeper_with_nothing_coming_times_out_at_its_deadline():
    mailbox = Mailbox(1, 2)
    with pytest.raises(CollectiveTimeout, match="from rank 0"):
        mailbox.take(0, "x", 0, 0, None, time.monotonic() + 0.05)
    assert mailbox._sleeping == 0


def test_a_sendrecv_with_a_timeout_that_is_no_number_of_seconds_sends_nothing():
    from allreduce_edu.comm.transports.local import LocalWorld
    sender, receiver = LocalWorld(2).comms
    with pytest.raises(ValueError, match="rank 0: timeout=inf is not a number of seconds"):
        sender.sendrecv(1, np.ones(2), 1, "step", timeout=float("inf"))
    assert receiver.pending() == 0  # refused before the send: nothing for a later recv to take


def test_a_nonblocking_wait_refuses_a_timeout_that_is_no_number_of_seconds():
    from allreduce_edu.collectives.nonblocking import iallreduce
    from allreduce_edu.comm.transports.local import LocalWorld
    (comm,) = LocalWorld(1).comms
    request = iallreduce(comm, np.ones(3))
    with pytest.raises(ValueError, match="rank 0: timeout=-1"):
        request.wait(timeout=-1)
    assert request.wait().tolist() == [1.0, 1.0, 1.0]
    comm.close()
