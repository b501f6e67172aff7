"""The n² wall: time and memory of one attention layer as the sequence doubles, and a way round it.

One layer (width 512, 8 heads, batch 1, float32) at n = 128, 256, … in the chapter's columns,
with log-log exponents over the last four rows (book: time ~n^1.91, memory ~n^1.87), then the
memory-efficient attention (Rabe & Staats 2021), forward and forward + backward, going on where
the naive one stops. A process per row (`experiments.complexity.measure`); what would not fit is estimated.
"""
from __future__ import annotations

from experiments.complexity.command import check_claims, figure, flags, measure_all, run, run_child, tabulate
from experiments.complexity.constants import (BOOK, COLUMNS, CPU, D_MODEL, HEADROOM, LAYER, MIB, N_HEADS, NAME, PRESETS,
                                              TITLES, VARIANTS, matrix_bytes)
from experiments.harness.experiment import Experiment

__all__ = ["check_claims", "figure", "flags", "matrix_bytes", "measure_all", "run", "run_child", "tabulate", "BOOK",
           "COLUMNS", "CPU", "D_MODEL", "EXPERIMENT", "HEADROOM", "LAYER", "MIB", "N_HEADS", "NAME", "PRESETS", "TITLES",
           "VARIANTS", "main"]

EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags, shares_accelerator=True)
main = EXPERIMENT.main
