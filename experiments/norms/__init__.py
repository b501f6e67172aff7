"""Pre-norm vs post-norm, with and without learning-rate warmup: twelve blocks of width 128.

    python -m experiments.norms [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--warmup N]
                                [--seeds N] [--eval-every N] [--lr X] [--batch-size N] [--corpus PATH]

Two measurements, as the chapter makes them. First the gradient norm of each block at
initialisation, before any step: the Engine's own `block_grad_norm` step metric (the global
L2 norm of all of a block's parameter gradients, from one backward pass of the mean
cross-entropy) on fixed training batches, for several seeds, pre-norm and post-norm alike.
Then four models trained alike but for where the LayerNorm sits and whether the learning
rate warms up linearly from 0 (the preset's `warmup_steps`, 200 in the book; the
no-warmup rows start at the full rate). Every row is `experiments.configs.ONE_BLOCK` (the
ladder's pre-norm block) with n_layers=12 and `norm` "pre" or "post"; post-norm puts a
LayerNorm after each residual add and has no final one.
"""
from __future__ import annotations

from experiments.harness.experiment import Experiment
from experiments.harness.rows import corpus_tokenizer
from experiments.norms.command import check_warmup, claims, flags, init_claims, run
from experiments.norms.constants import (BASE, BOOK_INIT, BOOK_PPL, CONFIGS, DEPTH, N_LAYERS, NORMS, PRESETS, PROBE,
                                         PROBE_SEED, ROWS, model_config)
from experiments.norms.figures import early_figure, init_figure
from experiments.norms.measure import init_grad_norms, init_record, measure_init, probe_batches

__all__ = ["check_warmup", "claims", "early_figure", "flags", "init_claims", "init_figure", "init_grad_norms",
           "init_record", "measure_init", "model_config", "probe_batches", "run", "BASE", "BOOK_INIT", "BOOK_PPL",
           "CONFIGS", "DEPTH", "EXPERIMENT", "N_LAYERS", "NORMS", "PRESETS", "PROBE", "PROBE_SEED", "ROWS", "main"]

# Twelve blocks on three seeds fragment one glibc arena (12.4 GB at the peak against 3.9 GB with two).
EXPERIMENT = Experiment("norms", __doc__, PRESETS, run, flags=flags, rows=list(ROWS),
                        big_programs=True, tokenizer=corpus_tokenizer)
main = EXPERIMENT.main
