"""Train/val split, stateless random batches, and fixed evaluation windows.

Batches are a pure function of (seed, step): a run killed at step k and restored from a
checkpoint draws exactly the batches it would have drawn, with no loader state to save,
and several seeds can be trained side by side without sharing an iterator.
"""

from __future__ import annotations

import numpy as np

from attention_jax.errors import ConfigError, DataError


def train_val_split(tokens, frac: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """First `frac` of the ids for training, the rest held out (contiguous, as in the book).

    A contiguous tail rather than a random sample keeps held-out text genuinely unseen:
    random windows would overlap training windows and leak their tokens.
    """
    if not 0.0 < float(frac) < 1.0:
        raise ConfigError(f"train fraction {frac} must lie strictly between 0 and 1; use e.g. 0.9")
    tokens = np.asarray(tokens)
    cut = int(len(tokens) * float(frac))
    if cut == 0 or cut == len(tokens):
        raise DataError(f"{len(tokens)} tokens cannot be split {frac:.2f}/{1 - frac:.2f}; "
                        "use a larger corpus")
    return tokens[:cut], tokens[cut:]


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if int(value) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value}")


def get_batch(tokens: np.ndarray, *, seed: int, step: int, batch_size: int,
              context: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows x [B, T] and targets y [B, T] (x shifted left by one), int32.

    Offsets come from np.random.default_rng((seed, step)); seeding by the pair rather
    than advancing one generator is what makes batch k independent of batches 0..k-1.
    """
    _check_positive(batch_size=batch_size, context=context)
    if int(seed) < 0 or int(step) < 0:
        raise ConfigError(f"seed ({seed}) and step ({step}) must be non-negative integers")
    tokens = np.asarray(tokens)
    n_starts = len(tokens) - int(context)  # a window needs context + 1 ids for its targets
    if n_starts < 1:
        raise DataError(f"{len(tokens)} tokens are too few for context {context}; "
                        f"use a context below {len(tokens)} or a larger corpus")
    rng = np.random.default_rng((int(seed), int(step)))
    starts = rng.integers(0, n_starts, size=int(batch_size))
    windows = tokens[starts[:, None] + np.arange(int(context) + 1)]
    return windows[:, :-1].astype(np.int32), windows[:, 1:].astype(np.int32)


def eval_windows(tokens: np.ndarray, context: int, *,
                 max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows x [W, T], y [W, T] tiling the split from its start.

    Every id after the first is a target exactly once, so the mean loss over all windows
    is the split's perplexity, not a sample of it; the ragged tail shorter than a window
    is dropped. With `max_windows`, evenly spaced windows are kept (a fixed, repeatable
    sample, e.g. of the training split) instead of the first few, which would all come
    from the opening scenes.
    """
    _check_positive(context=context)
    tokens = np.asarray(tokens)
    t = int(context)
    count = (len(tokens) - 1) // t  # y reaches one id past x's end
    if count < 1:
        raise DataError(f"{len(tokens)} tokens are too few for one evaluation window of {t}; "
                        f"use a context below {len(tokens)} or a larger split")
    x = tokens[: count * t].reshape(count, t)
    y = tokens[1 : count * t + 1].reshape(count, t)
    if max_windows is not None:
        _check_positive(max_windows=max_windows)
        if int(max_windows) < count:
            # Integer spacing: strictly increasing, hence distinct, and identical on every run.
            keep = (np.arange(int(max_windows)) * count) // int(max_windows)
            x, y = x[keep], y[keep]
    return x.astype(np.int32), y.astype(np.int32)
