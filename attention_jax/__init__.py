"""attention_jax: attention and the transformer block, derived from a plain average.

`attention_jax.functional` holds the pure functions (masks, scores, softmax, attention,
positions, norms); `attention_jax.model` composes them into Flax NNX modules driven by one
`ModelConfig`: the model as built is the equation. `attention_jax.speed` swaps in faster
forms of the same numbers; `attention_jax.inspect` looks inside the model, and
`attention_jax.patching` and `attention_jax.circuits` take it apart (patching sweeps, the
Mathematical Framework's circuits);
`attention_jax.train` is the training engine (one compiled step, N seeds at once);
`attention_jax.generate` writes text with a trained model.

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
    "count_params": ("attention_jax.inspect", "count_params"),
    "run_with_cache": ("attention_jax.inspect", "run_with_cache"),
    "fast": ("attention_jax.speed", "fast"),
    "Speed": ("attention_jax.speed", "Speed"),
    "ablate": ("attention_jax.inspect", "ablate"),
    "generate": ("attention_jax.generate", "generate"),
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
