"""attention_jax.speed.chunked: online-softmax attention in chunks equals the plain n×n computation,
forward and backward."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import functional as F
from attention_jax.speed.chunked import memory_efficient_attention

N, D = 37, 8   # 37 is not a multiple of the chunk size 8: the last chunk is padded

# Compiled once per shape and reused across tests (an eager call re-traces both scans).
chunked = jax.jit(memory_efficient_attention, static_argnames=("causal", "chunk_size", "query_chunk_size", "scale"))


@functools.partial(jax.jit, static_argnames=("causal", "scale"))
def reference(q, k, v, causal=True, scale=True):
    mask = F.causal_mask(q.shape[-2]) if causal else None
    return F.attention(q, k, v, mask=mask, scale=scale)


@functools.partial(jax.jit, static_argnames=("fn", "causal"))
def grads(fn, q, k, v, causal):
    """d/d(q, k, v) of a fixed random projection of the output (so no direction cancels)."""
    probe = jax.random.normal(jax.random.key(1), q.shape[:-1] + v.shape[-1:])
    return jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, causal=causal) * probe), argnums=(0, 1, 2))(q, k, v)


def qkv(rng, *lead, n=N):
    return tuple(rng.standard_normal((*lead, n, D)).astype(np.float32) for _ in range(3))


def test_causal_matches_attention_with_causal_mask_when_n_is_not_a_multiple_of_the_chunk(rng):
    q, k, v = qkv(rng)
    out = memory_efficient_attention(q, k, v, causal=True, chunk_size=8)
    chex.assert_shape(out, (N, D))
    chex.assert_trees_all_close(out, reference(q, k, v), atol=1e-5)


@pytest.mark.slow
def test_causal_gradients_match_attention_with_causal_mask(rng):
    q, k, v = qkv(rng)
    in_chunks_of_8 = functools.partial(memory_efficient_attention, chunk_size=8)
    chex.assert_trees_all_close(grads(in_chunks_of_8, q, k, v, causal=True),
                                grads(reference, q, k, v, causal=True), atol=1e-5)


def test_non_causal_matches_unmasked_attention_forward_and_gradients(rng):
    q, k, v = qkv(rng)
    chex.assert_trees_all_close(chunked(q, k, v, causal=False, chunk_size=8),
                                reference(q, k, v, causal=False), atol=1e-5)
    in_chunks_of_8 = functools.partial(memory_efficient_attention, chunk_size=8)
    chex.assert_trees_all_close(grads(in_chunks_of_8, q, k, v, causal=False),
                                grads(reference, q, k, v, causal=False), atol=1e-5)


@pytest.mark.slow
def test_leading_batch_and_head_dims_are_kept(rng):
    q, k, v = qkv(rng, 2, 3, n=13)
    out = chunked(q, k, v, chunk_size=4)
    chex.assert_shape(out, (2, 3, 13, D))
    chex.assert_trees_all_close(out, reference(q, k, v), atol=1e-5)


def test_keys_and_values_broadcast_over_heads(rng):
    q, _, _ = qkv(rng, 2, 3, n=13)
    _, k, v = qkv(rng, 2, 1, n=13)
    chex.assert_trees_all_close(chunked(q, k, v, chunk_size=4), reference(q, k, v), atol=1e-5)


def test_query_chunks_of_another_size_give_the_same_result(rng):
    q, k, v = qkv(rng)
    chex.assert_trees_all_close(chunked(q, k, v, chunk_size=8, query_chunk_size=5), reference(q, k, v), atol=1e-5)


def test_a_chunk_larger_than_the_sequence_is_one_chunk(rng):
    q, k, v = qkv(rng)
    chex.assert_trees_all_close(chunked(q, k, v, chunk_size=512), reference(q, k, v), atol=1e-5)


def test_unscaled_matches_unscaled_attention(rng):
    q, k, v = qkv(rng)
    chex.assert_trees_all_close(chunked(q, k, v, chunk_size=8, scale=False), reference(q, k, v, scale=False),
                                atol=1e-5)


def test_works_under_jit(rng):
    q, k, v = qkv(rng)
    jitted = jax.jit(lambda q, k, v: memory_efficient_attention(q, k, v, chunk_size=8))
    chex.assert_trees_all_close(jitted(q, k, v), reference(q, k, v), atol=1e-5)


@pytest.mark.slow
def test_half_precision_inputs_give_half_precision_outputs_close_to_float32(rng):
    q, k, v = qkv(rng)
    out = chunked(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), chunk_size=8)
    assert out.dtype == jnp.bfloat16
    chex.assert_trees_all_close(out.astype(jnp.float32), reference(q, k, v), atol=5e-2)


@pytest.mark.slow
def test_integer_inputs_are_promoted_to_float32_not_truncated(rng):
    q, k, v = (rng.integers(-3, 4, size=(2, N, D)).astype(np.int32) for _ in range(3))
    for causal, scale in ((True, True), (False, False)):
        out = chunked(q, k, v, causal=causal, chunk_size=8, scale=scale)
        assert out.dtype == jnp.float32
        f32 = [x.astype(np.float32) for x in (q, k, v)]
        chex.assert_trees_all_close(out, chunked(*f32, causal=causal, chunk_size=8, scale=scale), atol=0)
        chex.assert_trees_all_close(out, reference(*f32, causal=causal, scale=scale), atol=1e-5)
