"""The metrics the analyses read: functions of the logits [B, T, V] that give one number, each
keyed by its values (a sweep with an equal one reuses its program) and each with a value per text
(`per_prompt`, what a bootstrap over the texts resamples).

    metric = normalized_logit_diff(model, clean, corrupted, answer, wrong)   # 1 clean, 0 corrupted
    kl = kl_divergence(model, clean)                 # 0 on the clean run, lower is better (ACDC's)
    se = squared_error(model, clean)                 # 0 on the clean run, lower is better (tracr's)

A metric where lower is better says so (`lower_is_better`), which ACDC's one-sided rule reads.
A normalised difference below its floor (`checks.MIN_GAP`) is refused: it would scale noise up.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.analysis.checks import MIN_GAP, gap
from attention_jax.analysis.inspect import deterministic
from attention_jax.errors import ConfigError
from attention_jax.fingerprint import fingerprint
from attention_jax.layers import check_ids


def check_answers(answer, wrong, batch: int, vocab: int) -> None:
    """Answer and wrong ids: integers in the vocabulary, one for every text or one per text
    ([B]), or one line."""
    for name, ids in (("answer", answer), ("wrong", wrong)):
        if np.shape(ids) not in ((), (batch,)):
            raise ConfigError(f"{name} has shape {np.shape(ids)}, and the batch holds {batch} "
                              f"text(s): give one id for every text, or one per text ([{batch}])")
        check_ids(ids, vocab)            # JAX would clamp an id past the vocabulary, silently


def logit_diff(logits, answer, wrong, *, position: int = -1) -> jax.Array:
    """Mean over the batch of logit[answer] - logit[wrong] at `position` ([B] ids, or
    one id for all)."""
    return jnp.mean(logit_diffs(logits, answer, wrong, position=position))


def logit_diffs(logits, answer, wrong, *, position: int = -1) -> jax.Array:
    """[B]: each text's logit[answer] - logit[wrong] at `position` ([B] ids, or one id for all)."""
    B, T, V = logits.shape
    if not -T <= position < T:
        raise ConfigError(f"position={position} is outside the text's {T} positions "
                          f"(from {-T} to {T - 1})")
    check_answers(answer, wrong, B, V)
    at = logits[:, position]                                            # [B, V]
    rows = jnp.arange(B)
    pick = lambda ids: at[rows, jnp.broadcast_to(jnp.asarray(ids), rows.shape)]
    return pick(answer) - pick(wrong)


def normalized_logit_diff(model, clean, corrupted, answer, wrong, *, position: int = -1,
                          min_gap: float = MIN_GAP) -> Callable:
    """A metric over logits: 1 where the logit difference is the clean run's, 0 where it is the
    corrupted's (a patch can overshoot either end: values past 0 and 1 are real). A clean-corrupted
    difference below `min_gap` (nats) is refused: `NotMeasurable`."""
    model = deterministic(model)
    for name, tokens in (("clean", clean), ("corrupted", corrupted)):
        if np.ndim(tokens) != 2:
            raise ConfigError(f"{name} must be token ids [B, T] (a batch of texts; one text is "
                              f"[1, T]), got shape {np.shape(tokens)}")
    ld = lambda tokens: float(logit_diff(model(jnp.asarray(tokens)), answer, wrong,
                                         position=position))
    high, low = ld(clean), ld(corrupted)
    gap(high, low, min_gap)        # a difference below the floor would be normalised into noise
    return _Normalized(answer, wrong, position, high, low)


class _ByValue:
    """Equal to another of its class by its values (the arrays' too) and hashed alike, so sweeps
    with an equal metric reuse their programs (its dataclass leaves __eq__ to this: eq=False)."""

    def __hash__(self):
        return hash(fingerprint(self))

    def __eq__(self, other):
        return type(other) is type(self) and fingerprint(self) == fingerprint(other)


@dataclasses.dataclass(frozen=True, eq=False)
class _Normalized(_ByValue):
    """(logit_diff - corrupted) / (clean - corrupted): equal to another by its values (the ids'
    too), so sweeps with an equal one reuse their programs."""
    answer: object
    wrong: object
    position: int
    clean: float
    corrupted: float

    def __call__(self, logits):
        ld = logit_diff(logits, self.answer, self.wrong, position=self.position)
        return (ld - self.corrupted) / (self.clean - self.corrupted)

    def per_prompt(self, logits):
        """[B]: each text's value, whose mean the metric is (what a bootstrap over the
        texts resamples)."""
        ld = logit_diffs(logits, self.answer, self.wrong, position=self.position)
        return (ld - self.corrupted) / (self.clean - self.corrupted)


def kl_divergence(model, clean, *, position: int | None = -1) -> Callable:
    """A metric over logits: KL(the clean run's next-token distribution || this run's), the mean
    over the batch at `position` (None: over every position too); 0 on the clean run and lower is
    better (its `lower_is_better`, which ACDC's one-sided rule reads): the metric of
    ACDC's paper."""
    model = deterministic(model)
    if np.ndim(clean) != 2:
        raise ConfigError(f"clean must be token ids [B, T], got shape {np.shape(clean)}")
    T = np.shape(clean)[1]
    if position is not None \
            and not (isinstance(position, (int, np.integer)) and -T <= position < T):
        raise ConfigError(f"position={position!r} must be a position of the text "
                          f"(from {-T} to {T - 1}) or None")
    logp = jax.nn.log_softmax(model(jnp.asarray(clean)).astype(jnp.float32))
    return _Divergence(np.asarray(logp if position is None else logp[:, position]), position)


@dataclasses.dataclass(frozen=True, eq=False)
class _Divergence(_ByValue):
    """KL(clean || logits) at `position` (None: every one), the mean over the rest: keyed
    by its values."""
    clean: np.ndarray
    position: int | None
    lower_is_better: typing.ClassVar[bool] = True

    def __call__(self, logits):
        return jnp.mean(self.per_prompt(logits))

    def per_prompt(self, logits):
        """[B]: each text's divergence (the mean over its positions where `position` is None)."""
        logq = jax.nn.log_softmax(logits.astype(jnp.float32))
        logq = logq if self.position is None else logq[:, self.position]
        each = jnp.sum(jnp.exp(self.clean) * (self.clean - logq), axis=-1)
        return each if self.position is not None else jnp.mean(each, axis=-1)


def squared_error(model, clean, *, start: int = 1) -> Callable:
    """A metric over logits: the squared distance from the clean run's outputs at every position
    from `start` on (1: past a BOS), the mean over the batch of its mean over positions and
    outputs; 0 on the clean run and lower is better. ACDC's metric for tracr's compiled models,
    whose outputs are exact."""
    model = deterministic(model)
    if np.ndim(clean) != 2:
        raise ConfigError(f"clean must be token ids [B, T], got shape {np.shape(clean)}")
    T = np.shape(clean)[1]
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start < T:
        raise ConfigError(f"start={start!r} must be a position of the text (0 to {T - 1})")
    return _SquaredError(np.asarray(model(jnp.asarray(clean))[:, start:], np.float32), int(start))


@dataclasses.dataclass(frozen=True, eq=False)
class _SquaredError(_ByValue):
    """mean((logits - clean)²) from `start` on: keyed by its values."""
    clean: np.ndarray
    start: int
    lower_is_better: typing.ClassVar[bool] = True

    def __call__(self, logits):
        return jnp.mean(self.per_prompt(logits))

    def per_prompt(self, logits):
        """[B]: each text's mean squared distance."""
        return jnp.mean((logits[:, self.start:].astype(jnp.float32) - self.clean) ** 2,
                        axis=(-2, -1))
