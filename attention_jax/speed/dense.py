"""The dense layer with a hand-written backward: the training step's hottest spot on a CPU.

The same numbers as x·W (+ b) left to autodiff (`functional.dense`, what the model as built
computes), up to the order of float32 sums (tests compare them), from cheaper operations.
Left to autodiff, the weight gradient xᵀ·dy makes XLA copy the *larger* operand transposed
first (the output layer's logit gradient) and run a slower kernel. Here dx = dy·Wᵀ reads W
transposed in place, and dW keeps the smaller operand on the transposed side (an
optimization barrier stops XLA from folding the transpose back). In bfloat16/float16 every
product accumulates in float32 and is rounded once. With `operands=bfloat16` and float32 x,
only the products' inputs are rounded: the result, the gradients and everything around the
layer stay float32 (a CPU's bfloat16 units multiply, its vector units do the rest at full
rate). Like every `jax.custom_vjp` it supports reverse mode and vmap, not forward mode (jvp,
jacfwd): one more reason it is a swap (`speed.fast`), not the model.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from attention_jax.speed.backend import backend_of


def _dot(a, b):
    """a·b over a's last axis; a bfloat16/float16 product accumulates and returns float32, as GPUs
    and TPUs do (on a CPU, also the only way to XLA's bfloat16 kernel: AMX, AVX512-BF16)."""
    if not _low_precision(a.dtype):
        return jnp.dot(a, b)
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _low_precision(dtype) -> bool:
    """bfloat16 and float16: the dtypes whose products accumulate in float32 (float64
    stays itself)."""
    return dtype in (jnp.bfloat16, jnp.float16)


def _matmul(x, kernel, bias, operands):
    y = _dot(x.astype(operands or x.dtype), kernel.astype(operands or kernel.dtype))
    y = y if bias is None else y + bias
    return y.astype(x.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _dense(x, kernel, bias, operands, cpu):
    return _matmul(x, kernel, bias, operands)


def _forward(x, kernel, bias, operands, cpu):
    # x is kept as the product read it (bfloat16: half float32's memory); dy has x's own dtype.
    return _matmul(x, kernel, bias, operands), (x.astype(operands or x.dtype), kernel, bias)


def _backward(operands, cpu, saved, dy):
    x, kernel, bias = saved                  # x as the product read it, the kernel as given
    x_dtype, kernel_dtype = dy.dtype, kernel.dtype
    k, g = kernel.astype(operands or kernel.dtype), dy.astype(x.dtype)    # the products' inputs
    if _low_precision(x.dtype) and cpu:
        with jax.named_scope("cpu_only"):    # the cross-lowering tests look for this name
                                             # in cuda/tpu programs
            dx, d_kernel = _low_precision_cpu_grads(x, k, g)
    else:
        dx, d_kernel = _grads(x.reshape(-1, x.shape[-1]), k, g.reshape(-1, g.shape[-1]))
        dx = dx.reshape(x.shape)
    d_bias = None if bias is None else \
        jnp.sum(dy.reshape(-1, dy.shape[-1]), axis=0,
                dtype=jnp.float32).astype(bias.dtype)   # dy unrounded
    return dx.astype(x_dtype), d_kernel.astype(kernel_dtype), d_bias


def _grads(x2, kernel, dy):
    """dx and dW over [N, features] arrays, each transposed operand read in place."""
    dx = _dot(dy, kernel.T)
    n_in, n_out = kernel.shape
    if n_in <= n_out:
        return dx, _dot(x2.T, dy)                                            # [in, N]·[N, out]
    return dx, jax.lax.optimization_barrier(_dot(dy.T, x2)).T                # ([out, N]·[N, in])ᵀ


def _copied_transpose(a):
    """aᵀ copied in memory: through a 1-D array, which has one layout only, so XLA cannot fold
    the transpose back into the dot that reads it."""
    return jax.lax.optimization_barrier(a.T.reshape(-1)).reshape(a.shape[::-1])


def _low_precision_cpu_grads(x, kernel, dy):
    """dx and dW with every transposed operand copied first (XLA's low-precision CPU kernel reads a
    transposed operand slowly). dW contracts every leading axis of x and dy rather than one
    flattened token axis, so a batch axis a mesh shards stays its own (flattened, it would be
    gathered from every device first)."""
    dx = _dot(dy, _copied_transpose(kernel))
    if x.ndim == 2:   # one leading axis: nothing to keep apart
        return dx, _dot(_copied_transpose(x), dy)
    lead = tuple(range(x.ndim - 1))
    return dx, jax.lax.dot_general(x, dy, ((lead, lead), ((), ())),
                                   preferred_element_type=jnp.float32)


_dense.defvjp(_forward, _backward)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None, *, operands=None,
          backend=None) -> jax.Array:
    """x·W (+ b) over the last axis of `x`: [..., in] · [in, out] -> [..., out], in x's dtype.

    operands: a dtype (bfloat16) both inputs are rounded to for the product alone, which
    accumulates in float32; None: the product in x's and W's own dtypes. `backend`: the devices the
    program is built for (`speed.backend_of`; None: the default ones), which decide how the
    low-precision gradient reads its transposed operands."""
    operands = None if operands is None else jnp.dtype(operands)
    cpu = backend_of(backend).cpu
    if x.ndim == 1:
        return _dense(x[None], kernel, bias, operands, cpu)[0]
    return _dense(x, kernel, bias, operands, cpu)
