"""The dense layer with a hand-written backward: the training step's hottest spot on a CPU.

Same numbers as x·W (+ b) left to autodiff (up to the order of float32 sums; tests compare
them), cheaper operations. Measured on the ladder's one-block model, batch 64 × 128, on a
2-core CPU (`python -m experiments.throughput`, same-run medians): 209 -> 149 ms a step.
This module imports nothing from the package, so the functional core can build on it.

`dense`: x·W (+ b) with a hand-written backward. Every projection is a dense layer over
B·T tokens (8192 at that size), and their matmuls (forward, dx, dW) are most of a step.
Left to autodiff, the weight gradient `xᵀ·dy` contracts the token axis of two
[tokens, features] arrays, and XLA copies the *larger* one transposed first (the 33 MB
logit gradient, for the output layer) and runs a slower kernel. Here:
* dx = dy·Wᵀ reads W transposed, which the fast (YNNPACK) kernel takes as it is;
* dW keeps the smaller operand on the transposed side: xᵀ·dy when x is the narrower,
  else (dyᵀ·x)ᵀ, the small [out, in] result transposed afterwards. The optimization
  barrier stops XLA from folding that transpose back into the dot, which would put the
  wide operand on the transposed side again (that dW ran ~2x slower).
* in bfloat16/float16 every product accumulates in float32 and is rounded once, and on a
  CPU the backward copies its transposed operands first (`_low_precision_cpu_grads`).
Like every `jax.custom_vjp`, it supports reverse mode (grad, vjp, jacrev, any order) and
vmap, not forward mode (jvp, jacfwd).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _dot(a, b):
    """a·b over a's last axis; a low-precision product (bfloat16, float16) accumulates and
    returns float32, as GPUs and TPUs do. On a CPU that is also the only way to XLA's
    bfloat16 kernel (AMX, AVX512-BF16): with a bfloat16 result XLA multiplies in float32 and
    rounds. The throughput benchmark's bfloat16 peak, measured through `dense`, was 4.5x its
    float32 one on a CPU with AMX (README, "bfloat16 on a CPU with matrix units")."""
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
    """dx and dW with every transposed operand copied first: XLA's low-precision CPU kernel
    reads a transposed operand slowly (the output layer's dx, both devices: 22.7 -> 6.2 ms a
    step, `python -m experiments.throughput.profile --attention reference --dtype bfloat16`).
    dW contracts every leading axis of x and dy ([B, T] for a model) rather than one
    flattened token axis: XLA then copies x transposed itself, and the batch axis a mesh
    shards stays an axis of its own (flattened, it would be gathered from every device first)."""
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
