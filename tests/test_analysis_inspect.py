"""Looking inside a model: named intermediates,
attention maps, per-head weights, and ablations that always put the model back."""

import dataclasses

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import functional as F
from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError, DataError
from attention_jax.analysis.inspect import ablate, attention_blocks, head_weights, hook_names, patched, run_with_cache
from attention_jax.model import LanguageModel

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4)
B, T = 2, 8


def tokens(seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 50, (B, T)), jnp.int32)


# --- attention maps ---------------------------------------------------------------------------

def weights(model, idx):
    """Every attention block's weights, by run_with_cache, in block order."""
    logits, cache = run_with_cache(model, idx, [f"{p}.attention.weights" for p in attention_blocks(model)] or None)
    return logits, [cache[f"{p}.attention.weights"] for p in attention_blocks(model)]


@pytest.mark.parametrize("mixer, heads", [("heads", 4), ("head", 1)])
def test_each_attention_block_s_weights_are_a_causal_stochastic_map(mixer, heads):
    model = LanguageModel(dataclasses.replace(TINY, mixer=mixer), rngs=nnx.Rngs(0))
    idx = tokens()
    logits, maps = weights(model, idx)
    chex.assert_trees_all_close(logits, model(idx), atol=0)     # recording changes nothing: the model as built
    assert len(maps) == TINY.n_layers
    for w in maps:
        chex.assert_shape(w, (B, heads, T, T))
        chex.assert_trees_all_close(w.sum(-1), jnp.ones((B, heads, T)), atol=1e-6)
        assert np.all(np.asarray(w)[..., ~np.asarray(F.causal_mask(T))] == 0.0)


def test_a_fresh_model_shows_every_hook_point_with_no_notice_and_no_switch():
    """The model as built is the reference: reading scores and weights swaps nothing, says nothing."""
    import warnings
    model = LanguageModel(ModelConfig(vocab_size=64, context=16, n_layers=2), rngs=nnx.Rngs(0))
    before = parts(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits, cache = run_with_cache(model, jnp.arange(16)[None], names="blocks.*.mixer.attention.weights")
    chex.assert_shape(cache["blocks.1.mixer.attention.weights"], (1, 4, 16, 16))
    assert parts(model) == before


def test_a_weights_map_is_the_softmax_of_the_heads_own_scores():
    model = LanguageModel(dataclasses.replace(TINY, mixer="head", n_layers=1), rngs=nnx.Rngs(0))
    idx = tokens()
    _, (w,) = weights(model, idx)
    head, ln1 = model.blocks[0].mixer, model.blocks[0].ln1
    x = ln1(model.token_embed(idx) + model.position_embed.embedding[:T])
    expected = F.attention_weights(head.q(x), head.k(x), mask=F.causal_mask(T))
    chex.assert_trees_all_close(w[:, 0], expected, atol=1e-6)


def test_a_model_without_attention_has_no_weights_to_show():
    model = LanguageModel(dataclasses.replace(TINY, mixer="average", positions="learned"), rngs=nnx.Rngs(0))
    logits, maps = weights(model, tokens())
    assert maps == [] and attention_blocks(model) == []
    chex.assert_shape(logits, (B, T, 50))


def test_recording_leaves_nothing_behind():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    hooks_before = [type(m) for _, m in nnx.iter_modules(model)]
    weights(model, tokens())
    assert [type(m) for _, m in nnx.iter_modules(model)] == hooks_before     # every recorder swapped back
    model(tokens())
    assert len(nnx.state(model, nnx.Intermediate)) == 0


# --- run_with_cache ----------------------------------------------------------------------------

def block_by_hand(block, x):
    """A pre-norm block from its parts: x + mixer(LN1 x), then + ffn(LN2 x)."""
    mid = x + block.mixer(block.ln1(x))
    return mid, mid + block.ffn(block.ln2(mid))


def test_run_with_cache_names_every_intermediate_and_they_fit_together():
    model = LanguageModel(dataclasses.replace(TINY, dropout=0.0), rngs=nnx.Rngs(0))
    idx = tokens()
    logits, cache = run_with_cache(model, idx)
    assert set(cache) == set(hook_names(model))
    chex.assert_trees_all_close(logits, model(idx), atol=1e-5)          # recording changes nothing
    chex.assert_trees_all_close(cache["embed"] + cache["positions"], cache["blocks.0.resid_pre"], atol=0)
    for i, block in enumerate(model.blocks):
        x = cache[f"blocks.{i}.resid_pre"]
        mid, post = block_by_hand(block, x)
        chex.assert_trees_all_close(cache[f"blocks.{i}.resid_mid"], x + cache[f"blocks.{i}.mixer_out"], atol=0)
        chex.assert_trees_all_close(cache[f"blocks.{i}.resid_mid"], mid, atol=1e-5)
        chex.assert_trees_all_close(cache[f"blocks.{i}.resid_post"], post, atol=1e-5)
        w, scores = cache[f"blocks.{i}.mixer.attention.weights"], cache[f"blocks.{i}.mixer.attention.scores"]
        chex.assert_shape(scores, (B, TINY.n_heads, T, T))
        chex.assert_trees_all_close(w, F.masked_softmax(scores, F.causal_mask(T)), atol=0)
        chex.assert_trees_all_close(cache[f"blocks.{i}.mixer.z"], w @ cache[f"blocks.{i}.mixer.v"], atol=1e-5)
    chex.assert_trees_all_close(cache["final"], cache[f"blocks.{TINY.n_layers - 1}.resid_post"], atol=0)
    chex.assert_trees_all_close(model.unembed(model.blocks[1](model.blocks[0](model.embed(idx)))), logits,
                                atol=1e-5)


def test_run_with_cache_refuses_a_name_that_matches_nothing():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError) as info:
        run_with_cache(model, tokens(), names=["blocks.7.resid_pre"])
    assert "blocks.7.resid_pre" in str(info.value) and "\n" not in str(info.value)
    from attention_jax.speed import fast
    with fast(model), pytest.raises(ConfigError) as info:        # the faster forms hold no weights: it says so
        run_with_cache(model, tokens(), names="blocks.0.mixer.attention.weights")
    assert "computed by a faster form" in str(info.value) and "blocks.0.mixer.attention" in str(info.value)


def test_head_views_rebuild_the_attention_output():
    """sum over heads of softmax(x W_q^h (x W_k^h)ᵀ/√d) x W_v^h W_o^h + b_o is the layer's output."""
    cfg = dataclasses.replace(TINY, n_layers=1, qkv_bias=False)
    model = LanguageModel(cfg, rngs=nnx.Rngs(2))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((B, T, cfg.d_model)), jnp.float32)
    views = head_weights(model, 0)
    chex.assert_shape([views["q"], views["k"], views["v"], views["o"]],
                      [(4, 32, 8), (4, 32, 8), (4, 32, 8), (4, 8, 32)])
    out = sum(F.attention(x @ views["q"][h], x @ views["k"][h], x @ views["v"][h], mask=F.causal_mask(T))
              @ views["o"][h] for h in range(4)) + model.blocks[0].mixer.out.bias[...]
    chex.assert_trees_all_close(out, model.blocks[0].mixer(x), atol=1e-5)
    with pytest.raises(ConfigError):
        head_weights(LanguageModel(dataclasses.replace(cfg, mixer="average"), rngs=nnx.Rngs(0)), 0)


# --- ablation ---------------------------------------------------------------------------------

def parts(model):
    """Which modules sit where: equal before and after an ablation means the model is whole again."""
    return [(path, type(m)) for path, m in nnx.iter_modules(model)]


def test_ablate_mixer_changes_the_output_and_restores_it_after_the_with_block():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    before, shape = model(idx), parts(model)
    with ablate(model, mixer=[0]) as ablated:
        assert ablated is model
        assert np.abs(model(idx) - before).max() > 1e-4
        assert model.blocks[0].mixer is None and model.blocks[1].mixer is not None
    chex.assert_trees_all_close(model(idx), before, atol=0)
    assert parts(model) == shape


def test_ablate_feed_forward_changes_the_output_and_restores_it():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    before = model(idx)
    with ablate(model, feed_forward=[1]):
        assert np.abs(model(idx) - before).max() > 1e-4
    chex.assert_trees_all_close(model(idx), before, atol=0)


@pytest.mark.parametrize("kind", ["mixer", "heads", "positions", "bidirectional"])
def test_the_model_is_unchanged_after_an_ablation_whose_body_raises(kind):
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    before, shape = model(idx), parts(model)
    kw = {"mixer": {"mixer": [0, 1], "feed_forward": [0]}, "heads": {"heads": {0: [1], 1: [0, 3]}},
          "positions": {"positions": True}, "bidirectional": {"bidirectional": True}}[kind]
    with pytest.raises(RuntimeError):
        with ablate(model, **kw):
            assert np.abs(model(idx) - before).max() > 1e-5
            raise RuntimeError("boom")
    assert parts(model) == shape
    chex.assert_trees_all_close(model(idx), before, atol=0)


def test_ablating_every_head_equals_ablating_the_mixer():
    """Without W_o's bias the two are the same; with it, every head off leaves exactly that bias."""
    idx = tokens()
    for bias in (False, True):
        model = LanguageModel(dataclasses.replace(TINY, bias=bias), rngs=nnx.Rngs(3))
        with ablate(model, heads={0: range(4)}):
            _, heads_off = run_with_cache(model, idx, names="blocks.0.resid_mid")
        with ablate(model, mixer=[0]):
            _, mixer_off = run_with_cache(model, idx, names="blocks.0.resid_mid")
        b_o = model.blocks[0].mixer.out.bias[...] if bias else 0.0
        chex.assert_trees_all_close(heads_off["blocks.0.resid_mid"], mixer_off["blocks.0.resid_mid"] + b_o,
                                    atol=1e-6)
    model = LanguageModel(dataclasses.replace(TINY, bias=False), rngs=nnx.Rngs(3))
    with ablate(model, heads={0: range(4), 1: range(4)}):
        every_head = model(idx)
    with ablate(model, mixer=[0, 1]):
        chex.assert_trees_all_close(every_head, model(idx), atol=1e-5)


def test_ablating_one_head_zeroes_only_that_heads_output():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with ablate(model, heads={1: [2]}):
        _, cache = run_with_cache(model, tokens(), names="blocks.*.mixer.z")
    z1 = np.asarray(cache["blocks.1.mixer.z"])
    assert np.all(z1[:, 2] == 0) and np.all(np.abs(z1[:, [0, 1, 3]]).max(axis=(1, 2, 3)) > 0)
    assert np.abs(np.asarray(cache["blocks.0.mixer.z"])).min(axis=(0, 2, 3)).shape == (4,)


def test_zeroing_the_positions_makes_the_stream_start_at_the_token_vectors():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with ablate(model, positions=True):
        _, cache = run_with_cache(model, tokens(), names=["embed", "blocks.0.resid_pre"])
    chex.assert_trees_all_close(cache["blocks.0.resid_pre"], cache["embed"], atol=0)


def test_the_bidirectional_mask_lets_a_position_see_the_future():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    later = idx.at[:, -1].set((idx[:, -1] + 1) % 50)
    first = lambda: np.abs(np.asarray(model(later) - model(idx)))[:, 0].max()
    assert first() == 0.0                                         # causal: position 0 is blind to the last
    with ablate(model, bidirectional=True):
        assert first() > 1e-4
        _, cache = run_with_cache(model, idx, names="blocks.0.mixer.attention.weights")
        assert np.all(np.asarray(cache["blocks.0.mixer.attention.weights"]) > 0)    # every weight, the future's too
    assert first() == 0.0


def test_with_every_mixer_ablated_no_position_sees_another():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    other = idx.at[:, 0].set((idx[:, 0] + 1) % 50)
    with ablate(model, mixer=range(TINY.n_layers)):
        changed = np.abs(model(other) - model(idx)).max(axis=(0, 2))
    assert changed[0] > 0 and np.all(changed[1:] == 0.0)


def test_nested_ablations_restore_the_outer_state():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with ablate(model, mixer=[0]):
        with ablate(model, mixer=[0, 1]):
            pass
        assert model.blocks[0].mixer is None and model.blocks[1].mixer is not None
    assert model.blocks[0].mixer is not None


@pytest.mark.parametrize("bad", [50, 5000, -1])
def test_token_ids_outside_the_vocabulary_are_refused_at_the_door(bad):
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(DataError) as info:
        model(tokens().at[0, 3].set(bad))
    assert f"token id {bad} is outside the vocabulary [0, 50)" in str(info.value)


# --- asking for what is not there (found by an API audit) -------------------------------------

def test_ablating_a_head_that_does_not_exist_is_refused_not_ignored():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="block 0 has 4 head"):
        with ablate(model, heads={0: [7]}):
            pass
    with ablate(model, heads={0: [-1]}):           # Python's negative index: the last head
        last = model(tokens())
    with ablate(model, heads={0: [3]}):
        np.testing.assert_array_equal(np.asarray(model(tokens())), np.asarray(last))


@pytest.mark.parametrize("positions", ["rope", "alibi", "none"])
def test_ablating_positions_a_model_does_not_add_is_refused(positions):
    model = LanguageModel(dataclasses.replace(TINY, positions=positions), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=f"positions='{positions}' adds none"):
        with ablate(model, positions=True):
            pass


def test_a_patch_by_pattern_patches_every_match_and_two_patterns_on_one_point_are_refused():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with patched(model, {"blocks.*.mixer.z": jnp.zeros_like}):
        by_pattern = model(tokens())
    with ablate(model, heads={0: range(4), 1: range(4)}):
        np.testing.assert_array_equal(np.asarray(by_pattern), np.asarray(model(tokens())))
    with pytest.raises(ConfigError, match="matched by two patches"):
        with patched(model, {"blocks.*.mixer.z": jnp.zeros_like, "blocks.0.mixer.z": jnp.ones_like}):
            pass


def test_removing_a_mixer_and_seeing_both_ways_combine():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    plain = model(tokens())
    with ablate(model, mixer=[0], bidirectional=True):
        both = model(tokens())
    with ablate(model, mixer=[0]):
        with ablate(model, bidirectional=True):
            nested = model(tokens())
    np.testing.assert_array_equal(np.asarray(both), np.asarray(nested))
    np.testing.assert_array_equal(np.asarray(model(tokens())), np.asarray(plain))       # restored


def test_an_empty_head_list_ablates_nothing_and_a_block_past_the_last_is_refused():
    from attention_jax.analysis.inspect import head_weights
    model = LanguageModel(ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4), rngs=nnx.Rngs(0))
    idx = jnp.arange(8)[None]
    with ablate(model, heads={0: []}):
        np.testing.assert_array_equal(model(idx), model(idx))
    with pytest.raises(ConfigError, match="block 9 does not exist: the model has 2"):
        head_weights(model, 9)


def test_the_logit_lens_starts_at_the_embedding_and_ends_at_the_models_logits():
    from attention_jax.analysis.inspect import logit_lens
    model = LanguageModel(ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4), rngs=nnx.Rngs(0))
    idx = jnp.arange(8)[None]
    lens = logit_lens(model, idx)
    assert lens.shape == (3, 1, 8, 50)
    np.testing.assert_allclose(lens[-1], model(idx), atol=1e-5)
    start = model.embed(idx)
    np.testing.assert_allclose(lens[0], model.lm_head(model.ln_f(start)), atol=1e-5)


@pytest.mark.parametrize("change, absent", [({"positions": "rope"}, "positions"), ({"norm": "post"}, "ln_final"),
                                            ({"layer_norm": False}, "ln_final"),
                                            ({"feed_forward": False}, "blocks.0.ffn_out"),
                                            ({"mixer": "none"}, "blocks.0.mixer_out")])
def test_a_hook_point_the_forward_pass_skips_is_not_offered(change, absent):
    """`positions` under RoPE, `ln_final` without a final LayerNorm: listed, patched and recorded, they did
    nothing at all. They are not hook points of such a model."""
    model = LanguageModel(ModelConfig(vocab_size=32, context=8, d_model=16, n_heads=2, **change), rngs=nnx.Rngs(0))
    assert absent not in hook_names(model)
    with pytest.raises(ConfigError, match=f"no hook point matches '{absent}'"):
        with patched(model, {absent: jnp.zeros_like}):
            pass
    with pytest.raises(ConfigError, match="no hook point matches"):
        run_with_cache(model, jnp.arange(8)[None], absent)
    _, cache = run_with_cache(model, jnp.arange(8)[None])
    assert set(cache) == set(hook_names(model))          # every point offered is computed


@pytest.mark.parametrize("call, words", [
    (lambda m: ablate(m, mixer=0), r"ablate\(mixer=0\): give a list of whole numbers"),
    (lambda m: ablate(m, feed_forward=1), r"ablate\(feed_forward=1\)"),
    (lambda m: ablate(m, heads={0: 1}), r"ablate\(heads\[0\]=1\)"),
    (lambda m: ablate(m, heads=[0]), r"ablate\(heads=\[0\]\): give \{block: \[head, ...\]\}"),
])
def test_an_ablation_given_no_list_is_one_line(call, words):
    model = LanguageModel(ModelConfig(vocab_size=32, context=8, d_model=16, n_heads=2), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=words):
        with call(model):
            pass


def test_a_bidirectional_ablation_of_a_model_without_attention_is_refused():
    """It did nothing (an average has no mask to swap), and the logits were the causal ones."""
    model = LanguageModel(ModelConfig(vocab_size=32, context=8, d_model=16, mixer="average"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="this model has no attention"):
        with ablate(model, bidirectional=True):
            pass


@pytest.mark.slow
def test_a_patch_reading_a_global_is_not_served_a_program_of_its_old_value():
    """`generate` compiles the model with its patches; a patch function whose global changed gave the text
    of the old value. Patches are keyed by what they compute with."""
    from attention_jax.decoding.generate import generate
    model = LanguageModel(ModelConfig(vocab_size=32, context=16, d_model=16, n_heads=2), rngs=nnx.Rngs(3))
    global ALPHA
    ALPHA = 1.0
    scaled = lambda v: v * ALPHA
    texts = []
    try:
        for value in (1.0, 0.0):
            ALPHA = value
            with patched(model, {"blocks.*.resid_mid": scaled}):
                texts.append(generate(model, [1, 2, 3], 8, temperature=0).tolist())
                by_hand = [1, 2, 3]
                for _ in range(8):
                    by_hand.append(int(model(jnp.asarray([by_hand]))[0, -1].argmax()))
            assert texts[-1] == by_hand
    finally:
        ALPHA = 1.0
    assert texts[0] != texts[1]


ALPHA = 1.0
