"""The Communicator: the one seam between algorithms and transports. Introduced in lessons/01."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import numpy as np

from ..trace import Receive, Trace
from .calls import Calls
from .contract import Comm
from .courier import Courier
from .dtypes import WIRE_DTYPES, as_shape, check_array  # noqa: F401 - where callers found them
from .errors import CollectiveError, CollectiveTimeout
from .mailbox import ACKNOWLEDGED, SYNCHRONOUS, Mailbox, Message, signature
from .progress import Progress
from .request import Request, check_timeout


class InFlight(Request):
    """A send on an in-flight link (model/links.py): its bytes have left, and the rank's courier
    posts the message when it arrives; `wait()` returns once it is posted and on its way."""

    def __init__(self, comm: Communicator, dst: int, tag: str, nbytes: int, step: int, chunk):
        super().__init__(comm, dst, tag, nbytes, step, chunk)
        self._posted, self._request, self._error, self._chunk = threading.Event(), None, None, chunk

    def post(self, msg: Message) -> None:
        """On the courier's thread: hand the message to the transport; keep what goes wrong."""
        try:
            self._request = self.comm._post(self.dst, msg, self._chunk)
            self.via = self._request.via
        except BaseException as error:  # noqa: BLE001 - raised by wait(), on the rank's own thread
            self._error = error
        finally:
            self._posted.set()

    def _wait(self, deadline: float) -> None:
        if not self._posted.wait(max(0.0, deadline - time.monotonic())):
            raise CollectiveTimeout(f"rank {self.comm.rank}: its message {self.tag!r} to rank "
                                    f"{self.dst} was still in flight at its deadline",
                                    ranks=(self.dst,))
        if self._error is not None:
            raise self._error
        self._request._wait(deadline)


class Communicator(Comm):
    """What an algorithm sees of the world: its `rank`, the `world_size`,
    and send/recv between ranks (the contract: comm.contract.Comm).

    Transports implement `_post` (start moving a message to `dst`) and hand arriving messages to
    `deliver`; everything else is shared. Each collective call's state is its own
    (comm.calls.CollectiveCall), so threads of one rank never mix theirs.
    """

    transport = "local"  # what carries its messages (each Request may say otherwise)
    engine = ""  # the engine under it ("mpi", "gloo"), whose own all-reduce is builtin_allreduce
    builtin_allreduce = None  # that engine's all-reduce(x, op); None: no engine of its own

    def __init__(self, rank: int, world_size: int, timeout: float = 30.0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside the world (world_size={world_size})")
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.trace = Trace()
        self.mailbox = Mailbox(rank, world_size)
        self.epoch = 0
        self._calls = Calls()
        self._synchronous = itertools.count(1)  # numbers this rank's synchronous sends
        self._progress: Progress | None = None  # the communication thread, once one is asked for
        self._progress_lock = threading.Lock()
        self._courier: Courier | None = None  # posts the messages of in-flight links
        # emulated links (allreduce_edu.model.links): delay each send as its link would
        self.links = None
        self.ranks_per_node: int | None = None  # consecutive ranks that share a node; None: unknown

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"

    def use_links(self, links) -> None:
        """Delay every send as the emulated `links` would (None: no delay); their nodes are ours."""
        self.links = links
        self.ranks_per_node = links.ranks_per_node if links is not None else self.ranks_per_node

    # --- point to point -------------------------------------------------------------------
    def isend(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> Request:
        """Start sending `array` to rank `dst`; returns a Request to `wait()` on."""
        self.check_peer(dst, "dst")
        if not isinstance(tag, str):
            raise TypeError(f"rank {self.rank}: tag must be a string, got {tag!r}")
        if not -1 <= step < 1 << 20:
            raise ValueError(f"rank {self.rank}: step={step} is out of range "
                             f"(-1 for none, else 0 .. 2^20-1)")
        array = check_array(array)
        chunk = ((chunk, chunk + 1) if isinstance(chunk, (int, np.integer))
                 else (tuple(chunk) if chunk else None))
        call = self._calls.current()
        t_start = time.perf_counter()
        # the emulated link's time is part of the send; in flight, the message arrives later
        arrives = self.links.transmit(self.rank, dst, array.nbytes) if self.links else None
        msg = Message(self.rank, tag, array if arrives is None else array.copy(), self.epoch,
                      call.collective_id if call else 0, call.signature if call else None, step)
        if arrives is None:
            request = self._post(dst, msg, chunk)
        else:
            request = InFlight(self, dst, tag, array.nbytes, step, chunk)
            self._courier_thread().at(arrives, lambda: request.post(msg))
        request.t_start, request.collective = t_start, call.label if call else ""
        return request

    def send(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> None:
        """Send `array` to rank `dst`; returns once it is on its way (eager: your array is free)."""
        self.isend(dst, array, tag, step=step, chunk=chunk).wait()

    def issend(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> Request:
        """isend, synchronous (`MPI_Issend`): `wait()` returns once `dst`'s recv has taken it."""
        if SYNCHRONOUS in tag or ACKNOWLEDGED in tag:
            raise ValueError(f"rank {self.rank}: tag {tag!r} holds a reserved marker")
        number = next(self._synchronous)  # its receipt names it: two issends, two receipts
        request = self.isend(dst, array, f"{SYNCHRONOUS}{number}\x00{tag}", step=step,
                             chunk=chunk)
        call = self._calls.current()
        request.tag = tag
        request.synchronous = (self.epoch, call.collective_id if call else 0, number)
        return request

    def ssend(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> None:
        """send, synchronous (`MPI_Ssend`): returns once `dst` has received it; if every rank
        ssends first, each raises CollectiveTimeout at its deadline, naming its peer."""
        self.issend(dst, array, tag, step=step, chunk=chunk).wait()

    def await_receipt(self, request: Request, deadline: float) -> None:
        """Wait for the receipt of a synchronous send (its receiver's recv sends it back)."""
        epoch, collective_id, number = request.synchronous
        try:
            with self._receiving(request.dst):
                self.mailbox.take(request.dst, f"{ACKNOWLEDGED}{number}\x00{request.tag}", epoch,
                                   collective_id, None, deadline, self._pump(request.dst))
        except CollectiveTimeout:  # waiting_for, as in a recv: only inside a collective
            raise CollectiveTimeout(f"rank {self.rank}: rank {request.dst} did not take "
                                    f"{request.tag!r} ({request.nbytes} bytes) before the deadline "
                                    f"(a synchronous send)", ranks=(request.dst,),
                                    waiting_for=request.dst if collective_id else None) from None

    def recv(self, src: int, tag: str, timeout: float | None = None) -> np.ndarray:
        """Wait for the next array `src` sent with `tag`; raises instead of waiting forever."""
        self.check_peer(src, "src")
        if SYNCHRONOUS in tag or ACKNOWLEDGED in tag:
            raise ValueError(f"rank {self.rank}: tag {tag!r} holds a reserved marker")
        if timeout is not None:
            check_timeout(self.rank, timeout)
        t_start = time.perf_counter()
        call = self._calls.current()
        deadline = time.monotonic() + (timeout if timeout is not None
                                       else call.timeout if call else self.timeout)
        with self._receiving(src):
            msg = self.mailbox.take(src, tag, self.epoch, call.collective_id if call else 0,
                                     call.signature if call else None, deadline, self._pump(src))
        if msg.synchronous:  # an ssend waits for this receipt: an empty message back
            with contextlib.suppress(CollectiveError):  # a sender gone since: nobody waits
                self._post(src, Message(self.rank, f"{ACKNOWLEDGED}{msg.synchronous}\x00{tag}",
                                        np.empty(0, np.uint8), msg.epoch, msg.collective_id), None)
        self.trace.record_receive(Receive(self.rank, src, tag, msg.step, msg.array.nbytes, t_start,
                                          msg.t_arrived, time.perf_counter()))
        return msg.array

    def sendrecv(self, dst: int, array, src: int, tag: str, *, step: int = -1, chunk=None,
                 timeout: float | None = None) -> np.ndarray:
        """Send to `dst` while receiving from `src` (a ring step): full duplex, never deadlocks."""
        if timeout is not None:  # before the send: a refused recv must not leave it behind
            check_timeout(self.rank, timeout)
        request = self.isend(dst, array, tag, step=step, chunk=chunk)
        received = self.recv(src, tag, timeout)
        request.wait(timeout)
        return received

    def send_buffer(self, dst: int, shape, dtype) -> np.ndarray:
        """An empty array to fill and then send to `dst` (as NCCL's ranks write straight into the
        peer's buffer). Where the transport can, it lives where the message travels from (the
        shm transport: a shared segment), so sending it copies nothing. Once sent, it is the
        receiver's: do not write to it again."""
        return np.empty(shape, dtype)

    # --- collectives ----------------------------------------------------------------------
    @contextlib.contextmanager
    def collective(self, name: str, *, algorithm: str = "", op: str = "", dtype="", shape=(),
                   root: int = -1, space: int = 0):
        """Mark the messages this thread sends and receives inside as one collective call, so ranks
        that disagree on it fail loudly; yields the call (comm.calls.CollectiveCall). Nested calls
        (ring all-reduce calling reduce-scatter) belong to the outermost collective. `space` is
        the numbering a new call's id comes from: 0 the world's, a Group's its own."""
        call = self._calls.current()
        if call is not None:
            call.depth += 1
            try:
                yield call
            finally:
                call.depth -= 1
            return
        progress = self._progress  # non-blocking collectives first: ranks number calls in order
        if progress is not None and threading.current_thread() is not progress.thread:
            progress.drain()
        call = self._calls.open(signature(name, algorithm, op, dtype, as_shape(shape), root),
                                self.timeout, space)
        self.mailbox.discard_collectives_before(self.epoch, call.collective_id)
        try:
            yield call
        finally:
            self._calls.close()

    def current_call(self):
        """The calling thread's collective call (comm.calls.CollectiveCall), or None outside one."""
        return self._calls.current()

    def progress(self) -> Progress:
        """This rank's communication thread (comm.progress), started on first use."""
        with self._progress_lock:
            if self._progress is None:
                self._progress = Progress(self)
            return self._progress

    def _courier_thread(self) -> Courier:
        with self._progress_lock:
            if self._courier is None:
                self._courier = Courier(f"courier-{self.rank}")
            return self._courier

    def drain(self, report: bool = True) -> None:
        """Wait for every non-blocking collective this rank issued; raise the first error nobody
        waited for (comm.progress.Progress.drain)."""
        if self._progress is not None:
            self._progress.drain(report)

    # --- lifecycle (called by the Cluster) ------------------------------------------------
    def begin_run(self, epoch: int) -> None:
        """Start a fresh run: new epoch, empty trace, no abort pending."""
        self.epoch = epoch
        self._calls.reset()
        self.trace.clear()
        self.mailbox.reset(epoch)

    def abort(self, error: CollectiveError) -> None:
        """Stop every wait on this rank now by raising `error` in it."""
        self.mailbox.abort(error)

    def close(self) -> None:
        """Release the transport's resources (transports call this first)."""
        with self._progress_lock:
            progress, self._progress = self._progress, None
        if progress is not None:  # the communication thread of non-blocking collectives, whose
            progress.close()      # last sends may still need the courier
        with self._progress_lock:
            courier, self._courier = self._courier, None
        if courier is not None:  # messages still in flight are posted first
            courier.close()

    # --- for transports -------------------------------------------------------------------
    def deliver(self, msg: Message) -> None:
        """A whole message has arrived: into this rank's mailbox, where `recv` finds it."""
        self.mailbox.deliver(msg)

    def peer_failed(self, src: int, reason: str) -> None:
        """Peer `src` is gone: waits on it raise RankFailure instead of timing out."""
        self.mailbox.peer_failed(src, reason)

    def pending(self) -> int:
        """How many arrived messages wait unreceived (for tests and leak checks)."""
        return self.mailbox.pending()

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        raise NotImplementedError

    def _receiving(self, src: int) -> contextlib.AbstractContextManager:
        """Held while a recv from `src` waits (the gRPC communicator: its Link's `receiving`)."""
        return contextlib.nullcontext()

    def _pump(self, src: int):
        """How a recv from `src` waits: None (until another thread delivers), or a callable
        that reads the transport on the caller's thread (the shm transport: no thread hop)."""
        return None

    def check_peer(self, peer, what: str) -> None:
        """ValueError unless `peer` is a rank of this world."""
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise ValueError(f"rank {self.rank}: {what}={peer!r} is not a rank of this world "
                             f"(valid: 0..{self.world_size - 1})")
