"""A send in flight, as `isend` returns it (MPI's `MPI_Request`). Introduced in lessons/01."""

from __future__ import annotations

import math
import numbers
import time

from ..trace import Event


def check_timeout(rank: int, timeout) -> None:
    """ValueError unless `timeout` is None or finite seconds ≥ 0 (`inf` overflows a wait)."""
    if timeout is not None and not (isinstance(timeout, numbers.Real)
                                    and 0 <= timeout < math.inf):
        raise ValueError(f"rank {rank}: timeout={timeout!r} is not a number of seconds "
                         f"(finite, 0 or more; None for the communicator's own)")


class Request:
    """A send in flight (as MPI's `Isend` returns): `wait()` returns once the data is on its way.

    Sends are eager, like MPI's for small messages: the data has been copied out of your array
    (into the peer's mailbox, or into the gRPC stream), so you may reuse the array; the peer may
    not hold it yet. `comm` is the sending Communicator (comm.base). An issend's request waits,
    besides, for the receiver's receipt (`synchronous` set; Communicator.await_receipt).
    """

    def __init__(self, comm, dst: int, tag: str, nbytes: int, step: int, chunk):
        self.comm, self._done, self.via = comm, False, comm.transport
        self.dst, self.tag, self.nbytes, self.step, self.chunk = dst, tag, nbytes, step, chunk
        self.t_start = time.perf_counter()
        self.collective = ""  # the collective it belongs to ("allreduce/ring"), set by isend
        self.synchronous = None  # issend: (epoch, collective id) of the receipt wait() waits for

    # transports override: block until the peer acknowledged
    def _wait(self, deadline: float) -> None:
        pass

    def wait(self, timeout: float | None = None) -> None:
        if self._done:
            return
        if timeout is not None:
            check_timeout(self.comm.rank, timeout)
        deadline = time.monotonic() + (self.comm.timeout if timeout is None else timeout)
        self._wait(deadline)
        if self.synchronous is not None:  # and until the receiver has taken it
            self.comm.await_receipt(self, deadline)
        self._done = True
        c = self.comm
        c.trace.record(Event(c.rank, self.dst, self.tag, self.step, self.nbytes, self.t_start,
                             time.perf_counter(), self.chunk, self.collective, self.via))
