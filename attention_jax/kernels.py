"""The dense layer with a hand-written backward: the training step's hottest spot on a CPU.

The same numbers as x·W (+ b) left to autodiff, up to the order of float32 sums (tests
compare them), from cheaper operations. Left to autodiff, the weight gradient xᵀ·dy makes
XLA copy the *larger* operand transposed first (the output layer's logit gradient) and run a
slower kernel. Here dx = dy·Wᵀ reads W transposed in place, and dW keeps the smaller operand
on the transposed side (an optimization barrier stops XLA from folding the transpose back).
In bfloat16/float16 every product accumulates in float32 and is rounded once. Like every
`jax.custom_vjp` it supports reverse mode and vmap, not forward mode (jvp, jacfwd).
docs/performance.md has what it saves, measured by `python -m experiments.throughput`.
This module imports nothing from the package, so the functional core can build on it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _dot(a, b):
    """a·b over a's last axis; a bfloat16/float16 product accumulates and returns float32, as GPUs
    and TPUs do (on a CPU, also the only way to XLA's bfloat16 kernel: AMX, AVX512-BF16)."""
    if not _low_precision(a.dtype):
        return jnp.dot(a, b)
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _low_precision(dtype) -> bool:
    """bfloat16 and float16: the dtypes whose products accumulate in float32 (float64 stays itself)."""
    return dtype in (jnp.bfloat16, jnp.float16)


def _matmul(x, kernel, bias):
    y = _dot(x, kernel)
    y = y if bias is None else y + bias
    return y.astype(x.dtype)


@jax.custom_vjp
def _dense(x, kernel, bias):
    return _matmul(x, kernel, bias)


def _forward(x, kernel, bias):
    return _matmul(x, kernel, bias), (x, kernel, bias)


def _backward(saved, dy):
    x, kernel, bias = saved
    if _low_precision(x.dtype) and jax.default_backend() == "cpu":
        dx, d_kernel = _low_precision_cpu_grads(x, kernel, dy)
    else:
        dx, d_kernel = _grads(x.reshape(-1, x.shape[-1]), kernel, dy.reshape(-1, dy.shape[-1]))
        dx = dx.reshape(x.shape)
    d_bias = None if bias is None else \
        jnp.sum(dy.reshape(-1, dy.shape[-1]), axis=0, dtype=jnp.float32).astype(bias.dtype)
    return dx.astype(x.dtype), d_kernel.astype(kernel.dtype), d_bias


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
    return dx, jax.lax.dot_general(x, dy, ((lead, lead), ((), ())), preferred_element_type=jnp.float32)


_dense.defvjp(_forward, _backward)


def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x·W (+ b) over the last axis of `x`: [..., in] · [in, out] -> [..., out]."""
    if x.ndim == 1:
        return _dense(x[None], kernel, bias)[0]
    return _dense(x, kernel, bias)
