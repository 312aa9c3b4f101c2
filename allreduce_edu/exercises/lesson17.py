"""Lesson 17 · compressed all-reduce: measurements (`measure_schemes`, `step_model`, `fp8_error`)
and checkers: `check_error_feedback` checks your error feedback's invariant every step with two
biased compressors; `check_powersgd_ratio` takes a number, `check_when_compression_pays` a letter.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..collectives import allreduce
from ..compress import ErrorFeedback, allreduce_fp8
from ..compress.train import sent_since
from .feedback import Feedback, failed, multiple_choice, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook

# all-reduce-shaped exchanges (2(N − 1) steps each) a scheme runs per step; every other scheme: 1
EXCHANGES = {"powersgd": 3}  # the uncompressed tensors, the Ps, the Qs


def step_model(scheme, shapes, world_size: int, links, dtype="float32", step: int = 10) -> float:
    """α-β seconds of one step: each exchange is 2(N − 1) link steps of α, and every rank sends
    its share of the scheme's bytes, bytes_per_step / N, at β a byte."""
    n, link = world_size, links.uniform
    nbytes = scheme.bytes_per_step(shapes, dtype, n, step)  # all ranks together
    return EXCHANGES.get(scheme.name, 1) * 2 * (n - 1) * link.alpha + nbytes / n * link.beta


def _steps_on_rank(comm, scheme, shapes, steps: int, dtype: str, seed: int) -> dict:
    """Run on every rank: `steps` rounds of scheme.mean on a random gradient bucket of `shapes`;
    the bytes all ranks sent and the slowest rank's seconds, per step."""
    total = sum(math.prod(s) for s in shapes)
    seconds, sent = np.zeros(steps), np.zeros(steps)
    for step in range(steps):
        rng = np.random.default_rng([seed, step, comm.rank])
        flat = rng.standard_normal(total).astype(dtype)  # (total,) this rank's gradients
        comm.barrier()  # every rank starts the step together, as after a backward pass
        mark, t0 = len(comm.trace.events), time.perf_counter()
        scheme.mean(comm, flat, shapes, key=0, last=True)
        seconds[step], sent[step] = time.perf_counter() - t0, sent_since(comm, mark)
    return {"seconds": allreduce(comm, seconds, "max"), "bytes": allreduce(comm, sent, "sum")}


def measure_schemes(cluster, schemes: dict, shapes, steps: int = 5, skip: int = 2,
                    dtype: str = "float32") -> dict:
    """name -> {"bytes": bytes per step from the trace, "seconds": the median step after the
    first `skip` (PowerSGD's plain warm-up steps)}, averaging one bucket of `shapes`."""
    out = {}
    for name, scheme in schemes.items():
        run = cluster.run(_steps_on_rank, scheme, [tuple(s) for s in shapes], steps, dtype, 0)[0]
        out[name] = {"bytes": int(run["bytes"][-1]),
                     "seconds": float(np.median(run["seconds"][skip:]))}
    return out


def _fp8_on_rank(comm, hops: str, count: int) -> float:
    """Run on every rank: the relative error of the FP8 all-reduce's sum (float64 reference)."""
    def values(rank):
        return np.random.default_rng([7, rank]).standard_normal(count).astype(np.float32)
    got = allreduce_fp8(comm, values(comm.rank), hops).astype(np.float64)
    exact = sum(values(r).astype(np.float64) for r in range(comm.world_size))
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def fp8_error(cluster, hops: str, count: int = 4096) -> float:
    """‖FP8 sum − exact sum‖ / ‖exact sum‖ on `cluster`, quantized once or at every hop."""
    return cluster.run(_fp8_on_rank, hops, count)[0]


class YourFeedback(ErrorFeedback):
    """ErrorFeedback whose step is your `step_fn(grad, residual, compress) -> (sent, residual)`."""

    def __init__(self, step_fn):
        super().__init__()
        self.step_fn = step_fn

    def step(self, key, grad, compress) -> np.ndarray:
        residual = self.residuals.get(key)
        if residual is None or residual.shape != np.shape(grad):
            residual = np.zeros_like(grad)
        sent, self.residuals[key] = self.step_fn(grad, residual, compress)
        return np.asarray(sent)


def with_feedback(scheme, step_fn):
    """`scheme` (PowerSGD) with its error feedback done by `step_fn`."""
    scheme.feedback = YourFeedback(step_fn)
    return scheme


# --- 17.1 ------------------------------------------------------------------------------------
EF_SOLUTION = """def my_error_feedback_step(grad, residual, compress):
    corrected = grad + residual        # this step's gradient and what earlier steps kept back
    sent = compress(corrected)         # what travels
    return sent, corrected - sent      # what the compressor dropped waits for the next step"""


def top_k(x, share: float = 0.25):
    """Keep the largest quarter of |x|, zero the rest (a biased compressor)."""
    flat = x.reshape(-1)
    keep = np.argsort(-np.abs(flat), kind="stable")[:max(1, int(share * flat.size))]
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(x.shape)


def scaled_sign(x):
    """sign(x) · ‖x‖/√len: 1-bit compression (biased)."""
    return np.sign(x) * (np.linalg.norm(x) / math.sqrt(max(x.size, 1)))


COMPRESSORS = {"top-k (the largest quarter)": top_k, "scaled sign (1-bit)": scaled_sign}

class _Spy:
    """A compressor that writes down what it was given and what it returned."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, x):
        x = np.array(x, dtype=np.float64)
        self.calls.append((x, self.fn(x)))
        return self.calls[-1][1].copy()


@exercise(
    "17.1", "write the error-feedback step", kind="code", function="my_error_feedback_step",
    solution=EF_SOLUTION,
    hints=("Write down what must hold after every step: each gradient so far is either sent "
           "already or still waiting in the residual. What must compress be given so that "
           "stays true from one step to the next?",
           "compress must see this step's gradient plus the residual the earlier steps left. "
           "Whatever of that sum the compressor did not send becomes the new residual.",
           "The key idea: error feedback never throws away what the compressor drops. It adds "
           "it to the next step's input, sends the compressed sum, and keeps the difference "
           "between that sum and what was sent; gradient is only delayed, never lost."),
    key="""from allreduce_edu.exercises.lesson17 import check_error_feedback, hint, solution


""" + EF_SOLUTION + """


check_error_feedback(my_error_feedback_step)""")
def check_error_feedback(my_error_feedback_step, steps: int = 8, shape=(6, 5)) -> Feedback:
    """Exercise 17.1: every step, sent + residual == the sum of the gradients so far."""
    for name, compress in COMPRESSORS.items():
        problem = _feedback_problem(my_error_feedback_step, compress, name, steps, shape)
        if problem:
            return failed(problem)
    return passed(f"for {steps} steps with two biased compressors, what was sent plus the "
                  f"residual equalled the sum of the gradients after every step: nothing the "
                  f"compressor dropped was lost, only delayed. The loss curves below run your "
                  f"step inside PowerSGD.")


def _feedback_problem(fn, compress, name: str, steps: int, shape) -> str:
    """What goes wrong with `fn` under `compress` ("" if the invariant holds every step)."""
    rng = np.random.default_rng(17)
    residual = np.zeros(shape)
    grads_so_far, sent_so_far = np.zeros(shape), np.zeros(shape)
    for step in range(1, steps + 1):
        grad = rng.standard_normal(shape)
        spy = _Spy(compress)
        at = f"with {name}, step {step}"
        try:
            got = fn(grad.copy(), residual.copy(), spy)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return f"{at}: your function raised {type(e).__name__}: {e}"
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"{at}: return two arrays, (sent, residual); you returned {type(got).__name__}."
        sent, new = (np.asarray(g, dtype=np.float64) for g in got)
        if sent.shape != shape or new.shape != shape:
            return (f"{at}: sent and residual must have the gradient's shape {shape}; you "
                    f"returned shapes {sent.shape} and {new.shape}.")
        if not spy.calls:
            return (f"{at}: you never called compress. What travels must be compress(...) of "
                    f"something; otherwise nothing is compressed.")
        if len(spy.calls) > 1:
            return (f"{at}: you called compress {len(spy.calls)} times; each call is a message "
                    f"on the wire. Call it once per step.")
        given, returned = spy.calls[0]
        if not np.allclose(sent, returned, rtol=0, atol=1e-12):
            if np.allclose(new, returned, rtol=0, atol=1e-12):
                return f"{at}: you returned (residual, sent); return (sent, residual)."
            return (f"{at}: the sent array is not what compress returned. What you send is "
                    f"exactly the compressor's output.")
        grads_so_far += grad
        sent_so_far += sent
        gap = float(np.max(np.abs(grads_so_far - (sent_so_far + new))))
        if gap > 1e-9:
            return f"{at}: the invariant broke. {_why(step, grad, residual, given, new, sent, gap)}"
        residual = new
    return ""


def _why(step, grad, residual, given, new, sent, gap) -> str:
    """The likely slip behind a broken invariant, in words."""
    where = (f"The sum of the gradients of steps 1..{step} differs from the sum of what was sent "
             f"plus your residual by up to {gap:.3g}.")
    if step > 1 and np.allclose(given, grad) and not np.allclose(residual, 0):
        return (f"{where} compress was given this step's gradient alone: add the residual the "
                f"earlier steps left to it first.")
    if np.allclose(new, 0):
        return (f"{where} Your residual is zero, so what the compressor dropped is lost; keep "
                f"it for the next step.")
    if np.allclose(new, grad - sent):
        return (f"{where} Your residual is grad − sent, which forgets the residual you were "
                f"given: keep what compress did not send of the sum it was given.")
    return f"{where} hint(\"17.1\") gives a hint."


# --- 17.2 ------------------------------------------------------------------------------------
@exercise(
    "17.2", "predict PowerSGD's compression ratio for a conv layer", kind="number",
    todo="replace None with the ratio (a number or an expression), then run this cell again.",
    hints=("PowerSGD compresses matrices. A gradient of more than two dimensions is viewed as "
           "a matrix first: its first dimension by all the others together (torch: "
           "view(n, -1)). What are n and m for shape (256, 128, 3, 3)?",
           "n = 256 and m = 128·3·3 = 1152. Then count what travels instead of the n·m values.",
           "The key idea: P is n×r and Q is m×r, and both travel, so (n + m)·r values replace "
           "n·m; the ratio is the values before divided by the values after."),
    solution="""View the gradient as a matrix: n = 256 rows by m = 128·3·3 = 1152 columns.
Uncompressed it is n·m = 294,912 values; PowerSGD at rank 2 sends P (n×r) and Q (m×r):
(n + m)·r = 1408·2 = 2,816 values. The ratio is 294,912 / 2,816 ≈ 104.7
(compression_ratio(256, 1152, 2)).""",
    key="""from allreduce_edu.exercises.lesson17 import check_powersgd_ratio, hint, solution

# view (256, 128, 3, 3) as 256 × 1152; P and Q travel: (n + m)·r values instead of n·m
my_ratio = 256 * 1152 / ((256 + 1152) * 2)
check_powersgd_ratio(my_ratio)""")
def check_powersgd_ratio(answer, shape=(256, 128, 3, 3), rank: int = 2) -> Feedback:
    """Exercise 17.2: how many times fewer values PowerSGD sends for a gradient of `shape`."""
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)) \
            or not answer > 0:
        return failed("answer with a positive number: how many times fewer values travel.")
    n, m, r = shape[0], math.prod(shape[1:]), rank
    want = n * m / ((n + m) * r)
    def close(x):
        return abs(answer - x) <= 0.01 * x
    if close(want):
        return passed(f"{want:.1f}: the {shape} gradient is a {n}×{m} matrix, {n * m:,} values; "
                      f"P and Q are ({n} + {m})·{r} = {(n + m) * r:,}. A layer this wide "
                      f"compresses well; a 64×64 matrix at rank 2 only 16×.")
    second = shape[1]
    wrong = {
        n * second / ((n + second) * r): f"that uses m = {second}. PowerSGD views the gradient as "
        f"shape[0] × everything else, so m = {second}·{math.prod(shape[2:])} = {m}.",
        n * m / (n + m): "each factor has r columns: P is n×r and Q is m×r, so (n + m)·r values "
        "travel.",
        m / r: "that counts only P (n×r) against n·m: Q (m×r) travels too.",
        n / r: "that counts only Q (m×r): P (n×r) travels too.",
        n * m / (sum(shape) * r): "the matrix has two sides, n and m: every dimension after the "
        "first goes into m (their product), not into a sum of four.",
        (n + m) * r / (n * m): "that is the compressed share; the ratio is before ÷ after, more "
        "than 1.",
    }
    for value, why in wrong.items():
        if close(value):
            return failed(why)
    return failed(f"off by ×{answer / want:.3g}: view the gradient as a matrix, count the values "
                  f"of P and Q, and divide (hint(\"17.2\")).")


# --- 17.3 ------------------------------------------------------------------------------------
@exercise(
    "17.3", "when compression pays", kind="choice",
    hints=("Write the α-β time of one plain ring all-reduce here: 2(N − 1)·α + 2(N − 1)/N·S·β. "
           "Which of the two terms is bigger on this network?",
           "Compression shrinks S, so only the β term. How many all-reduces, each paying "
           "2(N − 1)·α, does one PowerSGD step run?",
           "The key idea: compression pays only when the bytes' time dominates the step. Where "
           "latency dominates, fewer bytes save almost nothing, and PowerSGD's three all-reduces "
           "pay the latency three times."),
    solution="""c: on this network the plain ring takes 2(N − 1)·α = 14 · 30 ms = 420 ms of
latency and only 2(N − 1)/N · 2 MB / 1 GB/s ≈ 3.5 ms of bytes. PowerSGD shrinks the 3.5 ms to
almost nothing but runs three all-reduces (the uncompressed tensors, the Ps, the Qs), each paying
the 420 ms: about 1.26 s against 0.42 s. fp16 would save under 2 ms. Compression pays where
the β term dominates (the slow link above), not where α does.""",
    key="""from allreduce_edu.exercises.lesson17 import check_when_compression_pays, hint, solution

my_choice = "c"   # α dominates; PowerSGD pays it three times
check_when_compression_pays(my_choice)""")
def check_when_compression_pays(choice: str) -> Feedback:
    """Exercise 17.3: PowerSGD across two data centres with a large α and small gradients."""
    answers = {
        "a": "no: count the time, not the bytes. Here plain's bytes take about 3.5 ms "
             "(2(N − 1)/N·S·β); what does the α part cost, and how often does PowerSGD pay it?",
        "b": "no: slow in which term? α is large here but the bytes are few: 2(N − 1)·α ≈ 420 "
             "ms against ≈ 3.5 ms of bytes. Compression shrinks only the bytes' term.",
        "c": "",
        "d": "no: compression_ratio(128, 128, 4) is 16, so PowerSGD does send fewer values. "
             "The reason is what every all-reduce costs whatever its size.",
    }
    success = ("the step is latency-bound: 420 ms of α against 3.5 ms of bytes, and PowerSGD "
               "runs three all-reduces, about 1.26 s against 0.42 s. Compression pays only when "
               "the β term dominates; torch's hooks and DeepSpeed's 1-bit Adam are for "
               "bandwidth-bound steps.")
    return multiple_choice(choice, answers, right="c", success=success)
