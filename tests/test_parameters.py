"""Parameter counts from abstract shapes: the chapter's ladder, GPT-2 small, the lecture's tiny GPT."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from attention_jax.config import GPT2_SMALL, ModelConfig
from attention_jax.model import Block, LanguageModel
from attention_jax.parameters import count_params, param_breakdown

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
