"""Pictures of collectives: animation widgets over replayed traces, timelines and benchmark plots.
Lessons 02-05.

    animate(cluster_or_trace)             # RingAnimation, TreeAnimation or NaiveAnimation,
                                          # by the collective's name
    RingAnimation.from_cluster(cluster)   # the last cluster.run, step by step;
                                          # .to_html(), .to_gif(path)
    timeline(trace)                       # per-rank timeline of a real run; hover a message
    plot_timeline(trace)                  # the same as a static matplotlib Figure
    plot_bandwidth(rows)                  # busbw vs size, rows from allreduce_edu.bench.run
    plot_cost_model(rows, alpha, beta)    # measured time vs the α-β prediction
"""

from .animation import StepAnimation
from .layouts import (
    CircleAnimation,
    DoubleTreeAnimation,
    NaiveAnimation,
    RingAnimation,
    TreeAnimation,
    animate,
)
from .plots import plot_bandwidth, plot_cost_model, plot_timeline
from .timeline import Timeline, timeline

__all__ = ["StepAnimation", "RingAnimation", "TreeAnimation", "NaiveAnimation",
           "DoubleTreeAnimation", "CircleAnimation", "animate",
           "plot_timeline", "plot_bandwidth", "plot_cost_model", "Timeline", "timeline"]
