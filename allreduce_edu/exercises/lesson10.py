"""Lesson 10 · transports: gRPC and shared memory side by side, the crossover they move, the bytes
a ring copies, and the transport NCCL picks for a pair of GPU ranks.

`check_crossover_shift` compares your factor with the one your own fitted α and β give;
`check_copied_bytes` with the count of bytes a ring copies into shared memory (the lesson then
measures it); `check_transport_names` with the transport NCCL picks for three pairs of GPU ranks.
"""

from __future__ import annotations

from ..model.costmodel import crossover
from ..trace import format_bytes
from .registry import exercise, hint, solution  # noqa: F401 - notebook
from .spec import REQUIRED, Blank, Slip, names, number
from .texts import exercise_texts, message

PAIRS = {  # exercise 10.3: pairs of GPU ranks the table does not name -> NCCL's transport
    "GPU 0 and GPU 1 of one server, behind one PCIe switch that allows peer access": ("P2P",),
    "two GPUs of one server whose PCIe layout forbids peer access": ("SHM",),
    "GPU 3 of server A and GPU 3 of server B, RoCE (RDMA over Ethernet), GPUDirect": ("NET",),
}


def _fit(fit) -> tuple[float, float]:
    alpha, beta = (float(v) for v in fit)
    if not (alpha > 0 and beta > 0):
        raise ValueError(message(__name__, "10.1", "fit-alpha-beta", fit=fit))
    return alpha, beta


number("10.1", module=__name__,
       setup='(alpha_g, beta_g), (alpha_s, beta_s) = fits["grpc"], fits["shm"]',
       blanks=(Blank("my_factor", key="(alpha_s / beta_s) / (alpha_g / beta_g)"),),
       inputs={"fits": REQUIRED}, call="fits", answer=lambda d: _shift(d.fits),
       slips=lambda d: _shift_slips(d.fits),
       otherwise=lambda d, name, got: (
        message(__name__, "10.1", "off-by", factor=got / _shift(d.fits))),
       success=lambda d: _shift_success(d.fits))


def _shift(fits) -> float:
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    return crossover("tree", "ring", 4, as_, bs) / crossover("tree", "ring", 4, ag, bg)


def _shift_slips(fits) -> list:
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    return [Slip(1 / _shift(fits), "upside-down-divide"),
            Slip(as_ / ag, "ratio-alone-crossover"),
            Slip(bs / bg, "beta-alone"),
            Slip(bg / bs, "beta-alone")]


def _shift_success(fits) -> str:
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    want = _shift(fits)
    way = "up: β fell more than α" if want > 1 else "down: α fell more than β"
    return (message(__name__, "10.1", "want-3g-way", want=want, way=way,
                    crossover=crossover('tree', 'ring', 4, ag, bg),
                    crossover2=crossover('tree', 'ring', 4, as_, bs)))


def model_against_measured(model: float | None, seen, largest: int) -> str:
    """Where the model's crossover falls against lesson 05's `measured_crossover` (`seen`), in
    words: lesson 10 prints this, so the model's size stays exercise 10.1's to compute."""
    if model is None:
        return message(__name__, "10.2", "nowhere-in-model")
    if seen is None:
        return f"{'below' if model < largest else 'above'} {format_bytes(largest)}"
    low, high = seen
    if low is not None and model < low:
        return "below that range"
    return "above that range" if model > high else "inside that range"


def copied_bytes(count: int, itemsize: int, world_size: int, rank: int) -> int:
    """Bytes `rank` copies into shared memory in a ring all-reduce of `count` elements: its own
    chunk r − 1 at reduce-scatter step 0, and the all-gather's chunks r, r − 1, …, r − N + 2.
    The N − 2 chunks reduced in between go out from the segment they were reduced into."""
    n = world_size
    if n == 1:
        return 0
    q, extra = divmod(count, n)
    size = lambda chunk: (q + (chunk % n < extra)) * itemsize  # noqa: E731 - np.array_split's
    return size(rank - 1) + sum(size(rank - s) for s in range(n - 1))


number("10.2", module=__name__, setup="S, N = 16 << 20, 4", blanks=(Blank("my_copied", key="S"),),
       inputs={"nbytes": 16 << 20, "world_size": 4}, call="S, N", unit="bytes",
       answer=lambda d: d.nbytes,
       slips=lambda d: [
        Slip(2 * (d.world_size - 1) * d.nbytes / d.world_size, "everything-rank-sends"),
        Slip((d.world_size - 1) * d.nbytes / d.world_size, "counts-one-phase"),
        Slip((d.world_size - 2) * d.nbytes / d.world_size, "count-all-gather"),
        Slip(d.nbytes / d.world_size, "all-gather-too"),
    ],
       otherwise=lambda d, name, got: (
        message(__name__, "10.2", "off-by", factor=got / d.nbytes)),
       values=lambda d: {"ring": 2 * (d.world_size - 1) * d.nbytes // d.world_size})


names("10.3", module=__name__, verb="name them", table=PAIRS,
      fallback=lambda situation, got: _pair_slip(situation, got))


def _pair_slip(situation: str, got: str) -> str:
    """The hint for a wrong transport, whatever its case; a name NCCL does not have."""
    slips = exercise_texts(__name__, "10.3")["slips"][situation]
    return slips.get(got.upper()) or message(__name__, "10.3", "got-one-nccl", got=got)
