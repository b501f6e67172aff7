"""The named models and training budgets every experiment draws on, written once.

A row is a name, what it adds in words, a `ModelConfig` and the book's figures for it;
each ladder row is `dataclasses.replace` of the row above, so the ladder reads as the
chapter builds it. Other tables start from these (`ONE_BLOCK` is the ladder's one full
pre-norm block) instead of copying their numbers. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    label: str                          # what this row adds, in words
    config: ModelConfig
    book_val_ppl: float | None = None   # the book's held-out perplexity, where it prints one
    book_train_ppl: float | None = None
    book_approx: bool = False           # the book gives the figure as "≈N"

    def book_text(self) -> str | None:
        """The book's figure as the book wrote it: "≈248", "38.07", or None."""
        if self.book_val_ppl is None:
            return None
        return f"≈{self.book_val_ppl:g}" if self.book_approx else f"{self.book_val_ppl:.2f}"

    def book_cell(self) -> str | None:
        """The table's book column: the held-out figure, and the train one where the book gives it."""
        text = self.book_text()
        return f"{text} (train {self.book_train_ppl:.2f})" if text and self.book_train_ppl else text


def by_name(rows: Sequence[Row], name: str) -> Row:
    for row in rows:
        if row.name == name:
            return row
    raise ConfigError(f"unknown row {name!r}; choose from: {', '.join(r.name for r in rows)}")


# Embedding -> linear: every ladder model is this plus parts. Width 128, context 128.
LADDER_BASE = ModelConfig(vocab_size=1024, context=128, d_model=128, n_layers=1, n_heads=4, mixer="none",
                          residual=False, positions="none", feed_forward=False, layer_norm=False)


def _ladder() -> tuple[Row, ...]:
    rows, cfg = [], LADDER_BASE
    # (name, what this row adds, change to the row above, the book's val / train ppl, "≈")
    for name, label, change, book, book_train, approx in [
        ("no_context", "embedding -> linear, no context", {}, 59.71, None, False),
        ("average", "uniform causal average, replacing the token", {"mixer": "average"}, 248.0, None, True),
        ("average_positions", "+ learned positions before averaging", {"positions": "learned"}, None, None, False),
        ("average_residual", "average added to the token (residual)", {"residual": True}, 60.45, None, False),
        ("head_replace", "one learned head, replacing", {"mixer": "head", "residual": False}, None, None, False),
        ("head_residual", "one learned head, residual", {"residual": True}, None, None, False),
        ("heads", "four heads + W_o", {"mixer": "heads"}, None, None, False),
        ("feed_forward", "+ feed-forward (4x, GELU)", {"feed_forward": True}, None, None, False),
        ("layer_norm", "+ LayerNorm (one pre-norm block)", {"layer_norm": True}, 38.07, 18.77, False),
        ("two_blocks", "two blocks", {"n_layers": 2}, 40.57, 14.49, False),
    ]:
        cfg = dataclasses.replace(cfg, **change)
        rows.append(Row(name, label, cfg, book, book_train, approx))
    return tuple(rows)


LADDER = _ladder()
ONE_BLOCK = by_name(LADDER, "layer_norm").config      # one full pre-norm block, the chapter's model

# The lecture's character-level GPT: 2 layers, d 64, 4 heads, context 96, tied output,
# biases everywhere (q, k, v included): 109,056 parameters with its 44-symbol alphabet.
TINY_GPT = ModelConfig(vocab_size=44, context=96, d_model=64, n_layers=2, n_heads=4,
                       tie_embeddings=True, qkv_bias=True)

# GPT-3 (Brown et al. 2020), counted by 12·L·d² (params, inside_tiny_gpt): no config, no weights.
GPT3 = dict(n_layers=96, d_model=12288, vocab_size=50257, context=2048, reported=175e9)
# A softmax row putting more than this on one key is "frozen": its gradient has (almost) vanished.
FROZEN = 0.99

# The ladder's budgets, shared by the tables built on its models.
LADDER_BUDGETS = {
    "paper": TrainConfig(steps=3000, batch_size=64, lr=1e-3, checkpoint_every=500, eval_every=500),
    # 3/8 of the paper's tokens at 3x its learning rate, ~20 min on 2 cores. At lr 1e-3 a CPU
    # budget leaves three orderings unshown; at 3e-3 two blocks fall behind one only after
    # ~1750 steps, while the FFN row without LayerNorm is past its best from ~1000 steps on,
    # so a longer run loses the "+ FFN improves" ordering (docs/results/ladder.md).
    "cpu": TrainConfig(steps=2250, batch_size=32, lr=3e-3, warmup_steps=100, checkpoint_every=250,
                       eval_every=250, train_eval_windows=120),
    # A plumbing check (its figures mean nothing): a checkpoint halfway, two log lines, a final
    # evaluation. Batch 8 splits over a Colab TPU's eight cores (test_all).
    "smoke": TrainConfig(steps=6, batch_size=8, lr=1e-3, checkpoint_every=3, log_every=3,
                         train_eval_windows=16),
}
