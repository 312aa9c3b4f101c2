"""Message traces: every logical send, recorded by the sender, merged across ranks.
Introduced in lessons/01."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


# Plain records with slots, not frozen ones: every message builds one on each side, and a frozen
# dataclass's constructor (a setattr per field) cost 1 us of an 8-byte message's 17 here.
@dataclass(slots=True)
class Event:
    """One logical send: `nbytes` from `src` to `dst` at algorithm `step`, timed on the sender."""

    src: int
    dst: int
    tag: str  # the phase, e.g. "reduce_scatter", "all_gather", "reduce", "broadcast"
    step: int  # step within the phase, -1 for a plain send
    nbytes: int
    t_start: float  # time.perf_counter() when the send began (one clock per machine)
    t_end: float  # ... and when on its way (copied out of the sender's array: sends are eager)
    # display chunks [lo, hi) the payload covers; None = whole buffer
    chunk: tuple[int, int] | None = None
    collective: str = ""  # e.g. "allreduce/ring"
    via: str = ""  # the transport that carried it: "grpc", "shm", "local", "mpi", ...

    def __str__(self) -> str:
        lo, hi = self.chunk or (0, 0)
        where = ("whole" if self.chunk is None else f"chunk {lo}" if hi == lo + 1
                 else f"chunks {lo}-{hi - 1}")
        return (f"{self.tag:<15} step {self.step:>2} | rank {self.src} → {self.dst} | "
                f"{where:<11} | {format_bytes(self.nbytes)}")


@dataclass(slots=True)
class Receive:
    """One completed recv on rank `dst`: called at `t_start`, message arrived at `t_arrived`,
    returned at `t_end`."""

    dst: int
    src: int
    tag: str
    step: int
    nbytes: int
    t_start: float
    t_arrived: float
    t_end: float


class Trace:
    """The events of one run, in send order; `str(trace)` prints one line per message.

    A rank keeps at most MAX_EVENTS sends (and as many receives) per run and counts the rest in
    `dropped`, so a long training loop cannot grow its memory without bound.
    """

    MAX_EVENTS = 100_000

    def __init__(self, events=(), receives=(), dropped: int = 0):
        self.events: list[Event] = list(events)  # sends, as recorded by their senders
        # recvs, as recorded by their receivers (for timelines)
        self.receives: list[Receive] = list(receives)
        self.dropped = dropped  # sends and receives not recorded because the trace was full
        self._lock = threading.Lock()

    def record(self, event: Event) -> None:
        with self._lock:
            if len(self.events) < self.MAX_EVENTS:
                self.events.append(event)
            else:
                self.dropped += 1

    def __getstate__(self):
        return {"events": self.events, "receives": self.receives, "dropped": self.dropped}

    def __setstate__(self, state):
        self.events, self.receives = state["events"], state["receives"]
        self.dropped, self._lock = state.get("dropped", 0), threading.Lock()

    def record_receive(self, receive: Receive) -> None:
        with self._lock:
            if len(self.receives) < self.MAX_EVENTS:
                self.receives.append(receive)
            else:
                self.dropped += 1

    def clear(self) -> None:
        with self._lock:
            self.events.clear()
            self.receives.clear()
            self.dropped = 0

    @classmethod
    def merge(cls, traces) -> Trace:
        """One trace of all ranks' events, ordered by start time."""
        traces = list(traces)
        return cls(sorted((e for t in traces for e in t.events), key=lambda e: (e.t_start, e.src)),
                   sorted((r for t in traces for r in t.receives),
                          key=lambda r: (r.t_start, r.dst)),
                   sum(t.dropped for t in traces))

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self):
        return iter(self.events)

    def bytes_sent(self) -> dict[int, int]:
        """Bytes each rank sent, by rank."""
        sent = Counter()
        for e in self.events:
            sent[e.src] += e.nbytes
        return dict(sorted(sent.items()))

    def messages_sent(self) -> dict[int, int]:
        """Messages each rank sent, by rank."""
        return dict(sorted(Counter(e.src for e in self.events).items()))

    def steps(self) -> dict[str, int]:
        """Number of steps in each phase (tag), in the order the phases first appear."""
        steps: dict[str, int] = {}
        for e in sorted(self.events, key=lambda e: e.t_start):
            steps[e.tag] = max(steps.get(e.tag, 0), e.step + 1)
        return steps

    def table(self) -> str:
        """One line per message, grouped by phase and step:
        `reduce_scatter step 1 | rank 1 → 2 | chunk 3 | 4.0 MiB`."""
        phase_order = {tag: i for i, tag in enumerate(self.steps())}
        events = sorted(self.events, key=lambda e: (phase_order[e.tag], e.step, e.src))
        return "\n".join(str(e) for e in events)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        more = f", {self.dropped} more not recorded (trace full)" if self.dropped else ""
        return (f"Trace({len(self.events)} messages, "
                f"{format_bytes(sum(e.nbytes for e in self.events))}, "
                f"steps {self.steps()}{more})")

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write Chrome trace-event JSON (open in https://ui.perfetto.dev):
        a process per rank, its sends and recvs."""
        t0 = min([e.t_start for e in self.events] + [r.t_start for r in self.receives], default=0.0)
        us = lambda t: round((t - t0) * 1e6, 3)  # microseconds since the first message
        ranks = sorted({e.src for e in self.events} | {e.dst for e in self.events}
                       | {r.dst for r in self.receives})
        events = [{"name": name, "ph": "M", "pid": r, "tid": 0, "args": args} for r in ranks
                  for name, args in (("process_name", {"name": f"rank {r}"}),
                                     ("process_sort_index", {"sort_index": r}))]
        # overlapping slices must go to separate threads
        lanes: dict[tuple[int, str], list[float]] = {}

        def lane(rank: int, kind: str, start: float, end: float) -> int:
            # when each lane of this rank's sends (recvs) is free again
            ends = lanes.setdefault((rank, kind), [])
            free = next((i for i, busy_until in enumerate(ends) if busy_until <= start), len(ends))
            ends[free:free + 1] = [end]
            return free + (0 if kind == "send" else 1000)

        for e in sorted(self.events, key=lambda e: e.t_start):
            events.append({"name": f"{e.tag} → {e.dst}", "cat": e.collective or "p2p", "ph": "X",
                           "pid": e.src, "tid": lane(e.src, "send", e.t_start, e.t_end),
                           "ts": us(e.t_start),
                           "dur": max(round(us(e.t_end) - us(e.t_start), 3), 0.0),
                           "args": {"src": e.src, "dst": e.dst, "step": e.step, "nbytes": e.nbytes,
                                    "chunk": list(e.chunk) if e.chunk else None,
                                    "via": e.via}})
        for r in sorted(self.receives, key=lambda r: r.t_start):
            waited = round(max(r.t_arrived - r.t_start, 0.0) * 1e6, 3)
            events.append({"name": f"recv {r.tag} ← {r.src}", "cat": "recv", "ph": "X",
                           "pid": r.dst, "tid": lane(r.dst, "recv", r.t_start, r.t_end),
                           "ts": us(r.t_start),
                           "dur": max(round(us(r.t_end) - us(r.t_start), 3), 0.0),
                           "args": {"src": r.src, "dst": r.dst, "step": r.step, "nbytes": r.nbytes,
                                    "waited_us": waited}})
        events += [{"name": "thread_name", "ph": "M", "pid": rank,
                    "tid": i + (0 if kind == "send" else 1000),
                    "args": {"name": kind if i == 0 else f"{kind} {i + 1}"}}
                   for (rank, kind), ends in sorted(lanes.items()) for i in range(len(ends))]
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return path


def format_bytes(n: float) -> str:
    """8 B, 1.5 KiB, 4.0 MiB: binary units, as nccl-tests and the lessons print them."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

