"""Animation widgets over a replayed trace: ring, tree/hypercube and star views share one base.
Lesson 03.

The widget only draws what `allreduce_edu.replay.replay` computes from the recorded messages, so the
picture is what happened on the wire. Frames are PNG bytes in an `ipywidgets.Image` (nbval-clean);
callback errors are written into the widget's `Output`.
"""

from __future__ import annotations

import base64
import math
import traceback
from pathlib import Path
from tempfile import TemporaryDirectory

import ipywidgets as widgets
from matplotlib.animation import FuncAnimation, HTMLWriter, PillowWriter

from ..collectives.registry import describe
from ..replay import replay
from .frame import Frame, fit_boxes, new_figure, png_bytes


class StepAnimation(widgets.VBox):
    """Step through a trace: Play/Pause, ◀ step / step ▶, a step slider, speed, and symbols or
    numbers.

    Subclasses choose where ranks sit (`unit_layout`) and which faint links join them (`edges`).
    """

    def __init__(self, trace, world_size: int | None = None, values=None, *, op: str = "sum",
                 chunks=None, collective: str | None = None, width: str = "720px"):
        self.trace = trace
        self.states = replay(trace, world_size, chunks, values=values, op=op, collective=collective)
        self.world_size, self.chunks = len(self.states[0].held), len(self.states[0].held[0])
        names = [e.collective for e in trace.events if collective in (None, e.collective)]
        self.collective = names[0] if names else (collective or "")
        self.positions, self.box_w = fit_boxes(self.unit_layout(self.world_size), self.chunks)
        self._figure, self._ax = new_figure()
        self._frames: dict[tuple[int, str], bytes] = {}  # PNG per (step, mode)
        self._pictures: dict = {}  # Axes -> its Frame
        self._numbers = False  # whether draw_frame shows values (set per render by _draw)
        last = len(self.states) - 1

        self.speed = widgets.FloatSlider(value=1.5, min=0.5, max=6.0, step=0.5,
                                         description="steps/s",
                                         layout=widgets.Layout(width="260px"))
        self.play = widgets.Play(value=0, min=0, max=last, interval=int(1000 / self.speed.value),
                                 description="play", layout=widgets.Layout(width="auto"))
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="step",
                                        layout=widgets.Layout(width="260px"))
        # plays without the kernel
        self._link = widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.back = widgets.Button(description="◀ step", tooltip="previous step",
                                   layout=widgets.Layout(width="76px"))
        self.forward = widgets.Button(description="step ▶", tooltip="next step",
                                      layout=widgets.Layout(width="76px"))
        self.back.add_class("allreduce-step-back")
        self.forward.add_class("allreduce-step-forward")
        self.mode = widgets.ToggleButtons(options=["symbols", "numbers"], value="symbols",
                                          disabled=values is None,
                                          tooltips=["which ranks each chunk contains",
                                                    "the chunk's numbers (pass values= to enable)"],
                                          style={"button_width": "84px"})
        self.image = widgets.Image(format="png",
                                   layout=widgets.Layout(width=width, max_width="100%"))
        self.output = widgets.Output()  # tracebacks of failed callbacks land here

        self.slider.observe(self._safely(lambda change: self.show()), names="value")
        self.play.observe(self._safely(lambda change: setattr(self.slider, "value", change["new"])),
                          names="value")
        self.mode.observe(self._safely(lambda change: self.show()), names="value")
        self.speed.observe(self._safely(lambda change: setattr(self.play, "interval",
                                                               int(1000 / change["new"]))),
                           names="value")
        self.back.on_click(self._safely(lambda button: self.step_by(-1)))
        self.forward.on_click(self._safely(lambda button: self.step_by(+1)))
        super().__init__([widgets.HBox([self.play, self.back, self.forward, self.slider]),
                          widgets.HBox([self.speed, self.mode]), self.image, self.output])
        self.show()

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

    def edges(self) -> list[tuple[int, int]]:
        """Faint links between ranks drawn behind the boxes (the topology)."""
        return []

    def draw_frame(self, ax, state) -> None:
        """Draw one State on `ax` (its artists are built on the first call, then only restyled)."""
        if ax not in self._pictures:
            self._pictures[ax] = Frame(ax, self.world_size, self.chunks, self.positions, self.box_w,
                                       self.edges(), title=f"{self.collective or 'trace'}, "
                                                           f"{self.world_size} ranks")
        self._pictures[ax].show(state, numbers=self._numbers)

    # --- stepping -------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.slider.value

    def step_by(self, delta: int) -> None:
        """Move `delta` steps, staying within the trace."""
        self.slider.value = min(max(self.slider.value + delta, 0), self.slider.max)

    def show(self) -> None:
        """Put the current step's frame into the Image."""
        self.image.value = self.frame(self.slider.value)

    def frame(self, index: int, mode: str | None = None) -> bytes:
        """The PNG of step `index` (rendered once, then cached)."""
        key = (index, mode or self.mode.value)
        if key not in self._frames:
            self._draw(self._ax, index, key[1])
            self._frames[key] = png_bytes(self._figure)
        return self._frames[key]

    def _draw(self, ax, index: int, mode: str) -> None:
        self._numbers = mode == "numbers"  # what draw_frame shows in the cells
        self.draw_frame(ax, self.states[index])

    def _safely(self, callback):
        """Wrap a widget callback so its exception shows in `self.output` instead of vanishing."""
        def run(*args):
            try:
                callback(*args)
            except Exception:  # noqa: BLE001 - shown to the learner, not swallowed
                self.output.append_stderr(traceback.format_exc())
        return run

    # --- static exports -------------------------------------------------------------------
    def _export(self, fps: float, mode: str, save) -> object:
        """Run `save(animation)` over a FuncAnimation of every step on a figure of its own."""
        fig, ax = new_figure()
        try:
            return save(FuncAnimation(fig, lambda i: self._draw(ax, i, mode),
                                      frames=len(self.states), interval=1000 / fps, repeat=True))
        finally:
            self._pictures.pop(ax, None)

    def to_html(self, fps: float = 1.5, mode: str = "symbols") -> str:
        """A self-contained HTML/JS animation (plays offline, on GitHub-rendered HTML exports and
        in Jupyter Book)."""
        with TemporaryDirectory() as scratch:
            path = Path(scratch, "animation.html")
            self._export(fps, mode,
                         lambda animation: animation.save(str(path), writer=_SmallFramesHTMLWriter(
                             fps=fps, embed_frames=True, default_mode="loop")))
            return path.read_text()

    def to_gif(self, path, fps: float = 1.5, mode: str = "symbols"):
        """Write the animation as a GIF (Pillow) and return its path."""
        self._export(fps, mode,
                     lambda animation: animation.save(str(path), writer=PillowWriter(fps=fps)))
        return path


class _SmallFramesHTMLWriter(HTMLWriter):
    """matplotlib's HTML/JS player, with frames as 128-colour PNGs (a third of the size, the same
    picture)."""

    def grab_frame(self, **savefig_kwargs):
        self._saved_frames.append(base64.encodebytes(png_bytes(self.fig)).decode("ascii"))


class RingAnimation(StepAnimation):
    """Ranks on a circle, rank 0 at the top, clockwise: ring, all-gather, reduce-scatter and custom
    algorithms."""

    def unit_layout(self, world_size):
        if world_size == 1:
            return [(0.0, 0.0)]
        return [(math.sin(2 * math.pi * r / world_size), math.cos(2 * math.pi * r / world_size))
                for r in range(world_size)]

    def edges(self):
        n = self.world_size
        return [(r, (r + 1) % n) for r in range(n)] if n > 1 else []


class NaiveAnimation(StepAnimation):
    """A star: rank 0 in the middle, the others around it (naive and all-to-all)."""

    def unit_layout(self, world_size):
        around = world_size - 1
        return [(0.0, 0.0)] + [(math.sin(2 * math.pi * k / around),
                                math.cos(2 * math.pi * k / around)) for k in range(around)]

    def edges(self):
        return [(0, r) for r in range(1, self.world_size)]


class TreeAnimation(StepAnimation):
    """Ranks in rows by the number of 1-bits in their rank: a binomial tree (tree) or a hypercube
    (recursive).

    In a world that is not a power of two, the recursive algorithms' folded-away ranks sit in a
    bottom row.
    """

    @property
    def _hypercube(self) -> bool:
        algorithm = describe(self.collective)
        return algorithm is not None and algorithm.layout == "hypercube"

    def _participants(self):
        """(p, map from a rank among the p to its real rank, the ranks that sit out)."""
        n = self.world_size
        if not self._hypercube:
            return n, list(range(n)), []
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        return (p, [2 * k + 1 if k < extra else k + extra for k in range(p)],
                [2 * k for k in range(extra)])

    def unit_layout(self, world_size):
        p, real, sitting_out = self._participants()
        rows: list[list[int]] = [[] for _ in range(p.bit_length())]
        for v in range(p):
            rows[bin(v).count("1")].append(v)
        rows = [row for row in rows if row]
        widest, levels = (max(len(row) for row in rows + [sitting_out]),
                          len(rows) + bool(sitting_out))
        u: dict[int, float] = {}
        # each rank under its parent (v without its lowest 1-bit), so few links cross
        for row in rows:
            row.sort(key=lambda v: (u.get(v & (v - 1), 0.0), v))
            u.update(_spread(row, widest))
        unit = {real[v]: (u[v], _level(i, levels)) for i, row in enumerate(rows) for v in row}
        if sitting_out:  # below, in the order of their partners
            row = sorted(sitting_out, key=lambda r: unit[r + 1][0])
            unit.update({r: (x, -1.0) for r, x in _spread(row, widest).items()})
        return [unit[r] for r in range(world_size)]

    def edges(self):
        p, real, sitting_out = self._participants()
        if not self._hypercube:
            return [(v, v & (v - 1)) for v in range(1, p)]
        links = [(real[v], real[v ^ (1 << s)])
                 for v in range(p) for s in range(p.bit_length() - 1) if v < v ^ (1 << s)]
        return links + [(r, r + 1) for r in sitting_out]


def _level(i: int, levels: int) -> float:
    return 1 - 2 * i / (levels - 1) if levels > 1 else 0.0


def _spread(row: list[int], widest: int) -> dict[int, float]:
    """Evenly spaced u positions for a row, centred, with the widest row spanning [-1, 1]."""
    gap = 2 / (widest - 1) if widest > 1 else 0.0
    return {v: (j - (len(row) - 1) / 2) * gap for j, v in enumerate(row)}


def animate(source, values=None, **kwargs) -> StepAnimation:
    """The right animation for a Cluster (its last run) or a Trace: the layout its algorithm's
    description gives."""
    trace, world_size = ((source.trace, source.world_size) if hasattr(source, "world_size")
                         else (source, None))
    names = {e.collective for e in trace.events}
    name = kwargs.get("collective") or (names.pop() if len(names) == 1 else "")
    algorithm = describe(name)
    cls = LAYOUTS[algorithm.layout if algorithm else "ring"]
    return cls(trace, world_size, values, **kwargs)


LAYOUTS = {"ring": RingAnimation, "star": NaiveAnimation, "tree": TreeAnimation,
           "hypercube": TreeAnimation}
