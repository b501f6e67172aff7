"""attention_jax.decoding.kv_cache: the key/value cache as a twin of the model. The cache writes where the clock
stands and returns every slot written; a left-padded row takes its positions after its padding and
its queries never read it; one row's cache is written in place; the model as built comes back."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.analysis.inspect import ablate
from attention_jax.decoding.kv_cache import Clock, KVCache, cached
from attention_jax.model import LanguageModel

SMALL = ModelConfig(vocab_size=40, context=32, d_model=32, n_layers=2, n_heads=4)


def test_a_cache_writes_where_it_is_told_and_returns_everything_so_far():
    cache = KVCache((1, 2, 6, 3), jnp.float32)
    cache.write(0, jnp.ones((1, 2, 2, 3)), 2 * jnp.ones((1, 2, 2, 3)))
    v, k = cache.write(2, 3 * jnp.ones((1, 2, 1, 3)), 4 * jnp.ones((1, 2, 1, 3)))
    np.testing.assert_array_equal(v[0, 0, :, 0], [1, 1, 3, 0, 0, 0])            # zeros past what is written
    np.testing.assert_array_equal(k[0, 1, :, 2], [2, 2, 4, 0, 0, 0])
    values_only = KVCache((1, 4, 3), jnp.float32, keys=False)
    v, k = values_only.write(0, jnp.ones((1, 2, 3)))
    assert k is None and v.shape == (1, 4, 3)


def test_a_left_padded_row_takes_its_positions_after_its_padding_and_its_queries_never_see_it():
    clock = Clock(5, [0, 2])                                      # row 1: two slots of padding
    np.testing.assert_array_equal(clock.positions(3), [[0, 1, 2], [-2, -1, 0]])
    np.testing.assert_array_equal(clock.visible(3)[1], [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]])
    clock.index[...] += 3
    np.testing.assert_array_equal(clock.slots(1), [3])
    np.testing.assert_array_equal(clock.visible(1)[:, 0], [[1, 1, 1, 1, 0], [0, 0, 1, 1, 0]])


def test_one_row_s_cache_is_written_in_place_not_copied_each_token():
    """The compiled one-token step of a model decoding one text copies no cache: held [1, H, S, D],
    XLA's CPU backend copied each cache whole several times a token (for a slot's write)."""
    model = LanguageModel(SMALL, rngs=nnx.Rngs(0))
    decoding = cached(model, 1, 32)
    graph, state = nnx.split(model)

    def step(state, token):
        from attention_jax.decoding.kv_cache import Cached
        m = nnx.merge(graph, state)
        return nnx.state(m), Cached.resume(m)(token)[:, -1].argmax(-1)

    hlo = jax.jit(step, donate_argnums=0).lower(state, jnp.zeros((1, 1), jnp.int32)).compile().as_text()
    copies = re.findall(r"= f32\[(?:1,)?4,32,8\]\{[\d,]*\} copy\(", hlo)
    writes = re.findall(r"dynamic-update-slice", hlo)
    assert writes and not copies, len(copies)
    decoding.undo()


def test_the_model_as_built_comes_back_and_knows_nothing_of_the_cache():
    model = LanguageModel(SMALL, rngs=nnx.Rngs(0))
    before = [(p, type(m).__name__) for p, m in nnx.iter_modules(model)]
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 40, (1, 12)))
    want = model(tokens)
    with cached(model, 1, 16) as decoding:
        got = jnp.concatenate([decoding(tokens[:, :6]), decoding(tokens[:, 6:])], axis=1)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert [(p, type(m).__name__) for p, m in nnx.iter_modules(model)] == before
    assert not any("cache" in str(p).lower() for p, _ in nnx.iter_modules(model))


def test_what_a_cache_cannot_hold_is_refused_in_one_line():
    model = LanguageModel(dict(SMALL.__dict__) and ModelConfig(vocab_size=40, context=8, d_model=16, n_heads=2,
                                                              positions="learned"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="passes the learned position table"):
        cached(model, 1, 9)
    for bad in ([3], [0, 8], [0.5, 1], [-1, 0]):
        with pytest.raises(ConfigError, match=r"padding=.*give one whole number per row, \[2\]"):
            cached(model, 2, padding=bad)
    decoding = cached(model, 1, 8)
    decoding(jnp.zeros((1, 6), jnp.int32))
    with pytest.raises(ConfigError, match="the cache holds 8 positions and 6 are written: 6 more do not fit"):
        decoding(jnp.zeros((1, 6), jnp.int32))                    # past slot 8 the writes would be clamped
    decoding.undo()
    with ablate(model, bidirectional=True), pytest.raises(ConfigError, match="a Bidirectional mask cannot decode"):
        cached(model, 1)


def test_no_rows_and_tokens_of_another_shape_are_refused_in_one_line():
    """An empty batch, a count that is no whole number, padding that is no numbers, tokens not [B, t]:
    each was a TypeError or ZeroDivisionError from deep inside JAX."""
    model = LanguageModel(SMALL, rngs=nnx.Rngs(0))
    for batch, max_len in ((0, 8), (-1, 8), (2.5, 8), (True, 8), ("2", 8), (1, 0), (1, 2.0)):
        with pytest.raises(ConfigError, match=r"a cache holds whole numbers >= 1 of rows and of slots") as err:
            cached(model, batch, max_len)
        assert "\n" not in str(err.value)
    for bad in ("ab", [0, None]):
        with pytest.raises(ConfigError, match=r"padding=.*give one whole number per row, \[2\]"):
            cached(model, 2, padding=bad)
    decoding = cached(model, 2, 8)
    for shape in ((3, 2), (2,), (2, 1, 1), (2, 0)):
        with pytest.raises(ConfigError, match=r"tokens of shape .* for a cache of 2 row\(s\): give \[2, t\] ids"):
            decoding(jnp.zeros(shape, jnp.int32))
    assert decoding(jnp.zeros((2, 3), jnp.int32)).shape == (2, 3, SMALL.vocab_size)     # and then it decodes
    decoding.undo()
