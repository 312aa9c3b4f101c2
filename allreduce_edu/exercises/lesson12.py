"""Lesson 12 · overlapping communication with compute: DDP's buckets during backward, what stays
exposed, ZeRO-3's prefetch; the lesson's measurements (`measure`, `plot_overlap`, `busy_shares`,
`zero3_pass`) and its checkers: `check_choose_bucket` runs your bucket size through
`predict_exposed` on three networks, `check_no_overlap` compares your number with the sum of the
buckets' ring times, `check_overlap_answer` takes a letter.
"""

from __future__ import annotations

import time

import numpy as np

from ..collectives import allreduce
from ..model.costmodel import predict
from ..runtime.osfacts import usable_cpus
from ..training.sharded.overlap import (  # noqa: F401 - zero3_pass: the notebook's
    bucket_layers,
    measure_overlap,
    predict_exposed,
    zero3_pass,
)
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number
from .texts import message

# the lesson's MLP (64, 256, 256, 256, 256, 8) in float64: each layer's W and b, in bytes
MLP_LAYER_BYTES = [133_120, 526_336, 526_336, 526_336, 16_448]
MS = 1e-3


def measure(cluster, params, X, y, configs: dict, rounds: int = 3, steps: int = 3,
            batch: int = 4096) -> dict:
    """`measure_overlap` for each config {name: (bucket_bytes, overlap)}, round after round (a busy
    moment hits every config alike). Per config: the medians over rounds of the ranks' mean
    exposed, step and compute seconds, each layer's backward seconds, and the last round's
    per-rank results (for plot_overlap)."""
    runs = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (bucket_bytes, overlap) in configs.items():
            runs[name].append(cluster.run(measure_overlap, params, X, y, bucket_bytes, overlap,
                                          steps, batch))
    layers, out = len(params) // 2, {}
    for name, rounds_ in runs.items():
        def mean(key, rounds_=rounds_):
            return float(np.median([np.mean([r[key] for r in ranks]) for ranks in rounds_]))
        backward = np.median([_backward(ranks, layers) for ranks in rounds_], axis=0)
        out[name] = {"exposed": mean("exposed_median"), "step": mean("step_median"),
                     "compute": mean("compute"), "backward": backward.tolist(),
                     "ranks": rounds_[-1], "buckets": rounds_[-1][0]["buckets"]}
    return out


def _backward(ranks: list, layers: int) -> list[float]:
    """Each layer's backward seconds in the last step, averaged over the ranks."""
    return [float(np.mean([sum(t1 - t0 for kind, i, t0, t1 in r["spans"]
                               if kind == "backward" and i == layer) for r in ranks]))
            for layer in range(layers)]


def plot_overlap(ranks: list, ax, title: str = "") -> None:
    """One DDP step per rank: forward and backward spans above each rank's line, its buckets'
    all-reduces below, in ms since the step began; the exposed communication on the right."""
    from matplotlib.patches import Patch

    colours = {"forward": "#9ecae1", "backward": "#3182bd"}
    for rank, r in enumerate(ranks):
        for kind, _, t0, t1 in r["spans"]:  # ms since this rank's step began
            ax.broken_barh([((t0 - r["t0"]) * 1e3, (t1 - t0) * 1e3)], (rank - 0.42, 0.4),
                           facecolors=colours[kind])
        for b, (_, t0, t1) in enumerate(r["comm_spans"]):
            ax.broken_barh([((t0 - r["t0"]) * 1e3, (t1 - t0) * 1e3)], (rank + 0.02, 0.4),
                           facecolors="#fd8d3c" if b % 2 == 0 else "#a63603")
        # this one step's exposure; the tables give medians over steps, rounds and ranks
        ax.text(r["step"] * 1e3, rank, f"  this step: exposed {r['exposed'] * 1e3:.0f} ms",
                va="center", fontsize=8)
    handles = [Patch(color=c, label=k) for k, c in colours.items()]
    handles += [Patch(color="#fd8d3c", label="all-reduce: buckets 0, 2, 4 …"),
                Patch(color="#a63603", label="all-reduce: buckets 1, 3, …")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
              frameon=False)
    room = 1.22e3 * max(r["step"] for r in ranks)  # for the labels
    if not ax.get_autoscalex_on():  # an axis shared with a plot drawn before: keep the wider
        room = max(room, ax.get_xlim()[1])
    ax.set_xlim(0, room)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in range(len(ranks))])
    ax.set_ylim(len(ranks) - 0.4, -0.6)
    ax.set_xlabel("ms since the step began")
    ax.set_title(title, fontsize=10)


def _cpu_of_allreduces(comm, nbytes: int, iters: int) -> tuple[float, float]:
    x = np.ones(nbytes // 8)
    allreduce(comm, x)
    comm.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(iters):
        allreduce(comm, x)
    return time.perf_counter() - wall, time.process_time() - cpu


def busy_cores(cluster, nbytes: int, iters: int = 10, repeats: int = 3) -> float:
    """The share of this machine's cores the ranks keep busy while they do nothing but all-reduce
    `nbytes`: their CPU seconds (every thread) over wall seconds × cores, the median of `repeats`
    rows of `iters` all-reduces (a busy moment of the machine moves one row). Ranks in processes."""
    return busy_shares({"": cluster}, nbytes, iters, repeats)[""]


def busy_shares(clusters: dict, nbytes: int, iters: int = 10, repeats: int = 5) -> dict:
    """busy_cores of each cluster (name -> cluster), their rows taken in turn, round after round,
    so that a busy moment of the machine falls on all of them alike."""
    shares = {name: [] for name in clusters}
    for _ in range(repeats):
        for name, cluster in clusters.items():
            per_rank = cluster.run(_cpu_of_allreduces, nbytes, iters)
            wall = max(w for w, _ in per_rank)
            shares[name].append(sum(c for _, c in per_rank) / (wall * usable_cpus()))
    return {name: float(np.median(s)) for name, s in shares.items()}


# --- 12.1 ------------------------------------------------------------------------------------
# (name, layer_bytes, backward_seconds, alpha, beta, world_size)
NETWORKS = (
    (message(__name__, "12.1", "lesson-mlp-behind"),
     MLP_LAYER_BYTES, [2 * MS, 30 * MS, 30 * MS, 30 * MS, 2 * MS], 2e-3, 1 / 200e6, 4),
    (message(__name__, "12.1", "slow-network"),
     [4 << 20] * 12, [20 * MS] * 12, 5e-3, 1 / 10e9, 8),
    (message(__name__, "12.1", "fast-network-like"),
     [200 << 20] + [50 << 20] * 24, [20 * MS] + [6 * MS] * 24, 10e-6, 1 / 25e9, 64),
)



def _sizes(layer_bytes) -> set[int]:
    n = len(layer_bytes)
    return {sum(layer_bytes[i:j]) for i in range(n) for j in range(i + 1, n + 1)}


@exercise("12.1", kind="code", function="choose_bucket", library=(),
          needs={"predict_exposed": predict_exposed},
          after=('from allreduce_edu.training.sharded.overlap import predict_exposed',),
          gaps=(2, 2))
def check_choose_bucket(choose_bucket) -> Feedback:
    """Exercise 12.1: choose_bucket(...) leaves within 10% of the model's least exposed time."""
    for network in NETWORKS:
        problem = _bucket_problem(choose_bucket, *network)
        if problem:
            return failed(problem)
    return passed(message(__name__, "12.1", "within-10-model"))


def _bucket_problem(choose_bucket, name, layer_bytes, backward, alpha, beta, n) -> str:
    """What is wrong with choose_bucket's size on one network ("" if it is good enough)."""
    def model(size):
        return predict_exposed(backward, layer_bytes, size, n, alpha, beta)
    best = min(_sizes(layer_bytes), key=model)
    try:
        got = choose_bucket(list(layer_bytes), list(backward), alpha, beta, n)
    except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
        return f"on {name}, choose_bucket raised {type(e).__name__}: {e}"
    if isinstance(got, bool) or not isinstance(got, (int, float, np.integer, np.floating)) \
            or not got > 0:
        return message(__name__, "12.1", "on-name-returned", name=name, got=got)
    if model(got) <= 1.1 * model(best) + 1e-9:
        return ""
    buckets = bucket_layers(layer_bytes, got)
    plural = "s" if len(buckets) > 1 else ""
    where = (message(__name__, "12.1", "on-name-got", name=name, got=got, count=len(buckets),
                     plural=plural, ms=model(got) / MS, best=best,
                     count2=len(bucket_layers(layer_bytes, best)),
                     leave=model(best) / MS))
    if len(buckets) == 1:
        why = (message(__name__, "12.1", "one-bucket-ready"))
    elif len(buckets) == len(layer_bytes):
        why = (message(__name__, "12.1", "one-bucket-per", ms=2 * (n - 1) * alpha / MS))
    else:
        why = message(__name__, "12.1", "compare-every-candidate")
    return f"{where}: {why}"


# --- 12.2 ------------------------------------------------------------------------------------
number("12.2", module=__name__,
       blanks=(Blank("my_exposed", key="sum(2 * (N - 1) * alpha + 2 * (N - 1) / N * s * beta "
                             "for s in layer_bytes)"),),
       inputs={"layer_bytes": tuple(MLP_LAYER_BYTES), "alpha": 2e-3, "beta": 1 / 200e6,
            "world_size": 4},
       call="layer_bytes, alpha, beta, N", unit="seconds", answer=lambda d: _exposed(d),
       slips=lambda d: _exposed_slips(d),
       otherwise=lambda d, name, got: (
        message(__name__, "12.2", "off-by", factor=got / _exposed(d))),
       success=lambda d: _exposed_success(d))


def _exposed(d) -> float:
    """Seconds of one ring all-reduce per layer, one after another: all of it exposed."""
    return sum(predict("ring", d.world_size, s, d.alpha, d.beta) for s in d.layer_bytes)


def _exposed_slips(d) -> list:
    n, total, k = d.world_size, sum(d.layer_bytes), len(d.layer_bytes)
    want = sum(predict("ring", n, s, d.alpha, d.beta) for s in d.layer_bytes)
    return [Slip(want * 1e3, "looks-like-milliseconds"),
            Slip(2 * (n - 1) / n * total * d.beta, "bytes-time-alone"),
            Slip(predict("ring", n, total, d.alpha, d.beta), "one-all-reduce"),
            Slip(k * d.alpha + 2 * (n - 1) / n * total * d.beta, "ring-all-reduce"),
            Slip(k * 2 * (n - 1) * d.alpha + total * d.beta, "each-rank-sends")]


def _exposed_success(d) -> str:
    n, total, k = d.world_size, sum(d.layer_bytes), len(d.layer_bytes)
    want = sum(predict("ring", n, s, d.alpha, d.beta) for s in d.layer_bytes)
    return (message(__name__, "12.2", "success", ms=want / MS, k=k,
                    latency_ms=k * 2 * (n - 1) * d.alpha / MS,
                    bytes_ms=2 * (n - 1) / n * total * d.beta / MS))


# --- 12.3 ------------------------------------------------------------------------------------
choice("12.3", module=__name__)
