"""The task as the Engine sees it: splits, batches, the scored word, accuracy per adjective."""
from __future__ import annotations

import hashlib
import json

import numpy as np


def spec_identity(spec, leaky: bool) -> dict:
    """What the rows were trained on: a hash of the word lists, template and split rule, and the task."""
    blob = json.dumps({"nouns": spec.nouns, "kinds": spec.kinds, "adjectives": spec.adjectives,
                       "template": spec.template, "heldout_fraction": spec.heldout_fraction}, sort_keys=True)
    return {"task": "winograd-leaky" if leaky else "winograd-clean",
            "words": hashlib.sha256(blob.encode()).hexdigest()[:16], "sampler": "with-replacement-v1"}


class Splits:
    """Each seed's task (its own held-out pairs), made once."""

    def __init__(self, spec, leaky: bool):
        self.spec, self.leaky, self._tasks = spec, leaky, {}

    def __call__(self, seed: int):
        from attention_jax.data import winograd as wg
        if seed not in self._tasks:
            self._tasks[seed] = wg.make_task(self.spec, leaky=self.leaky, seed=seed)
        return self._tasks[seed]


def sample_batch(split, seed: int, step: int, batch_size: int) -> dict:
    """Step `step`'s batch for `seed`: sentences drawn uniformly, a pure function of (seed, step)."""
    rows = np.random.default_rng([seed, step, 0x57]).integers(0, len(split.sentences), batch_size)
    return {"x": split.x[rows], "y": split.y[rows], "weights": split.weights[rows]}


def seed_logits(engine, state, x, i: int) -> np.ndarray:
    """Seed i's logits [N, T, V] for sentences x."""
    logits = np.asarray(engine.logits(state, x))
    return logits[i] if engine.vmapped else logits


def make_task(splits: Splits, seeds: list[int], batch_size: int):
    from attention_jax.data import winograd as wg
    from attention_jax.train import Task

    def sample(seed: int, step: int) -> dict:
        return sample_batch(splits(seed).train, seed, step, batch_size)

    def evaluate(engine, state) -> dict:
        out = {"accuracy": [], "other_noun": [], "train_accuracy": []}
        for i, seed in enumerate(seeds):   # one logits call per seed (train and held-out together): one compile
            t = splits(seed)
            logits = seed_logits(engine, state, np.concatenate([t.train.x, t.heldout.x]), i)
            train = wg.score(logits[:len(t.train.x)], t.train)
            held = wg.score(logits[len(t.train.x):], t.heldout)
            out["accuracy"].append(held["accuracy"])
            out["other_noun"].append(held["other_noun"])
            out["train_accuracy"].append(train["accuracy"])
        return {k: np.asarray(v) for k, v in out.items()}

    return Task(sample, evaluate, spec_identity(splits.spec, splits.leaky))


def by_adjective(splits: Splits, seeds: list[int]):
    """A row measure: held-out accuracy per adjective, per seed."""
    from attention_jax.data import winograd as wg

    def measure(engine, state) -> dict:
        per = []
        for i, s in enumerate(seeds):
            t = splits(s)
            logits = seed_logits(engine, state, np.concatenate([t.train.x, t.heldout.x]), i)
            per.append(wg.score(logits[len(t.train.x):], t.heldout)["by_adjective"])
        return {a: [p[a] for p in per] for a in per[0]}
    return measure
