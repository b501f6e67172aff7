"""The tiny world as a Task: random windows to train on, bits per character and fact accuracy to report."""
from __future__ import annotations

import dataclasses
import hashlib
import math

from attention_jax.config import TrainConfig
from attention_jax.errors import ConfigError
from experiments.inside_tiny_gpt.constants import CONFIG


def world_data(world_seed: int = 0):
    """(world, tokenizer, train ids, val ids) of the generated world."""
    from attention_jax.data import tiny_world as tw
    world, tok = tw.build_world(tw.WorldSpec(), seed=world_seed), tw.CharTokenizer()
    if tok.vocab_size != CONFIG.vocab_size:
        raise ConfigError(f"the alphabet has {tok.vocab_size} symbols but the model's vocab_size is "
                          f"{CONFIG.vocab_size}; make them agree")
    return world, tok, tok.encode(world.train_text), tok.encode(world.val_text)


def identity(world, world_seed: int, val_windows: int | None = None) -> dict:
    """What the row was trained and scored on: a changed spec, seed, alphabet, generator or
    number of validation windows retrains it (all windows, the default, adds no key)."""
    from attention_jax.data import tiny_world as tw
    text = hashlib.sha256((world.train_text + "\0" + world.val_text).encode()).hexdigest()[:16]
    return {"data": "tiny_world", "spec": dataclasses.asdict(tw.WorldSpec()), "world_seed": world_seed,
            "alphabet": tw.ALPHABET, "text_sha256": text, **({"val_windows": val_windows} if val_windows else {})}


def bits(total, count):
    import numpy as np
    return np.asarray(total, np.float64) / np.asarray(count, np.float64) / math.log(2)


def make_task(world, tok, train_ids, val: tuple, tc: TrainConfig, context: int, ident: dict):
    """Random `context`-char windows from (seed, step); validation bits/char on the windows
    `val` = (x, y) (the ablations score the same ones) and fact accuracy."""
    import numpy as np
    from attention_jax.data import eval_windows, get_batch
    from attention_jax.data import tiny_world as tw
    from attention_jax.train import Task
    vx, vy = val
    tx, ty = eval_windows(train_ids, context, max_windows=tc.train_eval_windows)
    fx, fy, fw = tw.fact_batch(tok, world)

    def sample(seed: int, step: int) -> dict:
        x, y = get_batch(train_ids, seed=seed, step=step, batch_size=tc.batch_size, context=context)
        return {"x": x, "y": y}

    def evaluate(engine, state) -> dict:
        logits = np.asarray(engine.logits(state, fx))
        logits = logits[None] if logits.ndim == 3 else logits            # [seeds, people, T, V]
        return {"val_bpc": bits(*engine.nll(state, vx, vy)), "train_bpc": bits(*engine.nll(state, tx, ty)),
                "fact_acc": np.array([tw.fact_accuracy_from_logits(lg, fy, fw) for lg in logits])}

    return Task(sample, evaluate, ident)
