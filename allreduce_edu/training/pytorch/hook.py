"""A DDP communication hook: each gradient bucket all-reduced by the package's algorithms, over the
rank's own transport. Introduced in lessons/13_pytorch.

PyTorch DDP (Li et al., "PyTorch Distributed", 2020) groups gradients into buckets and, as each
bucket fills during backward, hands it to a communication hook
(`DistributedDataParallel.register_comm_hook`) that returns a `torch.futures.Future` of the
reduced bucket. DDP's default hook calls gloo's (or NCCL's) all_reduce; this one issues the
package's non-blocking all-reduce on the rank's communication thread (collectives/nonblocking.py)
and completes the future from there, so the bucket travels over gRPC or shared memory while
backward goes on. DDP keeps its gloo process group for its own set-up (broadcasting the initial
parameters); every gradient byte goes through our code and is in `comm.trace`.

    state = register(ddp_model, comm, algorithm="ring")   # any name in ALGORITHMS, or
                                                          # your fn(comm, x) -> sum over ranks
    state = register(ddp_model, comm, compress=PowerSGD(1))   # or any training.compress
                                                              # scheme: its mean of each bucket
"""

# no `from __future__ import annotations`: DDP checks the hook's return annotation itself
import threading

import numpy as np
import torch

from ...collectives import ALGORITHMS, CollectiveRequest, allreduce
from ...collectives.nonblocking import progress_of
from ...comm.base import Communicator
from ..compress import PowerSGD


class HookState:
    """What the hook needs on one rank: the communicator, the all-reduce to use, and a log of the
    buckets it reduced."""

    def __init__(self, comm, algorithm="ring", compress=None):
        self.comm = comm
        self.reduce, self.name = _reducer(comm, algorithm)
        # a compression scheme (training/compress/) averages each bucket instead, when given
        self.compress = _check_compress(comm, compress)
        if compress is not None:
            self.name = compress.name
        self.buckets: list[tuple[int, int]] = []  # (bucket index, bytes), in the order reduced
        self.requests: list[CollectiveRequest] = []  # the last backward's (for their times)
        # how long a bucket may take, queue included, before DDP is told it failed
        self.deadline = 4 * (comm.timeout if isinstance(comm, Communicator) else 30.0)

    def __repr__(self) -> str:
        return (f"HookState(rank {self.comm.rank}, {self.name}, "
                f"{len(self.buckets)} buckets reduced)")


def _reducer(comm, algorithm):
    """(fn(comm, x) -> the sum over ranks, its name) for an algorithm name or a function."""
    if callable(algorithm):
        return algorithm, getattr(algorithm, "__name__", "custom")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"rank {comm.rank}: unknown algorithm {algorithm!r} for the DDP hook; "
                         f"valid algorithms: {', '.join(ALGORITHMS)}")
    return (lambda c, x: allreduce(c, x, "sum", algorithm)), algorithm


def _check_compress(comm, scheme):
    """`scheme`, if DDP can run it: state kept per bucket must not start before DDP's rebuild."""
    if (isinstance(scheme, PowerSGD) and (scheme.error_feedback or scheme.warm_start)
            and scheme.start_powerSGD_iter < 2):
        raise ValueError(f"rank {comm.rank}: PowerSGD under DDP needs start_powerSGD_iter >= 2 "
                         f"with error feedback or warm start (got {scheme.start_powerSGD_iter}): "
                         f"DDP rebuilds its buckets after the first step, as torch's "
                         f"PowerSGDState says")
    return scheme


def allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's hook: start the sum all-reduce of `bucket`'s flat gradients on the communication
    thread; the future it returns is completed there with the average (sum / world_size), as
    DDP's default hook averages. DDP waits on it with no deadline of its own, so it gets one here:
    a bucket not reduced within `state.deadline` seconds fails, naming the rank and the bucket."""
    future = torch.futures.Future()
    # (bucket elements,) flat, copied now: the all-reduce runs later, on another thread
    grads = bucket.buffer().detach().numpy().copy()
    index, n = bucket.index(), state.comm.world_size
    shapes, last = [tuple(g.shape) for g in bucket.gradients()], bucket.is_last()
    once = threading.Lock()  # the first of result, error and deadline settles the future

    def settle(result=None, error=None) -> None:
        if once.acquire(blocking=False):
            timer.cancel()
            future.set_exception(error) if error is not None else future.set_result(result)

    def reduce_and_complete(comm, flat: np.ndarray) -> np.ndarray:
        # runs on the rank's communication thread, in the order the buckets were issued
        try:
            if state.compress is not None:  # the scheme's mean is the hook's result as it is
                total = np.asarray(state.compress.mean(comm, flat, shapes, index, last))
            else:
                total = np.asarray(state.reduce(comm, flat))
            if total.shape != flat.shape:
                raise ValueError(f"rank {comm.rank}: {state.name} returned shape {total.shape} "
                                 f"for a bucket of shape {flat.shape}; return the sum, same shape")
        except BaseException as e:  # DDP's wait() on the future raises it
            settle(error=RuntimeError(f"rank {comm.rank}: the DDP hook's {state.name} all-reduce "
                                      f"of bucket {index} failed: {type(e).__name__}: {e}"))
            raise
        mean = torch.from_numpy(total.astype(flat.dtype, copy=False))
        settle(mean if state.compress is not None else mean.div_(n))
        return total

    timer = threading.Timer(state.deadline, lambda: settle(error=RuntimeError(
        f"rank {state.comm.rank}: bucket {index} was not all-reduced by {state.name} within "
        f"{state.deadline:.0f} s")))
    timer.daemon = True
    timer.start()
    if index == 0:  # buckets go in index order, 0 first: a new backward begins
        state.requests = []
    state.buckets.append((index, grads.nbytes))
    try:
        progress = progress_of(state.comm)
        state.requests.append(progress.submit(CollectiveRequest(
            progress, f"allreduce/{state.name}", reduce_and_complete, (grads,))))
    except Exception as e:  # noqa: BLE001 - a closed communicator: DDP hears it at once
        settle(error=RuntimeError(f"rank {state.comm.rank}: bucket {index} could not be issued: "
                                  f"{type(e).__name__}: {e}"))
    return future


def register(model, comm, algorithm="ring", compress=None) -> HookState:
    """Make DDP `model` all-reduce its gradient buckets with `algorithm` over `comm`, or average
    them with the compression scheme `compress` (call before the first backward)."""
    state = HookState(comm, algorithm, compress)
    model.register_comm_hook(state, allreduce_hook)
    return state
