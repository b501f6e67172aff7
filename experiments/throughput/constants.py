"""What the throughput table times and judges: the window, the presets, the claims' bars.

The worker processes read CONTEXT too; nothing here imports more than the standard library.
"""
from __future__ import annotations

CONTEXT = 128   # the ladder's window

NAME = "throughput"
PRESETS = {   # rounds × steps calls timed per contestant, after `warmup` calls (a call: 16 steps on a GPU/TPU)
    "smoke": dict(batch=8, warmup=1, rounds=2, steps=1, peak_size=512),   # a 512² peak: its MFU means nothing
    "cpu": dict(batch=64, warmup=3, rounds=10, steps=3),
    "paper": dict(batch=64, warmup=5, rounds=10, steps=5),
}
CLAIM = "JAX step faster than PyTorch eager on the same CPU"
GOAL_RATIO, GOAL_MFU = 1.15, 0.6   # issue 31's bar: against the fastest PyTorch setup, and of float32's matmul peak
