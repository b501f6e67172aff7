"""Decoding's layout: every weight matrix read as [out, in], in the dtype it is stored in.

A decoded token reads every weight once for a few rows of activations, so its time is the
weights' bytes over the memory's bandwidth, if the product streams them. With bfloat16
weights and float32 activations the product goes to a bfloat16 kernel (on a CPU XLA's
YNNPACK fusion; else a float32 product would read a float32 copy of every matrix, made
each token): the activations go in as two bfloat16 parts, hi + lo (16 bits of mantissa), so
only the weights are rounded, and each weight is still read once. XLA's CPU kernels stream
an [out, in] matrix faster as the product's left operand (the activations on the right) than
as its right one, and far faster than [in, out]; one row's two parts are padded to 4, a little
faster than 2. Float32 activations take that form from two rows up; one row stays a plain
matrix-vector product, which XLA streams already. Float16 weights are widened back to float32
once, their values still float16's: two float16 parts would overflow past 65504, and
converting every token costs more than reading float32. The output layer tied to the token
table reads it as it is, already [out, in] = [V, D].

Int8 weights (`quantized`: a scale per output, each row of [out, in] rounded to 255 levels) go to
XLA's int8 kernel, which reads int8 against int8: the activations go in as two int8 parts of
one scale a row (x ≈ a·(x1 + x2/254), 15 bits), the products sum exactly in int32, and only
the weights are rounded; a quarter of float32's bytes.

The twins hold the layer's matrix transposed (and its bias): `generate.Decoder` makes them
once. They compute no gradient: decoding only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import functional as F
from attention_jax.layers import Dense, TokenEmbed


@jax.jit
def quantized(matrix) -> tuple[jax.Array, jax.Array]:
    """[out, in] -> (int8 levels [out, in], float32 scale [out]): each row over its largest magnitude."""
    scale = jnp.max(jnp.abs(matrix), axis=1) / 127
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.round(matrix / scale[:, None]).astype(jnp.int8), scale.astype(jnp.float32)


def _streamed(weight, parts, accumulate):
    """weight [out, in] · each of `parts` [..., in] -> [len(parts), ..., out], summed in `accumulate`: the
    weight as the product's left operand, which XLA's CPU kernels stream faster than as the right one.
    A barrier keeps the result's transpose apart, else XLA folds it back into the product, swapping them."""
    rows = jnp.stack(parts).reshape(-1, parts[0].shape[-1])
    y = jax.lax.dot_general(weight, rows, (((1,), (1,)), ((), ())), preferred_element_type=accumulate)
    return jax.lax.optimization_barrier(y).T.reshape(len(parts), *parts[0].shape[:-1], -1)


def _int8_product(x, weight, scale):
    """x [..., in] · (weight·scale)ᵀ, x in two int8 parts of one scale per row, summed in int32."""
    a = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127
    a = jnp.where(a > 0, a, 1.0)
    x1 = jnp.round(x / a)
    x2 = jnp.round((x / a - x1) * 254)                  # the remainder, |r| <= 1/2, on 254ths
    parts = [x1.astype(jnp.int8), x2.astype(jnp.int8)]
    parts += [jnp.zeros_like(parts[0])] * (2 if x.size == x.shape[-1] else 0)
    y = _streamed(weight, parts, jnp.int32).astype(jnp.float32)
    return (a * (y[0] + y[1] / 254) * scale).astype(x.dtype)


def product(x, weight, scale=None) -> jax.Array:
    """x [..., in] · weightᵀ ([out, in]; int8 levels times `scale` [out]) -> [..., out], summed in
    float32 (x's dtype out)."""
    if weight.dtype == jnp.int8:
        return _int8_product(x.astype(jnp.float32), weight, scale).astype(x.dtype)
    contract = (((x.ndim - 1,), (1,)), ((), ()))
    if x.dtype in (jnp.bfloat16, jnp.float16):      # a low-precision stream: its own dtype, summed in float32
        return jax.lax.dot_general(x, weight.astype(x.dtype), contract,
                                   preferred_element_type=jnp.float32).astype(x.dtype)
    if weight.dtype != jnp.bfloat16:
        if x.size == x.shape[-1]:
            return jax.lax.dot_general(x, weight.astype(x.dtype), contract)
        return _streamed(weight.astype(x.dtype), [x], x.dtype)[0]
    hi = x.astype(weight.dtype)
    lo = (x - hi.astype(x.dtype)).astype(weight.dtype)
    parts = [hi, lo] + [jnp.zeros_like(hi)] * (2 if x.size == x.shape[-1] else 0)
    y = _streamed(weight, parts, jnp.float32)
    return (y[0] + y[1]).astype(x.dtype)


def _held(matrix):
    """A matrix as `product` reads it: float16 widened to float32 (its values float16's still)."""
    return matrix.astype(jnp.float32) if matrix.dtype == jnp.float16 else matrix


class DecodingDense(nnx.Module):
    """A `Dense` as decoding reads it: its kernel transposed to [out, in], in its stored dtype (or
    int8 levels and a scale per output)."""

    def __init__(self, layer: Dense, *, int8: bool = False):
        weight = _held(layer.kernel[...].T)
        self.weight, self.scale = (nnx.Param(a) for a in quantized(weight)) if int8 else (nnx.Param(weight), None)
        self.bias, self.dtype = layer.bias, layer.dtype

    def __call__(self, x):
        x = F.floating(x if self.dtype is None else x.astype(self.dtype))
        y = product(x, self.weight[...], None if self.scale is None else self.scale[...])
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


class DecodingEmbed(TokenEmbed):
    """The token table, the tied output layer reading it by `product` (int8: each row's levels and scale)."""

    def __init__(self, table: TokenEmbed, *, int8: bool = False):
        for name, value in vars(table).items():
            if not name.startswith("_"):             # the parameter and Embed's settings; nnx keeps its own state
                setattr(self, name, value)
        matrix = _held(table.embedding[...])
        self.embedding, self.scale = (nnx.Param(a) for a in quantized(matrix)) if int8 else \
            (nnx.Param(matrix), None)

    def __call__(self, tokens):
        if self.scale is None:
            return super().__call__(tokens)
        return jnp.take(self.embedding[...], tokens, axis=0).astype(jnp.float32) * self.scale[...][tokens][..., None]

    def attend(self, x):
        return product(x, self.embedding[...], None if self.scale is None else self.scale[...])


def parts(model, *, int8: bool = False) -> dict:
    """path -> twin: every dense layer (as built or swapped, unless it rounds its own operands) and
    the token table, when the output layer reads it; `int8`: their matrices as int8 levels."""
    swaps = {}
    for path, m in nnx.iter_modules(model):
        name = ".".join(map(str, path))
        if isinstance(m, Dense) and getattr(m, "matmul_dtype", None) is None:
            swaps[name] = DecodingDense(m, int8=int8)
        elif type(m) is TokenEmbed and name == "token_embed" and getattr(model, "lm_head", 0) is None:
            swaps[name] = DecodingEmbed(m, int8=int8)
    return swaps
