"""GPT-2's own weights in our modules, and ours back out in its format.

    model = from_pretrained("gpt2")              # the hub, when online; or a folder of its files
    bpe = tokenizer("path/to/folder")             # GPT-2's BPE, from the same folder
    save(model, "out/")                            # config.json + model.safetensors, as Hugging Face writes them

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

from attention_jax.config import ModelConfig
from attention_jax.errors import CheckpointError, ConfigError, DataError
from attention_jax.model import LanguageModel

FILES = ("config.json", "model.safetensors")
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "exact"}
# HF name -> ours, per block
BLOCK = {"ln_1.weight": "ln1.scale", "ln_1.bias": "ln1.bias", "attn.c_attn.weight": "mixer.qkv.kernel",
         "attn.c_attn.bias": "mixer.qkv.bias", "attn.c_proj.weight": "mixer.out.kernel",
         "attn.c_proj.bias": "mixer.out.bias", "ln_2.weight": "ln2.scale", "ln_2.bias": "ln2.bias",
         "mlp.c_fc.weight": "ffn.up.kernel", "mlp.c_fc.bias": "ffn.up.bias", "mlp.c_proj.weight": "ffn.down.kernel",
         "mlp.c_proj.bias": "ffn.down.bias"}
TOP = {"wte.weight": "token_embed.embedding", "wpe.weight": "position_embed.embedding", "ln_f.weight": "ln_f.scale",
       "ln_f.bias": "ln_f.bias"}


def config_from_hf(hf: dict) -> ModelConfig:
    """A Hugging Face GPT-2 `config.json` as our ModelConfig; what our modules cannot be is refused."""
    if hf.get("model_type") != "gpt2":
        raise ConfigError(f"config.json describes a {hf.get('model_type')!r} model; this loader reads GPT-2 "
                          "(model_type 'gpt2') checkpoints")
    d, act = hf.get("n_embd", 768), hf.get("activation_function", "gelu_new")
    inner = hf.get("n_inner") or 4 * d
    unsupported = [k for k, bad in (("activation_function", act not in GELU), ("n_inner", inner % d),
                                    ("scale_attn_weights", not hf.get("scale_attn_weights", True)),
                                    ("scale_attn_by_inverse_layer_idx", hf.get("scale_attn_by_inverse_layer_idx")),
                                    ("add_cross_attention", hf.get("add_cross_attention"))) if bad]
    if unsupported:
        raise ConfigError(f"this GPT-2 config sets {', '.join(f'{k}={hf.get(k)!r}' for k in unsupported)}, which our "
                          "modules do not compute; supported: GELU (exact or tanh), n_inner a multiple of n_embd, "
                          "scaled attention")
    positions = hf.get("n_positions", 1024)
    return ModelConfig(vocab_size=hf.get("vocab_size", 50257), context=positions, d_model=d,
                       n_layers=hf.get("n_layer", 12), n_heads=hf.get("n_head", 12), mixer="heads",
                       positions="learned", ff_mult=inner // d, ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                       tie_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=True, bias=True,
                       output_bias=False, gelu=GELU[act], init="gpt2")


def config_to_hf(config: ModelConfig) -> dict:
    """Our ModelConfig as a GPT-2 `config.json`, for a model GPT-2's architecture can hold."""
    gpt2 = dict(mixer="heads", positions="learned", residual=True, feed_forward=True, layer_norm=True, norm="pre",
                scale=True, bias=True, qkv_bias=True)
    differ = [k for k, v in gpt2.items() if getattr(config, k) != v]
    if differ or config.d_head_used * config.n_heads != config.d_model:
        raise ConfigError(f"GPT-2's architecture cannot hold this model ({', '.join(differ) or 'd_head'} differ); "
                          "save a GPT-2-shaped ModelConfig: heads, learned positions, pre-norm, biases")
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config.vocab_size,
            "n_positions": config.max_positions_used, "n_embd": config.d_model, "n_layer": config.n_layers,
            "n_head": config.n_heads, "n_inner": config.d_ff, "layer_norm_epsilon": config.ln_eps,
            "activation_function": "gelu_new" if config.gelu == "tanh" else "gelu",
            "tie_word_embeddings": config.tie_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def _ours(name: str, tied: bool) -> str | None:
    """Our parameter path for a HF tensor name (None: a buffer such as attn.bias, not a weight)."""
    name = name.removeprefix("transformer.")
    if name in TOP:
        return TOP[name]
    if name == "lm_head.weight":
        return None if tied else "lm_head.kernel"
    parts = name.split(".", 2)
    if parts[0] == "h" and len(parts) == 3 and parts[2] in BLOCK:
        return f"blocks.{parts[1]}.{BLOCK[parts[2]]}"
    return None


def load(folder) -> LanguageModel:
    """Our LanguageModel holding the GPT-2 checkpoint in `folder` (config.json, model.safetensors)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    folder = pathlib.Path(folder).expanduser()
    missing = [f for f in FILES if not (folder / f).is_file()]
    if missing:
        raise DataError(f"{folder} holds no {' or '.join(missing)}: a GPT-2 checkpoint is a folder with config.json "
                        "and model.safetensors, as Hugging Face's save_pretrained writes it")
    try:
        config = config_from_hf(json.loads((folder / "config.json").read_text(encoding="utf-8")))
        tensors = load_file(str(folder / "model.safetensors"))
    except (ValueError, OSError, SafetensorError) as e:
        if isinstance(e, ConfigError):
            raise
        raise CheckpointError(f"cannot read the checkpoint in {folder} ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}); download it again") from None
    model = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    wanted = {".".join(map(str, path)): var for path, var in nnx.to_flat_state(state)}
    found = {}
    for name, array in tensors.items():
        ours = _ours(name, config.tie_embeddings)
        if ours is None:
            continue
        array = array.T if ours == "lm_head.kernel" else array            # nn.Linear's [out, in]
        want = wanted.get(ours)
        if want is None or tuple(want.get_value().shape) != array.shape:
            raise CheckpointError(f"tensor {name} {array.shape} does not fit this config's {ours} "
                                  f"{None if want is None else tuple(want.get_value().shape)}: config.json and "
                              "model.safetensors "
                                  "disagree")
        found[ours] = jnp.asarray(array, jnp.float32)
    absent = sorted(set(wanted) - set(found))
    if absent:
        raise CheckpointError(f"model.safetensors in {folder} lacks {', '.join(absent[:4])}"
                              f"{' ...' if len(absent) > 4 else ''}; download it again")
    for name, var in wanted.items():
        var.set_value(found[name])
    nnx.update(model, state)            # restored into the abstract model, as a checkpoint is
    return model


def save(model: LanguageModel, folder) -> pathlib.Path:
    """Write `model` as a GPT-2 checkpoint Hugging Face loads (config.json, model.safetensors)."""
    from safetensors.numpy import save_file
    config = model.config
    hf = config_to_hf(config)
    ours = {v: k for k, v in TOP.items()} | {f"blocks.{i}.{v}": f"h.{i}.{k}" for i in range(config.n_layers)
                                             for k, v in BLOCK.items()}
    tensors = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name = ".".join(map(str, path))
        array = np.asarray(jax.device_get(var.get_value()), np.float32)
        if name == "lm_head.kernel":
            tensors["lm_head.weight"] = np.ascontiguousarray(array.T)
        elif name == "lm_head.bias":
            if np.any(array):
                raise ConfigError("GPT-2's output layer has no bias, and this model's is not zero; it cannot be saved "
                                  "as GPT-2 without changing its logits")
        else:
            tensors[f"transformer.{ours[name]}"] = np.ascontiguousarray(array)
    folder = pathlib.Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def from_pretrained(name_or_folder: str = "gpt2") -> LanguageModel:
    """A folder of a GPT-2 checkpoint, or a hub name ("gpt2", "gpt2-medium", ...) fetched with huggingface_hub."""
    folder = pathlib.Path(name_or_folder).expanduser()
    if folder.is_dir():
        return load(folder)
    return load(fetch(name_or_folder))


def fetch(name: str) -> pathlib.Path:
    """The hub's files for `name` in the local Hugging Face cache (downloaded when missing)."""
    import socket
    offline = ("offline, put its config.json, model.safetensors and tokenizer.json in a folder and pass that "
               "folder's path")
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        cached = [try_to_load_from_cache(name, f) for f in (*FILES, "tokenizer.json")]
        if all(isinstance(p, str) for p in cached):
            return pathlib.Path(cached[0]).parent
        socket.create_connection(("huggingface.co", 443), timeout=5).close()   # not minutes of the hub's retries
        paths = [hf_hub_download(name, f) for f in (*FILES, "tokenizer.json")]
    except OSError as e:
        raise DataError(f"cannot fetch {name!r}: the Hugging Face hub cannot be reached ({e.strerror or e}); "
                        f"{offline}") from None
    except Exception as e:          # no such repo, no permission: one line too
        raise DataError(f"cannot fetch {name!r} from the Hugging Face hub ({type(e).__name__}); {offline}") from None
    return pathlib.Path(paths[0]).parent


def tokenizer(folder):
    """GPT-2's byte-level BPE from a checkpoint folder: tokenizer.json, or vocab.json and merges.txt."""
    import tokenizers
    folder = pathlib.Path(folder).expanduser()
    if (folder / "tokenizer.json").is_file():
        return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        bpe = tokenizers.ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
        return bpe._tokenizer
    raise DataError(f"{folder} holds no tokenizer.json (nor vocab.json and merges.txt); download the tokenizer too")
