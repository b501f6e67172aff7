"""Looking inside a model without editing it: parameter counts, attention maps, ablations."""
from __future__ import annotations

import contextlib
from typing import Iterable

import jax
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.model import Head, LanguageModel, MultiHeadAttention


def count_params(config: ModelConfig) -> int:
    """Trainable parameters, counted from abstract shapes: GPT-2 small costs no memory."""
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


def _attention_modules(model):
    return [m for _, m in nnx.iter_modules(model) if isinstance(m, (Head, MultiHeadAttention))]


def capture_attention(model: LanguageModel, tokens) -> tuple[jax.Array, list[jax.Array]]:
    """Run the model once and return (logits, [weights of each block, [B, H, T, T]])."""
    modules = _attention_modules(model)
    before = [m.sow_weights for m in modules]
    for m in modules:
        m.sow_weights = True
    try:
        logits, sown = nnx.capture(model, nnx.Intermediate)(tokens)
    finally:
        for m, flag in zip(modules, before):
            m.sow_weights = flag
    maps = []
    for i in range(len(model.blocks)):   # blocks without attention (none/average) sow nothing
        try:
            sown_value = sown["blocks"][i]["mixer"]["attention_weights"]
        except KeyError:
            continue
        maps.append(sown_value.get_value()[0])   # sow keeps a tuple of the calls' values
    return logits, maps


@contextlib.contextmanager
def ablate(model: LanguageModel, *, mixer: Iterable[int] = (), feed_forward: Iterable[int] = ()):
    """Switch off the attention (`mixer`) or MLP (`feed_forward`) of the listed blocks, then restore."""
    changed = []   # (block, switch, value before), restored in reverse so nesting works
    for part, layers in (("use_mixer", mixer), ("use_ffn", feed_forward)):
        for i in layers:
            changed.append((model.blocks[i], part, getattr(model.blocks[i], part)))
            setattr(model.blocks[i], part, False)
    try:
        yield model
    finally:
        for block, part, value in reversed(changed):
            setattr(block, part, value)
