"""Lesson 17 · compressed all-reduce: measurements (`measure_schemes`, `step_model`, `fp8_error`)
and checkers: `check_error_feedback` checks your error feedback's invariant every step with two
biased compressors; `check_powersgd_ratio` takes a number, `check_when_compression_pays` a letter.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ..collectives import allreduce
from ..training.compress import ErrorFeedback, allreduce_fp8
from ..training.compress.train import sent_since
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number
from .texts import message

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


@exercise("17.1", kind="code", function="my_error_feedback_step",
          library=("training.compress.feedback:error_feedback_step",), gaps=(2, 2))
def check_error_feedback(my_error_feedback_step, steps: int = 8, shape=(6, 5)) -> Feedback:
    """Exercise 17.1: every step, sent + residual == the sum of the gradients so far."""
    for name, compress in COMPRESSORS.items():
        problem = _feedback_problem(my_error_feedback_step, compress, name, steps, shape)
        if problem:
            return failed(problem)
    return passed(message(__name__, "17.1", "for-steps-steps", steps=steps))


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
            return message(__name__, "17.1", "at-return-two", at=at, name=type(got).__name__)
        sent, new = (np.asarray(g, dtype=np.float64) for g in got)
        if sent.shape != shape or new.shape != shape:
            return (message(__name__, "17.1", "at-sent-and", at=at, shape=shape, shape2=sent.shape,
                            shape3=new.shape))
        if not spy.calls:
            return (message(__name__, "17.1", "at-never-called", at=at))
        if len(spy.calls) > 1:
            return (message(__name__, "17.1", "at-called-compress", at=at, count=len(spy.calls)))
        given, returned = spy.calls[0]
        if not np.allclose(sent, returned, rtol=0, atol=1e-12):
            if np.allclose(new, returned, rtol=0, atol=1e-12):
                return message(__name__, "17.1", "at-returned-residual", at=at)
            return (message(__name__, "17.1", "at-sent-array", at=at))
        grads_so_far += grad
        sent_so_far += sent
        gap = float(np.max(np.abs(grads_so_far - (sent_so_far + new))))
        if gap > 1e-9:
            return f"{at}: the invariant broke. {_why(step, grad, residual, given, new, sent, gap)}"
        residual = new
    return ""


def _why(step, grad, residual, given, new, sent, gap) -> str:
    """The likely slip behind a broken invariant, in words."""
    where = (message(__name__, "17.1", "sum-gradients-steps", step=step, gap=gap))
    if step > 1 and np.allclose(given, grad) and not np.allclose(residual, 0):
        return (message(__name__, "17.1", "where-compress-was", where=where))
    if np.allclose(new, 0):
        return (message(__name__, "17.1", "where-residual-zero", where=where))
    if np.allclose(new, grad - sent):
        return (message(__name__, "17.1", "where-residual-grad", where=where))
    return f"{where} hint(\"17.1\") gives a hint."


# --- 17.2 ------------------------------------------------------------------------------------
def _matrix(d) -> tuple[int, int, int]:
    """(n, m, r): the gradient viewed as shape[0] × the rest, and PowerSGD's rank."""
    return d.shape[0], math.prod(d.shape[1:]), d.rank


def _ratio(d) -> float:
    n, m, r = _matrix(d)
    return n * m / ((n + m) * r)


def _ratio_slips(d) -> list[Slip]:
    (n, m, r), second = _matrix(d), d.shape[1]
    return [
        Slip(n * second / ((n + second) * r), "uses-m-second",
             values={"second": second, "prod": math.prod(d.shape[2:]), "m": m}),
        Slip(n * m / (n + m), "each-factor-has"),
        Slip(m / r, "counts-only-p"),
        Slip(n / r, "counts-only-q"),
        Slip(n * m / (sum(d.shape) * r), "matrix-has-two"),
        Slip((n + m) * r / (n * m), "compressed-share-ratio"),
    ]


def _ratio_success(d) -> str:
    n, m, r = _matrix(d)
    return (message(__name__, "17.2", "ratio-1f-shape", ratio=_ratio(d), shape=d.shape, n=n, m=m,
                    values=n * m, r=r, sent=(n + m) * r))


number("17.2", module=__name__, blanks=(Blank("my_ratio", key="256 * 1152 / ((256 + 1152) * 2)"),),
       inputs={"shape": (256, 128, 3, 3), "rank": 2}, answer=_ratio, slips=_ratio_slips,
       success=_ratio_success,
       otherwise=lambda d, name, got: (message(__name__, "17.2", "off-by",
                                               factor=got / _ratio(d))))


# --- 17.3 ------------------------------------------------------------------------------------
choice("17.3", module=__name__)
