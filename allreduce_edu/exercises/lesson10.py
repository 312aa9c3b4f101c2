"""Lesson 10 · transports: gRPC and shared memory side by side, the crossover they move, the bytes
a ring copies, and the names NCCL and MPI give their transports.

`check_crossover_shift` compares your factor with the one your own fitted α and β give;
`check_copied_bytes` with the count of bytes a ring copies into shared memory (the lesson then
measures it); `check_transport_names` with NCCL's and Open MPI's names for the same three paths.
"""

from __future__ import annotations

from ..model.costmodel import crossover
from ..trace import format_bytes
from .registry import exercise, hint, solution  # noqa: F401 - notebook
from .spec import REQUIRED, Blank, Slip, names, number

TRANSPORT_NAMES = {  # situation -> (NCCL's transport, Open MPI's BTL)
    "two processes on one machine, through host memory": ("SHM", "sm"),
    "two GPUs in one server, over NVLink or PCIe": ("P2P", "smcuda"),
    "two machines, over the network": ("NET", "tcp"),
}
NCCL = {situation: names[0] for situation, names in TRANSPORT_NAMES.items()}


def _fit(fit) -> tuple[float, float]:
    alpha, beta = (float(v) for v in fit)
    if not (alpha > 0 and beta > 0):
        raise ValueError(f"a fit is (alpha, beta) in seconds and seconds per byte, got {fit}")
    return alpha, beta


check_crossover_shift = number(
    "10.1", "how far the crossover moves", module=__name__, checker="check_crossover_shift",
    question="By what factor does the N = 4 tree/ring crossover move when you go from gRPC to "
             "shared memory, with the α and β you fitted above (`fits[\"grpc\"]`, "
             "`fits[\"shm\"]`)?",
    setup='(alpha_g, beta_g), (alpha_s, beta_s) = fits["grpc"], fits["shm"]',
    blanks=(Blank("my_factor", "a number, or an expression of alpha_g, beta_g, alpha_s, beta_s",
                  "(alpha_s / beta_s) / (alpha_g / beta_g)"),),
    inputs={"fits": REQUIRED}, call="fits",
    answer=lambda d: _shift(d.fits),
    slips=lambda d: _shift_slips(d.fits),
    otherwise=lambda d, name, got: (
        f"off by ×{got / _shift(d.fits):.3g}. Write the crossover as a multiple of α/β "
        f"(hint(\"10.1\")), then take the ratio of the two."),
    success=lambda d: _shift_success(d.fits),
    hints=("Lesson 05 found the tree/ring crossover by setting two straight lines equal. On N = 4 "
           "ranks: tree 4α + 4·S·β, ring 6α + 1.5·S·β. Solve for S: it is a fixed number times "
           "α/β.",
           "So the crossover moves by the ratio of the two α/β: (α_shm / β_shm) / (α_grpc / "
           "β_grpc). Unpack each fit with alpha, beta = fits[\"shm\"]."),
    solution="""On N = 4 ranks the crossover is where 4α + 4Sβ = 6α + 1.5Sβ, so S = 0.8·α/β: a
fixed multiple of α/β. From gRPC to shared memory it moves by
    (α_shm / β_shm) / (α_grpc / β_grpc)
which is crossover("tree", "ring", 4, *fits["shm"]) / crossover("tree", "ring", 4, *fits["grpc"]).
α/β is the size at which a message spends as long starting as moving its bytes. Compare your
two fits: where shared memory shrinks β by a larger factor than α (its 1/β rose more than its α
fell), α/β grows and the crossover with it, so the tree's fewer steps win up to larger sizes;
where α fell more, the crossover moves down.""")


def _shift(fits) -> float:
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    return crossover("tree", "ring", 4, as_, bs) / crossover("tree", "ring", 4, ag, bg)


def _shift_slips(fits) -> list:
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    return [Slip(1 / _shift(fits), "upside down: divide the shared-memory crossover by the gRPC "
                                   "one."),
            Slip(as_ / ag, "that is the ratio of the α alone. The crossover is where α's cost "
                           "meets the bytes' cost, so β moves it too: it scales with α/β."),
            Slip(bs / bg, "that is the ratio of the β alone; the crossover scales with α/β."),
            Slip(bg / bs, "that is the ratio of the β alone; the crossover scales with α/β.")]


def _shift_success(fits) -> str:
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    want = _shift(fits)
    way = "up: β fell more than α" if want > 1 else "down: α fell more than β"
    return (f"×{want:.3g}, {way}. The crossover is 0.8·α/β on 4 ranks, so it moves with α/β, from "
            f"{crossover('tree', 'ring', 4, ag, bg):,.0f} B on gRPC to "
            f"{crossover('tree', 'ring', 4, as_, bs):,.0f} B on shared memory.")


def model_against_measured(model: float | None, seen, largest: int) -> str:
    """Where the model's crossover falls against lesson 05's `measured_crossover` (`seen`), in
    words: lesson 10 prints this, so the model's size stays exercise 10.1's to compute."""
    if model is None:
        return "nowhere: in the model the ring never overtakes the tree"
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


check_copied_bytes = number(
    "10.2", "the bytes a ring copies", module=__name__, checker="check_copied_bytes",
    question="In one ring all-reduce of S = 16 MiB on N = 4 ranks over shared memory, how many "
             "bytes does a rank **copy** into shared memory? (It *sends* 2(N − 1)/N·S = 24 MiB.)",
    setup="S, N = 16 << 20, 4",
    blanks=(Blank("my_copied", "bytes: a number, or an expression of S and N", "S"),),
    inputs={"nbytes": 16 << 20, "world_size": 4}, call="S, N", unit="bytes",
    answer=lambda d: d.nbytes,
    slips=lambda d: [
        Slip(2 * (d.world_size - 1) * d.nbytes / d.world_size, "that is everything the rank "
             "sends. The reduce-scatter's middle steps send a chunk the ring reduced straight "
             "into a send buffer: no copy."),
        Slip((d.world_size - 1) * d.nbytes / d.world_size, "that counts one phase. Both phases "
             "copy: the reduce-scatter at step 0, the all-gather at every step."),
        Slip((d.world_size - 2) * d.nbytes / d.world_size, "count the all-gather too: each of "
             "its N − 1 steps copies a finished chunk into a segment."),
        Slip(d.nbytes / d.world_size, "count the all-gather too: each of its N − 1 steps copies a "
             "finished chunk into a segment."),
    ],
    otherwise=lambda d, name, got: (
        f"off by ×{got / d.nbytes:.3g}. Go through one rank's 2(N − 1) sends and mark which ones "
        f"copy (hint(\"10.2\"))."),
    success=lambda d: (
        f"{d.nbytes:,} bytes = S: one chunk at step 0 and N − 1 in the all-gather. The ring sends "
        f"{2 * (d.world_size - 1) * d.nbytes // d.world_size:,} bytes but copies only S of them; "
        f"the next cell counts them on the ranks."),
    hints=("A send copies its array into a segment, unless the array was made by "
           "comm.send_buffer: the ring reduces chunks straight into one, and sends it the next "
           "step. Go through the 2(N − 1) sends of one rank: which of them send a chunk that was "
           "just reduced?",
           "Reduce-scatter: step 0 sends the rank's own input chunk (copied); steps 1 … N − 2 send "
           "the chunk reduced the step before, straight from its segment (no copy). All-gather: "
           "N − 1 sends of finished chunks (copied). Each chunk is S/N bytes."),
    solution="""S bytes, whatever N is: 1 copied chunk in the reduce-scatter (step 0's own input)
plus N − 1 in the all-gather, each S/N bytes: N·S/N = S. The N − 2 chunks reduced in between are
reduced straight into the segment they are sent from (comm.send_buffer), so they are never
copied. Without send_buffer a rank would copy everything it sends, 2(N − 1)/N·S.""")


check_transport_names = names(
    "10.3", "NCCL's and MPI's names for the three paths", module=__name__,
    checker="check_transport_names", verb="name them",
    question="Fill in NCCL's transport for each path (Open MPI's BTL names pass too).",
    table=TRANSPORT_NAMES,
    fallback=lambda situation, got: _transport_slip(got),
    success="SHM, P2P and NET: NCCL picks one per pair of ranks, as this package picks shm or "
            "gRPC per pair (NCCL_DEBUG=INFO prints its choice; Open MPI's sm, smcuda and tcp "
            "BTLs are the same three paths).",
    hints=("NCCL names its transports after the path the bytes take: through host memory, "
           "straight from GPU to GPU, over the network. The table above has them.",
           "NCCL: SHM, P2P, NET. Open MPI's byte-transfer layers (BTLs): sm, smcuda, tcp."))


def _transport_slip(got: str) -> str:
    others = [s for s, v in TRANSPORT_NAMES.items() if got.upper() in map(str.upper, v)]
    return (f"{got} is the path for {others[0]!r}." if others
            else f"{got} is not one of NCCL's transports (SHM, P2P, NET).")
