"""The lecture's model, the presets, and the lecture's own figures to print beside ours."""
from __future__ import annotations

from attention_jax.config import TrainConfig
from experiments.configs import TINY_GPT

NAME = "inside_tiny_gpt"
ROW = "tiny_gpt"
CONFIG = TINY_GPT
PRESETS = {
    # Longer, for a GPU/TPU (not measured here): 4x the cpu preset's tokens per step, 2.5x its steps.
    "paper": TrainConfig(steps=5000, batch_size=64, lr=1e-2, warmup_steps=200, schedule="cosine",
                         checkpoint_every=1000, eval_every=500, train_eval_windows=97, eval_batch=128),
    # About a minute on 2 cores, chosen by measurement (docs/results/inside_tiny_gpt.md): batch 16 learns more per second
    # than 32 here; at 1500 steps the facts are still being learned (accuracy 0.78), at 2000 they
    # are (0.975), with validation at 0.30 bits/char.
    "cpu": TrainConfig(steps=2000, batch_size=16, lr=1e-2, warmup_steps=100, schedule="cosine",
                       checkpoint_every=500, eval_every=250, train_eval_windows=97, eval_batch=128),
    "smoke": TrainConfig(steps=12, batch_size=8, lr=3e-3, checkpoint_every=12, log_every=6,
                         train_eval_windows=16, eval_batch=128),
}
SQRT_D_ROWS = {"smoke": 50, "cpu": 2000, "paper": 2000}    # random query rows per d_k (the lecture: 2000)
# Random q·k pairs for the std column: experiments.scaling's 20,000 except at smoke, whose figures
# mean nothing (drawing 2 x 20,000 x 1024 normals was most of a smoke run's sweep).
SQRT_D_PAIRS = {"smoke": 2_000}
# Validation windows (96 chars each) the engine and every ablation score: all 97 of the world's
# validation text, except at smoke, whose figures mean nothing (15 ablations x 97 windows were a
# fifth of a smoke rerun at the suite's XLA -O0).
VAL_WINDOWS = {"smoke": 16}
SQRT_D_KEYS, SQRT_D_SEED = 96, 4                           # keys per random row, the sweep's seed
RAW_FORWARD_RTOL = 1e-6                                     # raw forward vs module, relative to max |logit|
SHADES = " .:-=+*#%@"                                       # the lecture's ten levels, 0.1 apart
REVIEW = "\nreview: the soup was tasty and the host was kind."

# The lecture's figures (its demo 5 table and notes), beside ours: (bits/char, fact accuracy).
LECTURE = {"intact": (0.409, 0.93), "uniform": (5.459, 0.0), "positions": (5.022, 0.0),
           "attention 0": (6.799, None), "attention 1": (1.348, 0.05), "mlp 0": (5.499, None),
           "mlp 1": (None, None), "bidirectional": (7.528, None)}
LECTURE_SQRT_D = {4: "std 2.0", 16: "std 4.0", 64: "std 8.0; 18% rows > 0.99", 256: "std 16.0",
                  1024: "std 32.0; mean max 0.94, ~70% rows > 0.99"}
