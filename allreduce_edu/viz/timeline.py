"""The timeline of a real run as a browser widget: hover a message for its step, chunk, bytes and
times. Lessons 02 and 03.

    timeline(cluster.trace)            # the interactive picture (plays in exported pages too)
    timeline(trace).figure()           # the same as a static matplotlib Figure (plot_timeline)
    timeline(trace).to_png(path)       # ... written as a PNG
"""

from __future__ import annotations

from pathlib import Path

import traitlets

from .browser import HERE, BrowserWidget
from .plots import plot_timeline, timeline_data


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
