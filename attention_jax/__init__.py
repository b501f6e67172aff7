"""attention_jax: attention and the transformer block, derived from a plain average.

`attention_jax.functional` holds the pure functions (masks, scores, softmax, attention,
positions, norms); `attention_jax.model` composes them into Flax NNX modules driven by
one `ModelConfig`; `attention_jax.train` is the training engine every experiment uses.
"""
from attention_jax import functional
from attention_jax.config import GPT2_SMALL, ModelConfig
from attention_jax.errors import CheckpointError, ConfigError, DataError, UserError
from attention_jax.model import Block, FeedForward, Head, LanguageModel, MultiHeadAttention
from attention_jax.probe import ablate, capture_attention, count_params

__version__ = "0.1.0"

__all__ = ["functional", "ModelConfig", "GPT2_SMALL", "UserError", "ConfigError", "DataError",
           "CheckpointError", "Head", "MultiHeadAttention", "FeedForward", "Block", "LanguageModel",
           "count_params", "capture_attention", "ablate"]
