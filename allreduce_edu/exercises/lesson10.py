"""Lesson 10 · transports: gRPC and shared memory side by side, the crossover they move, the bytes
a ring copies, and the names NCCL and MPI give their transports.

`check_crossover_shift` compares your factor with the one your own fitted α and β give;
`check_copied_bytes` with the count of bytes a ring copies into shared memory (the lesson then
measures it); `check_transport_names` with NCCL's and Open MPI's names for the same three paths.
"""

from __future__ import annotations

import numpy as np

from ..costmodel import crossover
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, solution  # noqa: F401 - notebook

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


@exercise(
    "10.1", "how far the crossover moves", kind="number",
    todo="replace None with the factor (a number or an expression of the fits), then run this "
         "cell again.",
    hints=("Lesson 05 found the tree/ring crossover by setting two straight lines equal. On N = 4 "
           "ranks: tree 4α + 4·S·β, ring 6α + 1.5·S·β. Solve for S: it is a fixed number times "
           "α/β.",
           "So the crossover moves by the ratio of the two α/β: (α_shm / β_shm) / (α_grpc / "
           "β_grpc). Unpack each fit with alpha, beta = fits[\"shm\"]."),
    solution="""On N = 4 ranks the crossover is where 4α + 4Sβ = 6α + 1.5Sβ, so S = 0.8·α/β: a
fixed multiple of α/β. From gRPC to shared memory it moves by
    (α_shm / β_shm) / (α_grpc / β_grpc)
which is crossover("tree", "ring", 4, *fits["shm"]) / crossover("tree", "ring", 4, *fits["grpc"]).
α/β is the size at which a message spends as long starting as moving its bytes: shared memory
shrinks α more than β, so the sizes where the tree's fewer steps win shrink with it.""",
    key="""from allreduce_edu.exercises.lesson10 import check_crossover_shift, hint, solution

(alpha_g, beta_g), (alpha_s, beta_s) = fits["grpc"], fits["shm"]
my_factor = (alpha_s / beta_s) / (alpha_g / beta_g)
check_crossover_shift(my_factor, fits)""")
def check_crossover_shift(factor, fits: dict) -> Feedback:
    """Exercise 10.1: by what factor does the N = 4 tree/ring crossover move from gRPC to shm?"""
    (ag, bg), (as_, bs) = _fit(fits["grpc"]), _fit(fits["shm"])
    want = crossover("tree", "ring", 4, as_, bs) / crossover("tree", "ring", 4, ag, bg)
    if not isinstance(factor, (int, float, np.integer, np.floating)) or not factor > 0:
        return failed("answer with a positive number: the shm crossover divided by the gRPC one.")
    close = lambda x: abs(factor - x) <= 0.03 * abs(x)  # noqa: E731
    if close(want):
        return passed(f"×{want:.3g}: the crossover is 0.8·α/β on 4 ranks, so it moves with α/β, "
                      f"from {crossover('tree', 'ring', 4, ag, bg):,.0f} B on gRPC to "
                      f"{crossover('tree', 'ring', 4, as_, bs):,.0f} B on shared memory.")
    if close(1 / want):
        return failed("upside down: divide the shared-memory crossover by the gRPC one.")
    if close(as_ / ag):
        return failed("that is the ratio of the α alone. The crossover is where α's cost meets "
                      "the bytes' cost, so β moves it too: it scales with α/β.")
    if close(bs / bg) or close(bg / bs):
        return failed("that is the ratio of the β alone; the crossover scales with α/β.")
    return failed(f"off by ×{factor / want:.3g}. Write the crossover as a multiple of α/β "
                  f"(hint(\"10.1\")), then take the ratio of the two.")


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


@exercise(
    "10.2", "the bytes a ring copies", kind="number",
    todo="replace None with bytes (a number or an expression of S and N), then run this cell "
         "again.",
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
copied. Without send_buffer a rank would copy everything it sends, 2(N − 1)/N·S.""",
    key="""from allreduce_edu.exercises.lesson10 import check_copied_bytes, hint, solution

S, N = 16 << 20, 4
my_copied = S          # 1 + (N - 1) chunks of S/N: the step-0 chunk and the all-gather's
check_copied_bytes(my_copied, S, N)""")
def check_copied_bytes(answer, nbytes: int = 16 << 20, world_size: int = 4) -> Feedback:
    """Exercise 10.2: bytes one rank copies into shared memory in one ring all-reduce."""
    s, n = nbytes, world_size
    if not isinstance(answer, (int, float, np.integer, np.floating)) or answer < 0:
        return failed("answer with a number of bytes (0 or more).")
    close = lambda x: abs(answer - x) <= 0.01 * max(x, 1)  # noqa: E731
    if close(s):
        return passed(f"{s:,} bytes = S: one chunk at step 0 and N − 1 in the all-gather. The "
                      f"ring sends {2 * (n - 1) * s // n:,} bytes but copies only S of them; "
                      f"the next cell counts them on the ranks.")
    if close(2 * (n - 1) * s / n):
        return failed("that is everything the rank sends. The reduce-scatter's middle steps "
                      "send a chunk the ring reduced straight into a send buffer: no copy.")
    if close((n - 1) * s / n):
        return failed("that counts one phase. Both phases copy: the reduce-scatter at step 0, "
                      "the all-gather at every step.")
    if close((n - 2) * s / n) or close(s / n):
        return failed("count the all-gather too: each of its N − 1 steps copies a finished "
                      "chunk into a segment.")
    return failed(f"off by ×{answer / s:.3g}. Go through one rank's 2(N − 1) sends and mark "
                  f"which ones copy (hint(\"10.2\")).")


@exercise(
    "10.3", "NCCL's and MPI's names for the three paths", kind="names",
    hints=("NCCL names its transports after the path the bytes take: through host memory, "
           "straight from GPU to GPU, over the network. The table above has them.",
           "NCCL: SHM, P2P, NET. Open MPI's byte-transfer layers (BTLs): sm, smcuda, tcp."),
    solution="{\n" + "".join(f"    {k!r}: {v[0]!r},\n" for k, v in TRANSPORT_NAMES.items()) + "}",
    key="""from allreduce_edu.exercises.lesson10 import check_transport_names, hint, solution

my_names = {
    "two processes on one machine, through host memory": "SHM",
    "two GPUs in one server, over NVLink or PCIe": "P2P",
    "two machines, over the network": "NET",
}
check_transport_names(my_names)""")
def check_transport_names(answer: dict) -> Feedback:
    """Exercise 10.3: NCCL's transport for each situation (Open MPI's BTL names pass too)."""
    if not isinstance(answer, dict):
        return failed("answer with a dict {situation: NCCL's transport}.")
    for situation, names in TRANSPORT_NAMES.items():
        if situation not in answer:
            return failed(f"your dict has no entry for {situation!r}; keep every key.")
        got = str(answer[situation]).strip()
        if got in ("", "?"):
            return failed(f"{situation!r} is still \"?\": fill in every one.")
        if got.upper() not in {n.upper() for n in names}:
            others = [s for s, v in TRANSPORT_NAMES.items() if got.upper() in map(str.upper, v)]
            why = (f"{got} is the path for {others[0]!r}." if others
                   else f"{got} is not one of NCCL's transports (SHM, P2P, NET).")
            return failed(f"{situation}: {why}")
    return passed("SHM, P2P and NET: NCCL picks one per pair of ranks, as this package picks "
                  "shm or gRPC per pair (NCCL_DEBUG=INFO prints its choice; Open MPI's sm, "
                  "smcuda and tcp BTLs are the same three paths).")
