"""Lesson 17's checkers: a right answer passes, typical wrong ones fail with a specific hint; the
lesson's helpers run on real ranks (timings are the lesson's, never asserted here)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson17 import (
    YourFeedback,
    check_error_feedback,
    check_powersgd_ratio,
    check_when_compression_pays,
    fp8_error,
    measure_schemes,
    step_model,
    with_feedback,
)
from allreduce_edu.model.links import Links
from allreduce_edu.training.compress import FP16, OneBit, PowerSGD, Scheme, compression_ratio, train


def forgets_the_residual(grad, residual, compress):
    sent = compress(grad)
    return sent, grad - sent


def keeps_grad_minus_sent(grad, residual, compress):
    sent = compress(grad + residual)
    return sent, grad - sent


def drops_everything(grad, residual, compress):
    return compress(grad + residual), np.zeros_like(grad)


def swapped(grad, residual, compress):
    sent = compress(grad + residual)
    return grad + residual - sent, sent


def sends_uncompressed(grad, residual, compress):
    compress(grad + residual)
    return grad + residual, np.zeros_like(grad)


def never_compresses(grad, residual, compress):
    return grad + residual, np.zeros_like(grad)


def compresses_twice(grad, residual, compress):
    sent = compress(compress(grad + residual))
    return sent, grad + residual - sent


def my_error_feedback_step(grad, residual, compress):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def test_error_feedback_checker_passes_the_solution_and_names_the_step_that_breaks():
    assert check_error_feedback(reference("17.1"))
    for fn, text in [(forgets_the_residual, "step 2: the invariant broke"),
                     (forgets_the_residual, "this step's gradient alone"),
                     (keeps_grad_minus_sent, "step 2: the invariant broke"),
                     (keeps_grad_minus_sent, "forgets the residual you were given"),
                     (drops_everything, "step 1: the invariant broke"),
                     (drops_everything, "what the compressor dropped is lost"),
                     (swapped, "you returned (residual, sent)"),
                     (sends_uncompressed, "not what compress returned"),
                     (never_compresses, "never called compress"),
                     (compresses_twice, "called compress 2 times"),
                     (lambda g, r, c: c(g + r), "return two arrays"),
                     (lambda g, r, c: 1 / 0, "raised ZeroDivisionError")]:
        feedback = check_error_feedback(fn)
        assert not feedback and text in feedback.message, (fn, feedback)
    assert check_error_feedback(my_error_feedback_step).status == "not attempted"


def test_powersgd_ratio_checker():
    want = compression_ratio(256, 1152, 2)
    assert want == pytest.approx(104.727, abs=1e-3)
    assert check_powersgd_ratio(want) and check_powersgd_ratio(104.7)
    for answer, text in [(256 * 128 / (384 * 2), "m = 128"), (256 * 1152 / 1408, "r columns"),
                         (1152 / 2, "only P"), (256 / 2, "only Q"),
                         (256 * 1152 / (390 * 2), "two sides"), (1 / want, "before ÷ after"),
                         (3 * want, "off by"), (-1, "positive number"), ("105", "answer with a number")]:
        feedback = check_powersgd_ratio(answer)
        assert not feedback and text in feedback.message, (answer, feedback)
    assert check_powersgd_ratio(None).status == "not attempted"


def test_when_compression_pays():
    assert check_when_compression_pays("a") and check_when_compression_pays(" A ")
    assert "which term" in check_when_compression_pays("b").message
    assert "is 16" in check_when_compression_pays("c").message
    assert "only the bytes' term" in check_when_compression_pays("d").message
    assert compression_ratio(128, 128, 4) == 16
    assert "answer with" in check_when_compression_pays("e").message


def test_the_numbers_of_17_3_follow_the_model():
    """2 GB behind α = 30 ms: bandwidth-bound, PowerSGD wins; 2 MB: latency-bound, it loses."""
    alpha, beta, n = 30e-3, 1 / 1e9, 8
    links = Links.flat(alpha, 1e9)
    for s, powersgd_wins in ((2e9, True), (2e6, False)):
        plain = 2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta
        shapes = [(128, 128)] * (int(s) // 4 // (128 * 128))
        assert step_model(Scheme(), shapes, n, links) == pytest.approx(plain, rel=0.01)
        ratio = step_model(PowerSGD(4), shapes, n, links) / plain
        assert (ratio < 0.45) if powersgd_wins else (ratio > 2.9), (s, ratio)
    assert 2 * (n - 1) * alpha == pytest.approx(0.42)
    assert 2 * (n - 1) / n * 2e9 * beta == pytest.approx(3.5)


SHAPES = [(64, 64), (64,), (64, 32)]


def test_measure_schemes_counts_each_scheme_s_bytes_from_the_trace():
    schemes = {"plain": Scheme(), "fp16": FP16(), "powersgd": PowerSGD(2), "onebit": OneBit()}
    runs = measure_schemes(cluster_for("local", 3), schemes, SHAPES, steps=3, skip=1)
    for name, scheme in schemes.items():
        assert runs[name]["bytes"] == scheme.bytes_per_step(SHAPES, "float32", 3, step=2), name
        assert runs[name]["seconds"] > 0


def test_step_model_is_exchanges_of_alpha_plus_bytes_per_rank():
    links, n = Links.flat("5ms", "10MB/s"), 4
    plain = Scheme().bytes_per_step(SHAPES, "float32", n)
    assert step_model(Scheme(), SHAPES, n, links) == pytest.approx(6 * 5e-3 + plain / n / 10e6)
    sgd = PowerSGD(1)
    factors = sgd.bytes_per_step(SHAPES, "float32", n, step=10)
    assert step_model(sgd, SHAPES, n, links) == pytest.approx(18 * 5e-3 + factors / n / 10e6)


def test_fp8_error_grows_per_hop_and_not_once():
    once = [fp8_error(cluster_for("local", n), "once") for n in (2, 8)]
    ring = [fp8_error(cluster_for("local", n), "ring") for n in (2, 8)]
    assert once[1] < 1.1 * once[0] and ring[1] > 1.3 * once[1]


def test_your_feedback_runs_inside_powersgd_as_the_library_s():
    cluster = cluster_for("local", 2)
    ours = train(cluster, PowerSGD(1), 6)
    yours = train(cluster, with_feedback(PowerSGD(1), reference("17.1")), 6)
    np.testing.assert_allclose(yours["losses"], ours["losses"], rtol=1e-12)
    assert isinstance(with_feedback(PowerSGD(1), reference("17.1")).feedback, YourFeedback)
