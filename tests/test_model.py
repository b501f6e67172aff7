"""The Flax modules: parity with torch twins, causality by gradients, equivariance, switches."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import functional as F
from attention_jax.config import MIXERS, POSITIONS, ModelConfig
from attention_jax.analysis.inspect import Record, replaced
from attention_jax.model import (Bidirectional, Block, CausalMask, FeedForward, Head, LanguageModel,
                                 MultiHeadAttention, UniformAverage)

from helpers import forward

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4)
B, T = 2, 8


def config(**kw):
    return dataclasses.replace(TINY, **kw)


def randomize(module, seed=0, std=0.3):
    """Replace every parameter (biases and LayerNorm affine too) by N(0, std²): nothing stays 0 or 1.
    Drawn by numpy: a jax draw compiles a program for each parameter shape."""
    leaves, treedef = jax.tree.flatten(nnx.state(module, nnx.Param))
    rng = np.random.default_rng(seed)
    nnx.update(module, jax.tree.unflatten(treedef, [jnp.asarray(std * rng.standard_normal(x.shape), jnp.float32)
                                                    for x in leaves]))
    return module


def tokens(seed=0, shape=(B, T), vocab=50):
    return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)


def hidden(seed=0, shape=(B, T, 32)):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.fixture(scope="module")
def twin(torch):
    """The torch twins (experiments/torch_ref.py): with the oracle installed, else the test skips. A module
    first imported while another test hid torch has no twins: imported again."""
    import importlib
    from experiments import torch_ref
    return torch_ref if torch_ref.torch is not None else importlib.reload(torch_ref)


def future(torch):
    return torch.ones(T, T, dtype=torch.bool).triu(1)                  # torch MHA: True = may NOT attend


@pytest.mark.slow
@pytest.mark.parametrize("qkv_bias, bias", [(True, True), (False, False), (False, True)])
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_multi_head_attention_matches_torch_multihead_attention(qkv_bias, bias, mask_kind, parity, torch, twin):
    mha = randomize(MultiHeadAttention(config(qkv_bias=qkv_bias, bias=bias), rngs=nnx.Rngs(0)))
    mask = future(torch) if mask_kind == "bool" else torch.zeros(T, T).masked_fill(future(torch), float("-inf"))
    x = twin.as_torch(hidden())
    theirs, _ = twin.torch_mha(mha)(x, x, x, attn_mask=mask, need_weights=False)
    parity(f"MultiHeadAttention vs torch MHA (qkv_bias={qkv_bias}, bias={bias}, {mask_kind} mask)", mha(hidden()),
           theirs)


@pytest.mark.slow
def test_sown_attention_weights_match_torch_per_head_weights(parity, torch, twin):
    mha = randomize(MultiHeadAttention(config(qkv_bias=True), rngs=nnx.Rngs(0)))
    x = hidden()
    # the hook point swapped for a recorder: the model as built computes the weights
    with replaced(mha, {"attention.hook_weights": Record()}):
        _, sown = nnx.capture(mha, nnx.Intermediate)(x)
    weights = sown["attention"]["hook_weights"]["value"].get_value()[0]   # sow keeps a tuple of the calls' values
    t = twin.as_torch(x)
    _, theirs = twin.torch_mha(mha)(t, t, t, attn_mask=future(torch), need_weights=True, average_attn_weights=False)
    chex.assert_shape(weights, (B, 4, T, T))
    parity("sown attention weights vs torch MHA per-head weights", weights, theirs)


@pytest.mark.slow
def test_pre_norm_block_matches_torch_twin(parity, twin):
    block = randomize(Block(config(qkv_bias=True), rngs=nnx.Rngs(0)))
    x = hidden()
    theirs = twin.TwinBlock(config(qkv_bias=True)).load(block)(twin.as_torch(x))
    parity("pre-norm Block vs torch twin", block(x), theirs)


@pytest.mark.parametrize("tied, qkv_bias", [(False, False), (True, True)], ids=["untied", "tied_gpt2_style"])
def test_language_model_logits_match_torch_twin(tied, qkv_bias, parity, torch, twin):
    cfg = config(tie_embeddings=tied, qkv_bias=qkv_bias)
    model = randomize(LanguageModel(cfg, rngs=nnx.Rngs(0)))
    if tied:
        assert model.lm_head is None
    idx = tokens()
    theirs = twin.TwinLM(cfg).load(model)(torch.from_numpy(np.array(idx)).long())
    logits = model(idx)
    chex.assert_shape(logits, (B, T, 50))
    parity(f"LanguageModel vs torch twin ({'tied' if tied else 'untied'})", logits, theirs)


# --- causality and order --------------------------------------------------------------------

def embed(model, idx):
    """What LanguageModel.__call__ does before the blocks."""
    x = model.token_embed(idx)
    if model.config.positions == "learned":
        x = x + model.position_embed.embedding[: idx.shape[-1]]
    elif model.config.positions == "sinusoidal":
        x = x + F.sinusoidal_positions(idx.shape[-1], model.config.d_model)
    return x


def logits_from_embeddings(model, x):
    """What LanguageModel.__call__ does after the embeddings."""
    for block in model.blocks:
        x = block(x)
    if model.ln_f is not None:
        x = model.ln_f(x)
    return x @ model.token_embed.embedding[...].T if model.lm_head is None else model.lm_head(x)


# --- the model as built is the equation: every mode of differentiation goes through it ---------

def as_function(model):
    """The model as a pure function of its parameters (and tokens), for jax's transforms."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return (lambda p, idx: nnx.merge(graphdef, p, rest)(idx)), params


def test_forward_mode_jvp_goes_through_the_language_model_and_agrees_with_reverse_mode():
    """jax.jvp through every layer (a custom_vjp anywhere would refuse it), its tangent equal to the
    vector-Jacobian product taken by reverse mode: <J·t, c> = <t, Jᵀ·c>."""
    f, params = as_function(LanguageModel(config(positions="rope"), rngs=nnx.Rngs(0)))
    idx = tokens()
    tangent = jax.tree.map(lambda a: jnp.asarray(np.random.default_rng(a.size).standard_normal(a.shape), a.dtype),
                           params)
    out, jt = jax.jit(lambda p, t: jax.jvp(lambda q: f(q, idx), (p,), (t,)))(params, tangent)
    chex.assert_trees_all_close(out, f(params, idx), atol=1e-6)
    c = jnp.asarray(np.random.default_rng(1).standard_normal(out.shape), jnp.float32)
    jtc = jax.jit(jax.grad(lambda p: jnp.vdot(f(p, idx), c)))(params)
    lhs, rhs = float(jnp.vdot(jt, c)), sum(float(jnp.vdot(a, b)) for a, b in zip(jax.tree.leaves(tangent),
                                                                                  jax.tree.leaves(jtc)))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-4)


def test_jacfwd_and_jacrev_through_the_language_model_agree():
    """The logits' Jacobian in one embedding row, by forward and by reverse mode: the same matrix."""
    model = LanguageModel(config(n_layers=1), rngs=nnx.Rngs(0))
    idx = tokens(shape=(1, T))
    x = embed(model, idx)

    def last_logits(row):                      # the last position's logits as a function of position 2's vector
        return logits_from_embeddings(model, x.at[0, 2].set(row))[0, -1]
    fwd = jax.jit(jax.jacfwd(last_logits))(x[0, 2])
    rev = jax.jit(jax.jacrev(last_logits))(x[0, 2])
    chex.assert_shape(fwd, (50, 32))
    chex.assert_trees_all_close(fwd, rev, atol=1e-5)
    assert float(jnp.abs(fwd).max()) > 0


# Every kind of positions (POSITIONS); the fast tier (-m "not slow") checks RoPE's, which acts inside attention.
@pytest.mark.parametrize("positions", [p if p == "rope" else pytest.param(p, marks=pytest.mark.slow)
                                       for p in POSITIONS])
def test_no_position_gets_gradient_from_a_later_position(positions):
    model = randomize(LanguageModel(config(positions=positions), rngs=nnx.Rngs(0)), std=0.2)
    idx = tokens(shape=(1, T))
    x = embed(model, idx)[0]
    chex.assert_trees_all_close(logits_from_embeddings(model, x[None]), model(idx), atol=1e-6)
    # loss[t] = <logits[t], a random direction>;  J[t, s, d] = d loss[t] / d x[s, d]
    probe = jax.random.normal(jax.random.key(0), (T, 50))
    loss = lambda x: jnp.sum(logits_from_embeddings(model, x[None])[0] * probe, -1)
    # Runs once, so compile without optimisation: same numbers, a fraction of the compile time.
    jac = jax.jit(jax.jacobian(loss), compiler_options={"xla_backend_optimization_level": 0})(x)
    chex.assert_shape(jac, (T, T, 32))
    reach = np.abs(np.asarray(jac)).max(axis=-1)                         # [t, s]
    assert np.all(reach[np.triu_indices(T, k=1)] == 0.0), "a later position leaks into an earlier one"
    assert np.all(reach[np.tril_indices(T)] > 0.0), "every earlier position should matter"


@pytest.mark.slow
def test_without_positions_one_causal_layer_leaves_the_last_output_blind_to_earlier_order():
    # One layer only: with two, earlier positions' outputs (prefix-dependent) carry the order upwards.
    model = randomize(LanguageModel(config(positions="none", n_layers=1), rngs=nnx.Rngs(0)), std=0.2)
    idx = jnp.arange(T)[None] + 3
    shuffled = jnp.concatenate([idx[:, :-1][:, np.random.default_rng(0).permutation(T - 1)], idx[:, -1:]], -1)
    chex.assert_trees_all_close(model(shuffled)[:, -1], model(idx)[:, -1], atol=1e-5)


def test_learned_positions_make_the_order_of_earlier_tokens_visible():
    model = randomize(LanguageModel(config(positions="learned", n_layers=1), rngs=nnx.Rngs(0)), std=0.2)
    idx = jnp.arange(T)[None] + 3
    shuffled = jnp.concatenate([idx[:, :-1][:, ::-1], idx[:, -1:]], -1)
    assert np.abs(model(shuffled)[:, -1] - model(idx)[:, -1]).max() > 1e-3


# --- variants ---------------------------------------------------------------------------------

VALID = [(m, p) for m in MIXERS for p in POSITIONS if not (p in ("rope", "alibi") and m in ("none", "average"))]


@pytest.mark.slow
@pytest.mark.parametrize("mixer, positions", VALID)
def test_every_mixer_and_positions_combination_runs(mixer, positions):
    logits = LanguageModel(config(mixer=mixer, positions=positions), rngs=nnx.Rngs(0))(tokens())
    chex.assert_shape(logits, (B, T, 50))
    chex.assert_tree_all_finite(logits)


def test_post_norm_differs_from_pre_norm():
    idx = tokens()
    pre = LanguageModel(config(norm="pre"), rngs=nnx.Rngs(0))(idx)
    post = LanguageModel(config(norm="post"), rngs=nnx.Rngs(0))(idx)
    assert np.abs(pre - post).max() > 1e-3


def test_post_norm_block_outputs_normalised_vectors_and_pre_norm_does_not():
    x = 3.0 * hidden() + 1.0
    post, pre = Block(config(norm="post"), rngs=nnx.Rngs(0))(x), Block(config(norm="pre"), rngs=nnx.Rngs(0))(x)
    chex.assert_trees_all_close(post.mean(-1), jnp.zeros((B, T)), atol=1e-5)
    chex.assert_trees_all_close(post.var(-1), jnp.ones((B, T)), atol=1e-3)
    assert np.abs(pre.mean(-1)).max() > 0.1


def test_switching_off_both_sublayers_makes_a_block_the_identity():
    block = randomize(Block(TINY, rngs=nnx.Rngs(0)))
    x = hidden()
    with replaced(block, {"mixer": None, "ffn": None}):
        chex.assert_trees_all_close(block(x), x, atol=0)


def test_switching_off_the_mixer_leaves_only_the_feed_forward_sublayer():
    block = randomize(Block(TINY, rngs=nnx.Rngs(0)))
    x = hidden()
    with replaced(block, {"mixer": None}):
        chex.assert_trees_all_close(block(x), x + block.ffn(block.ln2(x)), atol=1e-6)


def test_without_residual_the_mixer_output_replaces_the_stream():
    block = randomize(Block(config(residual=False, feed_forward=False), rngs=nnx.Rngs(0)))
    x = hidden()
    chex.assert_trees_all_close(block(x), block.mixer(block.ln1(x)), atol=1e-6)


def test_average_mixer_adds_the_prefix_mean():
    block = Block(config(mixer="average", feed_forward=False, layer_norm=False), rngs=nnx.Rngs(0))
    assert isinstance(block.mixer, UniformAverage)
    x = hidden()
    prefix_mean = jnp.cumsum(x, axis=1) / jnp.arange(1, T + 1)[:, None]
    chex.assert_trees_all_close(block(x), x + prefix_mean, atol=1e-5)


@pytest.mark.slow
def test_head_is_causal_attention_on_its_projections():
    head = randomize(Head(config(mixer="head"), rngs=nnx.Rngs(0)))
    x = hidden()
    q, k, v = (x @ p.kernel[...] for p in (head.q, head.k, head.v))
    chex.assert_shape(head(x), (B, T, 32))
    chex.assert_trees_all_close(head(x), F.attention(q, k, v, mask=F.causal_mask(T)), atol=1e-5)


def test_unscaled_scores_equal_scaled_ones_with_queries_grown_by_sqrt_d_head():
    unscaled = randomize(MultiHeadAttention(config(scale=False), rngs=nnx.Rngs(0)))
    scaled = randomize(MultiHeadAttention(config(scale=True), rngs=nnx.Rngs(0)))
    kernel = scaled.qkv.kernel[...]
    scaled.qkv.kernel[...] = kernel.at[:, :32].multiply(np.sqrt(TINY.d_head_used))   # the q columns
    x = hidden()
    chex.assert_trees_all_close(scaled(x), unscaled(x), atol=1e-5)
    assert np.abs(unscaled(x) - randomize(MultiHeadAttention(TINY, rngs=nnx.Rngs(0)))(x)).max() > 1e-3


@pytest.mark.slow
def test_dropout_is_random_in_train_mode_and_deterministic_after_eval():
    model = LanguageModel(config(dropout=0.2), rngs=nnx.Rngs(0))
    idx = tokens()
    assert np.abs(model(idx) - model(idx)).max() > 1e-4
    model.eval()
    chex.assert_trees_all_close(model(idx), model(idx), atol=0)


# --- mixed precision ------------------------------------------------------------------------

@pytest.mark.slow      # the fast tier has test_layers' compute dtype and test_functional's half precision
def test_bfloat16_computes_in_half_precision_and_keeps_float32_parameters():
    cfg = config(dtype="bfloat16")
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    f32 = LanguageModel(config(), rngs=nnx.Rngs(0))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    logits = forward(model, tokens())
    assert logits.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(logits.astype(jnp.float32))))
    # the same weights: bfloat16 rounds to ~3 significant digits, no more
    np.testing.assert_allclose(np.asarray(logits, np.float32), np.asarray(forward(f32, tokens())), atol=0.15, rtol=0.05)
    grads = nnx.jit(nnx.grad(lambda m: jnp.mean(m(tokens()).astype(jnp.float32))))(model)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(nnx.state(grads, nnx.Param)))


@pytest.mark.parametrize("mixer", ["head", "heads"])
@pytest.mark.parametrize("qkv_bias", [True, False])
def test_each_attention_says_its_biases_what_a_zero_stream_projects_to(mixer, qkv_bias):
    cfg = ModelConfig(vocab_size=11, context=4, d_model=8, n_heads=2 if mixer == "heads" else 1, mixer=mixer,
                      qkv_bias=qkv_bias)
    attention = LanguageModel(cfg, rngs=nnx.Rngs(0)).blocks[0].mixer
    for p, m in nnx.iter_modules(attention):
        if getattr(m, "bias", None) is not None:
            m.bias[...] = jax.random.normal(jax.random.key(len(p)), m.bias.shape)
    projected = attention.project(jnp.zeros((1, 3, 8)))                 # q, k, v: [1, H, 3, D_head]
    for c, p in zip("qkv", projected):
        np.testing.assert_array_equal(np.asarray(attention.head_biases()[c]), np.asarray(p[0, :, 0]))
    assert bool(jnp.any(attention.head_biases()["v"] != 0)) == qkv_bias


@pytest.mark.parametrize("positions", ["rope", "alibi", "learned"])
def test_attend_takes_positions_and_a_memory_and_without_them_is_the_forward(positions):
    """`_attend`'s two arguments, as decoding passes them: the default positions and a memory that
    holds only the new keys under the causal mask are the forward's numbers; positions spread
    apart move RoPE's output (and nothing else's); a memory that hides every earlier key leaves
    each query its own value."""
    cfg = ModelConfig(vocab_size=16, context=6, d_model=16, n_heads=2, positions=positions)
    mixer = MultiHeadAttention(cfg, rngs=nnx.Rngs(0))
    q, k, v = mixer.project(jax.random.normal(jax.random.key(1), (2, 6, 16)))
    T, causal = 6, jnp.tril(jnp.ones((6, 6), bool))
    plain = mixer._attend(q, k, v)
    np.testing.assert_allclose(mixer._attend(q, k, v, positions=jnp.arange(T),
                                             memory=lambda k, v: (k, v, causal, jnp.arange(T))), plain, atol=1e-6)
    spread = mixer._attend(q, k, v, positions=3 * jnp.arange(T))
    assert (float(jnp.abs(spread - plain).max()) > 1e-3) == (positions == "rope")
    alone = mixer._attend(q, k, v, memory=lambda k, v: (k, v, jnp.eye(T, dtype=bool), jnp.arange(T)))
    np.testing.assert_allclose(alone, v, atol=1e-6)


# --- what tracr's compiled models need (attention_jax.compiled), against numbers made here ------

def test_without_the_causal_mask_each_head_is_the_unmasked_softmax_and_sees_the_future():
    """causal=False (tracr's attention): the mask part is `Bidirectional`, the heads' output is
    softmax(q·kᵀ/√d)·v over every position then W_o, in NumPy; an earlier output moves with a later
    token."""
    mha = randomize(MultiHeadAttention(config(causal=False, qkv_bias=True), rngs=nnx.Rngs(0)))
    assert isinstance(mha.attention.mask, Bidirectional) and isinstance(
        MultiHeadAttention(TINY, rngs=nnx.Rngs(0)).attention.mask, CausalMask)
    x = np.asarray(hidden(), np.float64)
    qkv = x @ np.asarray(mha.qkv.kernel[...]) + np.asarray(mha.qkv.bias[...])
    q, k, v = np.moveaxis(qkv.reshape(B, T, 3, 4, 8), (2, 3), (0, 2))      # each [B, H, T, D_head]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    z = (weights / weights.sum(-1, keepdims=True)) @ v
    out = (np.asarray(mha.out.kernel[...]), np.asarray(mha.out.bias[...]))
    want = np.swapaxes(z, 1, 2).reshape(B, T, 32) @ out[0] + out[1]
    np.testing.assert_allclose(np.asarray(mha(hidden())), want, atol=1e-5)
    model = LanguageModel(config(causal=False), rngs=nnx.Rngs(0))
    idx = tokens(shape=(1, T))
    later = idx.at[0, -1].set((idx[0, -1] + 1) % 50)
    assert float(jnp.abs(model(later)[0, 0] - model(idx)[0, 0]).max()) > 1e-4


def test_relu_feed_forward_of_its_own_width_is_relu_between_its_two_products():
    ffn = randomize(FeedForward(config(activation="relu", ff_width=24), rngs=nnx.Rngs(0)))
    assert ffn.up.kernel.shape == (32, 24) and ffn.down.kernel.shape == (24, 32)
    x = np.asarray(hidden(), np.float64)
    (w1, b1), (w2, b2) = ((np.asarray(p.kernel[...]), np.asarray(p.bias[...]))
                          for p in (ffn.up, ffn.down))
    want = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    np.testing.assert_allclose(np.asarray(ffn(hidden())), want, atol=1e-5)


def test_an_output_size_of_its_own_is_the_output_layer_s_width():
    model = randomize(LanguageModel(config(output_size=7), rngs=nnx.Rngs(0)))
    assert model.lm_head.kernel.shape == (32, 7) and model.token_embed.embedding.shape == (50, 32)
    idx = tokens()
    x = model.embed(idx)
    for block in model.blocks:
        x = block(x)
    head = model.lm_head
    want = np.asarray(model.ln_f(x)) @ np.asarray(head.kernel[...]) + np.asarray(head.bias[...])
    np.testing.assert_allclose(np.asarray(model(idx)), want, atol=1e-5)
