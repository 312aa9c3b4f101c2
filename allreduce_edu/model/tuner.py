"""Which algorithm and protocol for which size, chosen as NCCL's tuner chooses: predict every pair
with the α-β model, run the fastest. Introduced in lessons/05.

NCCL (src/graph/tuning.cc) gives each protocol a latency per step and a share of the link's
bandwidth, times every {algorithm} × {protocol} for the message size and takes the fastest; with
NCCL_DEBUG=INFO it prints the table. Here the algorithms are this package's (their formulas are
costmodel's), the protocols NCCL's three: a protocol adds its α to every message and divides the
bandwidth by its efficiency.

    rows = tune(8, [1 << 10, 1 << 20, 1 << 26], (200e-6, 1 / 50e6))
    print_table(rows)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace import format_bytes
from .costmodel import COSTS, NEEDS, predict, predict_on_links
from .links import Link, Links


@dataclass(frozen=True)
class Protocol:
    """How a step's data and its 'it is there' signal travel."""

    name: str
    alpha: float  # seconds each message adds (NCCL's ring hwLat over the network, tuning.cc)
    efficiency: float  # the share of the link's bandwidth that carries data
    why: str


PROTOCOLS = (
    Protocol("LL", 0.9e-6, 0.5,
             "low latency: each 8-byte store is 4 bytes of data and a 4-byte flag, so the receiver "
             "polls the data itself (no fence), at half the bandwidth"),
    Protocol("LL128", 2.5e-6, 120 / 128,
             "each 128-byte line carries 120 bytes of data and an 8-byte flag; needs hardware that "
             "writes 128 bytes at once (NVLink), so it keeps ~94 % of the bandwidth"),
    Protocol("Simple", 6.6e-6, 1.0,
             "whole chunks, then a memory fence and one flag: all the bandwidth, but every step "
             "waits for the fence"),
)


def _link(links) -> Link:
    """One Link from (alpha, beta), a Link, or uniform Links (Links.flat)."""
    if isinstance(links, (tuple, list)) and len(links) == 2:
        return Link(float(links[0]), float(links[1]))
    link = links.uniform if isinstance(links, Links) else links
    if not isinstance(link, Link):
        raise ValueError(f"tune needs one α and β: pass (alpha, beta), a Link or Links.flat(...), "
                         f"got {links!r}")
    return link


def tune(world_size: int, sizes, links, algorithms=None, protocols=PROTOCOLS,
         gamma: float = 0.0) -> list[dict]:
    """One row per size (bytes per rank): every (algorithm, protocol)'s predicted all-reduce time
    and the fastest. `links`: (alpha, beta), a Link or Links.flat(...) (in flight or not);
    algorithms: default every one with a formula that runs over messages (one_shot and two_shot
    need symmetric windows: name them to see their rows)."""
    link = _link(links)
    algorithms = [a for a in COSTS if a not in NEEDS] if algorithms is None else list(algorithms)
    unknown = [a for a in algorithms if a not in COSTS]
    if unknown or not algorithms or not protocols:
        raise ValueError(f"tune needs algorithms with a cost formula ({', '.join(COSTS)})"
                         f" and at least one protocol; got {algorithms} and {len(protocols)}")
    rows = []
    for size in sizes:
        times = {(a, p.name): _predict(a, world_size, size, link, p, gamma)
                 for a in algorithms for p in protocols}
        ranked = sorted(times, key=times.get)  # stable: ties go to the first registered
        (algorithm, protocol), runner_up = ranked[0], ranked[1] if len(ranked) > 1 else None
        rows.append({"size": int(size), "world_size": world_size, "algorithm": algorithm,
                     "protocol": protocol, "time": times[ranked[0]], "runner_up": runner_up,
                     "runner_up_time": times[runner_up] if runner_up else None, "times": times})
    return rows


def _predict(algorithm: str, n: int, size: float, link: Link, protocol: Protocol,
             gamma: float) -> float:
    """The algorithm's time with the protocol's α added to the link's and its share of the
    bandwidth; on in-flight links, as the testbed runs it there (costmodel.predict_on_links: the
    double binary tree's programs overlap their α's; the other formulas, one message per step and
    port, pay α per step either way; no γ there)."""
    alpha, beta = link.alpha + protocol.alpha, link.beta / protocol.efficiency
    if link.in_flight and n > 1:
        bandwidth = 1 / beta if beta else float("inf")
        return predict_on_links(algorithm, n, size,
                                Links.flat(alpha, bandwidth, in_flight=True))
    return predict(algorithm, n, size, alpha, beta, gamma)


def table_lines(rows) -> list[str]:
    """An NCCL_DEBUG-style table: size -> the algorithm/protocol chosen, its time, the next best."""
    lines = [f"# all-reduce on {rows[0]['world_size']} ranks: the tuner's choice per size"
             if rows else "# no sizes",
             f"# {'size':>10}  {'algorithm/protocol':<28} {'time':>10}   next best"]
    for row in rows:
        choice = f"{row['algorithm']}/{row['protocol']}"
        if row["runner_up"]:
            a, p = row["runner_up"]
            slower = row["runner_up_time"] / row["time"] - 1 if row["time"] else 0.0
            best = f"{a}/{p} (+{slower:.0%})"
        else:
            best = "-"
        lines.append(f"  {format_bytes(row['size']):>10}  {choice:<28} "
                     f"{_format_seconds(row['time']):>10}   {best}")
    return lines


def print_table(rows) -> None:
    """Print `table_lines(rows)`."""
    print("\n".join(table_lines(rows)))


def _format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e6:.3g} µs"
