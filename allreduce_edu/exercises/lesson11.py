"""Lesson 11 · sharded data parallel: write ZeRO-1's step (run for a few Adam steps on 4 gRPC ranks,
every shard checked against all-reduce + full Adam, every rank's bytes counted in its trace),
predict ZeRO-2's memory (memory.zero_formula) and ZeRO-3's bytes per step."""

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
        return f"{at} None at step {step}: return the new full weights (all_gather's result)."
    try:
        array = np.asarray(got)
    except Exception:  # noqa: BLE001 - whatever the learner returned
        array = np.asarray(None)
    if array.dtype == object:
        return f"{at} a {type(got).__name__} at step {step}: return a NumPy array of weights."
    if array.size == size:
        return f"{at} {size} numbers, its shard alone: all-gather the shards into all {length}."
    if array.shape != (length,):
        return f"{at} shape {array.shape} at step {step}: return the weights' shape, ({length},)."
    return array


TIPS = (  # (words in "ErrorType: message", what usually causes it)
    (("Timeout", "Mismatch"), "every rank must call the same collectives in the same order: "
                              "reduce_scatter once, then all_gather once."),
    (("NoneType", "dtype object"), "adam(...) updates its first argument in place and returns "
                                   "None: call adam on your shard, then all-gather the shard."),
    (("broadcast",), "m and v hold this rank's shard only, len(weights) // N elements: give adam "
                     "this rank's shard of the weights and the reduce-scattered gradient."),
    (("NameError",), "import what your step uses: from allreduce_edu import reduce_scatter, "
                     "all_gather; from allreduce_edu.training.sharded.adam import adam."),
)


def _raised(failure: RankError) -> str:
    """One sentence on an exception from the learner's ranks, with what usually causes it."""
    e = failure.error
    kind, text = type(e).__name__, str(e).split("\n")[0].strip()[:300]
    tip = next((tip for words, tip in TIPS if any(w in f"{kind}: {text}" for w in words)),
               "run it on Cluster(4, \"local\") with small float32 arrays to read the traceback.")
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
        return ("it holds NaN or inf. Pass adam the step you are given: it counts from 1 (step 0 "
                "divides by 1 − β^0 = 0).")
    causes = [(w, "it still holds the weights from before the step: all-gather the shard after "
                  "adam has updated it (adam changes its first argument in place)."),
              (_after(w, m, v, grads[step - 1, j], step, lr),
               f"it was updated with rank {j}'s own gradient, not the sum over all ranks: "
               f"reduce-scatter grad first (rank r gets shard r of the sum)."),
              (_after(w, 0 * m, 0 * v, g, step, lr),
               f"m and v started from zero again at step {step}: update the m and v you are "
               f"given, in place (adam does), so they carry over to the next step.")]
    causes += [(_after(w, m, v, g, other, lr), "Adam used the wrong step count: pass adam the "
                "step you are given.") for other in {max(step - 1, 1), step + 1}]
    causes += [(np.roll(want, (j - i) * size), f"it holds shard {i}'s new weights: join the "
                f"shards in rank order (all_gather does).") for i in range(len(got) // size)]
    for candidate, why in causes:
        if np.allclose(got[cut], candidate[cut], rtol=1e-5, atol=1e-6):
            return why
    return (f"it differs from all-reduce + Adam on the full weights by up to "
            f"{np.abs(got[cut] - want[cut]).max():.2e}.")


def _traffic_problem(sent: dict, length: int, n: int, rank: int, step: int) -> str | None:
    """Why a rank's bytes in a step are not ZeRO-1's: (N−1)/N·S reduce-scatter + as much gather."""
    u, total = (n - 1) * length * 4 // n, sum(sent.values())
    if total == 2 * u:
        return None
    says = (f"right weights, but rank {rank} sent {total} bytes in step {step}, "
            f"{total / (2 * u):g}× the {2 * u} ZeRO-1 needs (reduce-scatter and all-gather, "
            f"(N−1)/N·S = {u} each). ")
    if sent.get("allreduce"):
        return says + ("An all-reduce sends 2× the bytes of the reduce-scatter (or all-gather) "
                       "it stands for: each rank updates only its own shard, so it needs only "
                       "that shard of the summed gradient. llm.c's first ZeRO-1 all-reduced too, "
                       "until a pull request moved Adam between reduce-scatter and all-gather.")
    return says + f"Its bytes by collective: {sent}."


@exercise("11.1", kind="code", function="my_zero1_step",
          library=("training.sharded.zero:Rank.train_step",),
          needs={"reduce_scatter": reduce_scatter, "all_gather": all_gather, "adam": adam},
          before=('from allreduce_edu import all_gather, reduce_scatter',),
          after=('from allreduce_edu.training.sharded.adam import adam',))
def check_zero1_step(fn, world_size: int = 4, length: int = 80, steps: int = 3, lr: float = 1e-2,
                     timeout: float = 20.0, transport: str = "grpc") -> Feedback:
    """Exercise 11.1: `fn(comm, weights, grad, m, v, step, lr)` is one ZeRO-1 step (Adam)."""
    n, size = world_size, length // world_size
    rng = np.random.default_rng(11)  # the start, the same on every rank; grads[step, rank]
    start = rng.standard_normal(length).astype(np.float32)
    grads = (0.1 * rng.standard_normal((steps, n, length))).astype(np.float32)
    blob = ship(fn, (), {})
    with Cluster(n, transport, timeout=timeout) as cluster:
        reports, failure = run_on_ranks(cluster, _zero1_on_rank, blob, start, grads, lr)
        if failure:
            return failed(_raised(failure))
    states = _reference(start, grads, lr)
    for step in range(1, steps + 1):
        for rank, report in enumerate(reports):
            got = report["returned"][step - 1]
            if isinstance(got, str):
                return failed(got)
            for j in range(n):
                cut = slice(j * size, (j + 1) * size)
                if not np.allclose(got[cut], states[step][0][cut], rtol=1e-5, atol=1e-6):
                    why = _shard_problem(got, j, size, states, grads, step, lr)
                    return failed(f"on rank {rank}, rank {j}'s shard (elements {cut.start}.."
                                  f"{cut.stop - 1}) differs after step {step}: {why}")
    dtypes = {report["returned"][0].dtype.name for report in reports} - {"float32"}
    if dtypes:
        return failed(f"right values, but your weights came back as {', '.join(dtypes)}: keep "
                      f"them float32, the dtype they came in (all-gather the float32 shard).")
    for rank, report in enumerate(reports):
        for step, sent in enumerate(report["sent"], start=1):
            problem = _traffic_problem(sent, length, n, rank, step)
            if problem:
                return failed(problem)
    u = (n - 1) * length * 4 // n
    where = {"grpc": "gRPC", "local": "thread", "shm": "shared-memory"}.get(transport, transport)
    return passed(f"ZeRO-1 on {n} {where} ranks: after {steps} Adam steps every shard matches "
                  f"all-reduce + Adam on the full weights, with m and v for {size} of the {length} "
                  f"weights per rank. Rank 0 sent {2 * u} bytes per step: reduce-scatter {u} + "
                  f"all-gather {u} = 2(N−1)/N·S, an all-reduce's bytes.")


number("11.2", module=__name__,
       setup="psi, N, K = 1.5e9, 8, 12   # parameters, ranks, Adam's bytes per parameter (mixed)",
       blanks=(Blank("my_bytes", key="2 * psi + (2 + K) * psi / N"),),
       inputs={"psi": 1.5e9, "world_size": 8}, call="psi, N", unit="bytes",
       answer=lambda d: sum(zero_formula("zero2", d.psi, d.world_size, "mixed").values()),
       slips=lambda d: _zero2_slips(d.psi, d.world_size),
       otherwise=lambda d, name, got: (
        f"off by ×{got / sum(zero_formula('zero2', d.psi, d.world_size, 'mixed').values()):.3g}. "
        f"Add the three parts one by one: parameters, gradients, optimizer states "
        f"(hint(\"11.2\"))."),
       success=lambda d: _zero2_success(d.psi, d.world_size))


def _gb(x: float) -> str:
    return f"{x / 1e9:.4g} GB"


def _zero2_slips(psi: float, n: int) -> list:
    return [Slip(sum(zero_formula("zero2", psi, n, "mixed").values()) / 1e9,
                 "that looks like GB: answer in bytes."),
            Slip(4 * psi + 12 * psi / n, "the gradients are not divided by N: 4Ψ + KΨ/N is "
                 "ZeRO-1, which shards only the optimizer states. ZeRO-2 keeps only its 1/N of "
                 "the gradients too."),
            Slip(4 * psi + 16 * psi / n, "you counted 4-byte parameters and gradients: in mixed "
                 "precision they are fp16, 2 bytes each; the fp32 copy of the weights is one of "
                 "the K = 12 bytes."),
            Slip(16 * psi, "that is data parallel's (2 + 2 + K)Ψ, nothing sharded. ZeRO-2 shards "
                 "the gradients and the optimizer states."),
            Slip(16 * psi / n, "that is ZeRO-3's (2 + 2 + K)Ψ/N. ZeRO-2 still keeps every "
                 "parameter on every rank: 2Ψ bytes of fp16."),
            Slip(14 * psi / n, "you left out the parameters: ZeRO-2 keeps all of them on every "
                 "rank."),
            Slip(2 * psi + 2 * psi / n + 12 * psi, "the optimizer states are sharded too (stage "
                 "1; stage 2 adds the gradients): KΨ/N."),
            Slip(2 * psi + 10 * psi / n, "K = 8 counts m and v alone; mixed precision adds the "
                 "fp32 master weights: K = 12.")]


def _zero2_success(psi: float, n: int) -> str:
    want = sum(zero_formula("zero2", psi, n, "mixed").values())
    return (f"{want:,.0f} bytes = 2Ψ + (2 + K)Ψ/N, {_gb(want)}: all the fp16 parameters "
            f"({_gb(2 * psi)}), 1/{n} of the gradients and of Adam's state. Data parallel holds "
            f"{_gb(16 * psi)}, ZeRO-1 {_gb(4 * psi + 12 * psi / n)}, ZeRO-3 "
            f"{_gb(16 * psi / n)}.")


number("11.3", module=__name__,
       setup="psi, N, b = 1.5e9, 8, 2   # parameters, ranks, bytes per element on the wire (fp16)",
       blanks=(Blank("my_bytes", key="3 * (N - 1) / N * psi * b"),),
       inputs={"psi": 1.5e9, "world_size": 8, "itemsize": 2}, call="psi, N, b", unit="bytes",
       answer=lambda d: 3 * _one_collective(d),
       slips=lambda d: [
        Slip(3 * _one_collective(d) / 1e9, "looks-like-gb"),
        Slip(2 * _one_collective(d), "data-parallel-2"),
        Slip(4 * _one_collective(d), "one-collective-too"),
        Slip(3 * d.psi * d.itemsize, "each-ring-collective"),
        Slip(3 * _one_collective(d) / d.itemsize, "counts-elements-multiply"),
        Slip(_one_collective(d), "one-collective-bytes"),
        Slip(3 * _one_collective(d) * 4 / d.itemsize, "parameters-and-gradients"),
    ],
       otherwise=lambda d, name, got: (
        f"off by ×{got / (3 * _one_collective(d)):.3g}. List one step's collectives and what each "
        f"one covers (hint(\"11.3\"))."),
       values=lambda d: {"zero3": 3 * _one_collective(d), "ddp": 2 * _one_collective(d)})


def _one_collective(d) -> float:
    """Bytes one rank sends in one ring collective over the whole model."""
    return (d.world_size - 1) / d.world_size * d.psi * d.itemsize
