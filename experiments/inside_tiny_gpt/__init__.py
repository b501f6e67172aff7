"""Inside a tiny GPT: the lecture's demos on a char-level model trained on a generated world.

    python -m experiments.inside_tiny_gpt [--preset smoke|cpu|paper] [--steps N] [--lr X] [--batch-size N]
                                          [--seeds N] [--world-seed N] [--fresh] [--no-progress] [--out DIR]

The lecture's model (experiments.configs.TINY_GPT: 2 layers, d 64, 4 heads, context 96,
tied output, biases; 109,056 parameters over the 44-symbol alphabet) is trained on random
96-character windows of the tiny world's training text (attention_jax.data.tiny_world:
40 people in 8 cities, facts, questions, reviews) and cached by the row cache: a rerun
reopens the checkpoint instead of training. Then, in the lecture's order, each demo is
printed and saved: parameters by formula against the framework's count (and GPT-3 by
12·L·d²); a forward pass from the raw weight arrays alone, shapes printed at every step,
against the module's logits; the residual stream's norm after each component; where the
heads look on a fact question (exact zeros on the future, top-3 positions, weight on the
name, ASCII and PNG heatmaps); why scores are divided by √d (random vectors, then the
trained model's own scores); and ablations (positions zeroed, each layer's attention or
MLP off, each head off, causal -> bidirectional) with validation bits per character and
fact-completion accuracy, beside the lecture's figures.
"""
from __future__ import annotations

from experiments.harness.experiment import Experiment
from experiments.inside_tiny_gpt.ablations import ablation_claims, ablation_list, head_mask, run_ablations
from experiments.inside_tiny_gpt.anatomy import demo_params, forward_check, param_parts, raw_forward, residual_norms
from experiments.inside_tiny_gpt.attention import ascii_heatmap, attention_demo, heatmap_figure, sqrt_d_random
from experiments.inside_tiny_gpt.command import flags, run, tokenizer
from experiments.inside_tiny_gpt.constants import CONFIG, NAME, PRESETS, ROW
from experiments.inside_tiny_gpt.evaluate import (
    cached_run, compiled, greedy_accuracy, greedy_completions, model_bits, teacher_forced_accuracy)

__all__ = ["ablation_claims", "ablation_list", "ascii_heatmap", "attention_demo", "cached_run", "compiled",
           "demo_params", "forward_check", "greedy_accuracy", "greedy_completions", "head_mask", "heatmap_figure",
           "model_bits", "param_parts", "raw_forward", "residual_norms", "run_ablations", "sqrt_d_random",
           "teacher_forced_accuracy", "CONFIG", "EXPERIMENT", "NAME", "PRESETS", "ROW", "main"]

EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags, rows=[ROW], tokenizer=tokenizer)
main = EXPERIMENT.main
