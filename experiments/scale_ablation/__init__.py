"""Dividing the scores by √d: trained with and without it at head widths 32, 128, 256 and 1024.

    python -m experiments.scale_ablation [--preset smoke|cpu|paper] [--rows d32,d1024] [--steps N]
                                         [--seeds N] [--eval-every N] [--corpus PATH]

Each row trains one model twice, identical but for `ModelConfig.scale` (the same seed, so
the same initial weights and batches): with ÷√d and without. Two setups, as the chapter's:

* d32, d128: the ladder's one pre-norm block (LayerNorm before the projections, FFN) at
  the ladder's budget; d32 is its four heads of 32 + W_o, d128 the same block with one
  head of 128 (+ W_o), so that only the head count and width change between the two.
* d256, d1024: one head projecting *up* from d_model 128 to d_head 256 / 1024, W_o back
  down, no LayerNorm anywhere (so none before the projections), FFN and residuals kept;
  the chapter's shorter budget (1500 steps, batch 32).

--steps, --lr, --batch-size, --schedule and --eval-every override both budgets.
Besides perplexity, every row records on 16 fixed held-out windows, at initialisation,
at each evaluation and after training: the std of the scores fed to the softmax (causal
entries only; divided when ÷√d is on), the mean attention entropy (nats, rows with at
least two visible tokens) and the share of those rows putting > 0.99 on one token.
"""
from __future__ import annotations

from experiments.harness.experiment import Experiment
from experiments.harness.rows import corpus_tokenizer
from experiments.scale_ablation.command import claims, run
from experiments.scale_ablation.constants import PRESETS, ROWS, SHORT, WidthRow
from experiments.scale_ablation.measure import combine, make_probe, score_stats, uniform_entropy

__all__ = ["claims", "combine", "make_probe", "run", "score_stats", "uniform_entropy", "EXPERIMENT", "PRESETS",
           "ROWS", "SHORT", "WidthRow", "main"]

EXPERIMENT = Experiment("scale_ablation", __doc__, PRESETS, run, rows=[r.name for r in ROWS],
                        tokenizer=corpus_tokenizer)
main = EXPERIMENT.main
