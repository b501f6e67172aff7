"""Cached decoding: exact against the uncached path for every position kind, mixer, depth and batch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.generate import generate
from attention_jax.model import LanguageModel

from helpers import forward

BASE = ModelConfig(vocab_size=50, context=24, d_model=32, n_layers=2, n_heads=4)
KINDS = ("learned", "sinusoidal", "rope", "alibi", "none")


def model(**change):
    return LanguageModel(dataclasses.replace(BASE, **change), rngs=nnx.Rngs(0))


def prompts(batch, length=5, seed=0):
    return np.random.default_rng(seed).integers(0, BASE.vocab_size, (batch, length))


@pytest.mark.slow
@pytest.mark.parametrize("positions", KINDS)
@pytest.mark.parametrize("layers, batch", [(1, 1), (2, 3)])
def test_each_steps_logits_are_the_full_forwards_of_the_text_so_far(positions, layers, batch):
    """Prefill, then one token a step: every step's logits against the whole prefix run uncached."""
    m = model(positions=positions, n_layers=layers)
    text = prompts(batch, length=BASE.context)
    want = forward(m, jnp.asarray(text))                  # position t's logits see tokens 0 .. t
    m.init_cache(batch)
    got = [forward(m, jnp.asarray(text[:, :8]))]          # the prefill: the prompt's own logits
    for t in range(8, BASE.context):
        got.append(forward(m, jnp.asarray(text[:, t:t + 1])))
    m.drop_cache()
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("change", [dict(mixer="head"), dict(mixer="average", positions="learned"),
                                    dict(mixer="none"), dict(layer_norm=False, feed_forward=False),
                                    dict(norm="post"), dict(residual=False), dict(dtype="bfloat16")],
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_decoding_every_kind_of_block_matches_the_whole_window(change):
    m = model(**change)
    text = jnp.asarray(prompts(2, length=12))
    want = forward(m, text)
    m.init_cache(2)
    got = jnp.concatenate([forward(m, text[:, :7]), forward(m, text[:, 7:8]), forward(m, text[:, 8:])], axis=1)
    m.drop_cache()
    tol = 5e-2 if change.get("dtype") == "bfloat16" else 1e-5
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=0)


# The fast tier (-m "not slow") decodes greedily with RoPE, the one that rotates the cached keys.
@pytest.mark.parametrize("positions", [pytest.param(k, marks=pytest.mark.slow) if k != "rope" else k for k in KINDS])
def test_greedy_text_is_the_same_cached_or_not(positions):
    m = model(positions=positions)
    p = prompts(3)
    n = BASE.context - p.shape[1] + 1                    # up to the last position the context holds
    greedy = generate(m, p, n, temperature=0)
    np.testing.assert_array_equal(greedy, generate(m, p, n, temperature=0, cache=False))
    if positions == "learned":    # (slow tier) a 1-D prompt, [P + n]: its reshaping is the same whatever the positions
        one = generate(m, p[0], n, temperature=0)       # greedy rows are independent: the batch's first row
        assert one.shape == (BASE.context + 1,) and (one == greedy[0]).all()


@pytest.mark.slow
@pytest.mark.parametrize("positions", KINDS)
def test_sampled_text_is_the_same_cached_or_not(positions):
    m = model(positions=positions)
    p = prompts(3)
    n = BASE.context - p.shape[1] + 1
    key = jax.random.key(7)
    np.testing.assert_array_equal(generate(m, p, n, key=key, temperature=0.9, top_k=20),
                                  generate(m, p, n, key=key, temperature=0.9, top_k=20, cache=False))


def test_what_the_cache_cannot_hold_is_refused_in_one_line():
    m = model()
    with pytest.raises(ConfigError, match="past its context of 24.*cache=False") as err:
        generate(m, prompts(1, length=20), 6, temperature=0)               # 25 positions through the model
    assert "\n" not in str(err.value)
    assert generate(m, prompts(1, length=20), 5, temperature=0).shape == (1, 25)   # 24 fit exactly
    assert generate(m, prompts(1, length=30), 4, temperature=0, cache=False).shape == (1, 34)
    m.init_cache(1)
    with pytest.raises(ConfigError, match="decoding already"):
        generate(m, prompts(1), 3, temperature=0)
    m.drop_cache()
    with pytest.raises(ConfigError, match="passes the learned position table"):
        m.init_cache(1, BASE.context + 1)
    assert generate(m, prompts(2), 0, temperature=0).shape == (2, 5)


def test_decoding_leaves_the_callers_model_as_it_was():
    m = model()
    before = forward(m, jnp.asarray(prompts(2, length=24)))
    generate(m, prompts(2), 10, temperature=0)
    assert m.cache_index is None and all(b.mixer.cache is None for b in m.blocks)
    np.testing.assert_array_equal(forward(m, jnp.asarray(prompts(2, length=24))), before)
