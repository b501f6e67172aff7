"""What the complexity table measures: one layer's shape, the variants, the presets, the book's figures.

The measuring child process (`measure.py`) reads the shape and the headroom from here too.
"""
from __future__ import annotations

D_MODEL, N_HEADS = 512, 8
VARIANTS = ("naive", "naive_bwd", "memeff", "memeff_bwd")
HEADROOM = 2 * 2 ** 30      # bytes a row leaves free for the rest of the machine: it runs only if need + this fits


def matrix_bytes(n: int) -> int:
    """The scores, one n×n float32 matrix per head (the softmax output is a second one)."""
    return N_HEADS * n * n * 4


NAME, MIB = "complexity", 2 ** 20
# The layers' version, kept with every row in partial.jsonl so a resumed run measures rows of an
# older layer again: 2 since "naive" is one masked softmax over all n×n scores (it was the model's path).
LAYER = 2
# repeats: timed calls per row (median), one from one_repeat_from on (seconds a call). The memory-
# efficient backward stops at the paper's 16,384: 32,768 would take minutes more on two cores.
CPU = dict(max_n={"naive": 16384, "naive_bwd": 16384, "memeff": 131072, "memeff_bwd": 16384},
           repeats=3, one_repeat_from=8192, chunk_size=512)
PRESETS = {"smoke": dict(CPU, max_n=dict.fromkeys(VARIANTS, 512), repeats=1), "cpu": CPU, "paper": CPU}
TITLES = {"naive": "naive, forward (the book's table)", "naive_bwd": "naive, forward + backward",
          "memeff": "memory-efficient, forward", "memeff_bwd": "memory-efficient, forward + backward"}
BOOK = {128: (2.246, 14.6), 256: (2.855, 19.2), 512: (5.761, 34.4), 1024: (16.414, 89.1), 2048: (51.573, 296.1),
        4096: (225.432, 1100.1), 8192: (832.838, 4300.1), 16384: ("out of memory", None)}   # a laptop GPU
COLUMNS = [("n", "tokens", ",d"), ("ms", "ms total", ",.1f"), ("ms_x4", "ms x4", ".2f"),
           ("ms_projections", "ms projections", ",.1f"), ("matrix_mb", "attn matrix MB", ",.1f"),
           ("xla_mb", "XLA plan MB", ",.1f"), ("peak_mb", "peak MB", ",.1f"), ("mb_x4", "MB x4", ".2f")]
