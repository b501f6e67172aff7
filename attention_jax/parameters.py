"""How many parameters a model has, counted from abstract shapes: GPT-2 small costs no memory.

    count_params(config)            # 124,439,808 for GPT2_SMALL
    param_breakdown(config)         # {"token_embed": ..., "blocks": ..., ...}

Its own room, below the training engine (which sizes its memory by it) and the analyses.
"""
from __future__ import annotations

import jax
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.model import LanguageModel


def count_params(config: ModelConfig) -> int:
    """Trainable parameters, counted from abstract shapes."""
    abstract = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def param_breakdown(model_or_config) -> dict[str, int]:
    """Parameters per top-level part of a model, a config (whole model) or any abstract module."""
    model = model_or_config
    if isinstance(model, ModelConfig):
        model = nnx.eval_shape(lambda: LanguageModel(model_or_config, rngs=nnx.Rngs(0)))
    counts: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        top = str(getattr(path[0], "key", path[0]))
        counts[top] = counts.get(top, 0) + leaf.size
    return counts
