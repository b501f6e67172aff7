"""Cached decoding: exact against the uncached path for every position kind, mixer, depth and batch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.decoding.generate import generate
from attention_jax.decoding.kv_cache import cached
from attention_jax.model import LanguageModel

from helpers import decode_step, forward

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
    decoding = cached(m, batch)
    got = [decode_step(m, jnp.asarray(text[:, :8]))]      # the prefill: the prompt's own logits
    for t in range(8, BASE.context):
        got.append(decode_step(m, jnp.asarray(text[:, t:t + 1])))
    decoding.undo()
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
    decoding = cached(m, 2)
    got = jnp.concatenate([decode_step(m, text[:, :7]), decode_step(m, text[:, 7:8]), decode_step(m, text[:, 8:])],
                          axis=1)
    decoding.undo()
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
    assert [t.shape for t in generate(m, prompts(1, length=20), 5, temperature=0)] == [(25,)]   # 24 fit exactly
    assert [t.shape for t in generate(m, prompts(1, length=30), 4, temperature=0, cache=False)] == [(34,)]
    with pytest.raises(ConfigError, match="passes the learned position table"):
        cached(m, 1, BASE.context + 1)
    np.testing.assert_array_equal(generate(m, prompts(2), 0, temperature=0), prompts(2))


def test_a_decoder_keeps_the_caches_shapes_not_a_cache_and_makes_none_for_no_new_token():
    from attention_jax.decoding.generate import Decoder
    decoder = Decoder(model())
    assert np.shape(decoder(prompts(2), 0, temperature=0)) == (2, 5) and decoder._made == {}
    first = decoder(prompts(2), 4, temperature=0)
    (shape, (_, empty, _)), = decoder._made.items()
    assert shape == (2, 8) and jax.tree.leaves(empty)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(empty))
    np.testing.assert_array_equal(decoder(prompts(2), 4, temperature=0), first)     # the kept twins again


def test_decoding_leaves_the_callers_model_as_it_was():
    m = model()
    before, parts = forward(m, jnp.asarray(prompts(2, length=24))), [type(x) for _, x in nnx.iter_modules(m)]
    generate(m, prompts(2), 10, temperature=0)
    assert [type(x) for _, x in nnx.iter_modules(m)] == parts          # decoded on a copy: no twin left in
    np.testing.assert_array_equal(forward(m, jnp.asarray(prompts(2, length=24))), before)


UNEQUAL = [[3, 1, 4, 1, 5, 9, 2], [6, 5], [3, 5, 8, 9, 7]]
MIXERS = [dict(positions=k) for k in KINDS] + [dict(mixer="average", positions="learned"), dict(mixer="head")]


@pytest.mark.parametrize("change", [c if c == dict(positions="rope") else pytest.param(c, marks=pytest.mark.slow)
                                    for c in MIXERS], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_a_left_padded_row_gets_the_logits_it_gets_alone(change):
    """Rows of 9, 4 and 6 tokens left-padded to 9 in one cache, then 5 tokens a row one at a time:
    each row's logits at its own positions are its full forward alone, the padding read by no query."""
    m = model(**change)
    rng = np.random.default_rng(3)
    texts = [rng.integers(0, BASE.vocab_size, length + 5) for length in (9, 4, 6)]
    lengths = np.array([9, 4, 6])
    left = np.zeros((3, 9), np.int32)
    for r, (t, length) in enumerate(zip(texts, lengths)):
        left[r, 9 - length:] = t[:length]
    decoding = cached(m, 3, 14, padding=9 - lengths)
    got = [decode_step(m, jnp.asarray(left))]
    for i in range(5):
        got.append(decode_step(m, jnp.asarray([[t[length + i]] for t, length in zip(texts, lengths)])))
    decoding.undo()
    got = np.concatenate(got, axis=1)
    for r, (t, length) in enumerate(zip(texts, lengths)):
        np.testing.assert_allclose(got[r, 9 - length:], forward(m, jnp.asarray(t[None]))[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", [pytest.param(k, marks=pytest.mark.slow) if k != "alibi" else k for k in KINDS])
def test_prompts_of_unequal_length_are_each_decoded_as_alone(positions):
    m = model(positions=positions)
    n = 12
    for cache in (True, False):
        together = generate(m, UNEQUAL, n, temperature=0, cache=cache)
        assert [len(t) for t in together] == [len(p) + n for p in UNEQUAL]
        for text, prompt in zip(together, UNEQUAL):
            np.testing.assert_array_equal(text, generate(m, prompt, n, temperature=0, cache=cache))
    key = jax.random.key(3)             # drawn: each row its own draws, the same cached or not
    drawn = generate(m, UNEQUAL, n, key=key, temperature=1.0)
    for a, b in zip(drawn, generate(m, UNEQUAL, n, key=key, temperature=1.0, cache=False)):
        np.testing.assert_array_equal(a, b)
    assert generate(m, UNEQUAL, 0, temperature=0)[1].tolist() == UNEQUAL[1]


def test_rows_that_are_no_prompts_are_refused_in_one_line():
    m = model()
    for bad in ([[1, 2], []], [[1, 2], [[3]]], [[1, 2], [0.5, 1.0]]):
        with pytest.raises(ConfigError, match="a list of B prompts of lengths >= 1") as err:
            generate(m, bad, 3, temperature=0)
        assert "\n" not in str(err.value)
    from attention_jax.errors import DataError
    with pytest.raises(DataError, match="token id 50 is outside the vocabulary"):
        generate(m, [[1, 2], [50]], 3, temperature=0)
    for bad in ([1, 2, 3], [0, -1], [0, BASE.context], [0.5, 1.0]):
        with pytest.raises(ConfigError, match=r"padding=.*one whole number per row, \[2\], each from 0 to 23"):
            cached(m, 2, padding=bad)


@pytest.mark.parametrize("positions", [pytest.param(k, marks=pytest.mark.slow) if k != "learned" else k for k in KINDS])
def test_bfloat16_weights_give_logits_within_five_hundredths_of_a_standard_deviation(positions):
    """Every weight matrix rounded once to bfloat16 (8 bits of mantissa), activations and sums in
    float32: the logits move by under 0.05 of their spread, and decoding runs with them."""
    from attention_jax.decoding.generate import rounded
    m = model(positions=positions)
    ids = jnp.asarray(prompts(3, length=BASE.context))
    low = rounded(m, "bfloat16")
    assert low.blocks[0].mixer.qkv.kernel[...].dtype == jnp.bfloat16 and low.blocks[0].ln1.scale[...].dtype == jnp.float32
    assert m.blocks[0].mixer.qkv.kernel[...].dtype == jnp.float32            # the caller's model, untouched
    want, got = forward(m, ids), forward(low, ids)
    assert got.dtype == np.float32
    assert 0 < np.abs(got - want).max() < 0.05 * want.std()
    text = generate(m, prompts(2), 8, temperature=0, weights="bfloat16")
    assert [t.shape for t in text] == [(13,), (13,)]
    with pytest.raises(ConfigError, match="weights='int4'; choose one of"):
        generate(m, prompts(2), 8, temperature=0, weights="int4")


@pytest.mark.parametrize("weights", [pytest.param("bfloat16", marks=pytest.mark.slow), "int8"])
def test_a_row_with_an_outlier_feature_writes_alone_what_it_writes_in_a_batch(weights):
    """Token 7's feature 0 is 10^4 times the rest (no LayerNorm to tame it) and nothing reads that
    feature: the next token hangs on the others, which int8's one scale a row rounds coarsely.
    Rounded so alone as in a batch, row 0's greedy text is the same; before, int8 wrote another."""
    from attention_jax.decoding.generate import Decoder
    for seed in (1, 2):                  # both wrote other text in a batch before
        bare = dataclasses.replace(BASE, layer_norm=False, tie_embeddings=False)
        m = LanguageModel(bare, rngs=nnx.Rngs(seed))
        table = m.token_embed.embedding[...]
        m.token_embed.embedding[...] = table.at[:, 0].set(0.0).at[7, 0].set(1e4)
        for block in m.blocks:
            block.mixer.qkv.kernel[...] = block.mixer.qkv.kernel[...].at[0].set(0.0)
            block.ffn.up.kernel[...] = block.ffn.up.kernel[...].at[0].set(0.0)
        m.lm_head.kernel[...] = m.lm_head.kernel[...].at[0].set(0.0)
        rows = [[7], [11, 2, 4], [1, 3]]
        decoder = Decoder(m, weights=weights)
        for text, row in zip(decoder(rows, 10, temperature=0), rows):
            np.testing.assert_array_equal(text, decoder(row, 10, temperature=0))
