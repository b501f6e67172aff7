"""The functional core: attention and its parts as pure `jax.numpy` functions.

Arrays in, arrays out, any leading batch/head axes, composable with `jit`, `vmap` and
`grad`; the Flax modules in `attention_jax.model` are thin wrappers around them. Axis
names in einsum strings: T query position, S key position, D feature.

Integer and bool inputs are promoted to float32, never truncated (weights in [0, 1] cast
back to an integer would be zeros). Half precision is computed in float32 where it
matters (the softmax, LayerNorm's statistics) and returned in half precision.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_jax.errors import ConfigError


def floating(x) -> jax.Array:
    """`x` as a float array: float dtypes untouched (no op at all), integer/bool -> float32."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.float32)


# --- masks and scores ------------------------------------------------------------------

def causal_mask(n: int, keys: int | None = None, *,
                positions: jax.Array | None = None) -> jax.Array:
    """bool[n, keys], True where a query may attend to a key: key i is at or before the query.

    `causal_mask(T)` is the [T, T] lower triangle; with `keys` and `positions` (the queries' own
    positions, default 0 .. n-1) it is the mask of any n queries against keys 0 .. keys-1: while
    decoding, the new positions against every position the cache can hold.
    """
    if n < 0 or (keys is not None and keys < 0):
        raise ConfigError(f"causal_mask needs n >= 0 queries and keys >= 0, got n={n}, keys={keys}")
    if keys is None and positions is None:
        return jnp.tril(jnp.ones((n, n), dtype=bool))
    at = jnp.arange(n) if positions is None else jnp.asarray(positions)
    return jnp.arange(n if keys is None else keys)[None, :] <= at[:, None]


def attention_scores(q: jax.Array, k: jax.Array, *, scale: bool = True,
                     bias: jax.Array | None = None) -> jax.Array:
    """q·kᵀ, divided by √d_k when `scale` (Var(q·k) = d_k for unit-variance q, k), plus
    `bias` (ALiBi's).

    Integer/bool q and k are promoted to float32 first, so an integer product cannot overflow.
    """
    scores = _scores(q, k, scale)
    return scores if bias is None else scores + bias


def _scores(q, k, scale):
    q, k = floating(q), floating(k)
    if q.shape[-1] != k.shape[-1]:
        raise ConfigError(f"queries of width {q.shape[-1]} cannot score keys of width "
                          f"{k.shape[-1]}: q [..., T, D] and k [..., S, D] need one D")
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
    scores = floating(scores)
    _check_softmax_inputs(scores, mask)
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


def _check_softmax_inputs(scores, mask) -> None:
    """A mask that does not fit the scores, or (where the values are known, outside jit) a +inf
    score, whose softmax is inf/inf: one clear error rather than NaN weights or a
    broadcasting trace."""
    if mask is not None:
        try:
            jnp.broadcast_shapes(jnp.shape(mask), scores.shape)
        except ValueError:
            raise ConfigError(f"a mask of shape {jnp.shape(mask)} does not fit scores of shape "
                              f"{scores.shape}; "
                              "it must broadcast to them ([T, S] for one window)") from None
    if not isinstance(scores, jax.core.Tracer) and bool(jnp.isposinf(scores).any()):
        raise ConfigError("a score is +inf, and the softmax of it is undefined (inf/inf); mask "
                          "that entry (-inf) or keep the scores finite")


def attention_weights(q, k, *, mask=None, bias=None, scale: bool = True) -> jax.Array:
    """softmax(q·kᵀ/√d + bias) under `mask`, in the scores' dtype (a float32 bias is
    added in float32)."""
    scores = attention_scores(q, k, scale=scale)
    dtype = scores.dtype
    if bias is not None:
        scores = scores + bias
    return masked_softmax(scores, mask).astype(dtype)


def mix(weights: jax.Array, v: jax.Array) -> jax.Array:
    """weights [..., T, S] · v [..., S, D]: each position's weighted average of the values."""
    return jnp.einsum("...TS,...SD->...TD", weights, floating(v))


def attention(q, k, v, *, mask=None, bias=None, scale: bool = True, return_weights: bool = False):
    """Score, mask, normalise, mix: `mix(attention_weights(q, k, ...), v)`, and the
    weights on request."""
    w = attention_weights(q, k, mask=mask, bias=bias, scale=scale)
    out = mix(w, v)
    return (out, w) if return_weights else out


def uniform_causal_weights(n: int) -> jax.Array:
    """The prefix-averaging matrix: softmax of all-equal scores under the causal mask."""
    return masked_softmax(jnp.zeros((n, n), jnp.float32), causal_mask(n))


def softmax_jacobian(scores: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """d softmax(s) / d s for every row, by `jax.jacobian`: [..., n] -> [..., n, n].

    Analytically this is diag(w) - w wᵀ; its trace Σ w_i(1 - w_i) goes to 0 as a row
    saturates on one entry, which is why unscaled scores freeze a head at initialisation.
    Integer/bool scores are promoted to float32 (a derivative needs float inputs).
    """
    scores = floating(scores)
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
        raise ValueError("sinusoidal_positions needs n >= 0 positions and d >= 0 features, "
                         f"got n={n}, d={d}")
    pos = jnp.arange(n, dtype=jnp.float32)[:, None]
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / max(d, 1))
    angles = pos * inv_freq                                   # [n, ceil(d/2)]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(n, 2 * angles.shape[-1])
    return pe[:, :d]


def apply_rope(x: jax.Array, positions: jax.Array | None = None, *,
               base: float = 10000.0) -> jax.Array:
    """Rotary embedding (Su et al.): rotate each pair (x_2i, x_2i+1) by angle p·θ_i.

    Rotating q and k by the same rule makes q_t·k_i depend on t - i only, and a
    rotation keeps every vector's norm.
    """
    x = floating(x)   # integer features rotated and cast back would be truncated
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


def alibi_bias(n_heads: int, n: int, queries: jax.Array | None = None) -> jax.Array:
    """[n_heads, queries, n]: -slope·(t - i) for key i <= query t, a penalty linear in distance.

    `queries`: the queries' positions (default 0 .. n-1; decoding asks for the newest only).
    Above the diagonal the value is -slope·|t - i| (the causal mask hides it anyway).
    """
    pos = jnp.arange(n)
    at = pos if queries is None else jnp.asarray(queries)
    distance = jnp.abs(at[:, None] - pos[None, :]).astype(jnp.float32)
    return -alibi_slopes(n_heads)[:, None, None] * distance


# --- per-position layers ---------------------------------------------------------------

def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x·W (+ b) on the last axis: [..., in] · [in, out] -> [..., out], in x's dtype.

    A bfloat16/float16 product accumulates in float32 and is rounded once, with the bias added
    before the rounding. Integer/bool inputs are promoted to float32 (an integer product would be
    truncated). `attention_jax.speed` swaps in the same product with a hand-written backward."""
    x, kernel = floating(x), floating(kernel)
    low = x.dtype in (jnp.bfloat16, jnp.float16)
    y = jnp.dot(x, kernel, preferred_element_type=jnp.float32) if low else jnp.dot(x, kernel)
    y = y if bias is None else y + floating(bias)
    return y.astype(x.dtype)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None,
               eps: float = 1e-5) -> jax.Array:
    """Normalise each vector over its features (biased variance, as torch), then affine.

    Statistics in float32 for half-precision x, returned in x's dtype; integer/bool x is
    promoted to float32 (normalised values cast back to integers would be truncated).
    """
    x = floating(x)
    x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype)


def gelu(x: jax.Array, approximate: bool = False) -> jax.Array:
    """GELU, x·Φ(x): exact with the erf (torch's default), or GPT-2's tanh approximation."""
    return jax.nn.gelu(x, approximate=approximate)

