"""The timeline of a real run as a browser widget: hover a message for its step, chunk, bytes and
times. Lessons 02 and 03.

    timeline(cluster.trace)            # the interactive picture (plays in exported pages too)
    timeline(trace).figure()           # the same as a static matplotlib Figure (plot_timeline)
    timeline(trace).to_png(path)       # ... written as a PNG
"""

from __future__ import annotations

from pathlib import Path

import traitlets

from ..trace import format_bytes
from .browser import HERE, BrowserWidget
from .frame import OTHER_COLOUR, PHASE_COLOURS, chunk_span
from .plots import PHASE_NAMES, plot_timeline

WAITING, TAKING = "#d9d9d9", "#555555"  # the same greys as plot_timeline's


class Timeline(BrowserWidget):
    """Per-rank lanes of a trace's sends and receives, drawn in the browser with hover details."""

    _esm = HERE / "timeline.js"
    _standalone_traits = ("data",)
    data = traitlets.Dict().tag(sync=True)

    def __init__(self, trace):
        self.trace = trace
        super().__init__(data=timeline_data(trace))

    def __repr__(self) -> str:
        return f"Timeline({self.data['title']!r})"

    def figure(self):
        """The same timeline as a static matplotlib Figure (for papers and slides)."""
        return plot_timeline(self.trace)

    def to_png(self, path) -> Path:
        """Write the static timeline as a PNG and return its path."""
        self.figure().savefig(path, dpi=150, bbox_inches="tight")
        return Path(path)


def timeline(trace) -> Timeline:
    """The interactive timeline of `trace` (a Cluster's `.trace`)."""
    return Timeline(trace)


def timeline_data(trace) -> dict:
    """What the browser draws: one bar per send and two per receive (waiting, taking in), in ms
    since the first message, each with the text its hover shows."""
    starts = [e.t_start for e in trace.events] + [r.t_start for r in trace.receives]
    t0 = min(starts, default=0.0)
    ms = lambda t: round((t - t0) * 1e3, 4)
    chunks = max((e.chunk[1] for e in trace.events if e.chunk is not None), default=1)
    bars = []
    for e in trace.events:
        bars.append({"rank": e.src, "kind": "send", "t0": ms(e.t_start), "t1": ms(e.t_end),
                     "colour": PHASE_COLOURS.get(e.tag, OTHER_COLOUR),
                     "detail": f"send rank {e.src} → rank {e.dst}\n{e.tag}, step {e.step}\n"
                               f"chunk {chunk_span(e.chunk, chunks)} · {format_bytes(e.nbytes)}\n"
                               f"{ms(e.t_start):.3f}–{ms(e.t_end):.3f} ms"})
    for r in trace.receives:
        arrived = min(max(r.t_arrived, r.t_start), r.t_end)
        head = (f"recv rank {r.dst} ← rank {r.src}\n{r.tag}, step {r.step} · "
                f"{format_bytes(r.nbytes)}")
        bars.append({"rank": r.dst, "kind": "wait", "t0": ms(r.t_start), "t1": ms(arrived),
                     "colour": WAITING,
                     "detail": f"{head}\nwaiting {ms(r.t_start):.3f}–{ms(arrived):.3f} ms"})
        bars.append({"rank": r.dst, "kind": "take", "t0": ms(arrived), "t1": ms(r.t_end),
                     "colour": TAKING,
                     "detail": f"{head}\ntaking in {ms(arrived):.3f}–{ms(r.t_end):.3f} ms"})
    ranks = sorted({e.src for e in trace.events} | {e.dst for e in trace.events}
                   | {r.dst for r in trace.receives})
    names = sorted({e.collective for e in trace.events if e.collective}) or ["trace"]
    span = max([b["t1"] for b in bars], default=0.0)
    tags = list(dict.fromkeys(e.tag for e in trace.events))
    legend = [[f"send: {PHASE_NAMES.get(t, t)}", PHASE_COLOURS.get(t, OTHER_COLOUR)] for t in tags]
    legend += [["recv: waiting", WAITING], ["recv: taking in", TAKING]]
    return {"title": f"{', '.join(names)}: {len(trace.events)} messages, "
                     f"{format_bytes(sum(e.nbytes for e in trace.events))} in {span:.2f} ms",
            "ranks": ranks, "bars": bars, "span_ms": span, "legend": legend}
