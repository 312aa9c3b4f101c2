"""An array in the other byte order (`>f4` on a little-endian laptop) arrives with its values, on
every transport: the wire names a dtype, not its byte order, so it travels native."""

import numpy as np
import pytest

from allreduce_edu import Cluster, allreduce
from allreduce_edu.comm.dtypes import check_array

TRANSPORTS = ["local", pytest.param("grpc", marks=pytest.mark.processes),
              pytest.param("shm", marks=pytest.mark.processes)]
SWAPPED = ">" if np.little_endian else "<"  # the order this machine does not use


def test_an_array_in_the_other_byte_order_travels_as_native_c_contiguous_values():
    x = np.arange(12, dtype=f"{SWAPPED}f4").reshape(3, 4).T  # swapped and not C-contiguous
    sent = check_array(x)
    assert sent.dtype == np.float32 and sent.dtype.isnative and sent.flags.c_contiguous
    np.testing.assert_array_equal(sent, x)


def _swapped_messages(comm):
    small = np.arange(5, dtype=f"{SWAPPED}f4")  # a ring slot on shm
    large = np.arange(1 << 16, dtype=f"{SWAPPED}i8")  # 512 KiB: a segment on shm, chunks on gRPC
    if comm.rank == 0:
        comm.send(1, small, "small")
        comm.send(1, large, "large")
        return None
    got_small, got_large = comm.recv(0, "small"), comm.recv(0, "large")
    return (got_small.tolist() == small.tolist() and got_large.tolist() == large.tolist(),
            got_small.dtype.isnative and got_large.dtype.isnative)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_other_byte_order_arrives_with_its_values_on_every_transport(transport):
    with Cluster(2, transport=transport, timeout=20) as cluster:
        assert cluster.run(_swapped_messages)[1] == (True, True)
        summed = cluster.run(lambda comm: allreduce(
            comm, np.full(3, comm.rank + 1, f"{SWAPPED}f4"), algorithm="ring").tolist())
        assert summed == [[3.0] * 3, [3.0] * 3]
