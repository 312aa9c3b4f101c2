"""Step animations over a replayed trace, drawn and played in the browser. Lesson 03.

Python replays the recorded messages once (`allreduce_edu.viz.replay.replay`) and hands every step's
state to a small ES module (steps.js) as data; Play, Pause, stepping, the slider, the speed and the
symbols/numbers switch then run in the browser with the kernel idle, and the same module plays
without any kernel in an exported page (`to_html`, the static site). The picture is what happened on
the wire. matplotlib draws the same states for stills (`frame`) and GIFs (`to_gif`).
"""

from __future__ import annotations

import matplotlib.colors
import numpy as np
import traitlets
from matplotlib.animation import FuncAnimation, PillowWriter

from ..trace import format_bytes
from .browser import HERE, BrowserWidget
from .frame import (
    CELL_H,
    FIGSIZE,
    OTHER_COLOUR,
    PHASE_COLOURS,
    Frame,
    chunk_name,
    chunk_span,
    count_colour,
    fit_boxes,
    new_figure,
    png_bytes,
)
from .replay import replay

PX_PER_INCH = 125  # the browser picture is the matplotlib frame's layout at 900 x 600 px
MODES = ("symbols", "numbers")
MAX_RANKS, MAX_CHUNKS = 12, 26  # beyond, boxes no longer fit the picture (and chunks run past z)


class StepAnimation(BrowserWidget):
    """Step through a trace: Play/Pause, ◀ step / step ▶, a step slider, speed, and symbols or
    numbers — all in the browser.

    `step`, `mode` and `speed` are synced traits: set them from Python and the picture follows.
    Subclasses choose where ranks sit (`unit_layout`) and which faint links join them (`edges`).
    """

    _esm = HERE / "steps.js"
    _standalone_traits = ("data", "step", "mode", "speed")
    data = traitlets.Dict().tag(sync=True)  # every step's state, made once by _browser_data
    step = traitlets.Int(0).tag(sync=True)  # 0 = before any message; len(states) - 1 = the end
    mode = traitlets.Unicode("symbols").tag(sync=True)
    speed = traitlets.Float(1.5).tag(sync=True)  # steps per second when playing
    directed = False  # whether the topology's links have one direction (the ring's do)

    def __init__(self, trace, world_size: int | None = None, values=None, *, op: str = "sum",
                 chunks=None, collective: str | None = None):
        self.trace = trace
        self._made_with = (world_size, values, dict(op=op, chunks=chunks, collective=collective))
        self.states = replay(trace, world_size, chunks, values=values, op=op, collective=collective)
        self.world_size, self.chunks = len(self.states[0].held), len(self.states[0].held[0])
        if self.world_size > MAX_RANKS or self.chunks > MAX_CHUNKS:
            raise ValueError(f"an animation draws at most {MAX_RANKS} ranks and {MAX_CHUNKS} "
                             f"chunks legibly; this trace has {self.world_size} ranks and "
                             f"{self.chunks} chunks: animate a smaller run (the algorithm is "
                             f"the same), or look at timeline(trace)")
        names = [e.collective for e in trace.events if collective in (None, e.collective)]
        self.collective = names[0] if names else (collective or "")
        self.has_values = values is not None
        self.positions, self.box_w = fit_boxes(self.unit_layout(self.world_size), self.chunks)
        self._figure = self._ax = None  # matplotlib, made by the first frame() or export
        self._frames: dict[tuple[int, str], bytes] = {}  # PNG per (step, mode)
        self._pictures: dict = {}  # Axes -> its Frame
        self._numbers = False  # whether draw_frame shows values (set per render by _draw)
        super().__init__(data=self._browser_data())

    @classmethod
    def from_trace(cls, trace, world_size: int | None = None, values=None,
                   **kwargs) -> StepAnimation:
        """Animate a Trace (from `cluster.trace`, local or gRPC); values: each rank's input, for
        numbers."""
        return cls(trace, world_size, values, **kwargs)

    @classmethod
    def from_cluster(cls, cluster, values=None, **kwargs) -> StepAnimation:
        """Animate the last `cluster.run` (one collective per run)."""
        return cls(cluster.trace, cluster.world_size, values, **kwargs)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.collective or 'trace'!r}, "
                f"world_size={self.world_size}, steps={len(self.states) - 1})")

    # --- what subclasses choose -----------------------------------------------------------
    def unit_layout(self, world_size: int) -> list[tuple[float, float]]:
        """Where each rank's box sits, in [-1, 1]²."""
        raise NotImplementedError

    def edges(self) -> list[tuple]:
        """Faint links between ranks drawn behind the boxes (the topology): (a, b), or (a, b,
        colour) for a link drawn in its own colour (the double binary tree's two trees)."""
        return []

    # --- stepping -------------------------------------------------------------------------
    @traitlets.validate("step")
    def _clamp(self, proposal) -> int:
        return min(max(int(proposal["value"]), 0), len(self.states) - 1)

    @traitlets.validate("mode")
    def _known_mode(self, proposal) -> str:
        mode = proposal["value"]
        if mode not in MODES:
            raise traitlets.TraitError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "numbers" and not self.has_values:
            raise traitlets.TraitError("numbers need each rank's input: pass values= to the "
                                       "animation")
        return mode

    @traitlets.validate("speed")
    def _positive_speed(self, proposal) -> float:
        if not 0.1 <= proposal["value"] <= 30:
            raise traitlets.TraitError(f"speed is steps per second, 0.1 to 30; got "
                                       f"{proposal['value']}")
        return float(proposal["value"])

    def at(self, step: int) -> StepAnimation:
        """Another view of the same run, showing `step` (a still you can still play)."""
        world_size, values, options = self._made_with
        made = next(c for c in type(self).__mro__ if "_esm" not in vars(c))  # not anywidget's own
        view = made(self.trace, world_size, values, **options)
        view.step = step
        return view

    def step_by(self, delta: int) -> None:
        """Move `delta` steps, staying within the trace (the browser picture follows)."""
        self.step = self.step + delta

    # --- the data the browser draws -------------------------------------------------------
    def _browser_data(self) -> dict:
        n, chunks = self.world_size, self.chunks
        hexes = [matplotlib.colors.to_hex(count_colour(k, n)) for k in range(1, n + 1)]
        note = ("yellow: every rank's data, finished · outlined: changed this step"
                + (" · the ring turns along the arrows" if self.directed else ""))
        return {"title": f"{self.collective or 'trace'}, {n} ranks", "world_size": n,
                "chunks": chunks, "width": round(FIGSIZE[0] * PX_PER_INCH),
                "height": round(FIGSIZE[1] * PX_PER_INCH),
                "ranks": [{"x": round(x * PX_PER_INCH, 1),
                           "y": round((FIGSIZE[1] - y) * PX_PER_INCH, 1)}
                          for x, y in self.positions],
                "box_w": round(self.box_w * PX_PER_INCH, 1), "cell_h": round(CELL_H * PX_PER_INCH),
                "edges": [list(e) for e in self.edges()], "directed": self.directed,
                "colours": hexes, "phase_colours": PHASE_COLOURS, "other_colour": OTHER_COLOUR,
                "chunk_names": [chunk_name(c, chunks) for c in range(chunks)],
                "has_values": self.has_values, "key_note": note,
                "steps": [self._step_data(state) for state in self.states]}

    def _step_data(self, state) -> dict:
        moved = len(state.messages)
        if state.index == 0:
            readout = "start"
            sub = ("press ▶ play, or step with step ▶"
                   + ("; messages travel the ring along its arrows" if self.directed else ""))
        else:
            readout = f"{state.phase.replace('_', '-')} step {state.step}"
            sub = (f"{moved} message{'s' * (moved != 1)}: tag '{state.phase}', step={state.step} "
                   f"in the trace · sent so far: "
                   + "  ".join(f"r{r} {format_bytes(b)}" for r, b in enumerate(state.sent)))
        return {"caption": state.caption, "readout": readout, "subcaption": sub,
                "held": [[sorted(ranks) for ranks in row] for row in state.held],
                "values": (None if state.values is None else
                           [[_numbers_text(v) for v in row] for row in state.values]),
                "messages": [self._message_data(e) for e in state.messages]}

    def _message_data(self, e) -> dict:
        # a run that wraps past the last chunk (lo < 0) leaves from the whole box
        lo, hi = e.chunk if e.chunk is not None and e.chunk[0] >= 0 else (0, self.chunks)
        span, size = chunk_span(e.chunk, self.chunks), format_bytes(e.nbytes)
        return {"src": e.src, "dst": e.dst, "lo": lo, "hi": hi, "tag": e.tag, "step": e.step,
                "nbytes": e.nbytes, "label": f"{span} · {size}",
                "detail": f"rank {e.src} → rank {e.dst}\n{e.tag}, step {e.step}\n"
                          f"chunk {span}\n{size}"}

    # --- stills and GIFs, drawn by matplotlib ---------------------------------------------
    def draw_frame(self, ax, state) -> None:
        """Draw one State on `ax` (its artists are built on the first call, then only restyled)."""
        if ax not in self._pictures:
            self._pictures[ax] = Frame(ax, self.world_size, self.chunks, self.positions, self.box_w,
                                       self.edges(), title=f"{self.collective or 'trace'}, "
                                                           f"{self.world_size} ranks")
        self._pictures[ax].show(state, numbers=self._numbers)

    def frame(self, index: int, mode: str | None = None) -> bytes:
        """The PNG of step `index` (rendered once, then cached)."""
        key = (index, mode or self.mode)
        if key not in self._frames:
            if self._figure is None:
                self._figure, self._ax = new_figure()
            self._draw(self._ax, index, key[1])
            self._frames[key] = png_bytes(self._figure)
        return self._frames[key]

    def _draw(self, ax, index: int, mode: str) -> None:
        self._numbers = mode == "numbers"  # what draw_frame shows in the cells
        self.draw_frame(ax, self.states[index])

    def to_gif(self, path, fps: float = 1.5, mode: str = "symbols"):
        """Write the animation as a GIF (Pillow, one frame per step) and return its path."""
        fig, ax = new_figure()
        try:
            FuncAnimation(fig, lambda i: self._draw(ax, i, mode), frames=len(self.states),
                          interval=1000 / fps).save(str(path), writer=PillowWriter(fps=fps))
        finally:
            self._pictures.pop(ax, None)
        return path


def _numbers_text(value) -> str:
    """A chunk's numbers as the cell shows them: '3, 4.5, 6, …' (the browser shortens to fit)."""
    flat = np.asarray(value).reshape(-1)
    if not flat.size:
        return "∅"
    return ", ".join([f"{v:.4g}" for v in flat[:6]] + ["…"] * (flat.size > 6))
