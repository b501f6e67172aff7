"""One row of the complexity table: one layer, one length, one variant, in a process of its own.

`python -m experiments.complexity.measure --n 4096 --variant naive` prints one JSON line.
A process per row, because on a CPU the figure that tells the truth is resident memory:
`memory_analysis()` counts only the buffers XLA plans, not what a fusion library such as
YNNPACK allocates itself (naive forward + backward, n = 4096: 2,104 MB planned, 4,762 MB
resident). The kernel's high-water mark is reset just before the timed calls, read after.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.model import MultiHeadAttention
from attention_jax.speed import fast

# JAX reserves 75% of an accelerator's memory in the first process that touches it: each child
# takes only what it uses (the parent sets this before JAX starts, Experiment.shares_accelerator;
# here for a child run on its own).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from experiments.complexity.constants import D_MODEL, HEADROOM, N_HEADS, VARIANTS, matrix_bytes  # noqa: E402,F401


def layer_functions(chunk_size: int = 512) -> tuple[object, dict]:
    """(params, {name: f(params, x)}): our MultiHeadAttention computing by the reference equation
    (one masked softmax over all n×n scores: the chapter's naive attention) and by chunks (the
    memory-efficient form, swapped in by `attention_jax.speed`), the projections alone, and both
    layers' gradients. One set of weights; the projections have the engine's dense backward."""
    config = ModelConfig(d_model=D_MODEL, n_heads=N_HEADS, mixer="heads", positions="none")
    graphdef, params = nnx.split(MultiHeadAttention(config, rngs=nnx.Rngs(0)))

    def layer(form):
        def f(p, x):
            m = nnx.merge(graphdef, p)
            with fast(m, form=form, chunk=chunk_size):
                return m(x)
        return f

    naive, memeff = layer("reference"), layer("chunked")

    def projections(p, x):                        # attention replaced by a sum: all three
        m = nnx.merge(graphdef, p)                # projections used, nothing of size n×n
        fast(m, form="reference")
        qkv = m.qkv(x).reshape(*x.shape[:-1], 3, N_HEADS, D_MODEL // N_HEADS)
        q, k, v = jnp.moveaxis(qkv, (-3, -2), (0, -3))
        out = q + k + v
        return m.out(jnp.swapaxes(out, -3, -2).reshape(*out.shape[:-3], out.shape[-2], D_MODEL))

    fns = {"naive": naive, "memeff": memeff, "projections": projections}
    backward = lambda f: jax.grad(lambda p, x: f(p, x).sum(), argnums=(0, 1))   # params and input
    return params, fns | {f"{name}_bwd": backward(fns[name]) for name in ("naive", "memeff")}


def _read_kib(path: str, field: str) -> int | None:
    try:
        with open(path) as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


def free_bytes() -> int | None:
    """What may still be allocated: the device's limit on an accelerator, else MemAvailable."""
    stats = jax.devices()[0].memory_stats()
    if stats and "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    available = _read_kib("/proc/meminfo", "MemAvailable")
    if available is None and importlib.util.find_spec("psutil"):   # no dependency: used if installed
        available = importlib.import_module("psutil").virtual_memory().available
    return available


def peak_rss() -> int:
    """VmHWM, or getrusage's ru_maxrss (bytes on macOS, KiB on Linux) where /proc is missing."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return _read_kib("/proc/self/status", "VmHWM") or (rss if sys.platform == "darwin" else rss * 1024)


def timed(compiled, args, repeats: int, warmup: bool) -> float:
    """Median ms per call, after one untimed call when `warmup`; a call of seconds is timed once."""
    times = []
    while len(times) < (repeats if not times or times[0] < 2.0 else 1) + warmup:
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[warmup:])


def float32_products():
    """The table is float32: on a GPU (TF32) and a TPU (one bfloat16 pass) JAX's default float32
    product is not, so ask for full float32 there (the book's PyTorch default on a GPU is full
    float32 too). A CPU's float32 product already is; its programs are left as they were."""
    return contextlib.nullcontext() if jax.default_backend() == "cpu" else jax.default_matmul_precision("highest")


def measure(n: int, variant: str, *, repeats: int, chunk_size: int, expect_bytes: float = 0,
            budget_bytes: int | None = None) -> dict:
    params, fns = layer_functions(chunk_size)
    tiny = jnp.ones((128, D_MODEL))               # start thread pools and allocator before measuring
    jax.block_until_ready(jax.jit(jnp.dot)(tiny, tiny.T))
    x = jax.random.normal(jax.random.key(1), (1, n, D_MODEL))
    with float32_products():
        compiled = jax.jit(fns[variant]).lower(params, x).compile()   # allocates nothing of size n²
    ma = compiled.memory_analysis()
    plan = ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
    # Naive scores and weights (and, backward, their gradients) are a floor under the plan;
    # the caller adds the n² extrapolation of its last row, which sees what the plan misses.
    need = max(plan, {"naive": 2, "naive_bwd": 4}.get(variant, 0) * matrix_bytes(n), expect_bytes)
    free = free_bytes() if budget_bytes is None else budget_bytes
    row = {"n": n, "variant": variant, "repeats": repeats, "chunk_size": chunk_size, "xla_temp_bytes":
           ma.temp_size_in_bytes, "xla_total_bytes": plan, "estimate_bytes": need, "free_bytes": free}
    if free is not None and need * 1.25 + HEADROOM > free:   # estimates err; others need room
        return row | {"oom": True}
    if variant == "naive":
        with float32_products():
            projections = jax.jit(fns["projections"]).lower(params, x).compile()
        row["ms_projections"] = timed(projections, (params, x), repeats, warmup=True)
    try:  # "5" resets the high-water mark to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        baseline = _read_kib("/proc/self/status", "VmRSS")
    except OSError:   # then from the peak so far (set by compiling), which can hide a small call
        baseline = peak_rss()
    try:
        # The naive layer gets an untimed call even when timed once: the first touch of
        # gigabytes of fresh pages (12 s for 4 GiB in this VM) is not the algorithm's cost.
        row["ms"] = timed(compiled, (params, x), repeats, warmup=repeats > 1 or variant.startswith("naive"))
    except Exception as e:                        # an accelerator's allocator refuses instead
        if "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower():
            return row | {"oom": True, "error": str(e).splitlines()[0]}
        raise
    stats = jax.devices()[0].memory_stats()
    return row | {"rss_peak_bytes": max(0, peak_rss() - baseline) if baseline is not None else None,
                  "device_peak_bytes": stats.get("peak_bytes_in_use") if stats else None, "oom": False}


def run_child(n: int, variant: str, *, repeats: int, chunk_size: int, expect_bytes: float = 0,
              budget_bytes: int | None = None) -> dict:
    """`measure` in a process of its own; a crash or the kernel's OOM kill becomes a row too."""
    cmd = [sys.executable, "-m", "experiments.complexity.measure", "--n", str(n), "--variant", variant,
           "--repeats", str(repeats), "--chunk-size", str(chunk_size), "--expect-bytes", str(int(expect_bytes))]
    cmd += [] if budget_bytes is None else ["--budget-bytes", str(int(budget_bytes))]
    proc = subprocess.run(cmd, cwd=pathlib.Path(__file__).resolve().parents[2], capture_output=True, text=True)
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    killed = proc.returncode in (-9, 137)
    why = "killed by the kernel: out of memory" if killed else (proc.stderr.strip().splitlines() or ["?"])[-1]
    return {"n": n, "variant": variant, "oom": killed, "error": why}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="one row for experiments.complexity")
    p.add_argument("--variant", choices=VARIANTS, required=True)
    # --expect-bytes: the caller's extrapolated need; --budget-bytes: pretend this much is free
    for flag, kind, default in (("--n", int, 128), ("--repeats", int, 3), ("--chunk-size", int, 512),
                                ("--expect-bytes", float, 0), ("--budget-bytes", int, None)):
        p.add_argument(flag, type=kind, default=default)
    if os.access("/proc/self/oom_score_adj", os.W_OK):   # if memory runs out after all, the
        pathlib.Path("/proc/self/oom_score_adj").write_text("1000")  # kernel kills this, not a neighbour
    print(json.dumps(measure(**vars(p.parse_args()))), flush=True)
