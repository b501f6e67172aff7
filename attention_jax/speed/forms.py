"""Faster forms of attention's softmax(q·kᵀ/√d + bias)·v: the same numbers to float rounding.

Every form has one signature, takes q, k, v [..., H, T, D] and returns the heads' outputs:

    form(q, k, v, *, bias=None, causal=True, scale=True, dropout=None) -> [..., H, T, D]

    reference      the functional core as written (what the model as built computes)
    causal_halves  the same without the all-masked quarter of the scores (fastest on a CPU)
    chunked        keys and queries in chunks with an online softmax: O(T) memory, no T×T matrix
    fused          jax.nn.dot_product_attention: cuDNN's flash kernel on an NVIDIA GPU of
                   capability 8.0 or more in half precision (not a T4), XLA's fused elsewhere

They agree to float rounding (tests compare forward and gradients). `choose` says which form
"auto" is on a backend, `kernel_choice` which kernel `fused` runs there and why.
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from attention_jax import functional as F
from attention_jax.errors import ConfigError
from attention_jax.speed.backend import backend_of
from attention_jax.speed.chunked import memory_efficient_attention


def reference(q, k, v, *, bias=None, causal: bool = True, scale: bool = True, dropout=None):
    """`F.attention` under the causal mask (or none), dropout on the weights."""
    w = F.attention_weights(q, k, mask=F.causal_mask(q.shape[-2]) if causal else None, bias=bias,
                            scale=scale)
    return F.mix(w if dropout is None else dropout(w), v)


def causal_halves(q, k, v, *, bias=None, causal: bool = True, scale: bool = True, dropout=None,
                  return_weights: bool = False):
    """`reference` scored in two halves: under the causal mask the first half of the queries never
    sees the second half of the keys, so that quarter of the T×T scores (weights exactly 0) is
    never computed. Self-attention only (as many keys as queries). `return_weights`: (out,
    [..., T, T] weights before dropout) with the skipped quarter filled with zeros."""
    q, k, v = F.floating(q), F.floating(k), F.floating(v)
    T = q.shape[-2]
    if k.shape[-2] != T or v.shape[-2] != T:
        raise ValueError(f"causal_halves is self-attention over one window: {T} queries need {T} "
                         f"keys and values, got {k.shape[-2]} and {v.shape[-2]}; use "
                         "F.attention(q, k, v, mask=...) otherwise")
    if not causal:       # no mask, no quarter to skip
        out = reference(q, k, v, bias=bias, causal=False, scale=scale, dropout=dropout)
        return (out, F.attention_weights(q, k, bias=bias, scale=scale)) if return_weights else out
    mask, h = F.causal_mask(T), T // 2
    halves = [(slice(0, h), slice(0, h)), (slice(h, T), slice(0, T))] if h else [(slice(0, T),) * 2]
    weights, outs = [], []
    for rows, cols in halves:
        w = F.attention_weights(q[..., rows, :], k[..., cols, :], mask=mask[rows, cols],
                                bias=None if bias is None else bias[..., rows, cols], scale=scale)
        weights.append(w)
        outs.append(F.mix(w if dropout is None else dropout(w), v[..., cols, :]))
    out = jnp.concatenate(outs, axis=-2)
    if not return_weights:
        return out
    pad = lambda w: jnp.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, T - w.shape[-1])])
    return out, jnp.concatenate([pad(w) for w in weights], axis=-2)


def chunked(q, k, v, *, bias=None, causal: bool = True, scale: bool = True, dropout=None,
            chunk: int = 512):
    """`memory_efficient_attention` in chunks of `chunk` keys and queries. It adds no bias (no
    ALiBi) and has no dropout on weights it never holds."""
    if bias is not None or dropout is not None:
        raise ValueError("chunked attention takes no bias and no dropout; "
                         "use reference or causal_halves")
    return memory_efficient_attention(q, k, v, causal=causal, chunk_size=chunk, scale=scale)


CUDNN_HEAD_DIMS = "a multiple of 8 up to 128"


def kernel_choice(dtype, head_dim: int, backend=None) -> tuple[str, str | None]:
    """The kernel `fused` asks `jax.nn.dot_product_attention` for on `backend` ("cudnn" or "xla"),
    and on a CUDA GPU why it is not cuDNN (None otherwise).

    cuDNN's flash attention exists for float16/bfloat16 on an NVIDIA GPU of compute capability
    >= 8.0 with a head dimension that is a multiple of 8 up to 128; anything else (CPU, TPU, AMD,
    float32, a T4) gets XLA's. JAX's own `implementation=None` means XLA's on every backend,
    hence the choice here.
    """
    b = backend_of(backend)
    if b.platform != "cuda":
        return "xla", None
    name = jnp.dtype(dtype).name
    if name not in ("float16", "bfloat16"):
        return "xla", ("cuDNN's flash attention takes bfloat16/float16; "
                       f"this model computes in {name}")
    if head_dim % 8 or head_dim > 128:
        return "xla", ("cuDNN's flash attention needs a head dimension that is "
                       f"{CUDNN_HEAD_DIMS}; this one is {head_dim}")
    if b.capability is not None and b.capability < 8.0:
        return "xla", ("cuDNN's flash attention needs compute capability 8.0; "
                       f"this GPU has {b.capability:g}")
    return "cudnn", None


def fused_kernel(dtype, head_dim: int, backend=None) -> str:
    """`kernel_choice`'s kernel alone: "cudnn" or "xla"."""
    return kernel_choice(dtype, head_dim, backend)[0]


@functools.lru_cache(maxsize=256)
def cudnn_refusal(dtype: str, heads: int, T: int, head_dim: int, bias: bool,
                  causal: bool = True) -> str | None:
    """Why cuDNN refuses a training call of this shape (its forward and its gradient), or None:
    JAX's own checks, made as it traces, asked once here so that a run can say so
    before it starts."""
    shape = jax.ShapeDtypeStruct((1, T, heads, head_dim), jnp.dtype(dtype))
    b = jax.ShapeDtypeStruct((1, heads, T, T), jnp.dtype(dtype)) if bias else None

    def loss(q, k, v, b):
        out = jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=causal,
                                           implementation="cudnn")
        return out.astype(jnp.float32).sum()
    try:
        jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), shape, shape, shape, b)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return f"{type(e).__name__}: {' '.join(str(e).split())}"
    return None


def fused(q, k, v, *, bias=None, causal: bool = True, scale: bool = True, dropout=None,
          implementation=None, backend=None):
    """`jax.nn.dot_product_attention` on our layout ([..., H, T, D]; [T, D] is one head).

    `implementation=None`: `fused_kernel` chooses for `backend` (None: this process's default
    devices; a program built for others passes theirs, as `speed.fast` does), a bias over an odd
    number of positions goes to XLA (cuDNN's gradient refuses it only later), and a call cuDNN
    refuses while JAX traces it is computed by XLA's kernel with a warning (`cudnn_refusal` asks
    before a run). "cudnn" or "xla" asks for that kernel alone.
    """
    if dropout is not None:
        raise ValueError("fused attention has no dropout on its weights; "
                         "use reference or causal_halves")
    if implementation not in (None, "cudnn", "xla"):
        raise ConfigError(f"implementation={implementation!r}; choose None (chosen here), "
                          "'cudnn' or 'xla'")
    q, k, v = F.floating(q), F.floating(k), F.floating(v)
    one_head = q.ndim == 2
    if one_head:
        q, k, v = q[None], k[None], v[None]
    common = jnp.result_type(q, k, v)            # the fused kernel wants one dtype for all three
    T, S = q.shape[-2], k.shape[-2]
    b = backend_of(backend)
    kernel = implementation or fused_kernel(common, q.shape[-1], b)
    if implementation is None and bias is not None and (T % 2 or S % 2):
        kernel = "xla"
    # XLA's CPU backend has no float16 product with a float32 result, which JAX's attention asks for
    compute = jnp.float32 if kernel == "xla" and common == jnp.float16 and b.cpu else common
    q, k, v = q.astype(compute), k.astype(compute), v.astype(compute)
    lead = q.shape[:-3]
    to_bthd = lambda x: jnp.swapaxes(x.reshape((-1,) + x.shape[-3:]), -3, -2)   # [B, T, H, D]
    b = None if bias is None else jnp.broadcast_to(bias, (q.shape[-3], T, S))[None].astype(compute)

    def attend(kernel):
        return jax.nn.dot_product_attention(to_bthd(q), to_bthd(k), to_bthd(v), bias=b,
                                            scale=None if scale else 1.0, is_causal=causal,
                                            implementation=kernel)

    try:
        out = attend(kernel)
    except (RuntimeError, NotImplementedError, ValueError) as e:   # JAX's own checks,
                                                                   # made as it traces
        if implementation is not None or kernel == "xla":
            raise
        out = attend("xla")     # a call XLA's kernel refuses too was wrong to begin with:
                                # its error, no warning
        warnings.warn(f"cuDNN's attention kernel refused this call ({type(e).__name__}: {e}); "
                      "XLA's computes it instead", RuntimeWarning, stacklevel=2)
    out = jnp.swapaxes(out, -3, -2).reshape(
        lead + out.shape[-3:-1][::-1] + out.shape[-1:]).astype(common)
    return out[0] if one_head else out


FORMS = {"reference": reference, "causal_halves": causal_halves, "chunked": chunked, "fused": fused}


def choose(form: str, *, dropout: float = 0.0, backend=None) -> str:
    """The form that computes `form` on `backend` (`speed.backend`; None: the default devices):
    itself, or for "auto" causal_halves on a CPU and fused on a GPU/TPU (with dropout, a form that
    holds the weights)."""
    if form != "auto":
        return form
    return "fused" if not backend_of(backend).cpu and dropout == 0 else "causal_halves"
