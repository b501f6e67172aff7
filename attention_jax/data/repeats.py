"""Random tokens with one segment repeated: the task induction heads are found on
(Olsson et al. 2022).

Each sequence is uniform random tokens in which a segment of `span` tokens, starting at `first`,
is written again right after itself. Nothing in the first copy can be predicted; every token of
the second copy but its first can, by a head that finds the earlier occurrence of the current
token and copies the token after it. The span varies from sequence to sequence, so no fixed
offset (no head reading by position alone) finds the copy: only its content does.

Batches are a pure function of (seed, step), like every task's here, so a resumed run draws
exactly the batches it would have drawn.
"""
from __future__ import annotations

import numpy as np

from attention_jax.errors import ConfigError


def repeated_segments(seed: int, step: int, *, batch: int, length: int, vocab: int, shortest: int,
                      longest: int) -> dict[str, np.ndarray]:
    """{"x", "y"} [batch, length] int32 (y: x shifted by one), and per sequence where the first copy
    starts ("first") and how long a copy is ("span"), both [batch] int32; both copies
    lie inside x."""
    if not (isinstance(shortest, int) and isinstance(longest, int) and 2 <= shortest <= longest
            and 2 * longest <= length):
        raise ConfigError(f"repeated segments of {shortest} to {longest} tokens must be at least 2 "
                          f"long and fit twice in a window of {length}; choose 2 <= shortest <= "
                          "longest <= length // 2")
    if vocab < 2:
        raise ConfigError(f"vocab={vocab}: random tokens need at least 2 ids")
    rng = np.random.default_rng([int(seed), int(step), 0x5EED])
    tokens = rng.integers(0, vocab, (batch, length + 1))
    span = rng.integers(shortest, longest + 1, batch)
    # first + 2·span <= length
    first = (rng.random(batch) * (length - 2 * span + 1)).astype(np.int64)
    for row, (f, s) in enumerate(zip(first, span)):
        tokens[row, f + s:f + 2 * s] = tokens[row, f:f + s]
    return {"x": tokens[:, :-1].astype(np.int32), "y": tokens[:, 1:].astype(np.int32),
            "first": first.astype(np.int32), "span": span.astype(np.int32)}


def copy_targets(first, span, length: int) -> tuple[np.ndarray, np.ndarray]:
    """bool [batch, length] masks of the positions whose next token is in the second copy
    (predictable from the first: all but the copy's first token) and, as many, in the first copy
    (not predictable)."""
    t = np.arange(length)[None, :]
    first, span = np.asarray(first)[:, None], np.asarray(span)[:, None]
    repeat = (t >= first + span) & (t < first + 2 * span - 1)
    once = (t >= first) & (t < first + span - 1)
    return repeat, once
