"""Every impossible ModelConfig is refused at construction with a ConfigError naming the field."""

import dataclasses

import jax.numpy as jnp
import pytest
from flax import nnx

from attention_jax.config import GPT2_SMALL, MIXERS, POSITIONS, ModelConfig, TrainConfig
from attention_jax.errors import ConfigError, UserError
from attention_jax.model import LanguageModel

INVALID = [
    # (kwargs, a field the message must name)
    (dict(mixer="conv"), "mixer"),
    (dict(gelu="relu"), "gelu"),
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
    (dict(dropout=float("nan")), "dropout"),
    (dict(dropout=float("inf")), "dropout"),
    (dict(dropout="0.1"), "dropout"),
    (dict(dropout=None), "dropout"),
    (dict(ln_eps=-1.0), "ln_eps"),
    (dict(ln_eps=0.0), "ln_eps"),
    (dict(ln_eps=float("nan")), "ln_eps"),
    (dict(ln_eps=float("inf")), "ln_eps"),
    (dict(ln_eps="1e-5"), "ln_eps"),
    (dict(rope_base=0), "rope_base"),
    (dict(rope_base=-10000.0), "rope_base"),
    (dict(rope_base=float("nan")), "rope_base"),
    (dict(rope_base=float("inf")), "rope_base"),
    (dict(rope_base=True), "rope_base"),
    # the fields tracr's compiled models need (attention_jax.compiled)
    (dict(causal="false"), "causal"),
    (dict(causal=False, mixer="average"), "causal"),
    (dict(causal=False, mixer="none"), "mixer"),
    (dict(activation="swish"), "activation"),
    (dict(activation="relu", gelu="tanh"), "gelu"),
    (dict(ff_width=0), "ff_width"),
    (dict(ff_width=64.5), "ff_width"),
    (dict(ff_width=True), "ff_width"),
    (dict(d_model=32, ff_width=100, ff_mult=2), "ff_width"),
    (dict(output_size=0), "output_size"),
    (dict(output_size="7"), "output_size"),
    (dict(vocab_size=50, output_size=7, tie_embeddings=True), "tie_embeddings"),
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
    assert cfg.d_head_used == 8


def test_derived_sizes():
    cfg = ModelConfig(d_model=64, n_heads=4, ff_mult=4, context=32)
    assert (cfg.heads_used, cfg.d_head_used, cfg.d_ff, cfg.max_positions_used) == (4, 16, 256, 32)
    head = ModelConfig(d_model=64, mixer="head")
    assert (head.heads_used, head.d_head_used) == (1, 64)
    assert ModelConfig(mixer="average").heads_used == 0
    assert ModelConfig(context=32, max_positions=100).max_positions_used == 100


def test_the_compiled_models_fields_default_to_every_other_model_and_size_what_they_name():
    """causal, activation, ff_width and output_size: at their defaults the model of before (the
    step HLO is unchanged: tools/step_hlo.py); set, the feed-forward's width and the logits'."""
    base = ModelConfig(d_model=64, vocab_size=50)
    assert (base.causal, base.activation) == (True, "gelu")
    assert base.ff_width is None and base.output_size is None
    assert (base.d_ff, base.output_size_used) == (256, 50)
    tracr = ModelConfig(d_model=64, vocab_size=50, causal=False, activation="relu", ff_width=30,
                        output_size=7)
    assert (tracr.d_ff, tracr.output_size_used) == (30, 7)
    assert ModelConfig(d_model=32, ff_mult=2, ff_width=64).d_ff == 64        # both set, agreeing
    assert ModelConfig(vocab_size=50, output_size=50, tie_embeddings=True).output_size_used == 50
    for kwargs in (dict(causal=False, mixer="average"), dict(d_model=32, ff_width=100, ff_mult=2)):
        with pytest.raises(ConfigError) as err:
            ModelConfig(**kwargs)
        assert "\n" not in str(err.value)


def test_config_is_frozen_and_round_trips_through_a_dict():
    cfg = ModelConfig(d_model=64, n_heads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 32
    assert ModelConfig(**cfg.to_dict()) == cfg


def test_gpt2_small_is_a_valid_config():
    assert (GPT2_SMALL.d_model, GPT2_SMALL.n_heads, GPT2_SMALL.d_head_used, GPT2_SMALL.d_ff) == (768, 12, 64, 3072)
    assert GPT2_SMALL.tie_embeddings and GPT2_SMALL.qkv_bias and GPT2_SMALL.positions == "learned"


def test_more_tokens_than_the_learned_position_table_raises_config_error():
    cfg = ModelConfig(vocab_size=50, context=8, d_model=32, n_heads=4, positions="learned")
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="max_positions"):
        model(jnp.zeros((2, 9), jnp.int32))


@pytest.mark.slow
def test_a_larger_max_positions_admits_longer_inputs():
    cfg = ModelConfig(vocab_size=50, context=6, max_positions=8, d_model=32, n_heads=4, positions="learned")
    logits = LanguageModel(cfg, rngs=nnx.Rngs(0))(jnp.zeros((2, 8), jnp.int32))
    assert logits.shape == (2, 8, 50)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs, message", [
    (dict(ln_eps=-1), "invalid ModelConfig: ln_eps=-1 must be a finite positive number"),
    (dict(ln_eps=NAN), "invalid ModelConfig: ln_eps=nan must be a finite positive number"),
    (dict(rope_base=0), "invalid ModelConfig: rope_base=0 must be a finite number above 1"),
    (dict(rope_base=INF), "invalid ModelConfig: rope_base=inf must be a finite number above 1"),
    (dict(dropout=NAN), "invalid ModelConfig: dropout=nan must be a number in [0, 1)"),
    (dict(dropout="0.1"), "invalid ModelConfig: dropout='0.1' must be a number in [0, 1)"),
], ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items()) if isinstance(x, dict) else "")
def test_non_finite_or_non_positive_model_numbers_are_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_positive_finite_model_numbers_of_any_real_type_are_accepted():
    import numpy as np
    cfg = ModelConfig(ln_eps=np.float32(1e-6), rope_base=500, dropout=np.float32(0.1))
    assert (cfg.ln_eps, cfg.rope_base) == (float(np.float32(1e-6)), 500)
    assert type(cfg.ln_eps) is float and type(cfg.dropout) is float       # JSON writes them (a saved checkpoint)
    import json
    json.dumps(cfg.to_dict()), json.dumps(__import__("dataclasses").asdict(TrainConfig(lr=np.float32(1e-3))))
    with pytest.raises(ConfigError, match="rope_base=0.5 must be a finite number above 1"):
        ModelConfig(rope_base=0.5)
    assert ModelConfig(dropout=0) == ModelConfig(dropout=0.0)


TRAIN_INVALID = [
    # (kwargs, the start of the one-line message)
    (dict(lr=NAN), "invalid TrainConfig: lr=nan must be a finite positive number"),
    (dict(lr=INF), "invalid TrainConfig: lr=inf must be a finite positive number"),
    (dict(lr=-INF), "invalid TrainConfig: lr=-inf must be a finite positive number"),
    (dict(lr=0.0), "invalid TrainConfig: lr=0.0 must be a finite positive number"),
    (dict(lr=-1e-3), "invalid TrainConfig: lr=-0.001 must be a finite positive number"),
    (dict(lr="1e-3"), "invalid TrainConfig: lr='1e-3' must be a finite positive number"),
    (dict(lr=None), "invalid TrainConfig: lr=None must be a finite positive number"),
    (dict(weight_decay=NAN), "invalid TrainConfig: weight_decay=nan must be a finite number >= 0"),
    (dict(weight_decay=INF), "invalid TrainConfig: weight_decay=inf must be a finite number >= 0"),
    (dict(weight_decay=-0.1), "invalid TrainConfig: weight_decay=-0.1 must be a finite number >= 0"),
    (dict(grad_clip=NAN), "invalid TrainConfig: grad_clip=nan must be a finite number >= 0"),
    (dict(grad_clip=INF), "invalid TrainConfig: grad_clip=inf must be a finite number >= 0"),
    (dict(b1=NAN), "invalid TrainConfig: b1=nan must be a number in [0, 1)"),
    (dict(b1=1.0), "invalid TrainConfig: b1=1.0 must be a number in [0, 1)"),
    (dict(b1=-0.1), "invalid TrainConfig: b1=-0.1 must be a number in [0, 1)"),
    (dict(b2=INF), "invalid TrainConfig: b2=inf must be a number in [0, 1)"),
    (dict(b2=1.0), "invalid TrainConfig: b2=1.0 must be a number in [0, 1)"),
    (dict(b2=1.5), "invalid TrainConfig: b2=1.5 must be a number in [0, 1)"),
    (dict(min_lr_ratio=NAN), "invalid TrainConfig: min_lr_ratio=nan must be in [0, 1]"),
    (dict(min_lr_ratio=INF), "invalid TrainConfig: min_lr_ratio=inf must be in [0, 1]"),
]


@pytest.mark.parametrize("kwargs, message", TRAIN_INVALID,
                         ids=[",".join(f"{k}={v}" for k, v in kw.items()) for kw, _ in TRAIN_INVALID])
def test_train_config_refuses_non_finite_and_out_of_range_numbers_in_one_line(kwargs, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_train_config_accepts_its_defaults_and_the_edges_of_each_range():
    assert TrainConfig() == TrainConfig(lr=1e-3, weight_decay=0.01, b1=0.9, b2=0.999, grad_clip=0.0,
                                        min_lr_ratio=0.1)
    TrainConfig(lr=1, weight_decay=0, b1=0.0, b2=0.0, grad_clip=1, min_lr_ratio=0)   # ints are numbers
    TrainConfig(b1=0.999999, b2=0.999999, min_lr_ratio=1.0)


@pytest.mark.parametrize("field, value", [
    ("steps", 0), ("batch_size", -1), ("log_every", 0), ("checkpoint_every", 0),
    ("train_eval_windows", 0), ("eval_batch", 0), ("lr", 0.0), ("warmup_steps", -1), ("grad_clip", -0.5),
    ("eval_every", -1), ("weight_decay", -0.1)])
def test_train_config_refuses_impossible_values(field, value):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{field: value})
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "\n" not in message, message    # one line: the CLI prints it alone
    assert message.startswith("invalid TrainConfig") and field in message


@pytest.mark.parametrize("change, start", [
    ({"schedule": "linear"}, "invalid TrainConfig: schedule='linear'; choose 'constant' or 'cosine'"),
    ({"min_lr_ratio": 1.5}, "invalid TrainConfig: min_lr_ratio=1.5 must be in [0, 1]"),
    ({"schedule": "cosine", "steps": 10, "warmup_steps": 10}, "invalid TrainConfig: warmup_steps=10 leaves")])
def test_schedule_refuses_impossible_values(change, start):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**change)
    assert str(info.value).startswith(start) and "\n" not in str(info.value)


def test_replace_validates_train_config_again():
    with pytest.raises(ConfigError, match="lr=nan"):
        dataclasses.replace(TrainConfig(), lr=NAN)


def test_a_compute_dtype_the_model_cannot_take_is_refused_at_construction():
    with pytest.raises(ConfigError) as info:
        ModelConfig(dtype="float64")
    said = str(info.value)
    assert "dtype='float64'; choose one of float32, bfloat16, float16" in said and "\n" not in said
    assert ModelConfig(dtype="float16").dtype == "float16"      # a T4's: trained with a loss scale


# --- types (found by an API audit) -------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("layer_norm", "false"), ("residual", 0), ("scale", "no"),
                                          ("n_layers", True), ("n_heads", 4.0), ("context", "128")])
def test_switches_must_be_bools_and_counts_whole_numbers(field, value):
    with pytest.raises(ConfigError, match=f"{field}=") as err:
        ModelConfig(**{field: value})
    assert "\n" not in str(err.value)


def test_numpy_integers_from_a_sweep_are_stored_as_ints():
    import numpy as np
    cfg = ModelConfig(n_heads=np.int64(4), d_model=np.int32(64))
    assert type(cfg.n_heads) is int and type(cfg.d_model) is int and cfg == ModelConfig(n_heads=4, d_model=64)
    assert type(TrainConfig(steps=np.int64(7)).steps) is int
    for field, value in (("steps", 2.5), ("eval_every", True), ("warmup_steps", -1)):
        with pytest.raises(ConfigError, match=f"{field}="):
            TrainConfig(**{field: value})


def test_numbers_float32_or_int32_cannot_hold_are_refused_like_zero():
    from attention_jax.config import TrainConfig
    for bad in (1e-320, 1e-39, 1e39):
        with pytest.raises(ConfigError, match="float32 holds"):
            TrainConfig(lr=bad)
    with pytest.raises(ConfigError, match=r"up to 2\*\*31 - 1"):
        TrainConfig(steps=99999999999999999999)
    with pytest.raises(ConfigError, match="ln_eps"):
        ModelConfig(ln_eps=1e-50)
    assert TrainConfig(lr=1e-30).lr == 1e-30 and TrainConfig(steps=2**31 - 1).steps == 2**31 - 1


def test_to_dict_is_every_field_and_makes_the_config_again():
    """How a run's settings are written (checkpoints' fingerprints, results): every field, as it is."""
    changed = ModelConfig(gelu="tanh", output_bias=False)
    compiled = ModelConfig(causal=False, activation="relu", ff_width=96, output_size=9)   # tracr's
    assert set(changed.to_dict()) == set(ModelConfig.__dataclass_fields__)
    assert ModelConfig(**changed.to_dict()) == changed and ModelConfig(**ModelConfig().to_dict()) == ModelConfig()
    assert ModelConfig(**compiled.to_dict()) == compiled
    for gone in ("attention", "attention_chunk", "matmul_dtype"):     # how it is computed: attention_jax.speed
        assert gone not in changed.to_dict()
