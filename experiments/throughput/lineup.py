"""Who takes part in the throughput table: the allocators found, the JAX devices a batch splits over,
the dtypes `--dtype auto` means here, and each contestant's worker arguments and environment."""
from __future__ import annotations

import ctypes.util
import glob
import os
import sysconfig

from experiments.harness.platform import MALLOPT_ENV
from experiments.throughput.constants import CONTEXT


def allocators() -> dict[str, tuple[dict, str]]:
    """Allocators that keep freed memory, best first: name -> (environment, in words).

    XLA takes a ~120-250 MB scratch area every step, which glibc maps and unmaps each time
    (page faults: +60-100 ms a step). Measured best: mimalloc (`pip install cmeel-mimalloc`),
    jemalloc (`apt-get install libjemalloc2`), then glibc tuned by mallopt (always there).
    """
    found = {}
    wheel = sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "cmeel.prefix/lib/libmimalloc.so*")))
    lib = ctypes.util.find_library("mimalloc") or (wheel[0] if wheel else None)
    if lib:
        found["mimalloc"] = ({"LD_PRELOAD": lib, "MIMALLOC_PURGE_DELAY": "-1"}, "mimalloc, LD_PRELOAD, purge off")
    lib = ctypes.util.find_library("jemalloc")
    if lib:
        found["jemalloc"] = ({"LD_PRELOAD": lib, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"},
                             "jemalloc, LD_PRELOAD, decay off")
    found["mallopt"] = ({MALLOPT_ENV: "1"}, "glibc, mallopt in-process")
    return found


def cpu_devices(batch: int) -> int:
    """JAX CPU devices for data parallelism: one per core, each with >= 32 sequences.

    One device runs the small per-head attention matmuls on one thread while the other
    cores wait; one device per core runs them side by side (batch 64 on 2 cores: -5%).
    With few sequences per device the gradient all-reduce costs more than it saves.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(n for n in range(1, min(cores, batch // 32) + 1) if batch % n == 0) if batch >= 32 else 1


def auto_dtypes(on_cpu: bool, bf16_units) -> list[str]:
    """`--dtype auto`: on a CPU with bfloat16 units (AMX, AVX512-BF16) bfloat16 products in a
    float32 step ("bfloat16_matmul", ours) and the float32 step beside it; elsewhere float32
    (a GPU's or TPU's float32 products are already TF32 or bfloat16 passes)."""
    return ["bfloat16_matmul", "float32"] if on_cpu and bf16_units else ["float32"]


def contestants(p: dict, allocator: str, torch: bool, one_device: bool, loss_only: bool = False,
                variants=(("auto", "float32"),), context: int = CONTEXT) -> dict[str, tuple[list[str], dict, str]]:
    """name -> (worker arguments, extra environment, allocator in words).

    `variants`: (attention, dtype) pairs; the first is "ours", the others "ours (attention, dtype)".
    """
    found = {**allocators(), "system": ({}, "glibc, default")}
    env, words = found[next(iter(found)) if allocator == "auto" else allocator]
    devices = str(cpu_devices(p["batch"])) if one_device else "0"
    rows = {}
    for i, (attention, dtype) in enumerate(variants):
        name = "ours" if i == 0 else f"ours ({attention}, {dtype})"
        rows[name] = (["jax", "--devices", devices, "--attention", attention, "--dtype", dtype,
                       "--context", str(context)], env, words)
    first = rows["ours"][0]
    if loss_only:   # the same step without its metrics (grad norms per block, lr): what they cost
        rows["ours, loss only"] = (first + ["--loss-only"], env, words)
    if one_device and devices != "1":   # ours on several CPU devices, against one (else the same program twice)
        rows["ours, 1 device"] = (first[:2] + ["1"] + first[3:], env, words)
    if torch:   # as its users run it, then with each allocator we could have used
        rows["torch"] = (["torch"], {}, "glibc, default")
        rows.update({f"torch + {name}": (["torch"], e, w) for name, (e, w) in found.items() if name != "system"})
        if any(d != "float32" for _, d in variants):   # torch's own mixed precision, with the best allocator
            best, (e, w) = next((n, v) for n, v in found.items() if n != "system")
            rows[f"torch + {best}, bfloat16 autocast"] = (["torch", "--dtype", "bfloat16"], e, w)
    return rows
