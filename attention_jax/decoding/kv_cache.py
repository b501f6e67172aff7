"""Decoding with a key/value cache, as a twin of the model: the model as built never knows of it.

    decoding = cached(model, batch=2, max_len=24, padding=[0, 3])   # swapped in, in place
    logits = decoding(prompt)            # the prompt once (rows left-padded by `padding` slots)
    logits = decoding(next_tokens)       # then a position a call, reading every slot written
    decoding.undo()                      # the model as built again

`cached` swaps, by `attention_jax.swap`, each mixer for a twin that holds it and its cache:
`CachedAttention` runs the mixer's own `project`, `_attend` and `output`, and gives `_attend`
the two things decoding changes: the positions where the text is (RoPE's angles) and the cache
as its memory (the keys and values of every slot written, which of them each query reads, and
the queries' slots, ALiBi's distances); `CachedAverage` keeps the values the average reads.
The learned or sinusoidal positions added to the tokens are read at the same places
(`CachedPositions`). A `Clock` shared by all says which slot the next position goes to and
where each row's text begins: rows of unequal length are left-padded, row b's text at slot
`padding[b]` onward, and no query reads a padding slot. `generate` and `Decoder` use it;
`speed.fast` swapped in first stays in. A cache of no rows, or past the free memory
(`decoding.memory`), and tokens that are not [rows, t] are refused in one line.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.decoding import memory
from attention_jax.errors import ConfigError
from attention_jax.layers import CausalMask, PositionTable, SinusoidalPositions
from attention_jax.model import Head, MultiHeadAttention, UniformAverage
from attention_jax.swap import Swapped, twins


class Clock(nnx.Module):
    """Where decoding stands: the slot the next position goes to, and each row's first slot
    (`start`)."""

    def __init__(self, length: int, start):
        self.length = length
        self.index = nnx.Cache(jnp.zeros((), jnp.int32))
        self.start = nnx.Cache(jnp.asarray(start, jnp.int32))

    def slots(self, t: int) -> jax.Array:
        """Where the next t positions go: [t], the same for every row."""
        return self.index[...] + jnp.arange(t)

    def positions(self, t: int) -> jax.Array:
        """The next t positions of each row, [B, t] (negative in its padding)."""
        return self.slots(t)[None, :] - self.start[...][:, None]

    def visible(self, t: int) -> jax.Array:
        """bool [B, t, length]: the next t queries see the slots at or before their own, from their
        row's start."""
        at, slot = self.slots(t), jnp.arange(self.length)
        return (slot[None, None, :] <= at[None, :, None]) & \
            (slot[None, None, :] >= self.start[...][:, None, None])


class KVCache(nnx.Module):
    """Values (and keys) at every slot up to the clock's length, preallocated so shapes stay fixed
    under jit: [B, H, length, D] for attention, [B, length, D] for the average."""

    def __init__(self, shape: tuple[int, ...], dtype, *, keys: bool = True):
        # One row of attention is kept as [H, length, D]: held as [1, H, length, D], XLA's CPU
        # backend copies the whole cache several times a token, where it writes one slot in place
        # otherwise.
        self.shape = tuple(shape)
        stored = self.shape[1:] if len(shape) == 4 and shape[0] == 1 else self.shape
        self.k = nnx.Cache(jnp.zeros(stored, dtype)) if keys else None
        self.v = nnx.Cache(jnp.zeros(stored, dtype))

    def write(self, at, v, k=None):
        """t new slots from slot `at`; every value (and key) written so far, zeros past them:
        [..., length, D]."""
        put = lambda cache, new: jax.lax.dynamic_update_slice_in_dim(
            cache, new.astype(cache.dtype).reshape(*cache.shape[:-2], *new.shape[-2:]), at, axis=-2)
        self.v[...] = put(self.v[...], v)
        if k is not None:
            self.k[...] = put(self.k[...], k)
        keys = None if k is None else self.k[...].reshape(self.shape)
        return self.v[...].reshape(self.shape), keys


class CachedAttention(nnx.Module):
    """An attention mixer (`Head`, `MultiHeadAttention`) decoding: the mixer's own `project`,
    `_attend` and `output`, given the clock's positions and this cache as its memory."""

    def __init__(self, mixer, clock: Clock):
        cfg = mixer.config
        if type(mixer.attention.mask) is not CausalMask:
            mask = type(mixer.attention.mask).__name__
            raise ConfigError(f"decoding reads the past only; a {mask} mask cannot decode: decode "
                              "outside the ablation")
        self.reference, self.clock = mixer, clock
        shape = (clock.start.shape[0], cfg.heads_used, clock.length, cfg.d_head_used)
        self.cache = KVCache(shape, jnp.dtype(cfg.dtype))

    def __call__(self, x):
        ref = self.reference
        q, k, v = ref.project(x)                                     # [B, H, T, D]
        at = self.clock.positions(q.shape[-2])[:, None, :]           # [B, 1, T]
        return ref.output(ref._attend(q, k, v, positions=at, memory=self.remember))

    def remember(self, k, v):
        """The memory `_attend` reads: the T new keys and values [B, H, T, D] written at the
        clock's slots; (every key and value [B, H, length, D], which slots each new query sees
        [B, 1, T, length], the new queries' slots [T]: ALiBi's distance is the same in slots as in
        positions)."""
        clock, T = self.clock, k.shape[-2]
        v, k = self.cache.write(clock.index[...], v, k)
        return k, v, clock.visible(T)[:, None], clock.slots(T)


class CachedAverage(nnx.Module):
    """The uniform average decoding: each new position the mean of its row's values written so
    far."""

    def __init__(self, mixer: UniformAverage, clock: Clock, d_model: int, dtype):
        self.reference, self.clock = mixer, clock
        self.cache = KVCache((clock.start.shape[0], clock.length, d_model), dtype, keys=False)

    def __call__(self, x):
        clock, T = self.clock, x.shape[-2]
        at, seen = clock.positions(T), clock.visible(T)             # [B, T], [B, T, length]
        values, _ = self.cache.write(clock.index[...], x)
        w = seen / jnp.maximum(at[..., None] + 1.0, 1.0)    # a padding slot's query: 0, not 0/0
        return jnp.einsum("BTS,BSD->BTD", w.astype(x.dtype), values)


class CachedPositions(nnx.Module):
    """The positions added to the tokens, read at the clock's positions: [B, T, D] (a padding slot
    reads row 0, which no query reads)."""

    def __init__(self, positions, clock: Clock):
        self.reference, self.clock = positions, clock

    def rows(self, T: int):
        return self.reference.rows(self.clock.length)[jnp.maximum(self.clock.positions(T), 0)]


class Cached(Swapped):
    """A model decoding (`cached`): call it with the next tokens [B, t] for their logits; the clock
    moves on by t. `undo()` (or leaving a `with` block) puts the model as built back."""

    def __init__(self, model, clock: Clock | None, parts: dict):
        super().__init__(model, parts)
        self.clock = clock

    def __enter__(self):
        return self

    @classmethod
    def resume(cls, model) -> "Cached":
        """A model whose twins are in already (merged again from its state, inside a compiled
        loop)."""
        clock = next((m for _, m in nnx.iter_modules(model) if isinstance(m, Clock)), None)
        return cls(model, clock, {})

    def _check(self, shape: tuple) -> None:
        """One line for tokens the cache cannot take: not [rows, t], t >= 1, or past its slots."""
        clock, rows = self.clock, self.clock.start.shape[0]
        if len(shape) != 2 or shape[0] != rows or not shape[1]:
            raise ConfigError(f"tokens of shape {shape} for a cache of {rows} row(s): give "
                              f"[{rows}, t] ids, t >= 1")
        written = clock.index[...]
        if not isinstance(written, jax.core.Tracer) and int(written) + shape[1] > clock.length:
            raise ConfigError(f"the cache holds {clock.length} positions and {int(written)} are "
                              f"written: {shape[1]} more do not fit; decode with a longer max_len")

    def __call__(self, tokens):
        if self.clock is not None:    # a model of no mixer and no positions keeps nothing, no clock
            self._check(np.shape(tokens))
        logits = self.model(tokens)
        if self.clock is not None:
            self.clock.index[...] += np.shape(tokens)[1]
        return logits


# Which twin replaces which part (`attention_jax.swap.twins`): each mixer, and the positions added
# to the tokens (a model with neither keeps nothing while it decodes).
_attention = lambda mixer, path, *, clock, config: CachedAttention(mixer, clock)
TWINS = {
    Head: _attention,
    MultiHeadAttention: _attention,
    UniformAverage: lambda mixer, path, *, clock, config: CachedAverage(
        mixer, clock, config.d_model, jnp.dtype(config.dtype)),
    PositionTable: lambda table, path, *, clock, config: CachedPositions(table, clock),
    SinusoidalPositions: lambda table, path, *, clock, config: CachedPositions(table, clock),
}


def _whole(value) -> bool:
    """A whole number >= 1, not a bool."""
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    return integral and value >= 1


def _start(batch: int, max_len: int, padding) -> np.ndarray:
    """Each row's first slot, [batch] int32, or one line for a `padding` that gives none."""
    try:
        start = np.zeros((batch,), np.int32) if padding is None else np.asarray(padding)
    except (TypeError, ValueError):         # rows of other shapes, values that are no numbers
        start = np.asarray(None)
    if start.shape != (batch,) or not np.issubdtype(start.dtype, np.integer) or (
            start.min() < 0 or start.max() >= max_len):
        raise ConfigError(f"padding={start.tolist()}: give one whole number per row, [{batch}], "
                          f"each from 0 to {max_len - 1} (slots before the row's text)")
    return start.astype(np.int32)


def cached(model, batch: int, max_len: int | None = None, *, padding=None) -> Cached:
    """`model` made to decode `batch` texts of up to `max_len` slots (default its context), in
    place: see the module's docstring. `padding` ([batch] whole numbers, default 0): slots of left
    padding a row. What cannot be (no row, a cache past the free memory) is refused in one line."""
    cfg = model.config
    max_len = cfg.context if max_len is None else max_len
    if not _whole(batch) or not _whole(max_len):
        raise ConfigError(f"batch={batch!r}, max_len={max_len!r}: a cache holds whole numbers >= 1 "
                          "of rows and of slots a row")
    if cfg.positions == "learned" and max_len > cfg.max_positions_used:
        raise ConfigError(f"a cache of {max_len} positions passes the learned position table "
                          f"({cfg.max_positions_used} rows); decode at most "
                          f"{cfg.max_positions_used}")
    start = _start(batch, max_len, padding)
    memory.check({"cache": memory.cache_bytes(cfg, batch, max_len)},
                 f"a cache of {batch} row(s) of {max_len} slots",
                 "decode fewer rows at once, or fewer slots")
    clock = Clock(max_len, start)
    parts = twins(model, TWINS, clock=clock, config=cfg)
    return Cached(model, clock if parts else None, parts)
