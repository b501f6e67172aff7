"""Decoding's layout: every weight matrix read as [out, in], in the dtype it is stored in.

A decoded token reads every weight once for a few rows of activations, so its time is the
weights' bytes over the memory's bandwidth, if the product streams them.

Several rows (a batch, a prompt) go to XLA's matrix kernels (YNNPACK on a CPU), as do other
backends. With bfloat16 weights the activations go in as two bfloat16 parts, hi + lo (16 bits
of mantissa), so the weights are rounded and each is still read once; an [out, in] matrix
streams faster as the product's left operand than as its right one. Int8 weights
(`quantized`: a scale per output, each row of [out, in] rounded to 255 levels) go to XLA's
int8 kernel: the activations as two int8 parts of one scale a row (x ≈ a·(x1 + x2/254), 15
bits of the row's largest value), the products summed exactly in int32. Float16 weights are
widened back to float32 once, their values still float16's: two float16 parts would overflow
past 65504. The output layer tied to the token table reads it as it is, [out, in] = [V, D].

One row of float32 activations on a CPU (batch 1, the common case) goes to `_widened_row`:
the row times the transposed weight, widened to float32 inside the product. XLA's CPU backend
compiles that into one loop over the weight's rows, split over the cores, that widens each
element as it reads it: bfloat16 and int8 weights are read once in their own bytes, the sums
float32's. The row is first rounded to the very parts a matrix kernel takes (`_one_row`), so a
row's numbers are its own, alone or in any batch: int8's one scale a row, set by its largest
value, would otherwise round a batch's rows and leave a lone row exact, and an outlier feature
(a value 10^4 times the rest) then wrote other text in a batch than alone.

The twins hold the layer's matrix transposed (and its bias): `generate.Decoder` makes them
once. They compute no gradient: decoding only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import functional as F
from attention_jax.layers import Dense, TokenEmbed
from attention_jax.speed.backend import backend_of
from attention_jax.swap import twins


@jax.jit
def quantized(matrix) -> tuple[jax.Array, jax.Array]:
    """[out, in] -> (int8 levels [out, in], float32 scale [out]): each row over its largest
    magnitude."""
    scale = jnp.max(jnp.abs(matrix), axis=1) / 127
    scale = jnp.where(scale > 0, scale, 1.0)
    return jnp.round(matrix / scale[:, None]).astype(jnp.int8), scale.astype(jnp.float32)


def _streamed(weight, parts, accumulate):
    """weight [out, in] · each of `parts` [..., in] -> [len(parts), ..., out], summed in
    `accumulate`: the weight as the product's left operand, which XLA's CPU kernels stream faster
    than as the right one. A barrier keeps the result's transpose apart, else XLA folds it back
    into the product, swapping them."""
    rows = jnp.stack(parts).reshape(-1, parts[0].shape[-1])
    y = jax.lax.dot_general(weight, rows, (((1,), (1,)), ((), ())),
                            preferred_element_type=accumulate)
    return jax.lax.optimization_barrier(y).T.reshape(len(parts), *parts[0].shape[:-1], -1)


def _int8_parts(x):
    """x [..., in] as a·(x1 + x2/254): one scale `a` a row (its largest magnitude over 127), x1
    its int8 levels, x2 the remainder's (|r| <= 1/2) on 254ths. A row's own: no other row moves
    them."""
    a = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127
    a = jnp.where(a > 0, a, 1.0)
    x1 = jnp.round(x / a)
    return a, x1, jnp.round((x / a - x1) * 254)


def _bfloat16_parts(x):
    """x as hi + lo, two bfloat16 parts: 16 bits of each value's mantissa."""
    hi = x.astype(jnp.bfloat16)
    return hi, (x - hi.astype(x.dtype)).astype(jnp.bfloat16)


def _int8_product(x, weight, scale):
    """x [..., in] · (weight·scale)ᵀ: x as two int8 parts of one scale a row, summed in int32."""
    a, x1, x2 = _int8_parts(x)
    y = _streamed(weight, [x1.astype(jnp.int8), x2.astype(jnp.int8)], jnp.int32).astype(jnp.float32)
    return (a * (y[0] + y[1] / 254) * scale).astype(x.dtype)


def _one_row(x, weight, scale):
    """One row by `_widened_row`, its activations rounded to the very parts the matrix kernels take
    for each row of a batch (int8's two of one scale, bfloat16's hi + lo): a row decodes alike
    alone and in any batch, the two differing by float32's rounding of the sums alone."""
    if weight.dtype == jnp.int8:
        a, x1, x2 = _int8_parts(x)
        return a * _widened_row(x1 + x2 / 254, weight, None) * scale
    if weight.dtype == jnp.bfloat16:
        hi, lo = _bfloat16_parts(x)
        return _widened_row(hi.astype(x.dtype) + lo.astype(x.dtype), weight, scale)
    return _widened_row(x, weight, scale)


def _widened_row(x, weight, scale):
    """One row x [..., in] (float32, one row in all) · weightᵀ, the weight widened to float32 inside
    the product, then times `scale` (int8). Two fences keep XLA's loop a plain stream of the weight:
    the row is gathered, else the ops that made it are fused into the loop and redone for every
    row of the weight; the result passes a reduce_precision that changes no float32, else a bias
    added to it pulls the product into a kernel that copies the weight transposed first."""
    row = x.reshape(-1).at[jnp.arange(x.size)].get(mode="promise_in_bounds",
                                                   indices_are_sorted=True, unique_indices=True)
    y = jax.lax.reduce_precision(row @ weight.astype(jnp.float32).T, exponent_bits=8,
                                 mantissa_bits=23)
    return (y if scale is None else y * scale).reshape(*x.shape[:-1], -1)


def product(x, weight, scale=None, *, backend=None) -> jax.Array:
    """x [..., in] · weightᵀ ([out, in]; int8 levels times `scale` [out]) -> [..., out], summed in
    float32 (x's dtype out), by the form that streams fastest on `backend` (`speed.backend_of`;
    None: the default devices)."""
    if x.size == x.shape[-1] and x.dtype == jnp.float32 and backend_of(backend).cpu:
        with jax.named_scope("cpu_only"):     # the cross-lowering tests look for it in cuda/tpu
            return _one_row(x, weight, scale)
    if weight.dtype == jnp.int8:
        return _int8_product(x.astype(jnp.float32), weight, scale).astype(x.dtype)
    contract = (((x.ndim - 1,), (1,)), ((), ()))
    if x.dtype in (jnp.bfloat16, jnp.float16):   # a low-precision stream: its dtype, float32 sums
        return jax.lax.dot_general(x, weight.astype(x.dtype), contract,
                                   preferred_element_type=jnp.float32).astype(x.dtype)
    if weight.dtype != jnp.bfloat16:
        if x.size == x.shape[-1]:
            return jax.lax.dot_general(x, weight.astype(x.dtype), contract)
        return _streamed(weight.astype(x.dtype), [x], x.dtype)[0]
    y = _streamed(weight, list(_bfloat16_parts(x)), jnp.float32)
    return (y[0] + y[1]).astype(x.dtype)


def _held(matrix):
    """A matrix as `product` reads it: float16 widened to float32 (its values float16's still)."""
    return matrix.astype(jnp.float32) if matrix.dtype == jnp.float16 else matrix


class DecodingDense(nnx.Module):
    """A `Dense` as decoding reads it: its kernel transposed to [out, in], in its stored dtype (or
    int8 levels and a scale per output)."""

    def __init__(self, layer: Dense, *, int8: bool = False, backend=None):
        weight = _held(layer.kernel[...].T)
        self.weight, self.scale = (nnx.Param(a) for a in quantized(weight)) if int8 else \
            (nnx.Param(weight), None)
        self.bias, self.dtype, self.backend = layer.bias, layer.dtype, backend_of(backend)

    def __call__(self, x):
        x = F.floating(x if self.dtype is None else x.astype(self.dtype))
        scale = None if self.scale is None else self.scale[...]
        y = product(x, self.weight[...], scale, backend=self.backend)
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


class DecodingEmbed(TokenEmbed):
    """The token table, the tied output layer reading it by `product` (int8: each row's levels and
    scale)."""

    def __init__(self, table: TokenEmbed, *, int8: bool = False, backend=None):
        for name, value in vars(table).items():
            if not name.startswith("_"):    # the parameter and Embed's settings; nnx keeps its own
                setattr(self, name, value)
        matrix = _held(table.embedding[...])
        self.embedding, self.scale = (nnx.Param(a) for a in quantized(matrix)) if int8 else \
            (nnx.Param(matrix), None)
        self.backend = backend_of(backend)

    def __call__(self, tokens):
        if self.scale is None:
            return super().__call__(tokens)
        rows = jnp.take(self.embedding[...], tokens, axis=0).astype(jnp.float32)
        return rows * self.scale[...][tokens][..., None]

    def attend(self, x):
        scale = None if self.scale is None else self.scale[...]
        return product(x, self.embedding[...], scale, backend=self.backend)


def _dense(layer: Dense, path: str, *, int8: bool, backend, **_):
    # A dense layer that rounds its own operands (`Speed(matmul_dtype=...)`) keeps its product.
    if getattr(layer, "matmul_dtype", None) is not None:
        return None
    return DecodingDense(layer, int8=int8, backend=backend)


def _embed(table: TokenEmbed, path: str, *, tied: bool, int8: bool, backend):
    tied_table = tied and path == "token_embed"
    return DecodingEmbed(table, int8=int8, backend=backend) if tied_table else None


# Which twin replaces which part (`attention_jax.swap.twins`): every dense layer, as built or
# swapped, and the token table when the output layer reads it.
TWINS = {Dense: _dense, TokenEmbed: _embed, DecodingEmbed: None}


def parts(model, *, int8: bool = False, backend=None) -> dict:
    """path -> twin (`TWINS`) for decoding `model`; `int8`: its matrices as int8 levels; `backend`:
    the devices the decoding program is built for (`speed.backend_of`)."""
    return twins(model, TWINS, tied=getattr(model, "lm_head", 0) is None, int8=int8,
                 backend=backend_of(backend))
