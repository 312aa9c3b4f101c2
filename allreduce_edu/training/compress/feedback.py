"""Error feedback: what a biased compressor drops this step is added back to the next step's input.

Seide et al., "1-bit stochastic gradient descent" (2014); Karimireddy et al., "Error feedback fixes
SignSGD" (2019); PowerSGD keeps it on by default (Vogels et al., 2019). With it, nothing is lost,
only delayed: after every step, on every rank,

    sum of the gradients so far == sum of what was sent so far + the residual

so compression shifts gradient in time instead of throwing it away. `ErrorFeedback(audit=True)`
keeps both running sums so a test (or a lesson's checker) can check that invariant every step.
"""

from __future__ import annotations

import numpy as np


def error_feedback_step(grad, residual, compress) -> tuple[np.ndarray, np.ndarray]:
    """(sent, new residual): compress grad + residual, and keep what the compression dropped."""
    corrected = grad + residual
    sent = compress(corrected)
    return sent, corrected - sent


class ErrorFeedback:
    """The residuals of one rank, one per key (a tensor, a bucket, a chunk), zero to begin with."""

    def __init__(self, audit: bool = False):
        self.residuals: dict = {}
        self.audit = audit
        self.totals: dict = {}  # key -> [sum of grads, sum of what was sent], when auditing

    def step(self, key, grad, compress) -> np.ndarray:
        """What to use of `grad` this step: compress(grad + residual[key]); remembers the rest."""
        grad = np.asarray(grad)
        residual = self.residuals.get(key)
        if residual is None or residual.shape != grad.shape:
            residual = np.zeros_like(grad)
        sent, self.residuals[key] = error_feedback_step(grad, residual, compress)
        if self.audit:
            grads, sents = self.totals.setdefault(key, [np.zeros_like(grad), np.zeros_like(grad)])
            grads += grad
            sents += sent
        return sent

    def gap(self, key) -> float:
        """max |sum of grads - (sum sent + residual)| for `key`: 0 up to rounding (audit=True)."""
        grads, sents = self.totals[key]
        return float(np.max(np.abs(grads - (sents + self.residuals[key])), initial=0.0))

    def __repr__(self) -> str:
        return f"ErrorFeedback({len(self.residuals)} residuals)"
