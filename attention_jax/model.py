"""The language model as Flax NNX modules, thin compositions of `attention_jax.functional`.

Reading order follows the architecture: the context mixers (uniform average, one head,
several heads) and the attention they share (score, mask, normalise, mix), the
position-wise feed-forward network, the block that wires them with residuals and
LayerNorm, and the model around it; the parts they are made of (Dense, LayerNorm, hooks,
the mask) are in `attention_jax.layers`. Every variant comes from `ModelConfig`; nothing
here branches on which variant of the chapter it is.

The model as built is the equation: every projection is x·W + b and every attention is
`DotProductAttention`, the functional core's scores, mask, softmax and mix, all its hook
points live, differentiable in forward and reverse mode. `attention_jax.speed.fast` swaps
in faster forms of the same numbers (the training engine and `generate` apply it).
Inspection never edits this code and adds nothing to a training step: each named
intermediate passes through a `Hook`, an identity module, which `attention_jax.analysis.inspect`
swaps for one that records or patches the value (TransformerLens' hook points, done the
penzai way: select a part, replace it, put it back). The causal mask is a part too
(`CausalMask`), so "what if attention could see the future" is a swap, not a flag; a model
that never had the mask (tracr's compiled ones, `ModelConfig.causal=False`) is built with
`Bidirectional` in its place.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from attention_jax import functional as F
from attention_jax.config import ModelConfig
from attention_jax.layers import (  # noqa: F401  (Hook, masks, check_ids: part of the model's API)
    Bidirectional, CausalMask, Dense, Hook, LayerNorm, PositionTable, SinusoidalPositions,
    check_ids, compute_dtype, dropout, embedding_init, projection, TokenEmbed)

# --- context mixers --------------------------------------------------------------------------

class UniformAverage(nnx.Module):
    """Each position becomes the mean of its prefix: attention with every score equal."""

    def __call__(self, x):
        weights = F.uniform_causal_weights(x.shape[-2]).astype(x.dtype)
        return jnp.einsum("TS,...SD->...TD", weights, x)


class DotProductAttention(nnx.Module):
    """softmax(q·kᵀ/√d + bias) under the mask, dropout on the weights, times v: `F.attention`'s
    steps.

    Hook points, each [B, H, T, S]: scores (scaled, plus the ALiBi bias, before the mask) and
    weights (after the softmax, before dropout). `mask` is a part (`CausalMask`), so a mask of
    one's own is a swap; a mask passed in (bool [..., T, S]) stands in for it.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.scale = config.scale
        self.dropout = dropout(config, rngs)
        self.mask = CausalMask() if config.causal else Bidirectional()   # tracr's: no mask
        self.hook_scores, self.hook_weights = Hook(), Hook()

    def __call__(self, q, k, v, *, bias=None, mask=None):   # q [B, H, T, D], k and v [B, H, S, D]
        scores = self.hook_scores(F.attention_scores(q, k, scale=self.scale, bias=bias))
        mask = self.mask(q.shape[-2]) if mask is None else mask
        weights = self.hook_weights(F.masked_softmax(scores, mask))
        return F.mix(weights if self.dropout is None else self.dropout(weights), v)


class _Attention(nnx.Module):
    """A head's three steps: `project` the stream to q, k, v; `_attend` (positions, then
    `attention`); `output` each head's result back to the stream.

    Hook points, each [B, H, T, ·]: q, k, v (after RoPE), z (each head's output); `attention`'s
    own are the scores and weights.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.attention = DotProductAttention(config, rngs=rngs)
        self.hook_q, self.hook_k, self.hook_v, self.hook_z = Hook(), Hook(), Hook(), Hook()

    def __call__(self, x):
        return self.output(self._attend(*self.project(x)))

    def _attend(self, q, k, v, *, positions=None, memory=None):
        """q, k, v [B, H, T, D] -> each head's output z [B, H, T, D]: RoPE, the hooks, `attention`.

        `positions` [..., T]: where the T new positions sit in their text, RoPE's angles (None:
        0 .. T-1). `memory` (decoding's cache, `kv_cache.CachedAttention`): called with the new k
        and v, it keeps them and gives back every key and value it holds [B, H, S, D], which of them
        each query sees (bool [..., T, S]) and the queries' places among the S [T], from which
        ALiBi measures distance. None: the T positions attend to each other alone, by `attention`'s
        own mask. The forward passes neither; decoding passes both, and so runs this very code.
        """
        cfg = self.config
        if cfg.positions == "rope":
            q = F.apply_rope(q, positions, base=cfg.rope_base)
            k = F.apply_rope(k, positions, base=cfg.rope_base)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        k, v, mask, at = (k, v, None, None) if memory is None else memory(k, v)
        bias = F.alibi_bias(q.shape[-3], k.shape[-2], at) if cfg.positions == "alibi" else None
        return self.hook_z(self.attention(q, k, v, bias=bias, mask=mask))


class Head(_Attention):
    """One head of causal self-attention, as the chapter writes it: q, k, v without bias."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, dh = config.d_model, config.d_head_used
        super().__init__(config, rngs=rngs)
        self.q = projection(config, rngs, d, dh, bias=config.qkv_bias)
        self.k = projection(config, rngs, d, dh, bias=config.qkv_bias)
        self.v = projection(config, rngs, d, dh, bias=config.qkv_bias)

    def project(self, x):                                   # [B, T, D] -> q, k, v [B, 1, T, D_head]
        return tuple(p(x)[..., None, :, :] for p in (self.q, self.k, self.v))

    def output(self, z):                                     # [B, 1, T, D_head] -> [B, T, D_head]
        return z[..., 0, :, :]

    def head_weights(self) -> dict:
        """q, k, v [1, D, D_head] and o (None: one head has no output projection)."""
        return {"q": self.q.kernel[...][None], "k": self.k.kernel[...][None],
                "v": self.v.kernel[...][None], "o": None}

    def head_biases(self) -> dict:
        """q, k, v's biases [1, D_head] (zeros without them)."""
        zero = jnp.zeros((1, self.config.d_head_used))
        return {c: zero if p.bias is None else p.bias[...][None]
                for c, p in zip("qkv", (self.q, self.k, self.v))}


class MultiHeadAttention(_Attention):
    """H heads of width D/H side by side (width is divided, not added), then W_o mixes them."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, h, dh = config.d_model, config.heads_used, config.d_head_used
        # One matmul for all heads' q, k and v.
        self.qkv = projection(config, rngs, d, 3 * h * dh, bias=config.qkv_bias)
        self.out = projection(config, rngs, h * dh, d, bias=config.bias)
        super().__init__(config, rngs=rngs)   # after the projections: parameters drawn in order

    def project(self, x):                                   # [B, T, D] -> q, k, v [B, H, T, D_head]
        return tuple(jnp.moveaxis(self.columns(self.qkv(x)), (-3, -2), (0, -3)))

    def output(self, z):                                     # [B, H, T, D_head] -> [B, T, D]
        return self.out(jnp.swapaxes(z, -3, -2).reshape(*z.shape[:-3], z.shape[-2], -1))

    def columns(self, a):
        """The last axis of the qkv product (or of its kernel) as [..., q|k|v, H, D_head]: its
        layout."""
        return a.reshape(*a.shape[:-1], 3, self.config.heads_used, self.config.d_head_used)

    def head_weights(self) -> dict:
        """q, k, v [H, D, D_head] and o [H, D_head, D], read out of the shared kernels."""
        columns = jnp.moveaxis(self.columns(self.qkv.kernel[...]), 1, 0)       # [q|k|v, D, H, d]
        q, k, v = (jnp.moveaxis(w, 1, 0) for w in columns)
        cfg = self.config
        o = self.out.kernel[...].reshape(cfg.heads_used, cfg.d_head_used, cfg.d_model)
        return {"q": q, "k": k, "v": v, "o": o}

    def head_biases(self) -> dict:
        """q, k, v's biases [H, D_head], read out of the shared bias (zeros without one)."""
        b, cfg = self.qkv.bias, self.config
        zeros = jnp.zeros((3, cfg.heads_used, cfg.d_head_used))
        biases = zeros if b is None else self.columns(b[...])
        return dict(zip("qkv", biases))


class FeedForward(nnx.Module):
    """Computation within a position: widen (4× by default), GELU (exact, or GPT-2's tanh form) or
    ReLU (tracr's), narrow back."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.up = projection(config, rngs, config.d_model, config.d_ff, bias=config.bias)
        self.down = projection(config, rngs, config.d_ff, config.d_model, bias=config.bias)
        self.approximate = config.gelu == "tanh"
        self.relu = config.activation == "relu"

    def __call__(self, x):
        h = self.up(x)
        return self.down(jax.nn.relu(h) if self.relu else F.gelu(h, self.approximate))


_MIXERS = {"none": None, "average": lambda c, rngs: UniformAverage(),
           "head": lambda c, rngs: Head(c, rngs=rngs),
           "heads": lambda c, rngs: MultiHeadAttention(c, rngs=rngs)}


class Block(nnx.Module):
    """Mixer then feed-forward, each wrapped as pre-norm `x + f(LN(x))` or post-norm `LN(x + f(x))`.

    A sub-layer that is `None` is skipped, so ablating one is replacing it by None
    (`attention_jax.analysis.inspect.ablate`). Hook points, each [B, T, D]: resid_pre, mixer_in (the
    mixer's input, before its pre-norm), mixer_out (its output, before it is added), resid_mid,
    ffn_in, ffn_out, resid_post. The inputs are where edge patching's receivers read
    (`analysis.edges`): a twin there may hand the sub-layer one input per head.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        make = _MIXERS[config.mixer]
        self.mixer = make(config, rngs) if make else None
        self.ffn = FeedForward(config, rngs=rngs) if config.feed_forward else None
        norm = lambda part: LayerNorm(config.d_model, bias=config.bias, eps=config.ln_eps) \
            if config.layer_norm and part is not None else None
        self.ln1, self.ln2 = norm(self.mixer), norm(self.ffn)
        self.drop = dropout(config, rngs)
        self.hook_resid_pre, self.hook_mixer_in, self.hook_mixer_out = Hook(), Hook(), Hook()
        self.hook_resid_mid, self.hook_ffn_in = Hook(), Hook()
        self.hook_ffn_out, self.hook_resid_post = Hook(), Hook()

    def _sublayer(self, x, f, ln, residual, hook_in, hook_out):
        post = ln is not None and self.config.post_norm
        h = hook_in(x)
        y = f(h if ln is None or post else ln(h))
        if self.drop is not None:
            y = self.drop(y)
        y = hook_out(y)
        x = x + y if residual else y
        return ln(x) if post else x

    def __call__(self, x):
        x = self.hook_resid_pre(x)
        if self.mixer is not None:
            x = self._sublayer(x, self.mixer, self.ln1, self.config.residual, self.hook_mixer_in,
                               self.hook_mixer_out)
        x = self.hook_resid_mid(x)
        if self.ffn is not None:
            x = self._sublayer(x, self.ffn, self.ln2, True, self.hook_ffn_in, self.hook_ffn_out)
        return self.hook_resid_post(x)


class LanguageModel(nnx.Module):
    """tokens [B, T] -> logits [B, T, V]: `embed` (tokens + positions), blocks, `unembed` (final
    norm, output).

    Hook points: embed (the token vectors), positions (the [T, D] position vectors added to
    them, learned or sinusoidal), final (the stream after the last block), ln_final (after
    the final LayerNorm), logits.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d = config.d_model
        self.config = config
        init = embedding_init(config.init)
        self.token_embed = TokenEmbed(config.vocab_size, d, embedding_init=init, rngs=rngs)
        self.position_embed = (
            PositionTable(config.max_positions_used, d, embedding_init=init, rngs=rngs)
            if config.positions == "learned" else
            SinusoidalPositions(d) if config.positions == "sinusoidal" else None)
        self.drop = dropout(config, rngs)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layers)])
        # Pre-norm leaves the residual stream unnormalised, so it gets one LayerNorm at the end.
        self.ln_f = (LayerNorm(d, bias=config.bias, eps=config.ln_eps)
                     if config.layer_norm and config.norm == "pre" else None)
        out = config.output_size_used
        self.lm_head = None if config.tie_embeddings else \
            projection(config, rngs, d, out, bias=config.bias and config.output_bias)
        self.hook_embed, self.hook_positions, self.hook_final = Hook(), Hook(), Hook()
        self.hook_ln_final, self.hook_logits = Hook(), Hook()

    def embed(self, tokens):
        """Token ids [B, T] -> the residual stream's start [B, T, D]: token vectors plus
        positions."""
        cfg, T = self.config, tokens.shape[-1]
        check_ids(tokens, cfg.vocab_size)
        dtype = compute_dtype(cfg)
        x = self.token_embed(tokens)
        x = self.hook_embed(x.astype(dtype or jnp.float32))   # the stream's dtype, not the table's
        if self.position_embed is not None:                   # learned or sinusoidal: added
            x = x + self.hook_positions(self.position_embed.rows(T).astype(x.dtype))
        return x if self.drop is None else self.drop(x)

    def unembed(self, x):
        """The residual stream [B, T, D] -> logits [B, T, V]: final norm (pre-norm models), output
        layer."""
        x = self.hook_final(x)
        if self.ln_f is not None:
            x = self.hook_ln_final(self.ln_f(x))
        if self.lm_head is None:
            return self.hook_logits(self.token_embed.attend(x))
        return self.hook_logits(self.lm_head(x))

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)
