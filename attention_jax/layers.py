"""The parts every model is built of: projections, norms, dropout, and the points inspection swaps.

`Dense`, `TokenEmbed`, `PositionTable` and `LayerNorm` hold float32 parameters and call the
functional core; with a compute dtype (mixed precision) `Dense` multiplies in it. `Hook` (an
identity at a named point) and `CausalMask` exist to be swapped by
`attention_jax.analysis.inspect`; `check_ids` refuses token ids outside the vocabulary.
`projection`, `dropout`, `compute_dtype` and `embedding_init` build the parts as a
`ModelConfig` says.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax import functional as F
from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError, DataError


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
    """x·W (+ b). Parameters are float32; with a `dtype` (mixed precision) the product is
    computed in it."""

    def __init__(self, d_in: int, d_out: int, *, bias: bool, init: str, rngs: nnx.Rngs, dtype=None):
        self.kernel = nnx.Param(_kernel_init(init)(rngs.params(), (d_in, d_out)))
        bound = d_in ** -0.5
        torch_bias = lambda: jax.random.uniform(rngs.params(), (d_out,), minval=-bound,
                                                maxval=bound)
        self.bias = (nnx.Param(torch_bias() if init == "torch" else jnp.zeros((d_out,)))
                     if bias else None)
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


class PositionTable(nnx.Embed):
    """Learned positions: a row a position, `rows(T)` the first T [T, D] (a text past the
    table is refused)."""

    def rows(self, T: int):
        if T > self.num_embeddings:
            raise ConfigError(f"{T} positions exceed the learned position table "
                              f"({self.num_embeddings} rows); raise max_positions")
        return self.embedding[:T]


class SinusoidalPositions(nnx.Module):
    """Vaswani et al.'s fixed positions: `rows(T)` [T, D], computed, nothing learned."""

    def __init__(self, d: int):
        self.d = d

    def rows(self, T: int):
        return F.sinusoidal_positions(T, self.d)


class LayerNorm(nnx.Module):
    def __init__(self, d: int, *, bias: bool, eps: float):
        self.scale = nnx.Param(jnp.ones((d,)))
        self.bias = nnx.Param(jnp.zeros((d,))) if bias else None
        self.eps = eps

    def __call__(self, x):
        return F.layer_norm(x, self.scale[...], None if self.bias is None else self.bias[...],
                            self.eps)


def projection(config: ModelConfig, rngs: nnx.Rngs, d_in: int, d_out: int, *, bias: bool) -> Dense:
    """A `Dense` initialised and computed as the config says."""
    return Dense(d_in, d_out, bias=bias, init=config.init, rngs=rngs, dtype=compute_dtype(config))


def compute_dtype(config: ModelConfig):
    """None for float32 (nothing cast: the float32 step is the one measured); else the
    compute dtype."""
    return None if config.dtype == "float32" else jnp.dtype(config.dtype)


def dropout(config: ModelConfig, rngs: nnx.Rngs):
    """The config's dropout, or None (no module, no random stream) when it is 0."""
    return nnx.Dropout(config.dropout, rngs=rngs) if config.dropout > 0 else None


# --- points to look at and parts to swap ------------------------------------------------

class Hook(nnx.Module):
    """An identity at a named point of the forward pass; inspection swaps it for one that
    records or patches."""

    def __call__(self, x):
        return x


class CausalMask(nnx.Module):
    """bool[T, T]: position t sees positions i <= t (`F.causal_mask`). Swapped for `Bidirectional`
    to ablate causality, or for a mask of one's own (any module T -> bool[T, T])."""
    causal = True

    def __call__(self, T: int):
        return F.causal_mask(T)


class Bidirectional(CausalMask):
    """No mask: every position sees every other, the future included (an ablation swapped in, or
    what a model built with `causal=False` has: tracr's compiled models)."""
    causal = False

    def __call__(self, T: int):
        return None


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
        raise DataError(f"token ids must be integers, got {np.dtype(dtype).name} values; encode "
                        "the text with the model's own tokenizer (its ids are int32)")
    if isinstance(tokens, jax.core.Tracer):
        return
    ids = np.asarray(tokens)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise DataError(f"token id {bad} is outside the vocabulary [0, {vocab_size}); "
                        "encode the text with the model's own tokenizer")
