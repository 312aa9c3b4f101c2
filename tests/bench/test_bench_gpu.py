"""`allreduce-edu bench --op layernorm --device cuda`: refused on the simulator with a clear
message; on a GPU, the table's shape (never its timings)."""

import pytest

from allreduce_edu import cli

gpu = pytest.importorskip("allreduce_edu.kernels.gpu", reason='numba-cuda is not installed: '
                                                      'it installs with the package on Linux')

from allreduce_edu.bench import gpu as gpu_bench  # noqa: E402 - after the skip


@pytest.mark.skipif(not gpu.simulated(), reason="a real GPU is here: it can be timed")
def test_the_simulator_is_not_timed(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--op", "layernorm", "--device", "cuda"])
    assert exit_.value.code == 2
    assert "no CUDA GPU: the simulator cannot be timed" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no CUDA GPU"):
        gpu_bench.gpu_bench(rows=2, hidden=8)


def test_device_cuda_needs_op_layernorm(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--device", "cuda"])
    assert exit_.value.code == 2
    assert "--device cuda times the norm kernels: add --op layernorm" in capsys.readouterr().err


@pytest.mark.skipif(gpu.simulated(), reason="needs a real CUDA GPU")
def test_gpu_bench_rows_and_table():
    rows = gpu_bench.gpu_bench(rows=64, hidden=256, repeat=2)
    by_name = {r["kernel"]: r for r in rows}
    assert {"device copy", "layernorm", "add_layernorm", "rmsnorm"} <= set(by_name)
    assert by_name["device copy"]["bytes"] == 2 * 64 * 256 * 4
    assert by_name["device copy"]["vs_copy"] == 1.0
    assert all(r["wrong"] == 0 for r in rows)
    for r in rows:
        assert r["gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
    table = gpu_bench.format_gpu_table(rows, "a GPU")
    assert all(r["kernel"] in table for r in rows) and "the device copy's bandwidth" in table
