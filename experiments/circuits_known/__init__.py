"""Circuit discovery judged on compiled transformers whose circuit is known.

    python -m experiments.circuits_known [--preset smoke|cpu|paper]

tracr (Lindner et al. 2023) compiles RASP programs into transformer weights, and its compiler says
which heads and MLPs compute what: the true circuit is known. Each program of tracr's library here
(`reverse` and `frac_prevs`, the ACDC paper's two, then `hist` and `sort_unique`) is compiled, loaded
into our modules (`attention_jax.compiled`) and checked to answer as RASP evaluates it. On clean inputs
and the same inputs reordered, scored by the squared distance from the clean outputs (ACDC's metric for
tracr), each method gives circuits: exact edge patching, EAP, EAP-IG over the inputs and over the
activations (their top k for every k) and ACDC (one circuit a threshold), by resample and by zero
ablation. For each, the ROC curve against the true edges and its area as the ACDC paper computes it,
beside the paper's where it gives one, and its circuit of the true circuit's size run alone
(faithfulness), with the true circuit's own. tracr is a test oracle (the test extra): without it the
run says what it could not measure.
"""
from __future__ import annotations

from experiments.circuits_known.command import claims, judged, methods, run
from experiments.circuits_known.programs import PROGRAMS, built, inputs
from experiments.circuits_known.roc import area, curve, point
from experiments.harness.experiment import Experiment

NAME = "circuits_known"
# ACDC's thresholds, as shares of the whole clean-corrupted change. The first cpu run had eight (1e-4 to 0.3);
# after it, the grid was widened to reach both ends (0: every edge that matters kept; 0.5: nearly none), which
# can only add points to ACDC's ROC curve: its claim against the paper was judged on both (the notes say so).
THRESHOLDS = (0.0, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.2, 0.3, 0.5)
PRESETS = {"smoke": dict(programs=("frac_prevs",), inputs=12, steps=2, thresholds=(1e-3, 0.1)),
           "cpu": dict(programs=tuple(PROGRAMS), inputs=100, steps=5, thresholds=THRESHOLDS),
           "paper": dict(programs=tuple(PROGRAMS), inputs=100, steps=5, thresholds=THRESHOLDS)}

__all__ = ["area", "built", "claims", "curve", "inputs", "judged", "methods", "point", "run", "EXPERIMENT",
           "NAME", "PRESETS", "PROGRAMS", "THRESHOLDS", "main"]

EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, smoke_decides=False)
main = EXPERIMENT.main
