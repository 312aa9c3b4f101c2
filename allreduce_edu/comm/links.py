"""Emulated network links: each message waits α + bytes·β for the link it crosses.
Introduced in lessons/05.

On one laptop a message costs CPU time, not wire time, so the α-β trade-offs of a real cluster never
show. `Cluster(links=Links.two_level(...))` makes them show: `Communicator.isend` calls
`links.transmit(src, dst, nbytes)` before posting a message, and that call holds the sender for the
link's time.

The model, as the α-β formulas assume it:
- store and forward: a message occupies its link for α + nbytes·β, then it is posted whole;
- one port per rank, full duplex: a rank's sends leave one after another (the wait runs on the
  sending thread, so `isend` returns once the link is free again); receiving overlaps sending;
- every rank has its own links, into its node and into the network between nodes (one NIC per GPU,
  as in rail-optimised clusters): the ranks of one node never share the slow link's bandwidth;
- receives are not serialised: a rank takes in messages from several senders at once, so a root
  gathering from N-1 ranks waits one link time here, not N-1
  (costmodel's naive formula charges N-1);
- the transport's own cost (copies, gRPC) comes on top: make emulated links much slower than it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

# time.sleep overshoots by ~100 µs here: sleep until this close, then spin on perf_counter
SPIN = 200e-6

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# network rates are decimal: 1 GB/s = 1e9 B/s
_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def hold(seconds: float) -> None:
    """Block for `seconds`, accurate to a few µs:
    sleep for most of it, spin on perf_counter for the rest."""
    deadline = time.perf_counter() + seconds
    if seconds > SPIN:
        time.sleep(seconds - SPIN)
    while time.perf_counter() < deadline:
        pass


@dataclass(frozen=True)
class Link:
    """One kind of link: `alpha` seconds per message plus `beta` seconds per byte
    (1/beta = bandwidth)."""

    alpha: float
    beta: float

    def __post_init__(self):
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"a link's alpha and beta must be >= 0, "
                             f"got alpha={self.alpha}, beta={self.beta}")

    def seconds(self, nbytes: int) -> float:
        """How long `nbytes` occupy this link: α + nbytes·β."""
        return self.alpha + nbytes * self.beta

    @classmethod
    def parse(cls, text: str) -> Link:
        """'50us,1GB/s' -> Link(50e-6, 1e-9);
        bandwidth in B/s or bit/s with k, M, G, T (decimal)."""
        m = re.fullmatch(r"\s*([\d.e+-]+)\s*(s|ms|us|µs|ns)\s*,"
                         r"\s*([\d.e+-]+)\s*([kmgt]?)(b|bit|B)/s\s*", text, re.IGNORECASE)
        if not m:
            raise ValueError(f"cannot read link {text!r}; write latency,bandwidth, "
                             f"e.g. '50us,1GB/s' or '2ms,400Mbit/s'")
        alpha = float(m[1]) * _TIME_UNITS[m[2].lower()]
        rate = float(m[3]) * _RATE_UNITS[m[4].lower()] / (1 if m[5] == "B" else 8)
        if rate <= 0:
            raise ValueError(f"link {text!r}: bandwidth must be > 0")
        return cls(alpha, 1.0 / rate)

    def __str__(self) -> str:
        return f"{self.alpha * 1e6:g} us + {1e-9 / self.beta if self.beta else float('inf'):g} GB/s"


def _as_link(value) -> Link:
    if isinstance(value, Link):
        return value
    if isinstance(value, str):
        return Link.parse(value)
    alpha, beta = value
    return Link(float(alpha), float(beta))


@dataclass(frozen=True)
class Links:
    """A two-level network: nodes of `ranks_per_node` consecutive ranks;
    `intra` links inside a node, `inter` links between nodes.
    Rank r sits on node r // ranks_per_node (as torchrun numbers ranks)."""

    ranks_per_node: int
    intra: Link
    inter: Link

    def __post_init__(self):
        if not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be an integer >= 1, got {self.ranks_per_node!r}")

    @classmethod
    def two_level(cls, ranks_per_node: int, intra=(0.0, 0.0), inter=(0.0, 0.0)) -> Links:
        """Links.two_level(2, intra=(5e-6, 1e-10), inter="2ms,50MB/s"):
        (α s, β s/B) pairs, Links or text."""
        return cls(ranks_per_node, _as_link(intra), _as_link(inter))

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def link(self, src: int, dst: int) -> Link | None:
        """The link a message from `src` to `dst` crosses (None: a rank sending to itself)."""
        if src == dst:
            return None
        return self.intra if self.node(src) == self.node(dst) else self.inter

    def seconds(self, src: int, dst: int, nbytes: int) -> float:
        link = self.link(src, dst)
        return 0.0 if link is None else link.seconds(nbytes)

    def transmit(self, src: int, dst: int, nbytes: int) -> None:
        """Hold the sender while `nbytes` cross the link from `src` to `dst`
        (called by Communicator.isend)."""
        seconds = self.seconds(src, dst, nbytes)
        if seconds > 0:
            hold(seconds)

    def __str__(self) -> str:
        return (f"{self.ranks_per_node} ranks per node, intra-node {self.intra}, "
                f"inter-node {self.inter}")


def parse_topology(text: str) -> tuple[int, int]:
    """'2x4' -> (2 nodes, 4 ranks per node)."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"cannot read topology {text!r}; write NODESxRANKS_PER_NODE, e.g. 2x2")
    return int(m[1]), int(m[2])
