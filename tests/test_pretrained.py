"""GPT-2 checkpoints in our modules: logits equal to Hugging Face's on tiny random configs made here
(no hub: the machine is offline), greedy text equal, parameter counts equal, a round trip back,
and one clear line for every checkpoint that cannot load."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import pretrained
from attention_jax.errors import CheckpointError, ConfigError, DataError
from attention_jax.decoding.generate import generate
from attention_jax.parameters import count_params
from attention_jax.config import ModelConfig
from attention_jax.model import LanguageModel
from flax import nnx

from helpers import oracle

try:
    import torch               # the oracle: the tests that use it get transformers through hf(), which skips without
except ImportError:
    torch = None


def hf():
    """transformers (and torch), imported by the tests that use them, not when the file is collected: every
    xdist worker collects every file, and the import costs seconds."""
    oracle("torch")
    return oracle("transformers")


SHAPES = {   # several layers and heads, a vocabulary no multiple of 64, exact GELU, an untied output
    "one_layer": dict(vocab_size=97, n_positions=32, n_embd=32, n_layer=1, n_head=2),
    "three_layers": dict(vocab_size=131, n_positions=40, n_embd=48, n_layer=3, n_head=4, activation_function="gelu"),
    "untied": dict(vocab_size=70, n_positions=24, n_embd=64, n_layer=2, n_head=8, tie_word_embeddings=False),
}


def hf_model(shape: str, seed: int = 0):
    transformers = hf()                      # first: without the oracles, the test skips here
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**SHAPES[shape], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():                    # biases and LayerNorms away from their 0/1 start: every weight counts
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids))).logits.numpy()


@pytest.fixture(scope="module", params=[name if name == "one_layer" else pytest.param(name, marks=pytest.mark.slow)
                                        for name in SHAPES])
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = hf_model(request.param)
    model.save_pretrained(folder, safe_serialization=True)
    return request.param, folder, model


def test_our_logits_are_hugging_faces(checkpoint):
    shape, folder, theirs = checkpoint
    ours = pretrained.load(folder)
    ids = np.random.default_rng(0).integers(0, SHAPES[shape]["vocab_size"], (3, SHAPES[shape]["n_positions"]))
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), hf_logits(theirs, ids), atol=1e-5, rtol=0)
    assert count_params(ours.config) == sum(p.numel() for p in theirs.parameters())


def test_greedy_text_is_hugging_faces_token_for_token(checkpoint):
    shape, folder, theirs = checkpoint
    ours = pretrained.load(folder)
    prompt = np.random.default_rng(1).integers(0, SHAPES[shape]["vocab_size"], (2, 5))
    n = SHAPES[shape]["n_positions"] - 6
    with torch.no_grad():
        want = theirs.generate(torch.as_tensor(prompt), max_new_tokens=n, do_sample=False,
                               pad_token_id=0).numpy()
    np.testing.assert_array_equal(generate(ours, prompt, n, temperature=0), want)


def test_our_model_saved_loads_in_hugging_face_with_the_same_logits(checkpoint, tmp_path):
    shape, folder, _ = checkpoint
    ours = pretrained.load(folder)
    pretrained.save(ours, tmp_path / "ours")
    back = hf().GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    ids = np.random.default_rng(2).integers(0, SHAPES[shape]["vocab_size"], (2, 9))
    np.testing.assert_allclose(hf_logits(back, ids), np.asarray(ours(jnp.asarray(ids))), atol=1e-5, rtol=0)
    again = pretrained.load(tmp_path / "ours")
    np.testing.assert_array_equal(np.asarray(again(jnp.asarray(ids))), np.asarray(ours(jnp.asarray(ids))))


def test_a_checkpoint_that_cannot_load_is_one_line(tmp_path):
    with pytest.raises(DataError, match="holds no config.json or model.safetensors"):
        pretrained.load(tmp_path)
    good = tmp_path / "good"
    hf_model("one_layer").save_pretrained(good, safe_serialization=True)
    config = json.loads((good / "config.json").read_text())
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    (other / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match="describes a 'llama' model"):
        pretrained.load(other)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({**config, "n_embd": 64, "n_head": 2}))
    (wrong / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="does not fit this config's"):
        pretrained.load(wrong)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.json").write_text(json.dumps(config))
    (cut / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="cannot read the checkpoint"):
        pretrained.load(cut)
    (good / "config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    with pytest.raises(ConfigError, match="activation_function='relu'"):
        pretrained.load(good)
    with pytest.raises(DataError, match="cannot fetch .no-such/model.* a folder and pass that folder.s path"):
        pretrained.from_pretrained("no-such/model")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """one_layer saved by transformers, its config and tensors as NumPy (to damage one at a time)."""
    from safetensors.numpy import load_file
    folder = tmp_path_factory.mktemp("saved")
    model = hf_model("one_layer")
    model.save_pretrained(folder, safe_serialization=True)
    return model, json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def written(folder, config: dict, tensors: dict):
    from safetensors.numpy import save_file
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_checkpoint_loads_exactly_and_computes_in_float32(saved, dtype, tmp_path):
    import ml_dtypes
    model, config, tensors = saved
    half = {k: v.astype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else np.float16) for k, v in tensors.items()}
    ours = pretrained.load(written(tmp_path / dtype, config, half))
    wte = np.asarray(ours.token_embed.embedding[...])
    assert wte.dtype == np.float32
    np.testing.assert_array_equal(wte, half["transformer.wte.weight"].astype(np.float32))   # widened, exactly
    widened = hf_model("one_layer")
    with torch.no_grad():       # Hugging Face's float32 model holding the very same (half-precision) values
        for name, p in widened.named_parameters():
            p.copy_(torch.as_tensor(half.get(name, half.get("transformer.wte.weight")).astype(np.float32)))
    ids = np.random.default_rng(1).integers(0, SHAPES["one_layer"]["vocab_size"], (2, 7))
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), hf_logits(widened, ids), atol=1e-5, rtol=0)


def test_a_float64_checkpoint_loads_only_where_float32_holds_it(saved, tmp_path):
    _, config, tensors = saved
    exact = {k: v.astype(np.float64) for k, v in tensors.items()}
    ours = pretrained.load(written(tmp_path / "exact", config, exact))
    np.testing.assert_array_equal(np.asarray(ours.token_embed.embedding[...]), tensors["transformer.wte.weight"])
    exact["transformer.ln_f.bias"] = exact["transformer.ln_f.bias"] + 1e-12
    with pytest.raises(CheckpointError, match="transformer.ln_f.bias is float64 with values float32 cannot hold"):
        pretrained.load(written(tmp_path / "inexact", config, exact))


def test_each_damaged_checkpoint_is_one_line(saved, tmp_path):
    model, config, tensors = saved
    cases = {   # what is damaged: (config, tensors, the error, its words)
        "int_tensor": (config, {**tensors, "transformer.ln_f.bias": np.zeros(32, np.int32)}, CheckpointError,
                       "ln_f.bias is int32; GPT-2's weights are floating point"),
        "nan": (config, {**tensors, "transformer.h.0.mlp.c_fc.bias": np.full(128, np.nan, np.float32)},
                CheckpointError, "c_fc.bias holds NaN or infinite values"),
        "stray": (config, {**tensors, "transformer.h.0.attn.rotary.inv_freq": np.ones(4, np.float32)},
                  CheckpointError, r"no place for \(transformer.h.0.attn.rotary.inv_freq\)"),
        "untied_no_head": ({**config, "tie_word_embeddings": False}, tensors, CheckpointError,
                           "tie_word_embeddings=false, but model.safetensors holds no lm_head.weight"),
        "tied_head_differs": (config, {**tensors, "lm_head.weight": tensors["transformer.wte.weight"] + 1},
                              CheckpointError, "lm_head.weight differs from it"),
        "heads_do_not_divide": ({**config, "n_head": 5}, tensors, ConfigError,
                                "n_embd=32, which n_head=5 does not divide"),
        "string_setting": ({**config, "n_layer": "1"}, tensors, ConfigError, "n_layer='1', which is not a whole"),
        "no_object": ([config], tensors, ConfigError, "holds a JSON list, not GPT-2's settings"),
    }
    for case, (cfg, ts, error, words) in cases.items():
        with pytest.raises(error, match=words):
            pretrained.load(written(tmp_path / case, cfg, ts))
    mask = written(tmp_path / "old_buffers", config, {**tensors, "transformer.h.0.attn.bias": np.ones((1, 1, 32, 32),
                                                                                                     np.float32)})
    pretrained.load(mask)           # the causal mask older transformers saved: no weight, ignored
    empty = written(tmp_path / "empty", config, tensors)
    (empty / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)"):
        pretrained.load(empty)
    (empty / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(DataError, match="cannot read the tokenizer"):
        pretrained.tokenizer(empty)


# --- checkpoints written by our own `save`: no oracle needed --------------------------------------

SMALL = ModelConfig(vocab_size=61, context=12, d_model=32, n_layers=2, n_heads=4, mixer="heads", positions="learned",
                    qkv_bias=True, tie_embeddings=True, gelu="tanh", output_bias=False, init="gpt2")


def ours_saved(folder, config=SMALL):
    from safetensors.numpy import load_file
    pretrained.save(LanguageModel(config, rngs=nnx.Rngs(0)), folder)
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("flag", ["tie_word_embeddings", "scale_attn_weights", "add_cross_attention"])
def test_a_boolean_written_as_a_string_is_refused_not_read_as_true(flag, tmp_path):
    """bool("false") is True: an untied checkpoint whose config said "false" loaded tied, a wrong model."""
    config, tensors = ours_saved(tmp_path / "good")
    with pytest.raises(ConfigError, match=f"{flag}='false', which is not true or false") as info:
        pretrained.load(written(tmp_path / "bad", {**config, flag: "false"}, tensors))
    assert "\n" not in str(info.value)


def test_one_tensor_under_two_names_is_refused(tmp_path):
    config, tensors = ours_saved(tmp_path / "good")
    twice = {**tensors, "h.0.ln_1.weight": tensors["transformer.h.0.ln_1.weight"] + 1}   # which one is meant?
    with pytest.raises(CheckpointError, match="holds blocks.0.ln1.scale twice, as .*ln_1.weight and .*ln_1.weight"):
        pretrained.load(written(tmp_path / "twice", config, twice))


def test_a_layer_count_the_tensors_do_not_hold_is_refused_before_building(tmp_path):
    """n_layer=1200 beside two blocks' tensors took minutes building the model before failing."""
    import time
    config, tensors = ours_saved(tmp_path / "good")
    began = time.perf_counter()
    with pytest.raises(CheckpointError, match=r"n_layer=1200, but model.safetensors holds 2 block\(s\) \(0, 1\)"):
        pretrained.load(written(tmp_path / "many", {**config, "n_layer": 1200}, tensors))
    assert time.perf_counter() - began < 5


def test_a_bfloat16_model_saved_loads_back_with_its_dtype_and_its_logits(tmp_path):
    import dataclasses
    model = LanguageModel(dataclasses.replace(SMALL, dtype="bfloat16"), rngs=nnx.Rngs(0))
    back = pretrained.load(pretrained.save(model, tmp_path / "bf16"))
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 12)))
    assert back.config == model.config and back.config.dtype == "bfloat16"
    np.testing.assert_array_equal(np.asarray(back(ids)), np.asarray(model(ids)))


def test_a_context_shorter_than_the_position_table_comes_back(tmp_path):
    """n_positions is the table's rows; the context came back as 32 where it was 8, and the uncached text
    changed."""
    import dataclasses
    model = LanguageModel(dataclasses.replace(SMALL, context=8, max_positions=32), rngs=nnx.Rngs(0))
    back = pretrained.load(pretrained.save(model, tmp_path / "short"))
    assert (back.config.context, back.config.max_positions_used) == (8, 32) and back.config == model.config
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot save the model into .*file") as info:
        pretrained.save(model, tmp_path / "file" / "inside")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("change, field", [
    (dict(activation="relu", gelu="exact"), "activation"), (dict(causal=False), "causal"),
    (dict(output_size=5, tie_embeddings=False), "output_size_used")])
def test_a_model_gpt2_cannot_compute_is_not_saved_as_gpt2(change, field):
    """A ReLU, unmasked or other-width-output model (tracr's, attention_jax.compiled) written as
    GPT-2 would load computing something else."""
    import dataclasses
    with pytest.raises(ConfigError, match=f"cannot hold this model \\({field} differ") as info:
        pretrained.config_to_hf(dataclasses.replace(SMALL, **change))
    assert "\n" not in str(info.value)
