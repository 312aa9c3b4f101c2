"""Emulated network links: each message holds its sender's port and its receiver's port for
α + bytes·β (or, in flight, for bytes·β and arrives α later). Introduced in lessons/02; the
course's testbed (allreduce_edu.testbed) is built on it.

On one laptop a message costs CPU time, not wire time, so the α-β trade-offs of a real cluster never
show. `Cluster(links=Links.flat("1ms", "100MB/s"))` makes them show: `Communicator.isend` calls
`links.transmit(src, dst, nbytes)` before posting a message, and that call holds the sender for the
link's time.

The model, as the α-β formulas assume it:
- store and forward: a message occupies its link for α + nbytes·β, then it is posted whole;
- one full-duplex port per rank: a rank's sends leave one after another (egress) and its receives
  arrive one after another (ingress), so a root gathering from N-1 ranks waits N-1 link times, as
  costmodel's naive formula charges; sending and receiving overlap;
- a message starts once both its ports are free: the cluster's ranks book them in one shared table
  (`Ports`, shared memory with a lock), first come, first served;
- a waiting rank sleeps to a deadline (no spinning: it leaves the CPU to the other ranks; with a
  1 ns timer slack, Linux wakes it within tens of µs);
- in flight (`Links.flat(..., in_flight=True)`, lessons/16): α is the wire's latency, not port
  time: a message holds its sender's port for bytes·β, reaches the receiver's port α later and
  holds it for bytes·β (once it is free: the network buffers it meanwhile), so a port starts its
  next message while earlier ones are still on the wire (as a NIC does; LogP's L). A chain of
  dependent messages still pays α per hop; many messages in flight pay it once. The sender is
  free after bytes·β; the message is posted when it arrives (comm.courier);
- two levels (`Links.two_level`): ranks of one node talk over `intra` links, ranks of different
  nodes over `inter` links (one NIC per rank, as in rail-optimised clusters);
- the transport's own cost (copies, gRPC) comes on top: make emulated links much slower than it.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import re
import sys
import time
from dataclasses import dataclass, field, replace

# a sleep wakes this late at the 1 ns timer slack (FACTS.md: p50 26-66 µs): wake this much early
EARLY = 30e-6

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# network rates are decimal: 1 GB/s = 1e9 B/s
_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def _precise_sleeps() -> None:
    """Ask Linux to wake this process's sleepers within ~1 ns of their deadline (timer slack),
    instead of the default 50 µs; elsewhere nothing changes."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK = 29
        except (OSError, AttributeError):
            pass  # no prctl: sleeps are a little less precise


_precise_sleeps()


def sleep_until(deadline: float) -> None:
    """Sleep until time.monotonic() reaches `deadline` (never earlier, tens of µs later), using
    no CPU."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left - EARLY if left > 2 * EARLY else left)


class Ports:
    """When each rank's egress and ingress port is next free, shared by the ranks of one cluster
    (shared memory and a lock: made by the Cluster, inherited by the rank processes it spawns)."""

    def __init__(self, world_size: int):
        ctx = multiprocessing.get_context("spawn")
        self.world_size = world_size
        self._free = ctx.RawArray("d", 2 * world_size)  # [2r]: r's egress, [2r + 1]: r's ingress
        self._lock = ctx.Lock()

    def book(self, src: int, dst: int, seconds: float,
             latency: float | None = None) -> tuple[float, float]:
        """Book src's egress and dst's ingress for `seconds` each; returns the time.monotonic()
        at which src's port is free again and the one at which the message has arrived.
        Store and forward (latency None): both ports at once, from the first moment both are
        free. In flight: src's port at once; dst's when the bytes get there, `latency` later,
        or when it is free, whichever is later (the network holds them meanwhile, as a switch's
        buffers do)."""
        with self._lock:
            egress, ingress = self._free[2 * src], self._free[2 * dst + 1]
            if latency is None:
                start = max(time.monotonic(), egress, ingress)
                free = arrived = start + seconds
            else:
                start = max(time.monotonic(), egress)
                free, arrived = start + seconds, max(start + latency, ingress) + seconds
            self._free[2 * src], self._free[2 * dst + 1] = free, arrived
        return free, arrived

    def __repr__(self) -> str:
        return f"Ports(world_size={self.world_size})"


@dataclass(frozen=True)
class Link:
    """One kind of link: `alpha` seconds per message plus `beta` seconds per byte
    (1/beta = bandwidth); `in_flight`: α is latency on the wire, not time on the ports."""

    alpha: float
    beta: float
    in_flight: bool = False

    def __post_init__(self):
        if self.alpha < 0 or self.beta < 0:
            raise ValueError(f"a link's alpha and beta must be >= 0, "
                             f"got alpha={self.alpha}, beta={self.beta}")

    def seconds(self, nbytes: int) -> float:
        """How long `nbytes` take to cross this link: α + nbytes·β."""
        return self.alpha + nbytes * self.beta

    def port_seconds(self, nbytes: int) -> float:
        """How long `nbytes` hold each of the two ports: α + nbytes·β, or nbytes·β in flight."""
        return nbytes * self.beta + (0.0 if self.in_flight else self.alpha)

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
        rate = 1e-9 / self.beta if self.beta else float("inf")
        return f"{self.alpha * 1e6:g} us{' in flight' if self.in_flight else ''} + {rate:g} GB/s"


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
    # the cluster's shared port table (Cluster attaches one; None: each sender books only its own
    # egress, as if every receiver were always free)
    ports: Ports | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be an integer >= 1, got {self.ranks_per_node!r}")

    @classmethod
    def flat(cls, alpha, bandwidth, in_flight: bool = False) -> Links:
        """One kind of link between every pair of ranks (every rank its own node):
        Links.flat("1ms", "100MB/s"), or Links.flat(1e-3, 100e6) in seconds and bytes/s;
        in_flight=True: α is latency on the wire (see the module's docstring)."""
        if isinstance(alpha, str) or isinstance(bandwidth, str):
            link = Link.parse(f"{alpha},{bandwidth}")
        else:
            if not bandwidth > 0:
                raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
            link = Link(float(alpha), 1.0 / float(bandwidth))
        link = replace(link, in_flight=bool(in_flight))
        return cls(1, link, link)

    @property
    def uniform(self) -> Link | None:
        """The one link every message crosses, when both levels are the same (Links.flat)."""
        return self.inter if self.intra == self.inter else None

    def attach(self, world_size: int) -> Links:
        """These links with a new shared port table for a cluster of `world_size` ranks."""
        return replace(self, ports=Ports(world_size))

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

    def transmit(self, src: int, dst: int, nbytes: int) -> float | None:
        """Hold the sender, asleep, until `nbytes` have left `src`'s port for `dst`'s (called by
        Communicator.isend). Returns None when they have arrived too (store and forward), else
        the time.monotonic() at which they arrive (in flight: the caller posts them then)."""
        link = self.link(src, dst)
        if link is None or link.seconds(nbytes) <= 0:
            return None
        if self.ports is None:
            now = time.monotonic()
            free, arrived = now + link.port_seconds(nbytes), now + link.seconds(nbytes)
        else:
            free, arrived = self.ports.book(src, dst, link.port_seconds(nbytes),
                                            link.alpha if link.in_flight else None)
        sleep_until(free)
        return arrived if link.in_flight else None

    def __str__(self) -> str:
        if self.uniform is not None:
            return f"every link {self.uniform}"
        return (f"{self.ranks_per_node} ranks per node, intra-node {self.intra}, "
                f"inter-node {self.inter}")


def parse_topology(text: str) -> tuple[int, int]:
    """'2x4' -> (2 nodes, 4 ranks per node)."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ValueError(f"cannot read topology {text!r}; write NODESxRANKS_PER_NODE, e.g. 2x2")
    return int(m[1]), int(m[2])
