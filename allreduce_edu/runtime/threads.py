"""Ranks as threads of this process, over the local transport:
instant traces for animations and tests."""

from __future__ import annotations

import io
import queue
import sys
import threading

from ..comm.errors import CollectiveAborted, CollectiveError
from ..comm.transports.local import LocalWorld
from .shipping import ship
from .worker import Report, execute


class ThreadRanks:
    """One thread per rank in this process, over the local transport."""

    def __init__(self, world_size: int, timeout: float, links=None):
        self.world = LocalWorld(world_size, timeout)
        for comm in self.world.comms:
            comm.use_links(links)
        self.addresses = [f"local:{rank}" for rank in range(world_size)]
        self._reports: queue.SimpleQueue = queue.SimpleQueue()
        self._router: _OutputRouter | None = None

    def submit(self, run_id: int, fn, args, kwargs) -> None:
        payload = ship(fn, args, kwargs)  # the same by-value semantics as processes
        self._router = _OutputRouter.install()
        # before any thread starts: an abort that follows must not be undone
        for comm in self.world.comms:
            comm.begin_run(run_id)
        for comm in self.world.comms:
            threading.Thread(target=self._run, args=(comm, run_id, payload),
                             name=f"local-rank{comm.rank}", daemon=True).start()

    def _run(self, comm, run_id, payload) -> None:
        output = io.StringIO()
        self._router.buffers[threading.get_ident()] = output
        try:
            self._reports.put(execute(comm, run_id, payload, output))
        finally:
            self._router.buffers.pop(threading.get_ident(), None)

    def finish(self) -> None:
        if self._router is not None:
            self._router.uninstall()

    def wait(self, timeout: float, run_id: int) -> list[Report]:
        reports = []
        try:
            reports.append(self._reports.get(timeout=timeout))
            while True:
                reports.append(self._reports.get_nowait())
        except queue.Empty:
            pass
        return [r for r in reports if r.run_id == run_id]

    def abort(self, error: CollectiveError) -> None:
        for comm in self.world.comms:
            comm.abort(error)

    def kill(self, ranks) -> None:
        """A thread cannot be killed: a rank that stopped answering runs on, detached."""

    def close(self) -> None:
        self.abort(CollectiveAborted("the cluster was closed"))
        for comm in self.world.comms:  # ends their communication threads, if any
            comm.close()


class _OutputRouter(io.TextIOBase):
    """sys.stdout for thread ranks:
    each rank thread writes to its own buffer, others pass through."""

    def __init__(self, fallback):
        self.fallback, self.buffers = fallback, {}

    @classmethod
    def install(cls) -> _OutputRouter:
        if not isinstance(sys.stdout, cls):
            sys.stdout = cls(sys.stdout)
        return sys.stdout

    def uninstall(self) -> None:
        if sys.stdout is self:
            sys.stdout = self.fallback

    def write(self, text: str) -> int:
        return self.buffers.get(threading.get_ident(), self.fallback).write(text)

    def flush(self) -> None:
        self.fallback.flush()
