"""Training-step throughput of the ladder's one-block model: JAX (ours) vs PyTorch eager.

`python -m experiments.throughput [--preset smoke|cpu|paper] [--json]` times the ladder's
"layer_norm" row (vocab 1024, context 128, d 128, 4 heads, one pre-norm block) through
`Engine.step`, the compiled step every experiment uses (AdamW, lr 1e-3; on a GPU/TPU several
steps per call, `Engine.steps`, as `fit` runs them there), against a torch twin
(nanoGPT style: SDPA, exact GELU, torch.optim.AdamW) at the same batch. Each contestant has
its own process and they take turns, a few steps each, so other load on the machine weighs on
all alike; medians are reported. Ours: the best allocator found (see `allocators`), data
parallel over the cores (one JAX CPU device each, Engine's mesh); also on one device. Torch:
as installed, then with each allocator found. Useful FLOPs per token = 6·N + 12·L·T·d (N =
parameters outside the embedding tables: PaLM's count, attention as if unmasked); MFU divides
by a 2048² float32 matmul timed on the same backend in the same run.
"""
from __future__ import annotations

from experiments.harness.experiment import Experiment
from experiments.throughput.command import flags, run
from experiments.throughput.constants import CLAIM, CONTEXT, GOAL_MFU, GOAL_RATIO, NAME, PRESETS
from experiments.throughput.lineup import allocators, auto_dtypes, contestants, cpu_devices

__all__ = ["allocators", "auto_dtypes", "contestants", "cpu_devices", "flags", "run", "CLAIM", "CONTEXT", "EXPERIMENT",
           "GOAL_MFU", "GOAL_RATIO", "NAME", "PRESETS", "main"]

EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags, shares_accelerator=True)
main = EXPERIMENT.main
