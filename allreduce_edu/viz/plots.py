"""Plots of real runs: a per-rank timeline, bus bandwidth vs size, and measurement vs the α-β model.
Lessons 03, 05.

Each returns a Figure that shows itself as exactly one PNG when it ends a notebook cell, with or
without pyplot.
"""

from __future__ import annotations

from collections import defaultdict
from io import BytesIO

import matplotlib.figure
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from ..collectives.registry import describe
from ..model.costmodel import predict
from ..trace import format_bytes
from .frame import OTHER_COLOUR, PHASE_COLOURS, chunk_span

# Okabe-Ito, one colour per algorithm, the same in every plot
PHASE_NAMES = {"reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}
WAITING, TAKING = "#d9d9d9", "#555555"  # a receive: waiting for the message, taking it in


def _colour(algorithm: str) -> str | None:
    """The algorithm's colour from its description (Okabe-Ito, the same in every plot); None:
    matplotlib's."""
    described = describe(algorithm)
    return described.colour if described else None


class Figure(matplotlib.figure.Figure):
    """A matplotlib Figure that Jupyter shows as one PNG even when pyplot's inline backend is not
    active."""

    def _repr_png_(self) -> bytes:
        buffer = BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight", metadata={"Software": None})
        return buffer.getvalue()


def _axes(ax, figsize):
    """(figure, axes): the given Axes' figure, or a new pyplot-free Figure."""
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def plot_timeline(trace, ax=None):
    """Per-rank Gantt chart of a run: sends above each rank's line (coloured by phase), recvs below,
    in ms (the static twin of `viz.timeline`, from the same `timeline_data`).

    A recv bar is light while the rank waits for the message and dark while it takes it in; white is
    idle.
    """
    data = timeline_data(trace)
    ranks = data["ranks"]
    fig, ax = _axes(ax, (7.2, 1.2 + 0.55 * max(len(ranks), 1)))
    lanes = defaultdict(list)  # (rank, kind, colour) -> [(start, width)]
    for bar in data["bars"]:
        width = bar["t1"] - bar["t0"]
        lanes[bar["rank"], bar["kind"], bar["colour"]].append(
            (bar["t0"], width if bar["kind"] == "wait" else max(width, 1e-3)))
    for (rank, kind, colour), bars in lanes.items():
        below = kind != "send"  # sends above the rank's line, receives below
        ax.broken_barh(bars, (rank + 0.04 if below else rank - 0.42, 0.38), facecolors=colour,
                       alpha=1.0 if below else 0.85)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks, default=0) + 0.6, -0.6)  # rank 0 on top
    ax.set_xlabel("time since the first message (ms)")
    ax.legend(handles=[Patch(color=colour, label=label) for label, colour in data["legend"]],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax.set_title(data["title"], fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return fig


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


def _by_algorithm(rows) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["bytes"]):
        if row["bytes"] > 0:  # a log axis has no place for 0 bytes
            groups[row["algorithm"]].append(row)
    return groups


def _size_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_bytes(x).replace(".0 ", " ")))
    ax.set_xlabel("message size per rank")
    ax.grid(alpha=0.3, which="both")


def _world(rows) -> str:
    sizes = sorted({r.get("world_size") for r in rows if r.get("world_size")})
    return f"{sizes[0]} ranks" if len(sizes) == 1 else "ranks"


def plot_bandwidth(bench_rows, ax=None):
    """Bus bandwidth (busbw) against message size, one line per algorithm (rows from
    `bench.run(...)[1]`)."""
    fig, ax = _axes(ax, (7.2, 4.2))
    for algorithm, rows in _by_algorithm(bench_rows).items():
        ax.plot([r["bytes"] for r in rows], [r["busbw_gbps"] for r in rows], marker="o",
                label=algorithm, color=_colour(algorithm))
    _size_axis(ax)
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"all-reduce bus bandwidth, {_world(bench_rows)}", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def plot_cost_model(rows, alpha: float, beta: float, ax=None, gamma: float = 0.0):
    """Measured time (dots) against the α-β(-γ) prediction (lines) per algorithm; alpha in s, beta
    in s/byte."""
    fig, ax = _axes(ax, (7.2, 4.2))
    for algorithm, group in _by_algorithm(rows).items():
        colour = _colour(algorithm)
        sizes = [r["bytes"] for r in group]
        ax.plot(sizes, [r["time_us"] for r in group], "o", color=colour,
                label=f"{algorithm} measured")
        grid = (np.geomspace(min(sizes), max(sizes), 64) if len(sizes) > 1
                else np.array(sizes, float))
        ax.plot(grid, [predict(algorithm, group[0]["world_size"], s, alpha, beta, gamma) * 1e6
                       for s in grid], "--", color=colour, label=f"{algorithm} model")
    _size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel("time per all-reduce (µs)")
    bandwidth = f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "∞"
    ax.set_title(f"measured vs α-β model, {_world(rows)}: α = {alpha * 1e6:.0f} µs, "
                 f"1/β = {bandwidth}", fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    return fig


def mark_crossovers(fig, crossovers: dict[str, float | None], ax=None):
    """Mark sizes on a size axis (a plot above): one vertical line per `label: bytes` (None is
    left out), in the legend. Returns the figure."""
    ax = ax if ax is not None else fig.axes[0]
    styles = (":", "-.", "--", "-")
    for k, (label, nbytes) in enumerate(crossovers.items()):
        if nbytes is not None:
            ax.axvline(nbytes, color="black", linestyle=styles[k % 4], linewidth=1, alpha=0.7,
                       label=f"{label}: {format_bytes(nbytes)}")
    ax.legend(fontsize=7, ncols=2)
    return fig
