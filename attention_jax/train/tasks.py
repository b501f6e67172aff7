"""What a run trains on and how it is scored: a `Task`.

A task is two functions and a name for what it is: `sample(seed, step)` gives that step's
batch of host arrays (`x`, `y` and optional per-token `weights`) as a pure function of the
pair, so a resumed run draws exactly the batches it would have drawn; `evaluate(engine,
state)` gives the task's figures, one value per seed. The engine stays the same whether
the task is next-token prediction on a corpus, one scored word per sentence (the Winograd
toy) or characters with bits per character (the tiny GPT).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import numpy as np

from attention_jax.data import get_batch


@dataclasses.dataclass(frozen=True)
class Task:
    sample: Callable[[int, int], dict]                 # (seed, step) -> {"x", "y"[, "weights"]}
    evaluate: Callable[[Any, Any], dict[str, np.ndarray]]   # (engine, state) -> {figure: per seed}
    # What it is (e.g. the corpus hash), for the run's record (`checkpoints.run_record`).
    identity: dict = dataclasses.field(default_factory=dict)


def text_task(train_tokens: np.ndarray, val_tokens: np.ndarray, *, batch_size: int, context: int,
              train_eval_windows: int, identity: dict | None = None) -> Task:
    """Next-token prediction: random training windows; train perplexity on a fixed sample of
    the training split and held-out perplexity on the whole validation split."""
    def sample(seed: int, step: int) -> dict:
        x, y = get_batch(train_tokens, seed=seed, step=step, batch_size=batch_size, context=context)
        return {"x": x, "y": y}

    def evaluate(engine, state) -> dict:
        return {"train_ppl": engine.perplexity(state, train_tokens, max_windows=train_eval_windows),
                "val_ppl": engine.perplexity(state, val_tokens)}

    # Without an identity of the caller's, the tokens themselves say what the task is: a run
    # resumed on other tokens would otherwise continue from, and report, the first run's model.
    tokens = hashlib.sha256(np.ascontiguousarray(train_tokens).tobytes() + b"|" +
                            np.ascontiguousarray(val_tokens).tobytes()).hexdigest()[:16]
    return Task(sample, evaluate, dict(identity) if identity else {"tokens": tokens})
