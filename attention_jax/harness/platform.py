"""What this machine is: the accelerator JAX found, and a malloc tuned for XLA on a CPU.

`accelerator()` picks the default preset (paper on a GPU/TPU, cpu otherwise).

`apply_mallopt()` keeps freed memory in the process, so XLA's per-step scratch area is not
paged in anew.
glibc hands every allocation above 32 MB to mmap and gives it back on free, so XLA's
~120-250 MB CPU scratch area costs ~60k page faults (~100 ms of kernel time) on every
training step of the ladder's one-block model. One arena, no mmap and no trimming keep
freed memory for the next step (measured by experiments/throughput.py). Only glibc's
malloc is tuned; elsewhere this does nothing.
"""
from __future__ import annotations

import ctypes
import os

MALLOPT_ENV = "ATTENTION_JAX_MALLOPT"   # "0" turns the tuning off
# (M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD, M_TOP_PAD); mallopt takes a C int.
MALLOPT_SETTINGS = ((-8, 1), (-4, 0), (-1, 2**31 - 1), (-2, 64 << 20))


def apply_mallopt() -> bool:
    """Tune glibc malloc in this process; best before the first computation starts threads."""
    if os.environ.get(MALLOPT_ENV) == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(param, value) == 1 for param, value in MALLOPT_SETTINGS)
    except (OSError, AttributeError):   # not glibc: nothing to tune
        return False


def accelerator() -> str | None:
    """'gpu' or 'tpu' when JAX sees one, else None (imports JAX: call it only when needed)."""
    import jax
    backend = jax.default_backend()
    return backend if backend in ("gpu", "tpu", "cuda", "rocm") else None
