"""Every rank runs this file: `allreduce-edu launch -n 4 examples/allreduce_demo.py`.

Each rank contributes its own gradient, all-reduces it with each algorithm and checks the result
against the closed form. On several machines, run one launcher per machine (see the README).
"""

import numpy as np

import allreduce_edu
from allreduce_edu.collectives import available

comm = allreduce_edu.init()  # this process's rank, connected to every other rank
n = comm.world_size
grad = np.arange(8, dtype=np.float32) + comm.rank  # rank r contributes [r, r+1, ..., r+7]
expected = n * np.arange(8, dtype=np.float32) + n * (n - 1) / 2

for algorithm in available(comm):  # one_shot and two_shot need shared memory: not over gRPC
    total = allreduce_edu.allreduce(comm, grad, op="sum", algorithm=algorithm)
    assert np.array_equal(total, expected), f"rank {comm.rank}: {algorithm} gave {total}, expected {expected}"
    if comm.rank == 0:
        print(f"{algorithm:<20} {total[:4]} ... correct on all {n} ranks")

print(f"rank {comm.rank} of {n} at {comm.address}: done")
