"""The parts every model is built of: projections, norms, dropout, and the points inspection swaps.

`Dense`, `TokenEmbed` and `LayerNorm` hold float32 parameters and call the functional core; with a
compute dtype (mixed precision) `Dense` multiplies in it. `Hook` (an identity at a named
point) and `CausalMask` exist to be swapped by `attention_jax.inspect`; `check_ids` refuses
token ids outside the vocabulary. `projection`, `dropout`, `compute_dtype` and
`embedding_init` build the parts as a `ModelConfig` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax import functional as F
from attention_jax.config import ModelConfig
from attention_jax.errors import DataError


# Two initialisations (`ModelConfig.init`). "torch": PyTorch's defaults, which the book's
# numbers were trained with: nn.Linear U(±1/√fan_in) for weights and biases, nn.Embedding
# N(0, 1). Unit-variance embeddings give a fresh head non-uniform scores at once, so it
# starts learning where to look from the first steps. "gpt2": N(0, 0.02) weights and
# embeddings, zero biases. LayerNorm starts as the identity in both.
def _kernel_init(kind: str):
    if kind == "torch":
        return nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
    return nnx.initializers.normal(stddev=0.02)


def embedding_init(kind: str):
    return nnx.initializers.normal(stddev=1.0 if kind == "torch" else 0.02)


class Dense(nnx.Module):
    """x·W (+ b). Parameters are float32; with a `dtype` (mixed precision) the product is computed in it."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool, init: str, rngs: nnx.Rngs, dtype=None):
        self.kernel = nnx.Param(_kernel_init(init)(rngs.params(), (d_in, d_out)))
        bound = d_in ** -0.5
        torch_bias = lambda: jax.random.uniform(rngs.params(), (d_out,), minval=-bound, maxval=bound)
        self.bias = nnx.Param(torch_bias() if init == "torch" else jnp.zeros((d_out,))) if bias else None
        self.dtype = dtype

    def operands(self, x):
        """x, W and b as the product takes them: cast to the compute dtype, when there is one."""
        kernel, bias = self.kernel[...], None if self.bias is None else self.bias[...]
        if self.dtype is not None:
            x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
            bias = None if bias is None else bias.astype(self.dtype)
        return x, kernel, bias

    def __call__(self, x):
        return F.dense(*self.operands(x))


class TokenEmbed(nnx.Embed):
    """The token table: a row per id in (`__call__`) and, when tied, the output layer, which reads
    it transposed (`attend`: the stream [..., D] against every row, [..., V])."""

    def attend(self, x):
        return jnp.einsum("...D,VD->...V", x, self.embedding[...].astype(x.dtype))


class LayerNorm(nnx.Module):
    def __init__(self, d: int, *, bias: bool, eps: float):
        self.scale = nnx.Param(jnp.ones((d,)))
        self.bias = nnx.Param(jnp.zeros((d,))) if bias else None
        self.eps = eps

    def __call__(self, x):
        return F.layer_norm(x, self.scale[...], None if self.bias is None else self.bias[...], self.eps)


def projection(config: ModelConfig, rngs: nnx.Rngs, d_in: int, d_out: int, *, bias: bool) -> Dense:
    """A `Dense` initialised and computed as the config says."""
    return Dense(d_in, d_out, bias=bias, init=config.init, rngs=rngs, dtype=compute_dtype(config))


def compute_dtype(config: ModelConfig):
    """None for float32 (nothing cast: the float32 step is the one measured); else the compute dtype."""
    return None if config.dtype == "float32" else jnp.dtype(config.dtype)


def dropout(config: ModelConfig, rngs: nnx.Rngs):
    """The config's dropout, or None (no module, no random stream) when it is 0."""
    return nnx.Dropout(config.dropout, rngs=rngs) if config.dropout > 0 else None


# --- points to look at and parts to swap ------------------------------------------------

class Hook(nnx.Module):
    """An identity at a named point of the forward pass; inspection swaps it for one that records or patches."""

    def __call__(self, x):
        return x


class CausalMask(nnx.Module):
    """bool[T, T]: position t sees positions i <= t (`F.causal_mask`). Swapped for `Bidirectional` to
    ablate causality, or for a mask of one's own (any module T -> bool[T, T])."""
    causal = True

    def __call__(self, T: int):
        return F.causal_mask(T)


class Bidirectional(CausalMask):
    """No mask: every position sees every other, the future included."""
    causal = False

    def __call__(self, T: int):
        return None


def decoding_positions(index, start, t: int) -> jax.Array:
    """[B, t]: the positions of slots index .. index + t - 1 in each row, left-padded by start[b] slots
    (negative in the padding)."""
    return (index + jnp.arange(t))[None, :] - start[:, None]


class KVCache(nnx.Module):
    """What a mixer has seen so far, for decoding one position at a time: its values (and keys)
    at every slot up to `max_len`, preallocated so that shapes stay fixed under jit, and how
    many slots are written. `shape`: [B, H, max_len, D] for attention, [B, max_len, D] for the
    average. Rows of unequal length are left-padded: row b's text begins at slot `start[b]`, so
    slot s holds its position s - start[b], and the slots before it are read by no query."""

    def __init__(self, shape: tuple[int, ...], dtype, *, keys: bool = True, start=None):
        # One row of attention is kept as [H, max_len, D]: held as [1, H, max_len, D], XLA's CPU backend
        # copies the whole cache several times a token, where it writes one slot in place otherwise.
        self.shape = tuple(shape)
        stored = self.shape[1:] if len(shape) == 4 and shape[0] == 1 else self.shape
        self.k = nnx.Cache(jnp.zeros(stored, dtype)) if keys else None
        self.v = nnx.Cache(jnp.zeros(stored, dtype))
        self.index = nnx.Cache(jnp.zeros((), jnp.int32))
        # A copy of its own: a decoding loop may donate the state, and one buffer cannot be donated twice.
        self.start = nnx.Cache(jnp.zeros(shape[:1], jnp.int32) if start is None else jnp.array(start, jnp.int32))

    def slots(self, t: int) -> jax.Array:
        """Where the next t positions go: [t], one slot for every row."""
        return self.index[...] + jnp.arange(t)

    def positions(self, t: int) -> jax.Array:
        """The next t positions of each row, [B, t]: `decoding_positions`."""
        return decoding_positions(self.index[...], self.start[...], t)

    def visible(self, t: int) -> jax.Array:
        """bool [B, t, max_len]: the next t queries see the slots at or before their own, from their row's start."""
        at, slot = self.slots(t), jnp.arange(self.v.shape[-2])
        return (slot[None, None, :] <= at[None, :, None]) & (slot[None, None, :] >= self.start[...][:, None, None])

    def append(self, v, k=None):
        """Write t new slots; every value (and key) written so far, zeros past them: [..., max_len, D]."""
        start = self.index[...]
        write = lambda cache, new: jax.lax.dynamic_update_slice_in_dim(
            cache, new.astype(cache.dtype).reshape(*cache.shape[:-2], *new.shape[-2:]), start, axis=-2)
        self.v[...] = write(self.v[...], v)
        if k is not None:
            self.k[...] = write(self.k[...], k)
        self.index[...] = start + v.shape[-2]
        return self.v[...].reshape(self.shape), None if k is None else self.k[...].reshape(self.shape)


def check_ids(tokens, vocab_size: int) -> None:
    """Refuse, with one line, token ids that are no integers (floats, booleans) or are outside
    [0, vocab_size) (this last on concrete, host or eager, ids; an empty batch has none outside).

    Inside a compiled step the ids are abstract and only their dtype is checked: the engine
    checks each batch on the host where it is made. An id out of range would otherwise give
    NaN logits (too large) or silently read another row of the table (negative); a float
    would be truncated, and a boolean read as 0 or 1.
    """
    dtype = getattr(tokens, "dtype", None)
    if dtype is None:
        dtype = np.asarray(tokens).dtype
    if not np.issubdtype(dtype, np.integer):
        raise DataError(f"token ids must be integers, got {np.dtype(dtype).name} values; encode the text with the "
                        "model's own tokenizer (its ids are int32)")
    if isinstance(tokens, jax.core.Tracer):
        return
    ids = np.asarray(tokens)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise DataError(f"token id {bad} is outside the vocabulary [0, {vocab_size}); "
                        "encode the text with the model's own tokenizer")
