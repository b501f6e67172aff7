"""Decoding's layout: every weight matrix read as [out, in], in the dtype it is stored in.

A decoded token reads every weight once for a few rows of activations, so its time is the
weights' bytes over the memory's bandwidth, if the product streams them. With bfloat16
weights and float32 activations the product goes to a bfloat16 kernel (on a CPU XLA's
YNNPACK fusion; else a float32 product would read a float32 copy of every matrix, made
each token): the activations go in as two bfloat16 parts, hi + lo (16 bits of mantissa), so
only the weights are rounded, and each weight is still read once. On XLA's CPU backend that
kernel streams an [out, in] matrix faster than [in, out], and 4 rows faster than 2 (so one
row's two parts are padded to 4). Float16 weights are widened back to float32 once, their
values still float16's: two float16 parts would overflow past 65504, and converting every
token costs more than reading float32. The output layer tied to the token table reads it as
it is, already [out, in] = [V, D].

The twins hold the layer's matrix transposed (and its bias): `generate.Decoder` makes them
once. They compute no gradient: decoding only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import functional as F
from attention_jax.layers import Dense, TokenEmbed


def product(x, weight) -> jax.Array:
    """x [..., in] · weightᵀ ([out, in]) -> [..., out], summed in float32 (x's dtype out)."""
    contract = (((x.ndim - 1,), (1,)), ((), ()))
    if x.dtype in (jnp.bfloat16, jnp.float16):      # a low-precision stream: its own dtype, summed in float32
        return jax.lax.dot_general(x, weight.astype(x.dtype), contract,
                                   preferred_element_type=jnp.float32).astype(x.dtype)
    if weight.dtype != jnp.bfloat16:
        return jax.lax.dot_general(x, weight.astype(x.dtype), contract)
    hi = x.astype(weight.dtype)
    lo = (x - hi.astype(x.dtype)).astype(weight.dtype)
    parts = [hi, lo] + [jnp.zeros_like(hi)] * (2 if x.size == x.shape[-1] else 0)
    y = jax.lax.dot_general(jnp.stack(parts), weight, (((x.ndim,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
    return (y[0] + y[1]).astype(x.dtype)


def _held(matrix):
    """A matrix as `product` reads it: float16 widened to float32 (its values float16's still)."""
    return matrix.astype(jnp.float32) if matrix.dtype == jnp.float16 else matrix


class DecodingDense(nnx.Module):
    """A `Dense` as decoding reads it: its kernel transposed to [out, in], in its stored dtype."""

    def __init__(self, layer: Dense):
        self.weight = nnx.Param(_held(layer.kernel[...].T))
        self.bias, self.dtype = layer.bias, layer.dtype

    def __call__(self, x):
        x = F.floating(x if self.dtype is None else x.astype(self.dtype))
        y = product(x, self.weight[...])
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


class DecodingEmbed(TokenEmbed):
    """The token table, the tied output layer reading it by `product`."""

    def __init__(self, table: TokenEmbed):
        for name, value in vars(table).items():
            if not name.startswith("_"):             # the parameter and Embed's settings; nnx keeps its own state
                setattr(self, name, value)
        self.embedding = nnx.Param(_held(table.embedding[...]))

    def attend(self, x):
        return product(x, self.embedding[...])


def parts(model) -> dict:
    """path -> twin: every dense layer (as built or swapped, unless it rounds its own operands) and
    the token table, when the output layer reads it."""
    swaps = {}
    for path, m in nnx.iter_modules(model):
        name = ".".join(map(str, path))
        if isinstance(m, Dense) and getattr(m, "matmul_dtype", None) is None:
            swaps[name] = DecodingDense(m)
        elif type(m) is TokenEmbed and name == "token_embed" and getattr(model, "lm_head", 0) is None:
            swaps[name] = DecodingEmbed(m)
    return swaps
