"""Bandwidth of the norm kernels against a NumPy copy (the memory ceiling) and unfused NumPy."""

from __future__ import annotations

import time

import numpy as np

from .. import kernels


def numpy_layernorm(x, gamma, beta, eps=1e-5):
    """The NumPy formula (x - mean) / sqrt(var + eps) * gamma + beta: a pass and a temporary per
    operator."""
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def interleaved_median_seconds(calls, repeat: int = 5) -> list[float]:
    """Median wall time of each call over repeat rounds, after a warm-up round (compile, page
    faults).

    Rounds interleave the calls, so a noisy neighbour slows every kernel alike and the ratios stay
    fair.
    """
    times = [[] for _ in calls]
    for round_ in range(repeat + 1):
        for call, samples in zip(calls, times, strict=True):
            t0 = time.perf_counter()
            call()
            if round_ > 0:
                samples.append(time.perf_counter() - t0)
    return [float(np.median(samples)) for samples in times]


def _torch_layernorm(x, gamma, beta, eps):
    """torch.nn.functional.layer_norm on the same memory, or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    t, g, b = (torch.from_numpy(a) for a in (x, gamma, beta))
    return lambda: torch.nn.functional.layer_norm(t, (x.shape[-1],), g, b, eps)


def kernel_bench(rows=8192, hidden=4096, dtype="float32", partials=4, repeat=5) -> list[dict]:
    """Time each norm kernel (bytes = inputs read once + output written once) against a one-core
    NumPy copy."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    if min(rows, hidden, partials, repeat) < 1:
        raise ValueError(f"rows, hidden, partials and repeat must be >= 1, "
                         f"got {rows}, {hidden}, {partials}, {repeat}")
    rng = np.random.default_rng(0)
    parts = rng.random((max(partials, 2), rows, hidden), dtype=dtype) + 1  # (k, rows, hidden)
    x, incoming = parts[0], parts[1]
    gamma, beta = rng.random(hidden, dtype=dtype) + 1, rng.random(hidden, dtype=dtype)
    out = np.empty_like(x)
    eps = 1e-5
    row_bytes, param_bytes = x.nbytes, gamma.nbytes + beta.nbytes
    k = partials
    cases = [  # (kernel, bytes moved at minimum, call)
        ("numpy copy", 2 * row_bytes, lambda: np.copyto(out, x)),
        ("layernorm", 2 * row_bytes + param_bytes,
         lambda: kernels.layernorm(x, gamma, beta, eps, out=out)),
        ("numpy layernorm", 2 * row_bytes + param_bytes,
         lambda: numpy_layernorm(x, gamma, beta, eps)),
        ("add_layernorm", 3 * row_bytes + param_bytes,
         lambda: kernels.add_layernorm(x, incoming, gamma, beta, eps, out=out)),
        (f"sum_layernorm[{k}]", (k + 1) * row_bytes + param_bytes,
         lambda: kernels.sum_layernorm(parts[:k], gamma, beta, eps, out=out)),
        (f"numpy sum+layernorm[{k}]", (k + 1) * row_bytes + param_bytes,
         lambda: numpy_layernorm(parts[:k].sum(axis=0), gamma, beta, eps)),
        ("rmsnorm", 2 * row_bytes + gamma.nbytes, lambda: kernels.rmsnorm(x, gamma, eps, out=out)),
    ]
    torch_call = _torch_layernorm(x, gamma, beta, eps)
    if torch_call is not None:
        cases.append(("torch layer_norm", 2 * row_bytes + param_bytes, torch_call))
    results = []
    medians = interleaved_median_seconds([call for *_, call in cases], repeat)
    for (name, nbytes, _), seconds in zip(cases, medians, strict=True):
        results.append({"kernel": name, "rows": rows, "hidden": hidden, "dtype": dtype.name,
                        "bytes": nbytes, "time_us": seconds * 1e6, "gbps": nbytes / seconds / 1e9})
    copy_gbps = results[0]["gbps"]
    for r in results:
        r["vs_copy"] = r["gbps"] / copy_gbps
    return results


def table_lines(rows: list[dict], wrong: bool = False) -> list[str]:
    """The header and one line per row: kernel, shape, type, bytes moved, time, GB/s and the
    fraction of a copy's bandwidth (and #wrong, where results are checked per row)."""
    width = max([len("kernel")] + [len(r["kernel"]) for r in rows])
    lines = [f"#{'kernel':>{width}} {'rows':>7} {'hidden':>7} {'type':>8} {'bytes':>12} "
             f"{'time':>10} {'bw':>8} {'vs':>6}" + (f" {'#wrong':>7}" if wrong else ""),
             f"#{'':>{width}} {'':>7} {'':>7} {'':>8} {'(B)':>12} {'(us)':>10} {'(GB/s)':>8} "
             f"{'copy':>6}"]
    for r in rows:
        lines.append(f" {r['kernel']:>{width}} {r['rows']:>7} {r['hidden']:>7} {r['dtype']:>8} "
                     f"{r['bytes']:>12} {r['time_us']:>10.1f} {r['gbps']:>8.2f} "
                     f"{r['vs_copy']:>6.2f}" + (f" {r['wrong']:>7}" if wrong else ""))
    return lines


def format_kernel_table(rows: list[dict]) -> str:
    """The rows as an aligned text table, then how many times faster each kernel is than its NumPy
    version."""
    lines = table_lines(rows)
    by_name = {r["kernel"]: r for r in rows}
    # layernorm vs "numpy layernorm", sum_layernorm[k] vs "numpy sum+layernorm[k]"
    for name, r in by_name.items():
        baseline = by_name.get("numpy " + name.replace("sum_layernorm", "sum+layernorm"))
        if baseline is not None:
            lines.append(f"# {name} is {baseline['time_us'] / r['time_us']:.1f}x faster than "
                         f"{baseline['kernel']}")
    lines.append("# numpy copy runs on one core (np.copyto); "
                 "the Numba kernels use every core Numba was given")
    return "\n".join(lines)
