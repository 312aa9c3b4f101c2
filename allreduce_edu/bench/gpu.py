"""The CUDA norm kernels timed on a real GPU: against a device-to-device copy of the same bytes (the
memory ceiling) and torch.nn.functional.layer_norm, nccl-tests style. Lesson 14.

    allreduce-edu bench --op layernorm --device cuda --rows 8192 --hidden 4096
    python -m allreduce_edu.bench.gpu          # the same, at (8192, 4096) float32, in one shot
"""

from __future__ import annotations

import sys

import numpy as np

from ..kernels.reference import layernorm_reference
from .kernels import table_lines

NO_GPU = "no CUDA GPU: the simulator cannot be timed (its threads are Python threads)"
CHECK_ROWS = 64  # rows of each result checked against the float64 reference


def check_device():
    """The gpu package on a real GPU; ValueError saying why not (numba-cuda missing, no GPU)."""
    try:
        from ..kernels import gpu
    except ImportError as e:
        raise ValueError(str(e)) from e
    if gpu.simulated():
        raise ValueError(NO_GPU)
    return gpu


def _median_us(cuda, call, repeat: int) -> float:
    """Median of `repeat` timings of call() between CUDA events, after two warm-up calls."""
    call(), call()
    times = []
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) * 1e3)  # ms → µs
    return float(np.median(times))


def _torch_layernorm(x, gamma, beta, eps):
    """torch's layer_norm on copies of the same arrays on the GPU, or None without torch CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    t, g, b = (torch.from_numpy(a).cuda() for a in (x, gamma, beta))
    return lambda: torch.nn.functional.layer_norm(t, (x.shape[-1],), g, b, eps)


def gpu_bench(rows=8192, hidden=4096, dtype="float32", repeat=20) -> list[dict]:
    """Each kernel's median time, bytes (inputs read once + output written once), GB/s, its
    fraction of the copy's GB/s, and #wrong against the float64 reference."""
    gpu = check_device()
    cuda = gpu.cuda
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    x_h, inc_h = (rng.standard_normal((rows, hidden)).astype(dtype) for _ in range(2))
    gamma_h, beta_h = (rng.random(hidden) + 0.5).astype(dtype), rng.random(hidden).astype(dtype)
    x, incoming, gamma, beta = map(cuda.to_device, (x_h, inc_h, gamma_h, beta_h))
    out = cuda.device_array_like(x)
    eps, row_bytes, param_bytes = 1e-5, x_h.nbytes, gamma_h.nbytes + beta_h.nbytes
    reference = layernorm_reference(x_h[:CHECK_ROWS], gamma_h, beta_h, eps)
    cases = [  # (kernel, bytes moved at minimum, call, reference of the first rows or None)
        ("device copy", 2 * row_bytes, lambda: out.copy_to_device(x), None),
        ("layernorm", 2 * row_bytes + param_bytes,
         lambda: gpu.layernorm(x, gamma, beta, eps, out=out), reference),
        ("add_layernorm", 3 * row_bytes + param_bytes,
         lambda: gpu.add_layernorm(x, incoming, gamma, beta, eps, out=out),
         layernorm_reference(x_h[:CHECK_ROWS].astype(np.float64) + inc_h[:CHECK_ROWS],
                             gamma_h, beta_h, eps)),
        ("rmsnorm", 2 * row_bytes + gamma_h.nbytes,
         lambda: gpu.rmsnorm(x, gamma, eps, out=out), None),
    ]
    torch_call = _torch_layernorm(x_h, gamma_h, beta_h, eps)
    if torch_call is not None:
        cases.append(("torch layer_norm", 2 * row_bytes + param_bytes, torch_call, None))
    results = []
    for name, nbytes, call, ref in cases:
        time_us = _median_us(cuda, call, repeat)
        wrong = 0
        if ref is not None:  # the last call's result, its first rows
            y = out.copy_to_host()[:CHECK_ROWS].astype(np.float64)
            wrong = int(np.count_nonzero(np.abs(y - ref) > 1e-3 * np.abs(ref).max()))
        results.append({"kernel": name, "rows": rows, "hidden": hidden, "dtype": dtype.name,
                        "bytes": nbytes, "time_us": time_us, "gbps": nbytes / time_us / 1e3,
                        "wrong": wrong})
    for r in results:
        r["vs_copy"] = r["gbps"] / results[0]["gbps"]
    return results


def format_gpu_table(rows: list[dict], device: str = "") -> str:
    """The rows as an aligned table, then our layernorm beside the copy and torch's."""
    lines = [f"# allreduce-edu bench --device cuda: {device}", *table_lines(rows, wrong=True)]
    by_name = {r["kernel"]: r for r in rows}
    ours, torch = by_name.get("layernorm"), by_name.get("torch layer_norm")
    if ours:
        lines.append(f"# layernorm: {ours['vs_copy']:.2f}x the device copy's bandwidth "
                     f"(goal >= 0.70)")
    if ours and torch:
        lines.append(f"# layernorm: {torch['time_us'] / ours['time_us']:.2f}x torch layer_norm's "
                     f"speed (goal >= 1.00)")
    return "\n".join(lines)


def report(rows_list, hidden_list, dtype="float32", repeat=20) -> int:
    """`allreduce-edu bench --op layernorm --device cuda`: a table per (rows, hidden); 1 if any
    result was wrong."""
    gpu = check_device()
    device = gpu.cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else device
    wrong = 0
    for rows in rows_list:
        for hidden in hidden_list:
            table = gpu_bench(rows, hidden, dtype, repeat)
            wrong += sum(r["wrong"] for r in table)
            print(format_gpu_table(table, device), flush=True)
    print(f"# out of bounds values: {wrong} {'OK' if not wrong else 'FAILED'}")
    return 1 if wrong else 0


def plan(rows_list, hidden_list, dtype="float32"):
    """The CLI's run of `report`, once the GPU is known to be there (else ValueError)."""
    check_device()
    return lambda: report(rows_list, hidden_list, dtype)


if __name__ == "__main__":
    try:
        sys.exit(report([8192], [4096]))
    except ValueError as e:
        sys.exit(f"allreduce_edu.bench.gpu: {e}")
