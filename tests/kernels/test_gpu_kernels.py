"""The CUDA kernels (allreduce_edu.kernels.gpu) against the float64 references: the CPU kernels' own tests,
run again on the GPU, or on the CUDA simulator where there is none (small shapes: every simulated
thread is a Python thread)."""

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest

gpu = pytest.importorskip("allreduce_edu.kernels.gpu", reason='numba-cuda is not installed: '
                                                      'it installs with the package on Linux')

from allreduce_edu.kernels import cpu as kernels  # noqa: E402 - after the skip
from allreduce_edu.kernels.reference import layernorm_reference  # noqa: E402

# A private copy of the CPU kernels' test module whose `kernels` is the GPU one: the same test
# bodies, the same inputs, the same tolerances, run on the other target.
_spec = importlib.util.spec_from_file_location("_cpu_kernel_tests",
                                               Path(__file__).with_name("test_kernels.py"))
cpu = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cpu
_spec.loader.exec_module(cpu)
cpu.kernels = types.SimpleNamespace(layernorm=gpu.layernorm, rmsnorm=gpu.rmsnorm,
                                    add_layernorm=gpu.add_layernorm, NORMS=kernels.NORMS)

SAME = ("test_layernorm_matches_reference", "test_rmsnorm_matches_reference",
        "test_large_offset_breaks_naive_float32_but_not_ours", "test_layernorm_float32_offset_1e4",
        "test_hidden_one_gives_beta", "test_nan_poisons_only_its_row", "test_zero_rows",
        "test_non_contiguous_and_read_only_inputs", "test_add_layernorm_matches_reference",
        "test_add_layernorm_in_place")
# every simulated thread is a Python thread: a kernel launch on the simulator takes a second or so, so
# these runs are marked `processes` (out of the quick loop; CI runs them). The quick loop keeps one
# simulated launch (test_numba_cpu_kernels_still_run_beside_the_simulator) and every argument check.
on_the_simulator = pytest.mark.processes
for _name in SAME:
    globals()[_name] = on_the_simulator(getattr(cpu, _name))
# the CPU's bad-argument table, less sum_layernorm's rows (the GPU has no k-partials kernel)
BAD = [p for p in cpu.test_bad_arguments.pytestmark[0].args[1] if "k >= 1" not in p[2]]


@pytest.mark.parametrize("call, error, match", BAD)
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- what only the GPU side has ----

def test_the_target_is_chosen():
    import os

    # the simulator exactly when no GPU answers (or it was asked for), and then numba knows it
    assert gpu.simulated() == (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1")
    assert gpu.simulated() or gpu.cuda.is_available()


@pytest.mark.parametrize("threads", [3, 6, 0, 2048])
def test_threads_must_be_a_power_of_two_a_block_holds(threads):
    with pytest.raises(ValueError, match="power of two from 1 to 1024"):
        gpu.layernorm(np.ones((2, 12), np.float32), threads=threads)


def test_device_gamma_and_beta_are_checked_like_numpy_ones():
    x = np.ones((2, 12), np.float32)
    with pytest.raises(ValueError, match=r"gamma must have shape \(12,\)"):
        gpu.layernorm(x, gamma=gpu.cuda.to_device(np.ones(5, np.float32)))
    with pytest.raises(ValueError, match="beta must have shape"):
        gpu.layernorm(x, beta=gpu.cuda.to_device(np.ones(12, np.float64)))


def test_numba_cpu_kernels_still_run_beside_the_simulator():
    x = np.random.default_rng(1).standard_normal((3, 40))
    np.testing.assert_allclose(kernels.layernorm(x), layernorm_reference(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gpu.layernorm(x), kernels.layernorm(x), rtol=1e-12, atol=1e-12)


@on_the_simulator
@pytest.mark.parametrize("threads", [1, 2, 8, 32])
def test_any_power_of_two_threads_per_row(threads):
    x = np.random.default_rng(2).standard_normal((2, 37)) + 100  # 37: threads own unequal columns
    np.testing.assert_allclose(gpu.layernorm(x, threads=threads), layernorm_reference(x),
                               rtol=1e-11, atol=1e-11)


@on_the_simulator
def test_device_arrays_stay_on_the_device():
    x = np.random.default_rng(3).standard_normal((3, 2, 24)).astype(np.float32)
    gamma, beta = np.full(24, 2.0, np.float32), np.full(24, -1.0, np.float32)
    d = gpu.cuda.to_device(x)
    y = gpu.add_layernorm(d, gpu.cuda.to_device(x), gpu.cuda.to_device(gamma), beta)
    assert gpu.cuda.devicearray.is_cuda_ndarray(y) and tuple(y.shape) == x.shape
    np.testing.assert_allclose(y.copy_to_host(), layernorm_reference(2.0 * x, gamma, beta),
                               rtol=1e-5, atol=1e-5)
    out = gpu.cuda.device_array_like(d)
    assert gpu.layernorm(d, out=out) is out
    with pytest.raises(ValueError, match="out must be an array of shape"):
        gpu.layernorm(d, out=gpu.cuda.device_array((3, 2, 23), np.float32))


@pytest.mark.parametrize("addressing", ["sequential", "interleaved"])
@pytest.mark.parametrize("threads", [1, 2, 8, 32])
def test_schedule_sums_every_thread_once(threads, addressing):
    values = 2.0 ** np.arange(threads)  # each thread's bit: a sum says who it contains
    held = gpu.block.partials(values, addressing)
    assert len(held) == threads.bit_length()  # the start, then log2(threads) steps
    assert held[-1][0] == values.sum()
    steps = gpu.schedule(threads, addressing)
    for step in steps:  # a thread never reads and writes in one step: no race inside a step
        assert not {src for src, _ in step} & {dst for _, dst in step}
    trace = gpu.block_trace(threads, addressing)
    assert len(trace) == threads - 1 and {e.tag for e in trace} <= {"reduce"}


def test_sequential_is_recursive_halving_and_interleaved_is_lesson_04s_tree():
    assert gpu.schedule(8) == [[(4, 0), (5, 1), (6, 2), (7, 3)], [(2, 0), (3, 1)], [(1, 0)]]
    assert gpu.schedule(8, "interleaved") == [[(1, 0), (3, 2), (5, 4), (7, 6)], [(2, 0), (6, 4)],
                                              [(4, 0)]]
    for src, dst in (p for step in gpu.schedule(32) for p in step):
        assert src == dst ^ (src - dst)  # t + s = t xor s: a hypercube edge


@pytest.mark.parametrize("call, match", [
    (lambda: gpu.schedule(6), "power-of-two"),
    (lambda: gpu.schedule(8, "strided"), "addressing must be one of"),
])
def test_schedule_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
