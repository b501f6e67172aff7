"""The functional core: attention and its parts as pure `jax.numpy` functions.

Everything here takes arrays and returns arrays, works on any leading batch/head
dimensions, and composes with `jit`, `vmap` and `grad`. The Flax modules in
`attention_jax.model` are thin wrappers around these functions.

Axis names used in einsum strings: T = query position, S = key position, D = feature.

Integer and bool inputs are promoted to float32, never truncated: weights in [0, 1] cast
back to an integer type would be all zeros (or a one), a silently wrong answer. Float
inputs keep their dtype; half precision is computed in float32 inside where it matters
(the softmax, LayerNorm's statistics) and returned in half precision.
"""
from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp

from attention_jax.kernels import dense as _fast_dense
from attention_jax.memory_efficient import memory_efficient_attention  # noqa: F401  (part of the API)


def _floating(x) -> jax.Array:
    """`x` as a float array: float dtypes untouched (no op at all), integer/bool -> float32.

    Only non-float inputs are cast, so a float32 computation traces to exactly the
    operations it did before this guard existed.
    """
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)


# --- masks and scores ------------------------------------------------------------------

def causal_mask(n: int) -> jax.Array:
    """bool[n, n], True where position t may attend to position i (i <= t)."""
    return jnp.tril(jnp.ones((n, n), dtype=bool))


def attention_scores(q: jax.Array, k: jax.Array, *, scale: bool = True) -> jax.Array:
    """q·kᵀ, divided by √d_k when `scale` (the variance argument: Var(q·k) = d_k).

    Integer/bool q and k are promoted to float32 first, so the scores are float32 whether
    or not they are scaled (and an integer product cannot overflow).
    """
    q, k = _floating(q), _floating(k)
    if jnp.result_type(q, k) == jnp.float16:
        # float16 tops out at 65,504: q·k can pass it where q·k/√d fits, so the product is
        # taken and scaled in float32 and only the score comes back in float16.
        scores = jnp.einsum("...TD,...SD->...TS", q, k, preferred_element_type=jnp.float32)
        return (scores / math.sqrt(q.shape[-1]) if scale else scores).astype(jnp.float16)
    scores = jnp.einsum("...TD,...SD->...TS", q, k)
    if scale:
        scores = scores / jnp.sqrt(jnp.asarray(q.shape[-1], scores.dtype))
    return scores


def masked_softmax(scores: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Softmax over the last axis with forbidden entries set to -inf (never a constant).

    -inf is what masking means: exp(-inf) is exactly 0, it survives a cast to float16,
    and no constant has to be "large enough" for the scores at hand. A fully masked row
    returns zeros, not NaN. Half-precision inputs are normalised in float32 and returned
    in their dtype; integer/bool scores are promoted to float32 (weights in [0, 1] cast
    back to an integer would be truncated to 0). `mask` is a mask, whatever its dtype:
    nonzero/True means "may attend".
    """
    scores = _floating(scores)
    dtype = scores.dtype
    s = scores.astype(jnp.promote_types(dtype, jnp.float32))
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    # A row with every entry masked has max -inf; shifting by 0 keeps exp(-inf) = 0.
    row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    e = jnp.exp(s - row_max)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return (e / jnp.where(total == 0, 1.0, total)).astype(dtype)


def attention_weights(q, k, *, mask=None, bias=None, scale: bool = True) -> jax.Array:
    """Softmax(q·kᵀ/√d + bias) with `mask` applied after the bias (ALiBi adds a bias).

    Float weights always: integer/bool q and k are promoted to float32 (`attention_scores`).
    The weights keep the scores' dtype: a float32 bias (ALiBi's) is added in float32, and
    half-precision scores are normalised in float32 anyway (`masked_softmax`).
    """
    scores = attention_scores(q, k, scale=scale)
    dtype = scores.dtype
    if bias is not None:
        scores = scores + bias
    return masked_softmax(scores, mask).astype(dtype)


def attention(q, k, v, *, mask=None, bias=None, scale: bool = True, return_weights: bool = False):
    """Score, mask, normalise, mix: the weighted average of the values.

    Integer/bool q, k, v are promoted to float32 (a weighted average of integers is not
    an integer); float inputs keep their dtype.
    """
    w = attention_weights(q, k, mask=mask, bias=bias, scale=scale)
    out = jnp.einsum("...TS,...SD->...TD", w, _floating(v))
    return (out, w) if return_weights else out


def causal_attention(q, k, v, *, bias=None, scale: bool = True, dropout=None, return_weights: bool = False):
    """Causal softmax(q·kᵀ/√d + bias)·v over [..., T, D], `attention_weights` semantics, in halves.

    Under the causal mask the first half of the queries never sees the second half of the
    keys, so the two query halves are scored apart and the all-masked quarter of the T×T
    scores (weights exactly exp(-inf) = 0) is never computed: the same numbers as one masked
    softmax up to float32 rounding (tests compare them), ~8% off a CPU training step.

    Returns (out, weights): weights [..., T, T] before dropout when `return_weights`, else
    None. `dropout` (a callable, e.g. nnx.Dropout) is applied to each half's weights.
    Integer/bool q, k, v are promoted to float32, as in `attention`.
    """
    q, k, v = _floating(q), _floating(k), _floating(v)
    T = q.shape[-2]
    if k.shape[-2] != T or v.shape[-2] != T:
        raise ValueError(f"causal_attention is self-attention over one window: {T} queries need {T} keys and "
                         f"values, got {k.shape[-2]} and {v.shape[-2]}; use attention(q, k, v, mask=...) otherwise")
    mask, h = causal_mask(T), T // 2
    halves = [(slice(0, h), slice(0, h)), (slice(h, T), slice(0, T))] if h else [(slice(0, T),) * 2]
    weights, outs = [], []
    for rows, cols in halves:
        w = attention_weights(q[..., rows, :], k[..., cols, :], mask=mask[rows, cols],
                                bias=None if bias is None else bias[..., rows, cols], scale=scale)
        weights.append(w)
        outs.append(jnp.einsum("...TS,...SD->...TD", w if dropout is None else dropout(w), v[..., cols, :]))
    full = None
    if return_weights:   # the skipped quarter is exactly zero
        full = jnp.concatenate([jnp.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, T - w.shape[-1])]) for w in weights],
                               axis=-2)
    return jnp.concatenate(outs, axis=-2), full


def fused_kernel(dtype, head_dim: int, backend: str | None = None, capability: float | None = None) -> str:
    """The kernel `fused_attention` asks `jax.nn.dot_product_attention` for: "cudnn" or "xla".

    cuDNN's flash attention where it exists: an NVIDIA GPU of compute capability 8.0 or later
    (Ampere, Hopper, ...; a T4's 7.5 has none: cuDNN finds no engine when XLA compiles, too
    late to fall back), float16/bfloat16 operands, a head dimension that is a multiple of 8
    up to 128. Anywhere else (a CPU, a TPU, an AMD GPU, float32) XLA's own attention, which
    XLA fuses as it compiles. Chosen here because JAX does not: `implementation=None` means
    XLA's on every backend (jax 0.10: "defaults to XLA for now"). `capability`: the GPU's,
    read from this process's first device when not given (an AMD GPU's, e.g. "gfx90a", is no
    number: no cuDNN there).
    """
    backend = backend or jax.default_backend()
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
    if backend not in ("gpu", "cuda") or not half or head_dim % 8 or head_dim > 128:
        return "xla"
    if capability is None and jax.default_backend() == "gpu":
        try:
            capability = float(getattr(jax.local_devices()[0], "compute_capability", ""))
        except ValueError:
            return "xla"
    return "xla" if capability is not None and capability < 8.0 else "cudnn"


def fused_attention(q, k, v, *, bias=None, causal: bool = True, scale: bool = True, implementation=None):
    """`attention` by `jax.nn.dot_product_attention`: cuDNN's flash kernel on a GPU, else XLA's.

    Takes our layout [..., H, T, D] (heads before positions; [T, D] is one head) and returns
    it; the fused function wants [B, T, H, D]. `bias` [H or 1, T, S] is added before the
    causal mask, as in `attention_weights`. Integer inputs are promoted to float32.
    `implementation=None`: `fused_kernel` chooses (and XLA's takes a bias over an odd number
    of positions, whose gradient cuDNN refuses only later, as JAX differentiates); should
    cuDNN refuse the call as JAX traces it (no cuDNN found, a shape it does not take), XLA's
    kernel computes it instead, with a warning naming the reason. "cudnn" or "xla" asks for
    that kernel alone.
    """
    q, k, v = _floating(q), _floating(k), _floating(v)
    one_head = q.ndim == 2
    if one_head:
        q, k, v = q[None], k[None], v[None]
    common = jnp.result_type(q, k, v)            # the fused kernel wants one dtype for all three
    T, S = q.shape[-2], k.shape[-2]
    kernel = implementation or fused_kernel(common, q.shape[-1])
    if implementation is None and bias is not None and (T % 2 or S % 2):
        kernel = "xla"
    # XLA's CPU backend has no float16 product with a float32 result, which JAX's attention asks for
    compute = jnp.float32 if kernel == "xla" and common == jnp.float16 and jax.default_backend() == "cpu" else common
    q, k, v = q.astype(compute), k.astype(compute), v.astype(compute)
    lead = q.shape[:-3]
    to_bthd = lambda x: jnp.swapaxes(x.reshape((-1,) + x.shape[-3:]), -3, -2)   # [B, T, H, D]
    b = None if bias is None else jnp.broadcast_to(bias, (q.shape[-3], T, S))[None].astype(compute)

    def attend(kernel):
        return jax.nn.dot_product_attention(to_bthd(q), to_bthd(k), to_bthd(v), bias=b, scale=None if scale else 1.0,
                                            is_causal=causal, implementation=kernel)

    try:
        out = attend(kernel)
    except (RuntimeError, NotImplementedError, ValueError) as e:   # JAX's own checks, made as it traces
        if implementation is not None or kernel == "xla":
            raise
        out = attend("xla")     # a call XLA's kernel refuses too was wrong to begin with: its error, no warning
        warnings.warn(f"cuDNN's attention kernel refused this call ({type(e).__name__}: {e}); "
                      "XLA's computes it instead", RuntimeWarning, stacklevel=2)
    out = jnp.swapaxes(out, -3, -2).reshape(lead + out.shape[-3:-1][::-1] + out.shape[-1:]).astype(common)
    return out[0] if one_head else out


def uniform_causal_weights(n: int) -> jax.Array:
    """The prefix-averaging matrix: softmax of all-equal scores under the causal mask."""
    return masked_softmax(jnp.zeros((n, n), jnp.float32), causal_mask(n))


def softmax_jacobian(scores: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """d softmax(s) / d s for every row, by `jax.jacobian`: [..., n] -> [..., n, n].

    Analytically this is diag(w) - w wᵀ; its trace Σ w_i(1 - w_i) goes to 0 as a row
    saturates on one entry, which is why unscaled scores freeze a head at initialisation.
    Integer/bool scores are promoted to float32 (a derivative needs float inputs).
    """
    scores = _floating(scores)
    n = scores.shape[-1]
    row_jacobian = jax.jacobian(lambda row, m: masked_softmax(row, m))
    flat = scores.reshape(-1, n)
    if mask is None:
        jac = jax.vmap(lambda row: row_jacobian(row, None))(flat)
    else:
        m = jnp.broadcast_to(mask, scores.shape).reshape(-1, n)
        jac = jax.vmap(row_jacobian)(flat, m)
    return jac.reshape(*scores.shape, n)


# --- positions -------------------------------------------------------------------------

def sinusoidal_positions(n: int, d: int, *, base: float = 10000.0) -> jax.Array:
    """Vaswani et al.: PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(same)."""
    if n < 0 or d < 0:
        raise ValueError(f"sinusoidal_positions needs n >= 0 positions and d >= 0 features, got n={n}, d={d}")
    pos = jnp.arange(n, dtype=jnp.float32)[:, None]
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / max(d, 1))
    angles = pos * inv_freq                                   # [n, ceil(d/2)]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(n, 2 * angles.shape[-1])
    return pe[:, :d]


def apply_rope(x: jax.Array, positions: jax.Array | None = None, *, base: float = 10000.0) -> jax.Array:
    """Rotary embedding (Su et al.): rotate each pair (x_2i, x_2i+1) by angle p·θ_i.

    Rotating q and k by the same rule makes q_t·k_i depend on t - i only, and a
    rotation keeps every vector's norm.
    """
    x = _floating(x)                        # integer features rotated and cast back would be truncated
    n, d = x.shape[-2], x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope needs an even feature size, got {d}")
    if positions is None:
        positions = jnp.arange(n)
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)   # [d/2]
    angles = jnp.asarray(positions, jnp.float32)[..., None] * inv_freq  # [..., n, d/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], d // 2, 2)
    x1, x2 = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return rotated.reshape(x.shape).astype(x.dtype)


def alibi_slopes(n_heads: int) -> jax.Array:
    """Press et al. 2021: a geometric sequence starting at 2^(-8/n) with that ratio.

    For a head count that is not a power of two, take the slopes of the nearest lower
    power of two and fill up with every other slope of the next power, as the paper does.
    """
    if n_heads < 1:
        raise ValueError(f"alibi_slopes needs at least one head, got n_heads={n_heads}")

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest != n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return jnp.asarray(slopes, jnp.float32)


def alibi_bias(n_heads: int, n: int) -> jax.Array:
    """[n_heads, n, n]: -slope·(t - i) for i <= t, a penalty linear in distance.

    Above the diagonal the value is -slope·|t - i| (the causal mask hides it anyway).
    """
    pos = jnp.arange(n)
    distance = jnp.abs(pos[:, None] - pos[None, :]).astype(jnp.float32)
    return -alibi_slopes(n_heads)[:, None, None] * distance


# --- per-position layers ---------------------------------------------------------------

def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x·W (+ b) on the last axis, every projection; backward by hand (attention_jax.kernels).

    Integer/bool inputs are promoted to float32 (an integer product would be truncated)."""
    return _fast_dense(_floating(x), _floating(kernel), None if bias is None else _floating(bias))


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, eps: float = 1e-5) -> jax.Array:
    """Normalise each vector over its features (biased variance, as torch), then affine.

    Statistics in float32 for half-precision x, returned in x's dtype; integer/bool x is
    promoted to float32 (normalised values cast back to integers would be truncated).
    """
    x = _floating(x)
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype)


def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x·Φ(x) with the erf, as torch's default."""
    return jax.nn.gelu(x, approximate=False)

