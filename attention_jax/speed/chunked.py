"""Attention that never materialises the n×n matrix (Rabe & Staats 2021; FlashAttention).

The keys are visited in chunks while each query row keeps a running maximum, a running
normaliser and a running weighted sum of values (the "online softmax"): after the last
chunk, acc / normaliser is exactly softmax(q·kᵀ)·v, up to float32 rounding. Queries are
processed in chunks too, so the largest temporary is one query chunk × one key chunk.

Both loops are wrapped in `jax.checkpoint`: the backward pass recomputes each chunk's
scores instead of storing them, so training memory stays linear in n as well.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attention_jax import functional as F


def _pad_to(x: jax.Array, multiple: int) -> jax.Array:
    n = x.shape[-2]
    extra = -n % multiple
    return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, extra), (0, 0)]) if extra else x


def memory_efficient_attention(q, k, v, *, causal: bool = True, chunk_size: int = 512,
                               query_chunk_size: int | None = None,
                               scale: bool = True) -> jax.Array:
    """softmax(q·kᵀ/√d [+ causal mask])·v over [..., n, d] inputs, in O(n) memory.

    Any n works: the sequence is padded to a whole number of chunks and the padded
    keys are masked with -inf, like future keys under the causal mask.

    Computed in float32 always. The output has q's dtype when q is a float (half
    precision stays half); integer/bool inputs are promoted to float32 rather than the
    result truncated back to integers, as everywhere in `attention_jax.functional`.
    """
    if chunk_size < 1 or (query_chunk_size is not None and query_chunk_size < 1):
        raise ValueError(f"memory_efficient_attention needs chunks of at least one position, got "
                         f"chunk_size={chunk_size}, query_chunk_size={query_chunk_size}")
    lead = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, d = q.shape[-2:]
    n_k = k.shape[-2]
    q_chunk = min(query_chunk_size or chunk_size, n_q)
    k_chunk = min(chunk_size, n_k)
    out_dtype = q.dtype if jnp.issubdtype(q.dtype, jnp.inexact) \
        else jnp.result_type(q, k, v, jnp.float32)

    def flat(x):  # [..., n, d] -> [M, n, d] float32, M = all leading dims together
        x = jnp.broadcast_to(x, lead + x.shape[-2:]).astype(jnp.float32)
        return x.reshape(-1, *x.shape[-2:])

    qf = _pad_to(flat(q) * (1.0 / math.sqrt(d) if scale else 1.0), q_chunk)
    kf, vf = _pad_to(flat(k), k_chunk), _pad_to(flat(v), k_chunk)
    m = qf.shape[0]
    # Chunk axis first, so `lax.map` / `lax.scan` iterate over it.
    q_blocks = qf.reshape(m, qf.shape[1] // q_chunk, q_chunk, d).swapaxes(0, 1)
    k_blocks = kf.reshape(m, kf.shape[1] // k_chunk, k_chunk, -1).swapaxes(0, 1)
    v_blocks = vf.reshape(m, vf.shape[1] // k_chunk, k_chunk, -1).swapaxes(0, 1)
    one = _query_chunk(k_blocks, v_blocks, n_k, causal)
    q_starts = jnp.arange(q_blocks.shape[0]) * q_chunk
    out = jax.lax.map(one, (q_blocks, q_starts))                  # [chunks, M, q_chunk, d_v]
    d_v = v_blocks.shape[-1]
    out = out.swapaxes(0, 1).reshape(m, -1, d_v)[:, :n_q]
    return out.reshape(*lead, n_q, d_v).astype(out_dtype)


def _visit(carry, q_blk, k_blk, v_blk, q_idx, k_start, n_k: int, causal: bool):
    """One key chunk into a query chunk's running (acc, norm, max): the online softmax's step."""
    acc, norm, run_max = carry
    k_idx = k_start + jnp.arange(k_blk.shape[-2])
    valid = (k_idx < n_k)[None, :]          # the padding past the last key
    if causal:
        valid = valid & F.causal_mask(len(q_idx), k_blk.shape[-2], positions=q_idx - k_start)
    s = jnp.einsum("MTD,MSD->MTS", q_blk, k_blk)
    s = jnp.where(valid, s, -jnp.inf)
    # The running max only shifts exponents and cancels in acc / norm, so it is
    # kept out of the gradient (in every chunk alike, or the shifts disagree).
    new_max = jax.lax.stop_gradient(jnp.maximum(run_max, jnp.max(s, axis=-1)))
    shift = jnp.where(jnp.isfinite(new_max), new_max, 0.0)
    p = jnp.exp(s - shift[..., None])
    correction = jnp.exp(run_max - shift)
    norm = norm * correction + jnp.sum(p, axis=-1)
    acc = acc * correction[..., None] + jnp.einsum("MTS,MSD->MTD", p, v_blk)
    return acc, norm, new_max


def _query_chunk(k_blocks, v_blocks, n_k: int, causal: bool):
    """The function of one query chunk (and where it starts) to its output: a scan over
    the key chunks."""
    k_chunk = k_blocks.shape[-2]

    @jax.checkpoint
    def one_query_chunk(args):
        q_blk, q_start = args
        m, q_chunk = q_blk.shape[:2]
        q_idx = q_start + jnp.arange(q_chunk)

        @jax.checkpoint
        def key_step(carry, xs):
            k_blk, v_blk, k_start = xs
            visit = lambda c: _visit(c, q_blk, k_blk, v_blk, q_idx, k_start, n_k, causal)
            if causal:  # key chunks wholly in this query chunk's future change nothing
                carry = jax.lax.cond(k_start <= q_start + q_chunk - 1, visit, lambda c: c, carry)
            else:
                carry = visit(carry)
            return carry, None

        init = (jnp.zeros((m, q_chunk, v_blocks.shape[-1]), jnp.float32),
                jnp.zeros((m, q_chunk), jnp.float32), jnp.full((m, q_chunk), -jnp.inf, jnp.float32))
        k_starts = jnp.arange(k_blocks.shape[0]) * k_chunk
        (acc, norm, _), _ = jax.lax.scan(key_step, init, (k_blocks, v_blocks, k_starts))
        return acc / jnp.where(norm == 0, 1.0, norm)[..., None]

    return one_query_chunk
