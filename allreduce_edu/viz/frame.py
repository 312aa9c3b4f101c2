"""Picture one replayed State: rank boxes of chunk cells, the step's messages as arrows, a caption.
Lesson 03.

Pure matplotlib on a given Axes (no pyplot, no widgets). The Axes spans the whole figure and its
data units are inches, so text sizes and box sizes are predictable at every world size.
"""

from __future__ import annotations

import string
from io import BytesIO

import matplotlib
import numpy as np
import PIL.Image
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PatchCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..trace import format_bytes
from .outline import Writer, outline

FIGSIZE, DPI = (7.2, 4.8), 100  # 720 x 480 px: fits a notebook column
CAPTION_H, LEGEND_H = 0.62, 0.36  # inches at the top and bottom
CELL_H, MAX_CELL_W, MAX_BOX_W = 0.34, 0.62, 2.6
# how far a rank's box reaches above (title) and below (marks) its cells' centre
BOX_ABOVE, BOX_BELOW = 0.36, 0.26
CMAP = matplotlib.colormaps["viridis"]  # colour-blind safe, readable in greyscale
MARKS = ("#dddddd", "#333333")  # under a cell, per rank: grey = not (yet) in it, dark = included
# Okabe-Ito colours: reductions vermillion, gathers and broadcasts blue, swaps green
PHASE_COLOURS = {"fold": "#D55E00", "reduce_scatter": "#D55E00", "reduce": "#D55E00",
                 "exchange": "#009E73",
                 "all_gather": "#0072B2", "broadcast": "#0072B2", "unfold": "#0072B2"}
OTHER_COLOUR = "#CC79A7"


def new_figure() -> tuple[Figure, matplotlib.axes.Axes]:
    """A pyplot-free figure with one Axes measured in inches."""
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_axes((0, 0, 1, 1))


def png_bytes(fig: Figure) -> bytes:
    """The figure as a 128-colour PNG: looks the same, a third of the bytes; the same state gives
    the same bytes."""
    fig.canvas.draw()
    image = PIL.Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba())
    buffer = BytesIO()
    image.convert("RGB").quantize(128, method=PIL.Image.Quantize.FASTOCTREE).save(
        buffer, "png", compress_level=1)
    return buffer.getvalue()


def clear(ax) -> None:
    ax.clear()
    ax.set_xlim(0, FIGSIZE[0])
    ax.set_ylim(0, FIGSIZE[1])
    ax.set_axis_off()


def fit_boxes(unit_positions, chunks: int) -> tuple[list[tuple[float, float]], float]:
    """Place boxes (centres in inches) for positions in [-1, 1]²; shrink them until no two
    overlap."""
    box_w = min(max(chunks * MAX_CELL_W, 1.5), MAX_BOX_W)
    for _ in range(3):
        positions = _scale(unit_positions, box_w)
        close = [abs(a[0] - b[0]) - 0.18 for i, a in enumerate(positions) for b in positions[i + 1:]
                 if abs(a[1] - b[1]) < BOX_ABOVE + BOX_BELOW + 0.12]
        box_w = min([box_w] + close)
    return _scale(unit_positions, box_w), box_w


def _scale(unit_positions, box_w: float) -> list[tuple[float, float]]:
    half_x = FIGSIZE[0] / 2 - box_w / 2 - 0.08
    bottom, top = LEGEND_H + BOX_BELOW + 0.05, FIGSIZE[1] - CAPTION_H - BOX_ABOVE
    return [(FIGSIZE[0] / 2 + u * half_x, (top + bottom) / 2 + v * (top - bottom) / 2)
            for u, v in unit_positions]


def chunk_name(c: int, chunks: int) -> str:
    """'x' for a whole buffer, else a, b, c, ... (as in the classic ring diagrams: a0 = chunk a of
    rank 0)."""
    return "x" if chunks == 1 else string.ascii_lowercase[c % 26]


def chunk_span(chunk, chunks: int) -> str:
    """How an arrow names what it carries: 'b', 'c–d', 'all'."""
    if chunk is None or chunks == 1:
        return "all"
    lo, hi = chunk  # lo < 0: the run wraps past the last chunk ('d–a')
    return (chunk_name(lo % chunks, chunks) if hi == lo + 1
            else f"{chunk_name(lo % chunks, chunks)}–{chunk_name((hi - 1) % chunks, chunks)}")


def _fits(text: str, size: float, width: float) -> bool:
    _, text_w, text_h = outline(text, size)
    return text_w <= width - 0.05 and text_h <= CELL_H - 0.06


def _ranges(ranks) -> list[str]:
    """[0, 1, 2, 3, 5] -> ['0–3', '5']."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return [f"{lo}" if lo == hi else f"{lo}–{hi}" for lo, hi in runs]


def cell_label(ranks, c: int, chunks: int, world_size: int, width: float,
               value=None) -> tuple[str, float]:
    """The text for one cell and its font size: 'a0+a2+a3', wrapped, 'a0–3', '4/8' or '4' — the
    first that fits."""
    if value is not None:
        shown = np.asarray(value).reshape(-1)
        numbers = [f"{v:.4g}" for v in shown[:3]]
        candidates = ([(", ".join(numbers), 7.5), (", ".join(numbers), 6.5),
                       (numbers[0] + ("…" if shown.size > 1 else ""), 7), (numbers[0], 6)]
                      if shown.size else [("∅", 7)])
    else:
        name, terms = chunk_name(c, chunks), sorted(ranks)
        plain = [f"{name}{r}" for r in terms]
        half = (len(plain) + 1) // 2
        candidates = [("+".join(plain), 7.5), ("+".join(plain), 6.5),
                      ("+".join(plain[:half]) + "+\n" + "+".join(plain[half:]), 7),
                      ("+".join(name + r for r in _ranges(terms)), 7),
                      (f"{len(terms)}/{world_size}", 7), (f"{len(terms)}", 6.5)]
    for text, size in candidates:
        if _fits(text, size, width):
            return text, size
    return candidates[-1][0], 5


def count_colour(count: int, world_size: int):
    """Viridis from dark (one rank's data) to yellow (every rank's data: fully reduced)."""
    return CMAP(0.05 + 0.95 * (count - 1) / max(world_size - 1, 1))


def _text_colour(rgba) -> str:
    return "black" if 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] > 0.5 else "white"


class Frame:
    """The artists of one picture, built once on an Axes; `show(state)` restyles them for a step.

    Reusing the artists and drawing texts as outlines keeps a redraw cheap (see outline.py).
    """

    def __init__(self, ax, world_size: int, chunks: int, positions, box_w: float, edges=(),
                 title: str = ""):
        self.ax, self.world_size, self.chunks = ax, world_size, chunks
        self.positions, self.box_w = positions, box_w
        clear(ax)
        self.cell_w = cell_w = box_w / chunks
        for a, b, *colour in edges:  # the topology, faint (or in its own colour), behind all
            ax.plot(*zip(positions[a], positions[b], strict=True), color=(colour or ["#cccccc"])[0],
                    lw=1.5 if colour else 1, alpha=0.6 if colour else 1, zorder=0)
        static = Writer(ax)
        cells, marks, self.centres = [], [], []
        for rank, (x, y) in enumerate(positions):
            x0 = x - box_w / 2
            static.write(f"rank {rank}", x, y + CELL_H / 2 + 0.05, 8, va="bottom", bold=True)
            for c in range(chunks):
                cells.append(Rectangle((x0 + c * cell_w, y - CELL_H / 2), cell_w, CELL_H))
                self.centres.append((x0 + (c + 0.5) * cell_w, y))
                mark_w = cell_w / (world_size + 1)  # under each cell one mark per rank, then a gap
                marks += [(x0 + c * cell_w + (r + 0.5) * mark_w, y - CELL_H / 2 - 0.09, mark_w)
                          for r in range(world_size)]
        self.cells = ax.add_collection(PatchCollection(cells, edgecolor="white", linewidth=1),
                                       autolim=False)
        self.marks = ax.add_collection(
            PolyCollection([[(a, b), (a + w, b), (a + w, b + 0.06), (a, b + 0.06)]
                            for a, b, w in marks], edgecolor="none"), autolim=False)
        static.write(title, FIGSIZE[0] - 0.12, FIGSIZE[1] - 0.12, 8, colour="#555555", ha="right",
                     va="top")
        static.write("ranks in a chunk:", 0.12, 0.16, 7, ha="left")
        # every count its own swatch (8 fit), else the ends and the middle
        counts = (range(1, world_size + 1) if world_size <= 8
                  else sorted({1, (world_size + 1) // 2, world_size}))
        for i, count in enumerate(counts):
            colour = count_colour(count, world_size)
            ax.add_artist(Rectangle((1.12 + 0.2 * i, 0.07), 0.18, 0.18, facecolor=colour,
                                    edgecolor="none"))
            static.write(str(count), 1.21 + 0.2 * i, 0.16, 7, colour=_text_colour(colour))
        self.note_x = 1.12 + 0.2 * len(counts) + 0.15
        static.flush()
        self.texts, self.tags = Writer(ax), Writer(ax, zorder=6)  # redrawn every step
        self.arrows: list = []
        ax.set_xlim(0, FIGSIZE[0])
        ax.set_ylim(0, FIGSIZE[1])

    def show(self, state, numbers: bool = False) -> None:
        """Restyle the artists for `state` (numbers: cells show values instead of a0+a2)."""
        n, chunks, write = self.world_size, self.chunks, self.texts.write
        colours = [count_colour(len(ranks), n) for row in state.held for ranks in row]
        self.cells.set_facecolor(colours)
        self.marks.set_facecolor([MARKS[r in ranks] for row in state.held for ranks in row
                                  for r in range(n)])
        for i, ((x, y), colour) in enumerate(zip(self.centres, colours, strict=True)):
            rank, c = divmod(i, chunks)
            value = state.values[rank][c] if numbers and state.values is not None else None
            text, size = cell_label(state.held[rank][c], c, chunks, n, self.cell_w, value)
            write(text, x, y, size, colour=_text_colour(colour))
        top = FIGSIZE[1] - 0.12
        write(state.caption, 0.12, top, 11, ha="left", va="top", bold=True)
        moved = (f"{len(state.messages)} message{'s' * (len(state.messages) != 1)} · "
                 if state.index else "")
        sent = "  ".join(f"r{r} {format_bytes(b)}" for r, b in enumerate(state.sent))
        write(f"{moved}sent so far: {sent}", 0.12, top - 0.32, 7.5, colour="#333333", ha="left",
              va="top")
        name = chunk_name(0, chunks)
        write("cells: the numbers each chunk holds now" if numbers else
              f"{name}0+{name}2: {'chunk a' if chunks > 1 else 'the data'} "
              "of ranks 0 and 2, combined",
              self.note_x, 0.16, 7, colour="#333333", ha="left")
        self.texts.flush()
        for artist in self.arrows:
            artist.remove()
        self.arrows = [self._arrow(e, labelled=len(state.messages) <= 2 * n)
                       for e in state.messages if e.src != e.dst]
        self.tags.flush()

    def _arrow(self, e, labelled: bool):
        """An arc from src's box to dst's box, labelled with what it carries: 'b · 16 B'."""
        a = _boundary(self.positions[e.src], self.positions[e.dst], self.box_w / 2 + 0.04)
        b = _boundary(self.positions[e.dst], self.positions[e.src], self.box_w / 2 + 0.04)
        colour = PHASE_COLOURS.get(e.tag, OTHER_COLOUR)
        if labelled:  # beside the arc's midpoint, on its outer side, clear of the line
            text = f"{chunk_span(e.chunk, self.chunks)} · {format_bytes(e.nbytes)}"
            _, width, height = outline(text, 6.5)
            normal = np.array([b[1] - a[1], a[0] - b[0]])
            normal /= np.linalg.norm(normal)
            away = (0.1 * np.linalg.norm(b - a)
                    + (width * abs(normal[0]) + height * abs(normal[1])) / 2 + 0.04)
            self.tags.write(text, *((a + b) / 2 + away * normal), 6.5, colour=colour)
        return self.ax.add_artist(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=12, lw=1.6,
                                                  color=colour, connectionstyle="arc3,rad=0.2",
                                                  shrinkA=1, shrinkB=1, zorder=5))


def _boundary(centre, toward, half_w: float) -> np.ndarray:
    """Where the line from `centre` to `toward` leaves the box around `centre`."""
    centre, d = np.asarray(centre), np.asarray(toward) - np.asarray(centre)
    half_h = BOX_ABOVE if d[1] > 0 else BOX_BELOW
    t = min(half_w / abs(d[0]) if d[0] else np.inf, half_h / abs(d[1]) if d[1] else np.inf, 1.0)
    return centre + t * d
