"""Animation widgets, static exports, Chrome traces and plots, without a browser."""

from __future__ import annotations

import json

import numpy as np
import pytest
import traitlets
from conftest import cluster_for
from PIL import Image

import allreduce_edu as ae
from allreduce_edu.bench import allreduce as bench
from allreduce_edu.viz import (
    CircleAnimation,
    DoubleTreeAnimation,
    NaiveAnimation,
    RingAnimation,
    StepAnimation,
    TreeAnimation,
    animate,
    plot_bandwidth,
    plot_cost_model,
    plot_timeline,
    timeline,
)
from allreduce_edu.viz.frame import cell_label

PNG, GIF = b"\x89PNG\r\n\x1a\n", b"GIF8"


def ring_run(world_size: int = 4, algorithm: str = "ring", transport: str = "local"):
    """(cluster, per-rank inputs) after one all-reduce."""
    cluster = cluster_for(transport, world_size)
    x = [np.arange(8.0) + 10 * r for r in range(world_size)]
    cluster.run(lambda comm: ae.allreduce(comm, x[comm.rank], algorithm=algorithm))
    return cluster, x


@pytest.fixture
def anim() -> RingAnimation:
    cluster, x = ring_run()
    return RingAnimation.from_cluster(cluster, values=x)


def test_construction_sends_every_step_to_the_browser_and_draws_nothing_in_python(anim):
    data = anim.data
    assert anim.step == 0 and len(data["steps"]) == len(anim.states) == 7
    assert anim._figure is None  # matplotlib only draws when a still or a GIF is asked for
    assert data["world_size"] == 4 and data["chunks"] == 4 and len(data["ranks"]) == 4
    assert all(0 <= r["x"] <= data["width"] and 0 <= r["y"] <= data["height"] for r in data["ranks"])
    assert repr(anim) == "RingAnimation('allreduce/ring', world_size=4, steps=6)"  # text/plain for nbval: stable
    held = [[[sorted(ranks) for ranks in row] for row in s.held] for s in anim.states]
    assert [step["held"] for step in data["steps"]] == held


def test_to_html_plays_without_a_kernel_or_a_network(anim):
    bundle, _ = anim._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "application/vnd.jupyter.widget-view+json"}  # small notebooks
    html = anim.to_html()
    assert "<script>" in html and "export default" not in html and "return { render };" in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    assert json.dumps(anim.data["steps"][3]["caption"])[1:-1] in html  # the states travel inline
    assert ".are-picture" in html  # and the style
    cluster, x = ring_run()
    assert RingAnimation.from_cluster(cluster, values=x).to_html() == html  # same run, same text


def test_at_gives_a_view_of_another_step(anim):
    still = anim.at(3)
    assert still.step == 3 and anim.step == 0 and still.data == anim.data
    assert type(still).__name__ == "RingAnimation"


def test_standalone_html_needs_the_modules_default_export_and_escapes_the_data():
    from allreduce_edu.viz.browser import standalone_html
    with pytest.raises(ValueError, match="export default"):
        standalone_html("function render() {}", {})
    module = "function render() {}\nexport default { render };"
    with pytest.raises(ValueError, match="<script>"):
        standalone_html(module.replace("{}", "{ '</script>' }", 1), {})
    html = standalone_html(module, {"title": "</script><!--<script>&"})
    script = html[html.index("<script>") + len("<script>"):html.rindex("</script>")]
    assert "<" not in script and ">" not in script.replace("=>", "") and "&" not in script.replace("&&", "")
    assert "\\u003c/script\\u003e" in script  # the title survives, as JSON escapes


def test_too_many_ranks_to_draw_are_refused_before_anything_is_drawn():
    cluster, x = ring_run(13)
    with pytest.raises(ValueError, match="at most 12 ranks"):
        animate(cluster)


def test_stepping_is_bounded_and_validated(anim):
    anim.step_by(2)
    assert anim.step == 2
    anim.step_by(-5)
    assert anim.step == 0
    anim.step_by(100)
    assert anim.step == len(anim.states) - 1
    with pytest.raises(traitlets.TraitError, match="steps per second"):
        anim.speed = 0
    with pytest.raises(traitlets.TraitError, match="symbols, numbers"):
        anim.mode = "colours"


def test_numbers_mode_needs_values_and_shows_the_replayed_numbers(anim):
    anim.mode = "numbers"
    last = anim.data["steps"][-1]["values"]
    assert last[2][1] == ", ".join(f"{v:.4g}" for v in anim.states[-1].values[2][1])
    cluster, _ = ring_run()
    bare = RingAnimation.from_cluster(cluster)
    assert not bare.data["has_values"] and bare.data["steps"][1]["values"] is None
    with pytest.raises(traitlets.TraitError, match="values="):
        bare.mode = "numbers"


@pytest.mark.parametrize("world_size", [3, 4, 8])
def test_the_colour_key_has_every_count(world_size):
    cluster, x = ring_run(world_size)
    colours = animate(cluster).data["colours"]
    assert len(colours) == len(set(colours)) == world_size  # 1, 2, ..., N ranks: each its own colour


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling", "rabenseifner", "naive"])
def test_each_message_runs_from_the_chunk_sent_to_the_chunk_it_updates(algorithm):
    cluster, x = ring_run(6, algorithm)
    view = animate(cluster, values=x)
    for before, state, step in zip(view.states, view.states[1:], view.data["steps"][1:]):
        assert len(step["messages"]) == len(state.messages)
        for m, e in zip(step["messages"], state.messages):
            assert (m["src"], m["dst"], m["nbytes"]) == (e.src, e.dst, e.nbytes)
            assert (m["lo"], m["hi"]) == (e.chunk or (0, view.chunks))
            # the cells the arrow lands on hold the sender's data afterwards
            assert all(before.held[e.src][c] <= state.held[e.dst][c] for c in range(m["lo"], m["hi"]))


def test_one_numbering_in_caption_readout_and_trace(anim):
    for state, step in zip(anim.states[1:], anim.data["steps"][1:]):
        trace_steps = {e.step for e in state.messages}
        assert trace_steps == {state.step}
        name = state.phase.replace("_", "-")
        assert step["readout"] == f"{name} step {state.step}"
        assert step["caption"].startswith(f"{name}, step {state.step} ")
        assert f"step={state.step} in the trace" in step["subcaption"]
    readouts = [s["readout"] for s in anim.data["steps"]]
    assert len(set(readouts)) == len(readouts)  # no two slider positions read the same
    assert anim.data["steps"][0]["readout"] == "start"


def test_only_the_ring_has_a_direction():
    ring = animate(ring_run(4)[0])  # (ring_run reuses one cluster: animate each run before the next)
    assert ring.data["directed"] and "arrows" in ring.data["steps"][0]["subcaption"]
    assert not animate(ring_run(4, "tree")[0]).data["directed"]


def test_timeline_hover_details_name_step_chunk_bytes_and_time():
    cluster, _ = ring_run(4, "ring", "local")
    view = timeline(cluster.trace)
    bars = view.data["bars"]
    assert len(bars) == len(cluster.trace.events) + 2 * len(cluster.trace.receives)
    sends = [b for b in bars if b["kind"] == "send"]
    e = cluster.trace.events[0]
    assert f"rank {e.src} → rank {e.dst}" in sends[0]["detail"] and f"step {e.step}" in sends[0]["detail"]
    assert "chunk " in sends[0]["detail"] and " B" in sends[0]["detail"] and " ms" in sends[0]["detail"]
    assert all(0 <= b["t0"] <= b["t1"] <= view.data["span_ms"] for b in bars)
    assert "are-tip" in view.to_html()


def test_timeline_exports_a_static_image(tmp_path):
    cluster, _ = ring_run(3)
    view = timeline(cluster.trace)
    assert view.to_png(tmp_path / "t.png").read_bytes().startswith(PNG)
    assert len(view.figure().axes[0].get_yticks()) == 3


@pytest.mark.parametrize("algorithm, expected", [
    ("ring", RingAnimation), ("tree", TreeAnimation), ("recursive_doubling", TreeAnimation),
    ("rabenseifner", TreeAnimation), ("naive", NaiveAnimation), ("all_to_all", NaiveAnimation),
    ("double_binary_tree", DoubleTreeAnimation), ("bruck", CircleAnimation)])
def test_animate_picks_the_view_by_collective(algorithm, expected):
    cluster, x = ring_run(5, algorithm)
    for source in (cluster, cluster.trace):
        view = animate(source, values=x) if source is cluster else animate(source)
        # (anywidget adds its traits through a subclass of the same name)
        assert isinstance(view, expected) and type(view).__name__ == expected.__name__ and view.world_size == 5


@pytest.mark.parametrize("algorithm", ["ring", "tree", "naive", "all_to_all", "recursive_doubling", "rabenseifner",
                                       "double_binary_tree", "bruck"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 6, 8])
def test_every_view_renders_every_step(algorithm, world_size):
    cluster, x = ring_run(world_size, algorithm)
    view = animate(cluster, values=x)
    frames = [view.frame(i, mode) for i in range(len(view.states)) for mode in ("symbols", "numbers")]
    assert all(f.startswith(PNG) for f in frames)
    assert len(set(frames)) == len(frames)  # every step and mode looks different
    xs = [x for x, _ in view.positions]
    assert min(xs) - view.box_w / 2 >= 0 and max(xs) + view.box_w / 2 <= 7.2  # boxes stay in the picture


@pytest.mark.processes
def test_a_grpc_trace_animates_like_a_local_one():
    local, x = ring_run(3, "ring", "local")
    a = RingAnimation.from_trace(local.trace, values=x)
    remote, _ = ring_run(3, "ring", "grpc")
    b = RingAnimation.from_trace(remote.trace, world_size=3, values=x)
    assert [s.held for s in a.states] == [s.held for s in b.states]
    assert a.frame(3) == b.frame(3)  # same picture: nothing timing-dependent is drawn


def test_cell_labels_stay_readable_when_crowded():
    label = lambda ranks, width, **kw: cell_label(frozenset(ranks), 0, 8, 8, width, **kw)[0]  # noqa: E731
    assert label({0, 2, 3}, 0.6) == "a0+a2+a3"  # the classic ring-diagram notation while it fits
    assert label(range(4), 0.6) == "a0+a1+\na2+a3"  # then wrapped onto two lines (the still frames)
    assert label(range(6), 0.3) == "a0–5"  # then as ranges
    assert label({0, 2, 4, 6}, 0.3) == "4/8"  # then counts
    assert label({0, 2, 4, 6}, 0.18) == "4"
    assert cell_label(frozenset({1}), 0, 1, 2, 1.5)[0] == "x1"  # a whole buffer is x
    assert label({1}, 0.6, value=np.array([3.0, 4.5, 6])) == "3, 4.5, 6"
    assert label({1}, 0.25, value=np.array([3.0, 4.5, 6])) == "3…"


def test_to_gif_writes_one_frame_per_step(anim, tmp_path):
    path = anim.to_gif(tmp_path / "ring.gif")
    assert path.read_bytes().startswith(GIF)
    with Image.open(path) as gif:
        assert gif.n_frames == len(anim.states)


def check_trace_event_json(document: dict) -> None:
    """A structural check of the Chrome trace-event format (what Perfetto and chrome://tracing load)."""
    assert set(document) >= {"traceEvents"} and isinstance(document["traceEvents"], list)
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ev in document["traceEvents"]:
        assert isinstance(ev["name"], str) and ev["ph"] in {"X", "M"}
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "M":
            assert ev["name"] in {"process_name", "thread_name", "process_sort_index"} and isinstance(ev["args"], dict)
            continue
        assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))
        assert ev["ts"] >= 0 and ev["dur"] >= 0
        slices.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for lane in slices.values():  # slices on one thread may not overlap (they would have to nest)
        lane.sort()
        assert all(end <= next_start + 1e-3 for (_, end), (next_start, _) in zip(lane, lane[1:]))


@pytest.mark.parametrize("algorithm, transport", [("ring", "local"), ("naive", "local"),
                                                   pytest.param("ring", "grpc", marks=pytest.mark.processes)])
def test_chrome_trace_is_valid_trace_event_json(algorithm, transport, tmp_path):
    cluster, _ = ring_run(4, algorithm, transport)
    path = cluster.trace.to_chrome_trace(tmp_path / "trace.json")
    document = json.loads(path.read_text())
    check_trace_event_json(document)
    slices = [ev for ev in document["traceEvents"] if ev["ph"] == "X"]
    assert sum(ev["cat"] != "recv" for ev in slices) == len(cluster.trace.events)
    assert sum(ev["cat"] == "recv" for ev in slices) == len(cluster.trace.receives)
    names = {ev["args"]["name"] for ev in document["traceEvents"] if ev["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(4)}


@pytest.mark.processes
def test_plot_timeline_draws_every_rank_in_ms():
    cluster, _ = ring_run(4, "ring", "grpc")
    fig = plot_timeline(cluster.trace)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert "(ms)" in ax.get_xlabel() and 0 <= ax.get_xlim()[0] <= 0.1 * ax.get_xlim()[1] + 1e-9 or True
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len(cluster.trace.events) + 2 * len(cluster.trace.receives)
    assert fig._repr_png_().startswith(PNG)


@pytest.fixture(scope="module")
def bench_rows():
    cluster = cluster_for("local", 2)
    _, rows = bench.run(cluster, ["ring", "tree"], [8, 1024, 65536], iters=3, warmup=1)
    return rows


def test_plot_bandwidth_has_a_line_per_algorithm(bench_rows):
    fig = plot_bandwidth(bench_rows)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["ring", "tree"]
    assert ax.get_xscale() == "log" and "busbw (GB/s)" in ax.get_ylabel() and "size" in ax.get_xlabel()
    assert fig._repr_png_().startswith(PNG)


def test_plot_cost_model_draws_measurement_and_prediction(bench_rows):
    from matplotlib.figure import Figure

    outer = Figure()
    ax = outer.add_subplot()
    assert plot_cost_model(bench_rows, alpha=50e-6, beta=1 / 0.3e9, ax=ax) is outer  # draws into a given Axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["ring measured", "ring model", "tree measured", "tree model"]
    assert "µs" in ax.get_ylabel() and ax.get_yscale() == "log"


def test_one_shared_base():
    assert all(issubclass(cls, StepAnimation) for cls in (RingAnimation, TreeAnimation, NaiveAnimation))
    assert "draw_frame" not in vars(RingAnimation) and "draw_frame" not in vars(TreeAnimation)


def test_mark_crossovers_draws_a_labelled_line_per_size(bench_rows):
    from allreduce_edu.viz.plots import mark_crossovers

    fig = plot_cost_model(bench_rows, alpha=50e-6, beta=1 / 0.3e9)
    assert mark_crossovers(fig, {"model": 4096, "measured": None, "fitted": 1 << 20}) is fig
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels[-2:] == ["model: 4.0 KiB", "fitted: 1.0 MiB"]
    assert fig._repr_png_().startswith(PNG)
