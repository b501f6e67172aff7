"""Every impossible ModelConfig is refused at construction with a ConfigError naming the field."""

import dataclasses

import jax.numpy as jnp
import pytest
from flax import nnx

from attention_jax.config import GPT2_SMALL, MIXERS, POSITIONS, ModelConfig
from attention_jax.errors import ConfigError, UserError
from attention_jax.model import LanguageModel

INVALID = [
    # (kwargs, a field the message must name)
    (dict(mixer="conv"), "mixer"),
    (dict(positions="relative"), "positions"),
    (dict(norm="sandwich"), "norm"),
    (dict(d_model=30, n_heads=4), "n_heads"),
    (dict(d_model=30, n_heads=4), "d_model"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(context=-1), "context"),
    (dict(d_model=0), "d_model"),
    (dict(n_layers=0), "n_layers"),
    (dict(n_heads=0), "n_heads"),
    (dict(ff_mult=0), "ff_mult"),
    (dict(d_head=0), "d_head"),
    (dict(d_head=-8), "d_head"),
    (dict(context=16.0), "context"),
    (dict(dropout=-0.1), "dropout"),
    (dict(dropout=1.0), "dropout"),
    (dict(positions="rope", d_model=24, n_heads=8), "d_head"),           # head dim 3
    (dict(positions="rope", mixer="head", d_model=15), "d_head"),
    (dict(positions="rope", mixer="none"), "mixer"),
    (dict(positions="rope", mixer="average"), "mixer"),
    (dict(positions="alibi", mixer="none"), "mixer"),
    (dict(positions="alibi", mixer="average"), "mixer"),
    (dict(positions="learned", context=128, max_positions=64), "max_positions"),
    (dict(positions="learned", context=128, max_positions=-5), "max_positions"),
    (dict(mixer="head", d_model=32, d_head=16), "d_head"),
]


def test_config_error_is_a_value_error_and_a_user_error():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, UserError)


def _id(kwargs_field):
    kwargs, field = kwargs_field
    return ",".join(f"{k}={v}" for k, v in kwargs.items()) + f"->{field}"


@pytest.mark.parametrize("kwargs, field", INVALID, ids=[_id(case) for case in INVALID])
def test_invalid_config_raises_config_error_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(max_positions=0), dict(positions="none", max_positions=-5)])
def test_non_positive_max_positions_is_refused(kwargs):
    with pytest.raises(ConfigError, match="max_positions"):
        ModelConfig(**kwargs)


def test_replace_validates_again():
    with pytest.raises(ConfigError, match="mixer"):
        dataclasses.replace(ModelConfig(), mixer="conv")


def test_unknown_choice_message_lists_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        ModelConfig(positions="relative")
    assert all(choice in str(err.value) for choice in POSITIONS)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("positions", POSITIONS)
def test_every_mixer_and_positions_pair_is_valid_unless_positions_act_on_scores_without_them(mixer, positions):
    needs_scores = positions in ("rope", "alibi") and mixer in ("none", "average")
    if needs_scores:
        with pytest.raises(ConfigError):
            ModelConfig(mixer=mixer, positions=positions)
    else:
        ModelConfig(mixer=mixer, positions=positions)


def test_d_head_removes_the_divisibility_requirement():
    cfg = ModelConfig(d_model=30, n_heads=4, d_head=8)
    assert cfg.head_dim == 8


def test_derived_sizes():
    cfg = ModelConfig(d_model=64, n_heads=4, ff_mult=4, context=32)
    assert (cfg.num_heads, cfg.head_dim, cfg.d_ff, cfg.position_rows) == (4, 16, 256, 32)
    head = ModelConfig(d_model=64, mixer="head")
    assert (head.num_heads, head.head_dim) == (1, 64)
    assert ModelConfig(mixer="average").num_heads == 0
    assert ModelConfig(context=32, max_positions=100).position_rows == 100


def test_config_is_frozen_and_round_trips_through_a_dict():
    cfg = ModelConfig(d_model=64, n_heads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 32
    assert ModelConfig(**cfg.to_dict()) == cfg


def test_gpt2_small_is_a_valid_config():
    assert (GPT2_SMALL.d_model, GPT2_SMALL.n_heads, GPT2_SMALL.head_dim, GPT2_SMALL.d_ff) == (768, 12, 64, 3072)
    assert GPT2_SMALL.tie_embeddings and GPT2_SMALL.qkv_bias and GPT2_SMALL.positions == "learned"


def test_more_tokens_than_the_learned_position_table_raises_config_error():
    cfg = ModelConfig(vocab_size=50, context=8, d_model=32, n_heads=4, positions="learned")
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="max_positions"):
        model(jnp.zeros((2, 9), jnp.int32))


def test_a_larger_max_positions_admits_longer_inputs():
    cfg = ModelConfig(vocab_size=50, context=6, max_positions=8, d_model=32, n_heads=4, positions="learned")
    logits = LanguageModel(cfg, rngs=nnx.Rngs(0))(jnp.zeros((2, 8), jnp.int32))
    assert logits.shape == (2, 8, 50)
