"""attention_jax: attention and the transformer block, derived from a plain average.

The library in wings, each a folder or a file:
- the equation: `functional` (masks, scores, softmax, attention, positions, norms), `layers`
  (the parts: Dense, LayerNorm, hooks, the mask) and `model` (Flax NNX modules driven by one
  `config.ModelConfig`): the model as built;
- `swap`: select a part and replace it by a twin, the one mechanism beneath the wings below;
- `speed`: faster forms of the same numbers, swapped in; `parameters`: parameter counts;
- `train`: the training engine (one compiled step, N seeds at once); `data`: corpus and batches;
- `decoding`: `generate` and what it runs (loops, key/value cache, weight layout);
- `analysis`: looking inside (`inspect`), patching, edges, circuit discovery, circuits, viewer;
- `pretrained`: GPT-2's weights in these modules; `compiled`: tracr's compiled RASP programs,
  with the circuit each truly is.

The names below load on first use, so `import attention_jax.config` does not pay for
importing JAX (a program can parse its settings into configs first).
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "functional": ("attention_jax.functional", None),
    "ModelConfig": ("attention_jax.config", "ModelConfig"),
    "TrainConfig": ("attention_jax.config", "TrainConfig"),
    "GPT2_SMALL": ("attention_jax.config", "GPT2_SMALL"),
    "UserError": ("attention_jax.errors", "UserError"),
    "ConfigError": ("attention_jax.errors", "ConfigError"),
    "DataError": ("attention_jax.errors", "DataError"),
    "CheckpointError": ("attention_jax.errors", "CheckpointError"),
    "Head": ("attention_jax.model", "Head"),
    "MultiHeadAttention": ("attention_jax.model", "MultiHeadAttention"),
    "FeedForward": ("attention_jax.model", "FeedForward"),
    "Block": ("attention_jax.model", "Block"),
    "LanguageModel": ("attention_jax.model", "LanguageModel"),
    "count_params": ("attention_jax.parameters", "count_params"),
    "param_breakdown": ("attention_jax.parameters", "param_breakdown"),
    "run_with_cache": ("attention_jax.analysis.inspect", "run_with_cache"),
    "fast": ("attention_jax.speed", "fast"),
    "Speed": ("attention_jax.speed", "Speed"),
    "ablate": ("attention_jax.analysis.inspect", "ablate"),
    "generate": ("attention_jax.decoding.generate", "generate"),
    "Decoder": ("attention_jax.decoding.generate", "Decoder"),
    "patched": ("attention_jax.analysis.inspect", "patched"),
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attention_jax' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
