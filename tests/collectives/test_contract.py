"""The contract an algorithm may rely on (comm.contract.Comm): every communicator-shaped object
keeps it, and a toy communicator that has nothing else runs every registered algorithm."""

from __future__ import annotations

import collections
import queue
import threading

import numpy as np
import pytest

import allreduce_edu as ae
from allreduce_edu.collectives import ALGORITHMS
from allreduce_edu.comm.contract import Comm
from allreduce_edu.comm.group import Group
from allreduce_edu.comm.transports.local import LocalWorld
from allreduce_edu.comm.window import WindowsUnavailable
from allreduce_edu.exercises.harness import Spy
from allreduce_edu.runtime.transports import TRANSPORTS

MEMBERS = ("rank", "world_size", "ranks_per_node", "links", "send", "isend", "recv", "sendrecv", "barrier",
           "send_buffer", "collective", "progress")


class _Sent:
    def wait(self, timeout=None):
        pass


class ToyComm(Comm):
    """Threads and queues, and only what the contract names (barrier, send_buffer and collective
    are the contract's plain defaults)."""

    def __init__(self, boxes, rank, world_size, ranks_per_node=None):
        self.boxes, self.rank, self.world_size = boxes, rank, world_size
        self.ranks_per_node = ranks_per_node

    def isend(self, dst, array, tag, *, step=-1, chunk=None):
        self.boxes[(self.rank, dst, tag)].put(np.array(array))
        return _Sent()

    def send(self, dst, array, tag, *, step=-1, chunk=None):
        self.isend(dst, array, tag)

    def recv(self, src, tag, timeout=None):
        return self.boxes[(src, self.rank, tag)].get(timeout=timeout or 10)

    def sendrecv(self, dst, array, src, tag, *, step=-1, chunk=None, timeout=None):
        self.isend(dst, array, tag)
        return self.recv(src, tag, timeout)


def _run_toys(n, fn, ranks_per_node=None):
    lock = threading.Lock()

    class Boxes(collections.defaultdict):
        def __missing__(self, key):
            with lock:
                return self.setdefault(key, queue.SimpleQueue())

    boxes, results, errors = Boxes(), [None] * n, []

    def rank(r):
        try:
            results[r] = fn(ToyComm(boxes, r, n, ranks_per_node))
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.parametrize("n, ranks_per_node", [(1, None), (3, None), (4, 2), (6, 3)])
def test_a_toy_communicator_with_only_the_contract_runs_every_algorithm(algorithm, n,
                                                                         ranks_per_node):
    inputs = [np.arange(10.0) * (r + 1) for r in range(n)]
    if ae.collectives.DESCRIPTIONS[algorithm].needs == "windows" and n > 1:  # not in the contract
        with pytest.raises(WindowsUnavailable, match="cannot map its peers' memory"):
            _run_toys(n, lambda comm: ae.allreduce(comm, inputs[comm.rank], algorithm=algorithm),
                      ranks_per_node)
        return
    results = _run_toys(n, lambda comm: ae.allreduce(comm, inputs[comm.rank], algorithm=algorithm),
                        ranks_per_node)
    for result in results:
        np.testing.assert_allclose(result, sum(inputs))


def test_the_toy_runs_the_other_collectives_and_the_default_barrier():
    def everything(comm):
        comm.barrier()
        return (ae.reduce_scatter(comm, np.arange(6.0)).tolist(),
                ae.all_gather(comm, np.array([comm.rank])).tolist(),
                ae.broadcast(comm, np.array([comm.rank + 5]), root=1).tolist())

    for r, (scattered, gathered, broadcast) in enumerate(_run_toys(3, everything)):
        assert scattered == (3 * np.array_split(np.arange(6.0), 3)[r]).tolist()
        assert gathered == [0, 1, 2] and broadcast == [6]


def test_every_communicator_shaped_object_keeps_the_contract():
    world = LocalWorld(2)
    comm = world.comms[0]
    grpc = TRANSPORTS["grpc"].communicator(0, 1, token="t" * 32, timeout=5)
    try:
        for thing in (comm, grpc, Group(comm, [0, 1], "pair"), Spy(comm)):
            assert isinstance(thing, Comm), thing
            assert all(hasattr(thing, m) for m in MEMBERS), thing
    finally:
        grpc.close(drain=0.1)


def test_a_comm_without_a_communication_thread_says_so_when_asked_for_a_request():
    toy = ToyComm.__new__(ToyComm)  # the contract's defaults only: no thread behind it
    with pytest.raises(NotImplementedError, match="ToyComm has no communication thread"):
        ae.iallreduce(toy, np.ones(2))


def test_the_spy_refuses_what_an_exercise_does_not_allow_even_in_the_contract():
    spy = Spy(LocalWorld(2).comms[0])
    with pytest.raises(AttributeError, match="comm.barrier, which is not available"):
        spy.barrier()
    assert spy.send_buffer(1, (3,), np.float64).shape == (3,)
