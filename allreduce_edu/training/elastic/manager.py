"""The Manager: one per replica, torchft's Manager (torchft/manager.py) on the package's pieces.

    manager.start_quorum()             # in the background, while the forward pass runs
    loss, grad = forward_backward(params)
    grad = manager.allreduce(grad)     # SUM over the quorum / participants (zeros while healing)
    if manager.should_commit():        # every member voted ok: take the optimizer step
        params = sgd_step(params, grad, lr)

A new quorum id means a new world: this replica's rank in it, a fresh communicator (its own port)
connected to the members' fresh ones; the same quorum id keeps the communicator. As torchft's
Manager is handed its ProcessGroup and reconfigures it, this one is handed how to make each world's
communicator: `communicator(rank, world_size)` (default: a gRPC rank's, runtime/transports.py).

A replica behind the quorum's max step receives an up-to-date member's state over send/recv
(heal_plan says from whom), checks its digest once loaded, and contributes zeros to that step's
all-reduce.
Every error (a dead peer, a lost vote) is recorded; the step is then not committed, and the
replica asks for a fresh world at the next quorum.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from ...collectives import allreduce
from ...comm.base import Communicator
from ...comm.errors import CollectiveError, CollectiveTimeout, RankFailure
from ...runtime.transports import TRANSPORTS
from .lighthouse import LighthouseClient
from .quorum import heal_plan

# a step whose quorum call found no Lighthouse waits before asking again, doubling each time: a
# training loop must not spin through failed steps while the Lighthouse is away
BACKOFF_FIRST, BACKOFF_MOST = 0.05, 2.0
back_off = time.sleep  # how it waits (a test records the waits instead)


def state_digest(arrays) -> np.ndarray:
    """SHA-256 of a list of arrays (dtypes, shapes and bytes) as 32 uint8: equal iff
    bit-identical."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return np.frombuffer(h.digest(), np.uint8).copy()


class Manager:
    """This replica's side of fault-tolerant training: quorum, all-reduce, vote, healing.

    `state_dict()` returns the arrays to heal with (the parameters, the optimizer's state);
    `load_state_dict(arrays)` puts received ones in place. `algorithm` is a registered name or a
    learner's fn(comm, x) -> the sum over ranks. `timeout` bounds each wait for a peer (the
    communicator's deadline); `quorum_timeout`, each wait for the Lighthouse. `communicator(rank,
    world_size)` makes each new world's communicator, listening on a port of its own (`address`)
    until `connect(addresses, timeout)`.
    """

    def __init__(self, replica_id: str, lighthouse: str, token: str, state_dict, load_state_dict,
                 *, step: int = 0, algorithm="ring", timeout: float = 2.0,
                 quorum_timeout: float = 10.0, heartbeat_interval: float = 0.1,
                 host: str = "127.0.0.1",
                 communicator: Callable[[int, int], Communicator] | None = None):
        self.replica_id, self.step, self.algorithm = replica_id, step, algorithm
        self.timeout, self.quorum_timeout, self.host = timeout, quorum_timeout, host
        self._state, self._load = state_dict, load_state_dict
        self._client = LighthouseClient(lighthouse, token, replica_id)
        self._new_comm = communicator or (
            lambda rank, world_size: TRANSPORTS["grpc"].communicator(
                rank, world_size, token=token, host=host, timeout=timeout))
        self.comm: Communicator | None = None
        self.quorum_id: int | None = None  # this step's quorum (None until it is known)
        self._world: int | None = None  # the quorum id self.comm was built for
        self._round = 0  # which start_quorum the background call serves
        self.members: list[str] = []
        self.num_participants = 0
        self.healing = False
        self.healed_from: str | None = None  # the member this step's state came from
        self.ports: list[int] = []  # every port a communicator of this replica listened on
        self.lighthouse_failures = 0  # quorum calls in a row the Lighthouse did not answer
        self.errors: list[BaseException] = []  # this step's
        self._errored = False  # the last step failed: ask for a fresh world
        self._pending = None  # (arrays, step, digest) received while healing
        self._future, self._open = None, False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{replica_id}-quorum")
        self._stop = threading.Event()
        self._client.call("Heartbeat", quorum_timeout)  # known to the Lighthouse from now on
        self._beats = threading.Thread(target=self._heartbeat, args=(heartbeat_interval,),
                                       name=f"{replica_id}-heartbeat", daemon=True)
        self._beats.start()

    # --- the step ------------------------------------------------------------------------
    def start_quorum(self) -> None:
        """Ask for this step's quorum in the background (re-form the world, heal if behind)."""
        self.errors, self.healing, self.healed_from, self.quorum_id = [], False, None, None
        self._round, self._open = self._round + 1, True
        self._future = self._executor.submit(self._quorum_and_heal, self._round)

    def allreduce(self, grad: np.ndarray) -> np.ndarray:
        """SUM of `grad` over the quorum / the participants; zeros go in while healing.
        After an error, `grad` itself comes back (the step will not be committed)."""
        self._wait_quorum()
        if self.errors:
            return grad
        x = np.zeros_like(grad) if self.healing else grad
        fn = self.algorithm if callable(self.algorithm) else (
            lambda comm, y: allreduce(comm, y, op="sum", algorithm=self.algorithm))
        try:
            return fn(self.comm, x) / self.num_participants
        except CollectiveError as e:
            self.errors.append(e)
            self._abandon()  # its peers' waits on this replica end now, not at their deadline
            return grad

    def should_commit(self) -> bool:
        """The vote: True iff every member of the quorum finished this step without an error.
        Loads a healed state first (then this replica is at the quorum's max step)."""
        self._wait_quorum()
        if self._pending is not None:
            arrays, step, digest = self._pending
            self._pending = None
            self._load(arrays)
            if np.array_equal(state_digest(self._state()), digest):
                self.step = step
            else:
                self.errors.append(RankFailure(f"{self.replica_id}: the state healed from "
                                               f"{self.healed_from} differs once loaded"))
        self._open = False
        if self.quorum_id is None:
            self._errored = True
            return False
        try:
            vote = self._client.call("Commit", self.quorum_timeout, quorum_id=self.quorum_id,
                                     step=self.step, ok=not self.errors)
            commit = vote["commit"]
        except CollectiveError as e:
            self.errors.append(e)
            commit = False
        if commit:
            self.step += 1
        self._errored = not commit
        return commit

    def _wait_quorum(self) -> None:
        """Wait (once per step) for the background quorum; its failure becomes this step's."""
        if self._future is None:
            if not self._open:
                raise RuntimeError(f"{self.replica_id}: call start_quorum() first, every step")
            return
        future, self._future = self._future, None
        try:
            future.result(timeout=self.quorum_timeout + 2 * self.timeout)
        except FutureTimeout:
            self._round += 1  # what the late quorum call finds is kept by no step
            self.errors.append(CollectiveTimeout(f"{self.replica_id}: no quorum within "
                                                 f"{self.quorum_timeout:g} s"))
        except CollectiveError as e:
            self.errors.append(e)
        if self.errors:
            self.healing, self._pending = False, None

    # --- the background part: quorum, world, healing -------------------------------------
    def _quorum_and_heal(self, round_: int) -> None:
        if self.lighthouse_failures:  # the Lighthouse was away: wait longer each time (≤ 2 s)
            back_off(min(BACKOFF_MOST, BACKOFF_FIRST * 2 ** (self.lighthouse_failures - 1)))
        try:
            reply = self._client.call("Quorum", self.quorum_timeout, step=self.step,
                                      errored=self._errored)
        except RankFailure:  # unreachable (a timeout already took its time)
            self.lighthouse_failures += 1
            raise
        self.lighthouse_failures = 0
        self._errored = False
        members = [rid for rid, _ in reply["members"]]
        steps = {rank: step for rank, (_, step) in enumerate(reply["members"])}
        rank = members.index(self.replica_id)
        if reply["quorum_id"] != self._world or self.comm is None:
            self._reconfigure(reply["quorum_id"], rank, len(members), round_)
        elif round_ == self._round:
            self.quorum_id = reply["quorum_id"]  # a fast quorum: the same world
        top = max(steps.values())
        plan = heal_plan(steps)  # {rank behind: the up-to-date rank that sends it state}
        for dst, src in plan.items():
            if src == rank:
                self._send_state(dst)
        received = self._recv_state(plan[rank]) if rank in plan else None
        if round_ != self._round:
            return  # the step gave up waiting for this quorum: it keeps nothing of it
        self.members, self.num_participants = members, sum(s == top for s in steps.values())
        if received is not None:
            self.healing, self.healed_from = True, members[plan[rank]]
            self._pending = (received[0], top, received[1])

    def _reconfigure(self, quorum_id: int, rank: int, world_size: int, round_: int) -> None:
        """A new world: close the old communicator, listen afresh as `rank`, connect to the rest."""
        old, self.comm, self._world = self.comm, None, None
        if old is not None:
            old.close(drain=0.1)
        comm = self._new_comm(rank, world_size)
        self.ports.append(int(comm.address.rpartition(":")[2]))
        try:
            reply = self._client.call("Connect", self.quorum_timeout, quorum_id=quorum_id,
                                      address=comm.address)
            if round_ == self._round:  # every member has an address: from now on, each votes
                self.quorum_id = quorum_id
            comm.connect(reply["addresses"], timeout=self.timeout)
        except BaseException:
            comm.close(drain=0.1)
            raise
        self.comm, self._world = comm, quorum_id

    def _abandon(self) -> None:
        """Close this world's communicator now: a failed collective poisons it, and closing it
        ends the streams the other members wait on (they fail at once, as a ring does)."""
        comm, self.comm = self.comm, None  # the quorum id stays: this replica still votes
        if comm is not None:
            comm.close(drain=0.0)

    def _send_state(self, dst: int) -> None:
        arrays = [np.array(a) for a in self._state()]  # a copy: the forward pass runs meanwhile
        for i, a in enumerate(arrays):
            self.comm.send(dst, a, f"heal/{i}")
        self.comm.send(dst, state_digest(arrays), "heal/digest")

    def _recv_state(self, src: int):
        arrays = [self.comm.recv(src, f"heal/{i}") for i in range(len(self._state()))]
        return arrays, self.comm.recv(src, "heal/digest")

    # --- liveness ------------------------------------------------------------------------
    def _heartbeat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self._client.call("Heartbeat", 5 * interval)
            except CollectiveError:
                pass  # the Lighthouse is away: the quorum call will say so

    def close(self) -> None:
        """Leave: stop heartbeating, tell the Lighthouse, close the communicator."""
        self._stop.set()
        self._beats.join(2)
        self._executor.shutdown(wait=False, cancel_futures=True)
        try:
            self._client.call("Heartbeat", 1.0, leaving=True)
        except CollectiveError:
            pass
        if self.comm is not None:
            self.comm.close(drain=0.5)
        self._client.close()
