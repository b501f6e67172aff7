"""The Winograd toy: which noun does "it" refer to? A uniform average, one block, two blocks.

    python -m experiments.winograd [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--seeds N]
                                   [--width D] [--nouns FILE] [--adjectives FILE]

    the {x} did not cross the {y} because it was too {adj} , so the {ref} waited .

Word-level next-token models, trained with only the word after "so the" scored (per-token
loss weights), on the clean task (x, y from one pool of nouns; held-out pairs are seen in
training only in the reverse order) and the leaky task (x an animal, y a place; held-out
animal/place pairs never seen). Held-out accuracy is the argmax over the whole vocabulary
at the scored position; "other noun" is the share naming the other noun of the sentence.
Each seed draws its own held-out pairs (attention_jax.data.winograd, seed = model seed).
Then the trained two-block model is reopened and its attention (heads averaged) read at
the referent position: a tired/wet sentence pair per block, and block 2 across every
adjective (a table and a heatmap).
"""
from __future__ import annotations

from experiments.harness.experiment import Experiment
from experiments.winograd.attention import attention_demo, claims, referent_attention
from experiments.winograd.command import Words, flags, run, tokenizer
from experiments.winograd.constants import BOOK, CHANCE, IDENTICAL, MODELS, PRESETS, ROWS, TASKS
from experiments.winograd.task import Splits, by_adjective, make_task, sample_batch, spec_identity

__all__ = ["attention_demo", "by_adjective", "claims", "make_task", "referent_attention", "sample_batch",
           "spec_identity", "BOOK", "CHANCE", "EXPERIMENT", "IDENTICAL", "MODELS", "PRESETS", "ROWS", "Splits",
           "TASKS", "Words", "main"]

EXPERIMENT = Experiment("winograd", __doc__, PRESETS, run, flags=flags, rows=ROWS,
                        tokenizer=tokenizer)
main = EXPERIMENT.main
