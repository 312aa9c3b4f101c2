"""The course's testbed: real rank processes on emulated links, where the links, not the laptop's
CPU, set every time. Introduced in lessons/02; every lesson that compares speeds measures here.

    with testbed(8) as cluster:          # 8 shm ranks, every pair joined by a 10 ms, 100 MB/s link
        cluster.run(bench.measure, ["ring", "naive"], [1 << 20], "float32", 3, 1)

On one laptop every rank shares the same two cores, so a raw transport's time is CPU time: the ring
cannot beat naive there, and crossovers vanish. Here each rank has one full-duplex port whose
messages take α + n·β (allreduce_edu.model.links), the waiting ranks sleep, and the bytes move
through shared memory, so the transport's own cost per message (~0.1-0.3 ms on 2 cores) stays
small beside the link's. Measured times then follow costmodel.predict_on_links(…, TESTBED).
"""

from __future__ import annotations

from ..model.links import Links
from .cluster import Cluster

#: the testbed's network: every link 10 ms per message and 100 MB/s (a 1 MiB message: 20.5 ms)
TESTBED = Links.flat("10ms", "100MB/s")
#: the same links with α in flight (lessons/16): a port sends its next message while earlier ones
#: are still on the wire, as a NIC does, so ranks that keep many messages going pay α once
TESTBED_IN_FLIGHT = Links.flat("10ms", "100MB/s", in_flight=True)


def testbed(world_size: int = 4, links: Links = TESTBED, **kwargs) -> Cluster:
    """A Cluster of `world_size` shared-memory ranks on the course's emulated `links`."""
    return Cluster(world_size, transport="shm", links=links, **kwargs)
