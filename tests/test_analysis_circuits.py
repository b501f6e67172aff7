"""attention_jax.analysis.circuits: factored matrices give the full matrices' products, norms and eigenvalues; the
direct logit attribution adds up to the logit difference; what the analyses cannot mean is refused;
and composition scores, OV eigenvalues and attributions equal TransformerLens' on the same weights."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.analysis import circuits as C
from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError, DataError
from attention_jax.model import LanguageModel
from attention_jax.analysis.patching import logit_diff

from helpers import oracle, tiny_gpt2, tl_bridge

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=3, n_heads=4)


@pytest.fixture(scope="module")
def model():
    return LanguageModel(TINY, rngs=nnx.Rngs(0))


def test_a_factored_matrix_is_its_product_in_every_operation():
    k = jax.random.split(jax.random.key(0), 4)
    f = C.Factored(jax.random.normal(k[0], (2, 9, 3)), jax.random.normal(k[1], (2, 3, 9)))
    g = C.Factored(jax.random.normal(k[2], (2, 9, 3)), jax.random.normal(k[3], (2, 3, 9)))
    full = np.asarray(f.full())
    assert f.shape == (2, 9, 9) and f.T.shape == (2, 9, 9)
    np.testing.assert_allclose(f.T.full(), np.swapaxes(full, -1, -2), atol=1e-5)
    np.testing.assert_allclose((f @ g).full(), full @ np.asarray(g.full()), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(f.norm(), np.linalg.norm(full, axis=(-2, -1)), rtol=1e-5)
    lam = np.sort_complex(f.eigenvalues()[0])
    big = np.linalg.eigvals(full[0].astype(np.float64))
    big = np.sort_complex(big[np.argsort(-np.abs(big))[:3]])        # rank 3: the others are zero
    np.testing.assert_allclose(lam, big, rtol=1e-4, atol=1e-4)
    with pytest.raises(ConfigError, match="square"):
        C.Factored(jnp.ones((4, 2)), jnp.ones((2, 5))).eigenvalues()


def test_the_circuits_are_the_heads_weights(model):
    from attention_jax.analysis.inspect import head_weights
    w = head_weights(model, 1)
    np.testing.assert_allclose(C.qk(model).full()[1, 2], w["q"][2] @ w["k"][2].T, atol=1e-6)
    np.testing.assert_allclose(C.ov(model).full()[1, 2], w["v"][2] @ w["o"][2], atol=1e-6)
    e, u = model.token_embed.embedding[...], model.lm_head.kernel[...]
    np.testing.assert_allclose(C.full_ov(model).full()[1, 2], e @ w["v"][2] @ w["o"][2] @ u, atol=1e-4)
    assert C.full_qk(model).shape == (3, 4, 50, 50) and C.copying_scores(model).shape == (3, 4)


def test_composition_scores_are_zero_unless_the_second_head_is_later_and_random_ones_sit_at_the_baseline(model):
    for kind in "QKV":
        s = C.composition_scores(model, kind)
        assert s.shape == (3, 4, 3, 4) and np.all(s[1, :, :2] == 0) and np.all(s[2] == 0)
        assert np.all(s[0, :, 1:] > 0)
    mean, std = C.composition_baseline(32, 8, samples=500)
    # an untrained model's heads are unrelated: their scores scatter around the baseline of random matrices
    s = C.composition_scores(model, "V")[0, :, 1:].ravel()
    assert abs(s.mean() - mean) < 3 * std and 0 < std < mean < 1


def test_a_copying_head_scores_near_one_and_an_anti_copying_head_near_minus_one(model):
    """W_V W_O = ± W_E⁺-like: the OV circuit of a head that writes back each token's own unembedding."""
    m = LanguageModel(dataclasses.replace(TINY, n_layers=1, tie_embeddings=True), rngs=nnx.Rngs(0))
    qkv = m.blocks[0].mixer.qkv.kernel
    e = m.token_embed.embedding[...]                                    # [V, D]; W_U = Eᵀ when tied
    basis = jnp.linalg.qr(e.T @ e)[0][:, :8]                            # 8 directions of the tokens' span
    cols = m.blocks[0].mixer.columns(qkv[...])                          # [D, 3, H, D_head]
    m.blocks[0].mixer.qkv.kernel[...] = cols.at[:, 2, 0].set(basis).at[:, 2, 1].set(-basis).reshape(qkv.shape)
    out = m.blocks[0].mixer.out.kernel
    m.blocks[0].mixer.out.kernel[...] = out[...].reshape(4, 8, 32).at[0].set(basis.T).at[1].set(basis.T).reshape(32, 32)
    score = C.copying_scores(m)[0]
    assert score[0] > 0.99 and score[1] < -0.99


def test_direct_logit_attribution_adds_up_to_the_logit_difference(model):
    tokens = np.random.default_rng(0).integers(0, 50, (3, 8))
    parts = C.direct_logit_attribution(model, tokens, 3, 4)
    assert parts.labels == ("embed", "positions", "0.mixer_out", "0.ffn_out", "1.mixer_out", "1.ffn_out",
                            "2.mixer_out", "2.ffn_out")
    w, b = model.lm_head.kernel[...], model.lm_head.bias[...]
    shift = float(model.ln_f.bias[...] @ (w[:, 3] - w[:, 4]) + b[3] - b[4])    # the LayerNorm's shift, the bias
    total = float(logit_diff(model(jnp.asarray(tokens)), 3, 4))
    assert parts.values.sum() + shift == pytest.approx(total, abs=1e-4)
    heads = C.direct_logit_attribution(model, tokens, 3, 4, by="head")
    for i in range(3):            # a block's heads and W_O's bias make its attention output's share
        bias = C.direct_logit_attribution(model, tokens, 3, 4)     # (same run: the bias is the difference)
        assert heads.values[i].sum() == pytest.approx(bias.values[2 + 2 * i] - _bias_share(model, tokens, i),
                                                      abs=1e-4)


def _bias_share(model, tokens, block):
    """The biases a block's heads add whatever they attend to, through the frozen final LayerNorm."""
    _, cache = __import__("attention_jax.analysis.inspect", fromlist=["run_with_cache"]).run_with_cache(
        model, jnp.asarray(tokens), ["final"])
    final = cache["final"][:, -1]
    scale = jnp.sqrt(jnp.var(final, axis=-1, keepdims=True) + model.config.ln_eps)
    mixer = model.blocks[block].mixer                                   # W_O's bias, and the value bias through W_O
    b = mixer.out.bias[...] + jnp.einsum("Hd,HdD->D", C.value_bias(model, block), mixer.head_weights()["o"])
    w = model.lm_head.kernel[...]
    return float(jnp.mean(jnp.sum((b - b.mean()) / scale * model.ln_f.scale[...] * (w[:, 3] - w[:, 4]), -1)))


@pytest.mark.parametrize("change, call, match", [
    ({"positions": "rope"}, lambda m: C.qk(m), "rotates queries and keys"),
    ({"positions": "rope"}, lambda m: C.composition_scores(m, "K"), "rotates queries and keys"),
    ({"norm": "post"}, lambda m: C.composition_scores(m, "V"), "post-norm model normalises the stream"),
    ({"norm": "post"}, lambda m: C.direct_logit_attribution(m, np.zeros((1, 8), int), 1, 2), "post-norm"),
    ({"mixer": "average"}, lambda m: C.ov(m), "attention in every block"),
    ({}, lambda m: C.composition_scores(m, "X"), "kind='X'"),
    # residual=False: each block replaces the stream; its parts added up gave -2.94 for a logit difference of -0.91
    ({"residual": False}, lambda m: C.direct_logit_attribution(m, np.zeros((1, 8), int), 1, 2), "residual=False"),
    ({}, lambda m: C.direct_logit_attribution(m, np.zeros((1, 8), int), 50, 2), "token id 50 is outside"),
    ({}, lambda m: C.direct_logit_attribution(m, np.zeros((2, 8), int), [1, 2, 3], 2),
     r"answer has shape \(3,\), and the batch holds 2"),
    ({}, lambda m: C.direct_logit_attribution(m, np.zeros((1, 8)), 1, 2), "token ids must be integers, got float64"),
    ({}, lambda m: C.direct_logit_attribution(m, np.zeros((1, 0), int), 1, 2), r"tokens must be \[B, T\]"),
])
def test_what_an_analysis_does_not_mean_for_a_model_is_refused_in_one_line(change, call, match):
    m = LanguageModel(dataclasses.replace(TINY, **change), rngs=nnx.Rngs(0))
    with pytest.raises((ConfigError, DataError), match=match) as info:
        call(m)
    assert "\n" not in str(info.value)
    if change == {"positions": "rope"}:
        assert C.ov(m).shape == (3, 4, 32, 32) and C.composition_scores(m, "V").shape == (3, 4, 3, 4)


# --- TransformerLens on the same weights --------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, torch):
    oracle("transformers"), oracle("transformer_lens")
    ours, hf = tiny_gpt2(tmp_path_factory.mktemp("gpt2"))
    return ours, hf


@pytest.mark.slow
def test_composition_scores_and_ov_eigenvalues_equal_transformer_lens(gpt2, torch):
    ours, hf = gpt2
    bridge = tl_bridge(hf)
    with torch.no_grad():
        for kind in "QKV":
            theirs = bridge.all_composition_scores(kind).scores.numpy()
            np.testing.assert_allclose(C.composition_scores(ours, kind), theirs, atol=1e-5, err_msg=kind)
        lam = (bridge.W_E @ bridge.OV @ bridge.W_U).eigenvalues.numpy()          # [L, H, D_head]
    mine = C.full_ov(ours).eigenvalues()
    key = lambda a: np.sort_complex(np.round(a, 4))
    for idx in np.ndindex(*mine.shape[:2]):
        np.testing.assert_allclose(key(mine[idx]), key(lam[idx]), rtol=1e-3, atol=1e-3, err_msg=str(idx))


@pytest.mark.slow
def test_direct_logit_attribution_equals_transformer_lens_with_its_layernorm_folded(gpt2, torch):
    ours, hf = gpt2
    bridge = tl_bridge(hf, compatible=True)
    tokens = np.random.default_rng(3).integers(0, 101, (2, 10))
    answer, wrong = np.array([5, 7]), np.array([6, 8])
    with torch.no_grad():
        _, cache = bridge.run_with_cache(torch.as_tensor(tokens))
        stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
        theirs = cache.logit_attrs(stack, tokens=torch.as_tensor(answer), incorrect_tokens=torch.as_tensor(wrong),
                                   pos_slice=-1).mean(-1).numpy()
        heads = cache.stack_head_results(layer=-1, pos_slice=-1)
        theirs_heads = cache.logit_attrs(heads, tokens=torch.as_tensor(answer), incorrect_tokens=torch.as_tensor(wrong),
                                         pos_slice=-1).mean(-1).numpy()
    mine = C.direct_logit_attribution(ours, tokens, answer, wrong)
    assert len(labels) == len(mine.labels)
    np.testing.assert_allclose(mine.values, theirs, atol=1e-4)
    np.testing.assert_allclose(C.direct_logit_attribution(ours, tokens, answer, wrong, by="head").values.ravel(),
                               theirs_heads, atol=1e-4)


def test_prefix_matching_and_previous_token_scores_read_the_heads_signatures():
    """A head attending exactly to the token after the earlier occurrence scores 1 on prefix matching;
    one attending to the token before, 1 on previous-token; one on the first token, 0 on both."""
    from attention_jax.data.repeats import repeated_segments
    b = repeated_segments(0, 0, batch=4, length=32, vocab=50, shortest=4, longest=12)
    T, first, span = 32, b["first"], b["span"]
    w = np.zeros((4, 3, T, T))
    w[:, :, :, 0] = 1
    for i in range(4):
        for t in range(first[i] + span[i], first[i] + 2 * span[i]):
            w[i, 0, t] = 0
            w[i, 0, t, t - span[i] + 1] = 1
        for t in range(1, T):
            w[i, 1, t] = 0
            w[i, 1, t, t - 1] = 1
    prefix, previous = np.asarray(C.prefix_matching(jnp.asarray(w), first, span)), np.asarray(C.previous_token(jnp.asarray(w)))
    np.testing.assert_allclose(prefix, [1, 0, 0], atol=1e-6)
    assert previous[1] == pytest.approx(1.0) and previous[0] < 0.2 and previous[2] == pytest.approx(1 / (T - 1))


@pytest.mark.parametrize("first, span, words", [(1, 3, "one per text"), ([-5], [3], "first >= 0"),
                                                ([7], [3], "first \\+ 2 \\* span <= 8"), ([1], [0], "span >= 1"),
                                                ([1.0], [3], "whole numbers")])
def test_a_repeated_segment_outside_the_window_is_refused(first, span, words):
    """0.125 or 0.0 came back for segments past the text, and an IndexError for a scalar."""
    w = jnp.full((1, 2, 8, 8), 1 / 8)
    with pytest.raises(ConfigError, match=words):
        C.prefix_matching(w, first, span)


@pytest.mark.parametrize("samples", [0, 1, -1, 2.5])
def test_a_baseline_of_too_few_samples_is_refused(samples):
    with pytest.raises(ConfigError, match="samples="):
        C.composition_baseline(16, 4, samples=samples)
