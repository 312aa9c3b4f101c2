"""A signal's two halves, as Numba kernels: a store that nothing before it may pass, and a load
that nothing after it may pass (comm.window; lesson 18).

x86 keeps one core's stores in order anyway; ARM (Apple's laptops) does not, and there a flag could
become visible before the data it announces. LLVM's `fence seq_cst` is the portable answer; Python
has no way to say it, so these two kernels do (`numba.core.extending.intrinsic`).
"""

from __future__ import annotations

from numba import njit, types
from numba.core.extending import intrinsic


@intrinsic
def _fence(typingctx):
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@njit(cache=True, nogil=True)
def store(pad, channel, src, value):
    """pad[channel, src] = value, after every earlier write of this thread is visible."""
    _fence()
    pad[channel, src] = value


@njit(cache=True, nogil=True)
def load(pad, channel, src):
    """pad[channel, src]; no later read of this thread sees older data than it."""
    value = pad[channel, src]
    _fence()
    return value
