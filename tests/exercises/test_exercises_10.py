"""Lesson 10's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae
from allreduce_edu.exercises.lesson05 import crossover
from allreduce_edu.exercises.lesson10 import (
    PAIRS,
    check_copied_bytes,
    check_crossover_shift,
    check_transport_names,
    copied_bytes,
    model_against_measured,
)

FITS = {"grpc": (400e-6, 1 / 0.5e9), "shm": (120e-6, 1 / 4e9)}  # the shape of this machine's fits


def test_crossover_shift_checker():
    want = crossover("tree", "ring", 4, *FITS["shm"]) / crossover("tree", "ring", 4, *FITS["grpc"])
    assert check_crossover_shift(want, FITS) and want == pytest.approx((120e-6 * 4e9) / (400e-6 * 0.5e9))
    assert "upside down" in check_crossover_shift(1 / want, FITS).message
    assert "the α alone" in check_crossover_shift(120 / 400, FITS).message
    assert "the β alone" in check_crossover_shift(8, FITS).message
    assert "off by" in check_crossover_shift(want * 3, FITS).message
    assert "answer with a number" in check_crossover_shift("big", FITS).message
    assert check_crossover_shift(None, FITS).status == "not attempted"


def test_model_against_measured_names_a_place_not_a_size():
    """Lesson 10 prints where the model's crossover falls, so its size stays exercise 10.1's."""
    kib, mib = 1 << 10, 1 << 20
    assert model_against_measured(431 * kib, (mib, 4 * mib), 16 * mib) == "below that range"
    assert model_against_measured(2 * mib, (mib, 4 * mib), 16 * mib) == "inside that range"
    assert model_against_measured(8 * mib, (mib, 4 * mib), 16 * mib) == "above that range"
    assert model_against_measured(8 * kib, (None, 16 * kib), 16 * mib) == "inside that range"
    assert model_against_measured(2 * mib, None, 16 * mib) == "below 16.0 MiB"
    assert model_against_measured(None, None, 16 * mib).startswith("nowhere")
    for place in (model_against_measured(431 * kib, (mib, 4 * mib), 16 * mib),
                  model_against_measured(2 * mib, None, 16 * mib)):
        assert "431" not in place and "2.0" not in place


def test_copied_bytes_checker():
    s, n = 16 << 20, 4
    assert check_copied_bytes(s, s, n)
    assert "everything the rank sends" in check_copied_bytes(2 * (n - 1) * s // n, s, n).message
    assert "one phase" in check_copied_bytes((n - 1) * s // n, s, n).message
    assert "count the all-gather" in check_copied_bytes(s // n, s, n).message
    assert check_copied_bytes(None, s, n).status == "not attempted"


@pytest.mark.processes
@pytest.mark.parametrize("count", [1 << 22, (1 << 22) + 3])
def test_the_ring_copies_what_copied_bytes_says_on_every_rank(count):
    """The count the lesson's claim rests on, measured on shm ranks (uneven chunks too)."""
    def copies(comm):
        before = comm.bytes_copied()
        y = ae.allreduce(comm, np.ones(count, np.float32), algorithm="ring")
        assert (y == 4).all()
        return comm.bytes_copied() - before
    assert cluster_for("shm", 4).run(copies) == [copied_bytes(count, 4, 4, r) for r in range(4)]
    assert copied_bytes(1 << 22, 4, 4, 0) == 16 << 20  # S, not the 2(N-1)/N·S it sends


def test_transport_names_checker():
    nccl = {pair: names[0] for pair, names in PAIRS.items()}
    assert check_transport_names(nccl) and check_transport_names({k: v.lower() for k, v in nccl.items()})
    staged = "two GPUs of one server whose PCIe layout forbids peer access"
    assert "cannot go straight from GPU to GPU" in check_transport_names(dict(nccl, **{staged: "P2P"})).message
    assert "cannot go straight" in check_transport_names(dict(nccl, **{staged: "p2p"})).message  # any case
    rdma = "GPU 3 of server A and GPU 3 of server B, RoCE (RDMA over Ethernet), GPUDirect"
    assert "still cross the network" in check_transport_names(dict(nccl, **{rdma: "P2P"})).message
    peer = "GPU 0 and GPU 1 of one server, behind one PCIe switch that allows peer access"
    assert "never pass through host memory" in check_transport_names(dict(nccl, **{peer: "SHM"})).message
    assert "not one of NCCL's transports" in check_transport_names(dict(nccl, **{rdma: "RDMA"})).message
    half = dict(nccl, **{rdma: "?"})
    assert "still \"?\"" in check_transport_names(half).message
    assert check_transport_names({k: "?" for k in nccl}).status == "not attempted"
