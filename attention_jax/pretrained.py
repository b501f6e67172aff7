"""GPT-2's own weights in our modules, and ours back out in its format.

    model = from_pretrained("gpt2")              # the hub, when online; or a folder of its files
    bpe = tokenizer("path/to/folder")             # GPT-2's BPE, from the same folder
    save(model, "out/")                            # config.json + model.safetensors,
                                                   # as Hugging Face writes them

A GPT-2 checkpoint is a folder holding `config.json` and `model.safetensors`, as Hugging
Face saves one. Its architecture is a `ModelConfig` (`config_from_hf`): learned positions,
pre-norm LayerNorm, GELU in its tanh form, biases everywhere, the output tied to the token
table (or not). Its Conv1D weights are [in, out], as our `Dense` kernels, and `c_attn`'s
columns are (q|k|v, head, width), as our `qkv`'s, so every tensor is copied as it is; the
output layer's weight, when untied, is transposed. Tensors are read with `safetensors`
into NumPy: no torch.
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.config import DTYPES, ModelConfig
from attention_jax.errors import CheckpointError, ConfigError, DataError
from attention_jax.model import LanguageModel

FILES = ("config.json", "model.safetensors")
# A model of ours that computes in bfloat16 says so here (GPT-2's own keys have no place for it;
# Hugging Face keeps the key and ignores it), so that it loads back computing as it was saved.
DTYPE_KEY = "attention_jax_dtype"
# Likewise its context where the position table is longer (GPT-2's n_positions is the table's rows).
CONTEXT_KEY = "attention_jax_context"
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
# HF name -> ours, per block
BLOCK = {"ln_1.weight": "ln1.scale", "ln_1.bias": "ln1.bias",
         "attn.c_attn.weight": "mixer.qkv.kernel", "attn.c_attn.bias": "mixer.qkv.bias",
         "attn.c_proj.weight": "mixer.out.kernel", "attn.c_proj.bias": "mixer.out.bias",
         "ln_2.weight": "ln2.scale", "ln_2.bias": "ln2.bias", "mlp.c_fc.weight": "ffn.up.kernel",
         "mlp.c_fc.bias": "ffn.up.bias", "mlp.c_proj.weight": "ffn.down.kernel",
         "mlp.c_proj.bias": "ffn.down.bias"}
TOP = {"wte.weight": "token_embed.embedding", "wpe.weight": "position_embed.embedding",
       "ln_f.weight": "ln_f.scale", "ln_f.bias": "ln_f.bias"}


def _setting(hf: dict, name: str, default, kind=int):
    """config.json's `name`, which must be a whole number (or, for `float`, any number)."""
    value = hf.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise ConfigError(f"config.json sets {name}={value!r}, which is not "
                          f"{'a number' if kind is float else 'a whole number'};"
                          " the checkpoint's config is damaged: download it again")
    return kind(value)


def _flag(hf: dict, name: str, default: bool) -> bool:
    """config.json's `name`, which must be JSON's true or false (absent or null: the default)."""
    value = hf.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"config.json sets {name}={value!r}, which is not true or false (a JSON "
                          "boolean); the checkpoint's config is damaged: download it again")
    return value


def config_from_hf(hf: dict) -> ModelConfig:
    """A Hugging Face GPT-2 `config.json` as our ModelConfig (what ours cannot be: refused)."""
    if not isinstance(hf, dict):
        raise ConfigError(f"config.json holds a JSON {type(hf).__name__}, not GPT-2's settings "
                          "(an object); download it again")
    if hf.get("model_type") != "gpt2":
        raise ConfigError(f"config.json describes a {hf.get('model_type')!r} model; this loader "
                          "reads GPT-2 (model_type 'gpt2') checkpoints")
    d, heads, act = _setting(hf, "n_embd", 768), _setting(hf, "n_head", 12), \
        hf.get("activation_function", "gelu_new")
    if d > 0 and heads > 0 and d % heads:
        raise ConfigError(f"config.json sets n_embd={d}, which n_head={heads} does not divide: "
                          "GPT-2 splits n_embd evenly among its heads, so this config describes no "
                          "GPT-2; download it again")
    inner = 4 * d if hf.get("n_inner") is None else _setting(hf, "n_inner", None)
    unsupported = [k for k, bad in (
        ("activation_function", act not in GELU), ("n_inner", d and inner % d),
        ("scale_attn_weights", not _flag(hf, "scale_attn_weights", True)),
        ("scale_attn_by_inverse_layer_idx", _flag(hf, "scale_attn_by_inverse_layer_idx", False)),
        ("add_cross_attention", _flag(hf, "add_cross_attention", False))) if bad]
    if unsupported:
        raise ConfigError("this GPT-2 config sets "
                          f"{', '.join(f'{k}={hf.get(k)!r}' for k in unsupported)}, which our "
                          "modules do not compute; supported: GELU (exact or tanh), n_inner a "
                          "multiple of n_embd, scaled attention")
    positions = _setting(hf, "n_positions", 1024)
    context = _setting(hf, CONTEXT_KEY, positions)
    if not 0 < context <= positions:
        raise ConfigError(f"config.json sets {CONTEXT_KEY}={context}, past its "
                          f"n_positions={positions}; download it again")
    return ModelConfig(vocab_size=_setting(hf, "vocab_size", 50257), context=context,
                       max_positions=positions if positions != context else None,
                       d_model=d, n_layers=_setting(hf, "n_layer", 12), n_heads=heads,
                       mixer="heads", positions="learned", ff_mult=inner // d if d > 0 else 4,
                       ln_eps=_setting(hf, "layer_norm_epsilon", 1e-5, float),
                       tie_embeddings=_flag(hf, "tie_word_embeddings", True), qkv_bias=True,
                       bias=True, output_bias=False, gelu=GELU[act], init="gpt2", dtype=_dtype(hf))


def _dtype(hf: dict) -> str:
    """The dtype our modules compute in: float32, or what `save` recorded (DTYPE_KEY)."""
    value = hf.get(DTYPE_KEY, "float32")
    if value not in DTYPES:
        raise ConfigError(f"config.json sets {DTYPE_KEY}={value!r}; choose one of "
                          f"{', '.join(DTYPES)}")
    return value


def config_to_hf(config: ModelConfig) -> dict:
    """Our ModelConfig as a GPT-2 `config.json`, for a model GPT-2's architecture can hold."""
    gpt2 = dict(mixer="heads", positions="learned", residual=True, feed_forward=True,
                layer_norm=True, norm="pre", scale=True, bias=True, qkv_bias=True, causal=True,
                activation="gelu", output_size_used=config.vocab_size)
    differ = [k for k, v in gpt2.items() if getattr(config, k) != v]
    if differ or config.d_head_used * config.n_heads != config.d_model:
        raise ConfigError("GPT-2's architecture cannot hold this model "
                          f"({', '.join(differ) or 'd_head'} differ); save a GPT-2-shaped "
                          "ModelConfig: heads, learned positions, pre-norm, biases")
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": config.vocab_size, "n_positions": config.max_positions_used,
            "n_embd": config.d_model, "n_layer": config.n_layers, "n_head": config.n_heads,
            "n_inner": config.d_ff, "layer_norm_epsilon": config.ln_eps,
            "activation_function": "gelu_new" if config.gelu == "tanh" else "gelu",
            "tie_word_embeddings": config.tie_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0, **({DTYPE_KEY: config.dtype} if config.dtype != "float32" else {}),
            **({CONTEXT_KEY: config.context} if config.context != config.max_positions_used
               else {})}


BUFFERS = ("attn.bias", "attn.masked_bias")  # the causal mask older transformers saved as tensors
EXACT = ("float32", "float16", "bfloat16")   # each value has a float32 twin: read exactly


def _ours(name: str, tied: bool) -> str | None:
    """Our parameter path for a HF tensor name; "" for one that holds no weight of ours (a saved
    causal mask, the tied output's copy of the token table); None for a name GPT-2 has
    no place for."""
    name = name.removeprefix("transformer.")
    if name in TOP:
        return TOP[name]
    if name == "lm_head.weight":
        return "" if tied else "lm_head.kernel"
    parts = name.split(".", 2)
    if parts[0] == "h" and len(parts) == 3 and parts[1].isdigit():
        return f"blocks.{int(parts[1])}.{BLOCK[parts[2]]}" if parts[2] in BLOCK else \
            ("" if parts[2] in BUFFERS else None)
    return None


def _float32(name: str, array: np.ndarray) -> np.ndarray:
    """A checkpoint's tensor in float32, the dtype our modules compute in, when that changes no
    value: float16 and bfloat16 widen exactly; float64 only if every value is a float32 one; the
    rest, refused."""
    kind = array.dtype.name
    wide = array.astype(np.float32) if kind in EXACT or kind == "float64" else None
    if wide is None:
        raise CheckpointError(f"tensor {name} is {kind}; GPT-2's weights are floating point "
                              "(float32, float16, bfloat16): this is no GPT-2 checkpoint")
    if kind == "float64" and not np.array_equal(wide.astype(np.float64), array, equal_nan=True):
        raise CheckpointError(f"tensor {name} is float64 with values float32 cannot hold exactly, "
                              "and our modules compute in float32; save the checkpoint in float32 "
                              "to load it rounded")
    if not np.isfinite(wide).all():
        raise CheckpointError(f"tensor {name} holds NaN or infinite values: the checkpoint is "
                              "damaged; download it again")
    return wide


def _read(folder: pathlib.Path):
    """config.json as our ModelConfig, and model.safetensors' tensors by name."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    missing = [f for f in FILES if not (folder / f).is_file()]
    if missing:
        raise DataError(f"{folder} holds no {' or '.join(missing)}: a GPT-2 checkpoint is a folder "
                        "with config.json and model.safetensors, as Hugging Face's "
                        "save_pretrained writes it")
    try:
        config = config_from_hf(json.loads((folder / "config.json").read_text(encoding="utf-8")))
        if not (folder / "model.safetensors").stat().st_size:
            raise CheckpointError(f"{folder / 'model.safetensors'} is empty (0 bytes): the "
                                  "download stopped before it began; download it again")
        return config, load_file(str(folder / "model.safetensors"))
    except (ValueError, OSError, SafetensorError) as e:
        if isinstance(e, ConfigError):
            raise
        raise CheckpointError(f"cannot read the checkpoint in {folder} ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}); download it again") from None


def _placed(tensors: dict, config: ModelConfig, wanted: dict) -> dict:
    """Our path -> float32 array for every tensor; one with no place, or no tensor: refused."""
    found, strays = {}, sorted(n for n in tensors if _ours(n, config.tie_embeddings) is None)
    if strays:
        raise CheckpointError(f"model.safetensors holds tensors GPT-2 has no place for "
                              f"({', '.join(strays[:3])}{' ...' if len(strays) > 3 else ''}): it "
                              "is no GPT2LMHeadModel checkpoint")
    named = {}
    for name, array in tensors.items():
        ours = _ours(name, config.tie_embeddings)
        if ours and ours in named:       # "h.0.ln_1.weight" beside "transformer.h.0.ln_1.weight":
                                         # which is meant?
            raise CheckpointError(f"model.safetensors holds {ours} twice, as {named[ours]} "
                                  f"and {name}: it is damaged or merged from two checkpoints; "
                                  "download it again")
        named[ours] = name
        if ours == "lm_head.kernel":
            array = array.T                                                # nn.Linear's [out, in]
        want = wanted.get(ours)
        if ours and (want is None or tuple(want.get_value().shape) != array.shape):
            raise CheckpointError(f"tensor {name} {array.shape} does not fit this config's {ours} "
                                  f"{None if want is None else tuple(want.get_value().shape)}: "
                                  "config.json and model.safetensors disagree")
        if ours:
            found[ours] = _float32(name, array)
    head = tensors.get("lm_head.weight", tensors.get("transformer.lm_head.weight"))
    if config.tie_embeddings and head is not None \
            and not np.array_equal(head, found.get(TOP["wte.weight"])):
        raise CheckpointError("config.json ties the output layer to the token table "
                              "(tie_word_embeddings), but model.safetensors' lm_head.weight "
                              "differs from it; set tie_word_embeddings to false in config.json to "
                              "load the output layer as saved")
    if not config.tie_embeddings and "lm_head.kernel" not in found:
        raise CheckpointError("config.json sets tie_word_embeddings=false, but model.safetensors "
                              "holds no lm_head.weight; set it to true if the output layer "
                              "is the token table")
    absent = sorted(set(wanted) - set(found))
    if absent:
        raise CheckpointError(f"model.safetensors lacks {', '.join(absent[:4])}"
                              f"{' ...' if len(absent) > 4 else ''} (our names); download it again")
    return found


def _check_layers(config: ModelConfig, tensors: dict) -> None:
    """config.json's n_layer against the blocks model.safetensors holds (a config claiming 1,200
    layers beside two layers' tensors would be built, abstractly, before any tensor is
    found missing)."""
    held = {int(n.split(".")[1]) for n in (t.removeprefix("transformer.") for t in tensors)
            if n.startswith("h.") and n.split(".")[1].isdigit()}
    if held != set(range(config.n_layers)):
        raise CheckpointError(f"config.json sets n_layer={config.n_layers}, but model.safetensors "
                              f"holds {len(held)} block(s) ({', '.join(map(str, sorted(held)[:4]))}"
                              f"{' ...' if len(held) > 4 else ''}): they disagree; download the "
                              "checkpoint again")


def load(folder) -> LanguageModel:
    """Our LanguageModel holding the GPT-2 checkpoint in `folder` (config.json, model.safetensors).

    The model computes in float32: float16 and bfloat16 tensors are widened, which is exact; a
    float64 tensor only loads if float32 holds its every value. What else cannot load is one
    line."""
    folder = pathlib.Path(folder).expanduser()
    config, tensors = _read(folder)
    _check_layers(config, tensors)            # before building the model config.json describes
    model = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    wanted = {".".join(map(str, path)): var for path, var in nnx.to_flat_state(state)}
    found = _placed(tensors, config, wanted)
    for name, var in wanted.items():
        var.set_value(jnp.asarray(found[name]))
    nnx.update(model, state)            # restored into the abstract model, as a checkpoint is
    return model


def save(model: LanguageModel, folder) -> pathlib.Path:
    """Write `model` as a GPT-2 checkpoint Hugging Face loads (config.json, model.safetensors)."""
    from safetensors.numpy import save_file
    config = model.config
    hf = config_to_hf(config)
    ours = {v: k for k, v in TOP.items()} | \
        {f"blocks.{i}.{v}": f"h.{i}.{k}" for i in range(config.n_layers) for k, v in BLOCK.items()}
    tensors = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name = ".".join(map(str, path))
        array = np.asarray(jax.device_get(var.get_value()), np.float32)
        if name == "lm_head.kernel":
            tensors["lm_head.weight"] = np.ascontiguousarray(array.T)
        elif name == "lm_head.bias":
            if np.any(array):
                raise ConfigError("GPT-2's output layer has no bias, and this model's is not zero; "
                                  "it cannot be saved as GPT-2 without changing its logits")
        else:
            tensors[f"transformer.{ours[name]}"] = np.ascontiguousarray(array)
    folder = pathlib.Path(folder).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot save the model into {folder} ({e.strerror or e}): give a folder "
                          "that can be made and written") from None
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def from_pretrained(name_or_folder: str = "gpt2") -> LanguageModel:
    """A GPT-2 checkpoint's folder, or a hub name ("gpt2", ...) fetched with huggingface_hub."""
    folder = pathlib.Path(name_or_folder).expanduser()
    if folder.is_dir():
        return load(folder)
    return load(fetch(name_or_folder))


def fetch(name: str) -> pathlib.Path:
    """The hub's files for `name` in the local Hugging Face cache (downloaded when missing)."""
    import socket
    offline = ("offline, put its config.json, model.safetensors and tokenizer.json in a folder and "
               "pass that folder's path")
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        cached = [try_to_load_from_cache(name, f) for f in (*FILES, "tokenizer.json")]
        if all(isinstance(p, str) for p in cached):
            return pathlib.Path(cached[0]).parent
        socket.create_connection(("huggingface.co", 443), timeout=5).close()   # not minutes of
                                                                               # the hub's retries
        paths = [hf_hub_download(name, f) for f in (*FILES, "tokenizer.json")]
    except OSError as e:
        raise DataError(f"cannot fetch {name!r}: the Hugging Face hub cannot be reached "
                        f"({e.strerror or e}); {offline}") from None
    except Exception as e:          # no such repo, no permission: one line too
        raise DataError(f"cannot fetch {name!r} from the Hugging Face hub "
                        f"({type(e).__name__}); {offline}") from None
    return pathlib.Path(paths[0]).parent


def tokenizer(folder):
    """GPT-2's byte-level BPE from a checkpoint's tokenizer.json, or vocab.json and merges.txt."""
    import tokenizers
    folder = pathlib.Path(folder).expanduser()
    try:
        if (folder / "tokenizer.json").is_file():
            return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            bpe = tokenizers.ByteLevelBPETokenizer(str(folder / "vocab.json"),
                                                   str(folder / "merges.txt"))
            return bpe._tokenizer
    except Exception as e:         # tokenizers raises a bare Exception for a damaged file
        raise DataError(f"cannot read the tokenizer in {folder} "
                        f"({' '.join(str(e).split())[:160]}); download it again") from None
    raise DataError(f"{folder} holds no tokenizer.json (nor vocab.json and merges.txt); download "
                    "the tokenizer too")
