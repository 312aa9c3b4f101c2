"""Lesson 11 · sharded data parallel: write ZeRO-1's step (run for a few Adam steps on 4 gRPC ranks,
every shard checked against all-reduce + full Adam, every rank's bytes counted in its trace),
predict the fewest ranks ZeRO-2 fits on (memory.zero_formula) and ZeRO-3's bytes per step."""

from __future__ import annotations

from collections import Counter

import cloudpickle
import numpy as np

from ..collectives import all_gather, reduce_scatter
from ..runtime import Cluster, ship
from ..training.sharded.adam import adam
from ..training.sharded.memory import zero_formula
from .feedback import Feedback, failed, passed
from .harness import RankError, run_on_ranks
from .registry import exercise, hint, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, number
from .texts import message


def _zero1_on_rank(comm, blob: bytes, start, grads, lr: float) -> dict:
    """On one rank: the learner's step, `steps` times; what it returned and sent at each step."""
    fn = cloudpickle.loads(blob)[0]
    size = len(start) // comm.world_size
    weights = start.copy()
    m, v = np.zeros(size, np.float32), np.zeros(size, np.float32)  # this rank's moments, kept
    returned, sent = [], []
    for step, grad in enumerate(grads[:, comm.rank], start=1):
        first = len(comm.trace.events)
        new = fn(comm, weights.copy(), grad.copy(), m, v, step, lr)
        counts = Counter()  # bytes this rank sent in the step, by collective
        for e in comm.trace.events[first:]:
            counts[e.collective.split("/")[0] or "send"] += e.nbytes
        sent.append(dict(counts))
        returned.append(_returned(new, comm.rank, step, len(start), size))
        if not isinstance(returned[-1], str):  # a string says what is wrong with it
            weights = returned[-1].astype(np.float32)
    return {"returned": returned, "sent": sent}


def _returned(got, rank: int, step: int, length: int, size: int):
    """What a rank's step returned, as an array, or a sentence on why it is not the weights."""
    at = f"rank {rank}'s my_zero1_step returned"
    if got is None:
        return message(__name__, "11.1", "at-none-at", at=at, step=step)
    try:
        array = np.asarray(got)
    except Exception:  # noqa: BLE001 - whatever the learner returned
        array = np.asarray(None)
    if array.dtype == object:
        return message(__name__, "11.1", "at-name-at", at=at, name=type(got).__name__, step=step)
    if array.size == size:
        return message(__name__, "11.1", "at-size-numbers", at=at, size=size, length=length)
    if array.shape != (length,):
        return message(__name__, "11.1", "at-shape-shape", at=at, shape=array.shape, step=step,
                       length=length)
    return array


TIPS = (  # (words in "ErrorType: message", what usually causes it)
    (("Timeout", "Mismatch"), message(__name__, "11.1", "every-rank-must")),
    (("NoneType", "dtype object"), message(__name__, "11.1", "adam-updates-its")),
    (("broadcast",), message(__name__, "11.1", "m-and-v")),
    (("NameError",), message(__name__, "11.1", "import-step-uses")),
)


def _raised(failure: RankError) -> str:
    """One sentence on an exception from the learner's ranks, with what usually causes it."""
    e = failure.error
    kind, text = type(e).__name__, str(e).split("\n")[0].strip()[:300]
    tip = next((tip for words, tip in TIPS if any(w in f"{kind}: {text}" for w in words)),
               message(__name__, "11.1", "run-on-cluster"))
    return (f"your my_zero1_step raised {kind} on {failure.on}: "
            f"{text} — {tip}")


def _reference(start, grads, lr: float) -> list[tuple]:
    """All-reduce + Adam: (weights, m, v, summed gradient) before each step, then (weights,)."""
    w, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    states = []
    for step, g in enumerate(grads.sum(axis=1, dtype=np.float64).astype(np.float32), start=1):
        states.append((w.copy(), m.copy(), v.copy(), g))
        adam(w, g, m, v, step, lr)
    return states + [(w,)]


def _after(w, m, v, g, step: int, lr: float):
    w = w.copy()  # w, m and v stay as they were
    adam(w, g, m.copy(), v.copy(), step, lr)
    return w


def _shard_problem(got, j: int, size: int, states, grads, step: int, lr: float) -> str:
    """Why shard j of a rank's weights differs after `step`: the first likely cause that fits."""
    (w, m, v, g), want = states[step - 1], states[step][0]
    cut = slice(j * size, (j + 1) * size)
    if not np.all(np.isfinite(got[cut])):
        return (message(__name__, "11.1", "holds-nan-or"))
    causes = [(w, message(__name__, "11.1", "still-holds-weights")),
              (_after(w, m, v, grads[step - 1, j], step, lr),
               message(__name__, "11.1", "was-updated-with", j=j)),
              (_after(w, 0 * m, 0 * v, g, step, lr),
               message(__name__, "11.1", "state-reset", step=step))]
    causes += [(_after(w, m, v, g, other, lr), message(__name__, "11.1", "adam-used-wrong"))
               for other in {max(step - 1, 1), step + 1}]
    causes += [(np.roll(want, (j - i) * size), message(__name__, "11.1", "holds-shard-i", i=i))
               for i in range(len(got) // size)]
    for candidate, why in causes:
        if np.allclose(got[cut], candidate[cut], rtol=1e-5, atol=1e-6):
            return why
    return (message(__name__, "11.1", "differs-from-all", max=np.abs(got[cut] - want[cut]).max()))


def _traffic_problem(sent: dict, length: int, n: int, rank: int, step: int) -> str | None:
    """Why a rank's bytes in a step are not ZeRO-1's: (N−1)/N·S reduce-scatter + as much gather."""
    u, total = (n - 1) * length * 4 // n, sum(sent.values())
    if total == 2 * u:
        return None
    says = (message(__name__, "11.1", "right-weights-rank", rank=rank, total=total, step=step,
                    times=total / (2 * u), zero=2 * u, u=u))
    if sent.get("allreduce"):
        return says + (message(__name__, "11.1", "all-reduce-sends"))
    return says + f"Its bytes by collective: {sent}."


@exercise("11.1", kind="code", function="my_zero1_step",
          library=("training.sharded.zero:Rank.train_step",),
          needs={"reduce_scatter": reduce_scatter, "all_gather": all_gather, "adam": adam},
          before=('from allreduce_edu import all_gather, reduce_scatter',),
          after=('from allreduce_edu.training.sharded.adam import adam',))
def check_zero1_step(fn, world_size: int = 4, length: int = 80, steps: int = 3, lr: float = 1e-2,
                     timeout: float = 20.0, transport: str = "grpc") -> Feedback:
    """Exercise 11.1: `fn(comm, weights, grad, m, v, step, lr)` is one ZeRO-1 step (Adam); run on
    `world_size` ranks, then on another N with shards of the same size (so a world size written
    into the function as a number fails)."""
    problem = _zero1_problem(fn, world_size, length, steps, lr, timeout, transport)
    if problem:
        return failed(problem)
    other, size = (3 if world_size != 3 else 4), length // world_size
    problem = _zero1_problem(fn, other, size * other, steps, lr, timeout, transport)
    if problem:
        return failed(message(__name__, "11.1", "on-another-n", n=world_size, other=other,
                              problem=problem))
    n, u = world_size, (world_size - 1) * length * 4 // world_size
    where = {"grpc": "gRPC", "local": "thread", "shm": "shared-memory"}.get(transport, transport)
    return passed(message(__name__, "11.1", "zero-1-on", n=n, where=where, steps=steps, size=size,
                          length=length, bytes=2 * u, u=u, other=other))


def _zero1_problem(fn, n: int, length: int, steps: int, lr: float, timeout: float,
                   transport: str) -> str | None:
    """What is wrong with fn's ZeRO-1 steps on n ranks (None: nothing)."""
    size = length // n
    rng = np.random.default_rng(11)  # the start, the same on every rank; grads[step, rank]
    start = rng.standard_normal(length).astype(np.float32)
    grads = (0.1 * rng.standard_normal((steps, n, length))).astype(np.float32)
    blob = ship(fn, (), {})
    with Cluster(n, transport, timeout=timeout) as cluster:
        reports, failure = run_on_ranks(cluster, _zero1_on_rank, blob, start, grads, lr)
        if failure:
            return _raised(failure)
    states = _reference(start, grads, lr)
    for step in range(1, steps + 1):
        for rank, report in enumerate(reports):
            got = report["returned"][step - 1]
            if isinstance(got, str):
                return got
            for j in range(n):
                cut = slice(j * size, (j + 1) * size)
                if not np.allclose(got[cut], states[step][0][cut], rtol=1e-5, atol=1e-6):
                    why = _shard_problem(got, j, size, states, grads, step, lr)
                    return message(__name__, "11.1", "shard-differs", rank=rank, j=j,
                                   start=cut.start, differs=cut.stop - 1, step=step, why=why)
    dtypes = {report["returned"][0].dtype.name for report in reports} - {"float32"}
    if dtypes:
        return message(__name__, "11.1", "wrong-dtype", listed=', '.join(dtypes))
    for rank, report in enumerate(reports):
        for step, sent in enumerate(report["sent"], start=1):
            problem = _traffic_problem(sent, length, n, rank, step)
            if problem:
                return problem
    return None


number("11.2", module=__name__,
       setup="import math\n\npsi, K, budget = 7.5e9, 12, 32e9   "
             "# parameters, Adam's bytes (mixed), bytes per rank",
       blanks=(Blank("my_ranks", key="math.ceil((2 + K) * psi / (budget - 2 * psi))"),),
       inputs={"psi": 7.5e9, "budget": 32e9}, call="psi, budget", unit="ranks", exact=True,
       answer=lambda d: fewest_ranks("zero2", d.psi, d.budget),
       slips=lambda d: _zero2_slips(d.psi, d.budget),
       otherwise=lambda d, name, got: _zero2_otherwise(d.psi, d.budget, got),
       success=lambda d: _zero2_success(d.psi, d.budget))


def fewest_ranks(stage: str, psi: float, budget: float, precision: str = "mixed") -> int | None:
    """The fewest ranks on which `stage`'s model states fit in `budget` bytes per rank (None:
    none do, as for data parallel, which shards nothing)."""
    held = lambda n: sum(zero_formula(stage, psi, n, precision).values())  # noqa: E731
    if held(1 << 20) > budget:
        return None
    n = 1
    while held(n) > budget:
        n += 1
    return n


def _zero2_slips(psi: float, budget: float) -> list:
    ranks = fewest_ranks("zero2", psi, budget)
    gb = lambda n: sum(zero_formula("zero2", psi, n, "mixed").values()) / 1e9  # noqa: E731
    slips = [Slip(14 * psi / (budget - 2 * psi), "round-up",
                  values={"below": ranks - 1, "held": gb(ranks - 1)}),
             Slip(ranks - 1, "one-rank-short",
                  values={"below": ranks - 1, "held": gb(ranks - 1), "limit": budget / 1e9}),
             Slip(fewest_ranks("zero3", psi, budget), "zero-3"),
             Slip(-(-10 * psi // (budget - 2 * psi)), "k-8-counts")]
    if budget > 4 * psi:  # ZeRO-1 and 4-byte parameters fit on enough ranks
        slips += [Slip(fewest_ranks("zero1", psi, budget), "zero-1"),
                  Slip(-(-16 * psi // (budget - 4 * psi)), "counted-4-byte")]
    return [s for s in slips if s.value != ranks]


def _zero2_otherwise(psi: float, budget: float, got: float) -> str:
    if got < 1:
        return message(__name__, "11.2", "no-ranks", got=got)
    if got > fewest_ranks("zero2", psi, budget):
        return message(__name__, "11.2", "fits-on-fewer", got=got)
    held = sum(zero_formula("zero2", psi, got, "mixed").values()) / 1e9
    return message(__name__, "11.2", "too-few", got=got, held=held)


def _zero2_success(psi: float, budget: float) -> str:
    ranks = fewest_ranks("zero2", psi, budget)
    f = zero_formula("zero2", psi, ranks, "mixed")
    return message(__name__, "11.2", "success", ranks=ranks, params=2 * psi / 1e9,
                   rest=14 * psi / 1e9, left=(budget - 2 * psi) / 1e9,
                   held=sum(f.values()) / 1e9, zero1=fewest_ranks("zero1", psi, budget),
                   zero3=fewest_ranks("zero3", psi, budget), dp=16 * psi / 1e9)


number("11.3", module=__name__,
       setup="psi, N, b = 1.5e9, 8, 2   # parameters, ranks, bytes per element on the wire (fp16)",
       blanks=(Blank("my_bytes", key="3 * (N - 1) / N * psi * b"),),
       inputs={"psi": 1.5e9, "world_size": 8, "itemsize": 2}, call="psi, N, b", unit="bytes",
       answer=lambda d: 3 * _one_collective(d),
       slips=lambda d: [
        Slip(3 * _one_collective(d) / 1e9, "looks-like-gb"),
        Slip(2 * _one_collective(d), "data-parallel"),
        Slip(4 * _one_collective(d), "one-collective-too"),
        Slip(3 * d.psi * d.itemsize, "each-ring-collective"),
        Slip(3 * _one_collective(d) / d.itemsize, "counts-elements-multiply"),
        Slip(_one_collective(d), "one-collective-bytes"),
        Slip(3 * _one_collective(d) * 4 / d.itemsize, "parameters-and-gradients"),
    ],
       otherwise=lambda d, name, got: (
        message(__name__, "11.3", "off-by", factor=got / (3 * _one_collective(d)))),
       values=lambda d: {"zero3": 3 * _one_collective(d), "ddp": 2 * _one_collective(d)})


def _one_collective(d) -> float:
    """Bytes one rank sends in one ring collective over the whole model."""
    return (d.world_size - 1) / d.world_size * d.psi * d.itemsize
