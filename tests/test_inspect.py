"""Looking inside a model: parameter counts (GPT-2 small from abstract shapes), attention maps, ablation."""

import dataclasses

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import functional as F
from attention_jax.config import GPT2_SMALL, ModelConfig
from attention_jax.model import Block, LanguageModel
from attention_jax.inspect import ablate, capture_attention, count_params, param_breakdown

# The chapter's ladder: vocab 1024, d_model 128, each rung adds one thing to the one before.
RUNG0 = ModelConfig(vocab_size=1024, context=128, d_model=128, mixer="none", positions="none",
                    feed_forward=False, layer_norm=False)
RUNG1 = dataclasses.replace(RUNG0, positions="learned", mixer="head")
RUNG2 = dataclasses.replace(RUNG1, mixer="heads", n_heads=4)
RUNG3 = dataclasses.replace(RUNG2, feed_forward=True)
RUNG4 = dataclasses.replace(RUNG3, layer_norm=True)
RUNG5 = dataclasses.replace(RUNG4, n_layers=2)
LADDER = [
    ("embed_and_unembed_only", RUNG0, 263_168),
    ("learned_positions_and_one_head", RUNG1, 328_704),
    ("four_heads_with_W_o", RUNG2, 345_216),
    ("feed_forward", RUNG3, 476_928),
    ("layer_norm", RUNG4, 477_696),
    ("two_layers", RUNG5, 675_584),
]

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4)
B, T = 2, 8


def tokens(seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 50, (B, T)), jnp.int32)


# --- counting -------------------------------------------------------------------------------

@pytest.mark.parametrize("config, expected", [(c, n) for _, c, n in LADDER], ids=[name for name, _, _ in LADDER])
def test_count_params_of_the_ladder(config, expected):
    assert count_params(config) == expected


def test_ladder_steps_cost_what_the_chapter_says():
    counts = [count_params(c) for _, c, _ in LADDER]
    assert np.diff(counts).tolist() == [65_536, 16_512, 131_712, 768, 197_888]


def test_count_params_of_gpt2_small_from_abstract_shapes():
    assert count_params(GPT2_SMALL) == 124_439_808


def test_param_breakdown_of_gpt2_small():
    assert param_breakdown(GPT2_SMALL) == {
        "token_embed": 38_597_376, "position_embed": 786_432, "ln_f": 1_536, "blocks": 85_054_464}


def test_one_gpt2_small_block_has_7_087_872_params():
    block = nnx.eval_shape(lambda: Block(GPT2_SMALL, rngs=nnx.Rngs(0)))
    parts = param_breakdown(block)
    assert sum(parts.values()) == 7_087_872
    assert parts == {"mixer": 2_362_368, "ffn": 4_722_432, "ln1": 1_536, "ln2": 1_536}
    assert 12 * 7_087_872 == param_breakdown(GPT2_SMALL)["blocks"]


def test_count_params_of_the_lecture_tiny_gpt():
    config = ModelConfig(vocab_size=44, context=96, d_model=64, n_layers=2, n_heads=4,
                         tie_embeddings=True, qkv_bias=True)
    assert count_params(config) == 109_056


def test_param_breakdown_of_a_model_matches_its_config_and_sums_to_count_params():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    parts = param_breakdown(model)
    assert parts == param_breakdown(TINY)
    assert sum(parts.values()) == count_params(TINY)
    assert set(parts) == {"token_embed", "position_embed", "blocks", "ln_f", "lm_head"}


# --- attention maps ---------------------------------------------------------------------------

@pytest.mark.parametrize("mixer, heads", [("heads", 4), ("head", 1)])
def test_capture_attention_returns_one_causal_stochastic_map_per_attention_block(mixer, heads):
    model = LanguageModel(dataclasses.replace(TINY, mixer=mixer), rngs=nnx.Rngs(0))
    idx = tokens()
    logits, maps = capture_attention(model, idx)
    chex.assert_trees_all_close(logits, model(idx), atol=0)
    assert len(maps) == TINY.n_layers
    for w in maps:
        chex.assert_shape(w, (B, heads, T, T))
        chex.assert_trees_all_close(w.sum(-1), jnp.ones((B, heads, T)), atol=1e-6)
        assert np.all(np.asarray(w)[..., ~np.asarray(F.causal_mask(T))] == 0.0)


def test_captured_map_is_the_softmax_of_the_heads_own_scores():
    model = LanguageModel(dataclasses.replace(TINY, mixer="head", n_layers=1), rngs=nnx.Rngs(0))
    idx = tokens()
    _, (w,) = capture_attention(model, idx)
    head, ln1 = model.blocks[0].mixer, model.blocks[0].ln1
    x = ln1(model.token_embed(idx) + model.position_embed.embedding[:T])
    expected = F.attention_weights(head.q(x), head.k(x), mask=F.causal_mask(T))
    chex.assert_trees_all_close(w[:, 0], expected, atol=1e-6)


def test_capture_attention_skips_blocks_without_attention():
    model = LanguageModel(dataclasses.replace(TINY, mixer="average", positions="learned"), rngs=nnx.Rngs(0))
    logits, maps = capture_attention(model, tokens())
    assert maps == []
    chex.assert_shape(logits, (B, T, 50))


def test_capture_attention_switches_sowing_off_again():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    capture_attention(model, tokens())
    assert not any(block.mixer.sow_weights for block in model.blocks)
    model(tokens())
    assert len(nnx.state(model, nnx.Intermediate)) == 0


# --- ablation ---------------------------------------------------------------------------------

def test_ablate_mixer_changes_the_output_and_restores_it_after_the_with_block():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    before = model(idx)
    with ablate(model, mixer=[0]) as ablated:
        assert ablated is model
        assert np.abs(model(idx) - before).max() > 1e-4
        assert not model.blocks[0].use_mixer and model.blocks[1].use_mixer
    chex.assert_trees_all_close(model(idx), before, atol=0)


def test_ablate_feed_forward_changes_the_output_and_restores_it():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    before = model(idx)
    with ablate(model, feed_forward=[1]):
        assert np.abs(model(idx) - before).max() > 1e-4
    chex.assert_trees_all_close(model(idx), before, atol=0)


def test_ablate_restores_even_when_the_body_raises():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(RuntimeError):
        with ablate(model, mixer=[0, 1], feed_forward=[0]):
            raise RuntimeError("boom")
    assert all(block.use_mixer and block.use_ffn for block in model.blocks)


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
        assert not model.blocks[0].use_mixer
    assert model.blocks[0].use_mixer
