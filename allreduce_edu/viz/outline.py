"""Text as filled outlines from cached glyphs, so a frame with a hundred labels redraws in
milliseconds.

matplotlib lays out and rasterises every `Text` on every draw (about half a millisecond each); the
labels of an animation repeat from step to step, so one PathCollection of cached outlines is far
cheaper.
"""

from __future__ import annotations

import functools

import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.font_manager import FontProperties, findfont, get_font
from matplotlib.path import Path
from matplotlib.textpath import TextPath
from matplotlib.transforms import Affine2D

FONTS = {False: FontProperties(family="DejaVu Sans"),
         True: FontProperties(family="DejaVu Sans", weight="bold")}
LINE, CAP = 1.1, 0.74  # line spacing and capital height, in font sizes


@functools.cache
def _glyph(char: str, size: float, bold: bool) -> tuple[Path, float]:
    """One character's outline in points (baseline at y = 0) and how far the pen moves after it."""
    # shared with the renderers: set its size right before asking
    font = get_font(findfont(FONTS[bold]))
    font.set_size(size, 72)
    advance = font.load_char(ord(char)).linearHoriAdvance / 65536
    return (Path(np.zeros((0, 2))) if char.isspace()
            else TextPath((0, 0), char, size=size, prop=FONTS[bold])), advance


@functools.lru_cache(maxsize=4096)
def outline(text: str, size: float, bold: bool = False) -> tuple[Path, float, float]:
    """(`text` as one outline in inches centred on (0, 0), its width, its height); lines split at
    '\\n'."""
    lines, parts, width = text.split("\n"), [], 0.0
    for i, line in enumerate(lines):
        advances = [_glyph(char, size, bold)[1] for char in line]
        x, width = -sum(advances) / 2, max(width, sum(advances))
        # capitals centred on y = 0
        baseline = ((len(lines) - 1) / 2 - i) * LINE * size - CAP / 2 * size
        for char, advance in zip(line, advances, strict=True):
            parts.append(_glyph(char, size, bold)[0].transformed(Affine2D().translate(x, baseline)))
            x += advance
    path = Path.make_compound_path(*parts) if parts else Path(np.zeros((0, 2)))
    return (path.transformed(Affine2D().scale(1 / 72)), width / 72,
            ((len(lines) - 1) * LINE + CAP) * size / 72)


class Writer:
    """Outlined texts on an Axes whose units are inches, drawn as one PathCollection."""

    def __init__(self, ax, zorder: float = 3):
        self.collection = ax.add_collection(PathCollection([], edgecolor="none", zorder=zorder),
                                            autolim=False)
        self.paths: list[Path] = []
        self.colours: list = []

    def write(self, text: str, x: float, y: float, size: float, colour="black", ha="center",
              va="center", bold: bool = False) -> None:
        """Queue `text` anchored at (x, y) like `ax.text(..., ha=, va=)`; `flush()` shows what was
        queued."""
        path, width, height = outline(text, size, bold)
        x += {"left": width / 2, "center": 0.0, "right": -width / 2}[ha]
        y += {"bottom": height / 2, "center": 0.0, "top": -height / 2}[va]
        self.paths.append(path.transformed(Affine2D().translate(x, y)))
        self.colours.append(colour)

    def flush(self) -> None:
        """Show the queued texts (replacing what was shown) and start a new queue."""
        self.collection.set_paths(self.paths)
        self.collection.set_facecolor(self.colours or "none")
        self.paths, self.colours = [], []
