"""attention_jax.analysis.discovery: every edge's exact effect equals TransformerLens' loop of patched forwards on the
same weights; the gradient estimates are the exact effect's first order and integral; circuits reach the logits;
pre-norm and post-norm models alike."""
import dataclasses

import numpy as np
import pytest
from flax import nnx

from attention_jax import ConfigError, ModelConfig
from attention_jax.analysis import discovery
from attention_jax.analysis.discovery import (EdgeScores, acdc, circuit, edge_attribution, edge_patch, faithfulness,
                                     patch_paths, smallest_circuit)
from attention_jax.analysis.edges import Graph
from attention_jax.model import LanguageModel
from attention_jax.analysis.patching import normalized_logit_diff

from helpers import gpt2_texts, tl_bridge


@pytest.fixture(scope="module", params=["pre", "post"])
def case(request):
    cfg = ModelConfig(vocab_size=23, context=8, d_model=16, n_heads=2, n_layers=2, mixer="heads", qkv_bias=True,
                      bias=True, norm=request.param)
    model = LanguageModel(cfg, rngs=nnx.Rngs(3))
    clean = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]])
    corrupted = np.array([[1, 2, 9, 4, 5, 6, 7, 8], [3, 1, 4, 1, 7, 9, 2, 6]])
    return model, clean, corrupted, normalized_logit_diff(model, clean, corrupted, 5, 6)


def test_each_edge_alone_is_its_own_path_patch(case):
    exact = edge_patch(*case, batch_size=7)              # 7 does not divide the edges: the last batch filled up
    assert exact.clean == pytest.approx(1.0, abs=1e-5) and exact.method == "exact"
    picks = [0, 5, len(exact.graph.edges) - 1, int(np.argmax(np.abs(exact.effect)))]
    alone = patch_paths(*case, *[[i] for i in picks])
    np.testing.assert_allclose(alone - exact.clean, exact.effect[picks], atol=1e-5)
    assert np.abs(exact.effect).max() > 0.05                 # some edge matters
    every = patch_paths(*case, range(len(exact.graph.edges)))
    assert every[0] == pytest.approx(0.0, abs=1e-4)           # every edge patched: the corrupted run


@pytest.mark.slow
def test_eap_is_the_exact_effects_first_order_and_ig_sums_to_the_whole_change(case):
    model, clean, corrupted, metric = case
    eap = edge_attribution(*case)
    g = eap.graph
    at = discovery._setup(model, clean, corrupted, metric)
    eps = 0.02                                  # the metric's slope along one edge, by central differences
    for e in (0, int(np.argmax(np.abs(eap.effect)))):
        s, r = g.edges[e]
        mask = np.zeros((2, len(g.senders), len(g.receivers)), np.float32)
        mask[:, s, r] = eps, -eps
        up, down = at.under(mask)
        assert (up - down) / (2 * eps) == pytest.approx(eap.effect[e], rel=1e-2, abs=2e-3)
    ig = edge_attribution(*case, steps=32)
    assert ig.method == "eap_ig32" and ig.effect.sum() == pytest.approx(0.0 - ig.clean, abs=2e-3)
    exact = edge_patch(*case)
    assert np.corrcoef(ig.effect, exact.effect)[0, 1] > 0.5


def _scores():
    g = Graph(("embed", "0.h0", "0.ffn"), ("0.h0.q", "0.h0.k", "0.h0.v", "0.ffn", "logits"),
              ((0, 0), (0, 1), (0, 2), (0, 3), (1, 3), (0, 4), (1, 4), (2, 4)))
    return EdgeScores(g, np.array([0.9, 0.1, 0.05, -0.8, 0.7, 0.0, 0.02, 0.6]), "exact", 1.0)


def test_a_circuit_keeps_only_edges_on_a_path_to_the_logits():
    # embed->0.h0.q (0.9) is kept only while 0.h0 reaches the logits or the ffn that does
    assert circuit(_scores(), k=2) == []                                   # 0.h0.q and 0.ffn: neither reaches the logits
    assert circuit(_scores(), k=3) == []
    assert circuit(_scores(), k=4) == ["embed->0.h0.q", "embed->0.ffn", "0.h0->0.ffn", "0.ffn->logits"]
    assert circuit(_scores(), threshold=0.65) == []
    assert circuit(_scores(), threshold=0.6) == circuit(_scores(), k=4)
    with pytest.raises(ConfigError, match="k .* or threshold"):
        circuit(_scores())


@pytest.mark.slow
def test_acdc_equals_its_greedy_loop_written_with_path_patching(case):
    g = edge_patch(*case).graph
    names = g.names()
    order = sorted(range(len(names)), key=lambda e: (-g.edges[e][1], -g.edges[e][0]))
    patched, current = [], patch_paths(*case, [])[0]
    for e in order:                                   # the plain loop: one path patch per decision
        value = patch_paths(*case, patched + [e])[0]
        if abs(value - current) < 0.05:
            patched, current = patched + [e], value
    kept = [e for e in range(len(names)) if e not in patched]
    found = acdc(*case, threshold=0.05)
    assert set(found) <= {names[e] for e in kept} and 0 < len(found) < len(names)
    assert set(found) == set(discovery._reaching(g, kept))
    assert acdc(*case, threshold=0.0) == names           # nothing may change the metric by less than 0
    assert acdc(*case, threshold=1e9) == []
    with pytest.raises(ConfigError, match="threshold=-1"):
        acdc(*case, threshold=-1)


def test_faithfulness_runs_from_none_to_the_whole_model(case):
    exact = edge_patch(*case)
    n = len(exact.graph.edges)
    curve = faithfulness(*case, exact, ks=[0, n])
    assert curve[0] == pytest.approx(0.0, abs=1e-6) and curve[1] == pytest.approx(1.0, abs=1e-5)


def test_models_whose_inputs_are_not_sums_and_bad_arguments_are_refused(case):
    model, clean, corrupted, metric = case
    with pytest.raises(ConfigError, match="steps=0"):
        edge_attribution(*case, steps=0)
    with pytest.raises(ConfigError, match="batch_size"):
        edge_patch(*case, batch_size=0)
    with pytest.raises(ConfigError, match="one shape"):
        edge_patch(model, clean, corrupted[:, :5], metric)
    plain = LanguageModel(dataclasses.replace(model.config, residual=False), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="no residual stream"):
        edge_patch(plain, clean, corrupted, metric)
    with pytest.raises(ConfigError, match="at least one set"):
        patch_paths(*case)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, torch):
    from experiments.transformer_lens_ref import split_inputs
    ours, hf, clean, corrupted = gpt2_texts(tmp_path_factory.mktemp("gpt2"))
    return ours, split_inputs(tl_bridge(hf)), clean, corrupted


@pytest.mark.slow
def test_every_edge_equals_transformer_lens_loop_on_the_same_weights(gpt2, torch):
    from experiments.transformer_lens_ref import edge_patch_loop
    ours, bridge, clean, corrupted = gpt2
    metric = normalized_logit_diff(ours, clean, corrupted, 5, 6)
    exact = edge_patch(ours, clean, corrupted, metric)
    with torch.no_grad():
        tl_diff = lambda lg: (lg[:, -1, 5] - lg[:, -1, 6]).mean()
        tl_metric = lambda lg: (tl_diff(lg) - metric.corrupted) / (metric.clean - metric.corrupted)
        names = exact.graph.names()
        theirs = edge_patch_loop(bridge, torch.as_tensor(clean), torch.as_tensor(corrupted),
                                 [[tuple(n.split("->"))] for n in names], tl_metric)
    np.testing.assert_allclose(exact.effect + exact.clean, theirs, atol=2e-4)
    # 3 blocks of 4 heads: 12 q/k/v inputs and an MLP's a block, each from every sender before it, and the logits
    assert len(names) == sum(12 * (1 + 5 * i) + 5 * (i + 1) for i in range(3)) + 16 == 262
    assert np.abs(exact.effect).max() > 0.05
    whole = edge_patch_loop(bridge, torch.as_tensor(clean), torch.as_tensor(corrupted),
                            [[tuple(n.split("->")) for n in exact.top(10)]], tl_metric)
    assert patch_paths(ours, clean, corrupted, metric, exact.top(10))[0] == pytest.approx(whole[0], abs=2e-4)


def test_spearman_ranks_ties_by_their_mean_rank(case):
    np.testing.assert_array_equal(discovery._ranks(np.array([3.0, 1.0, 3.0, 2.0])), [2.5, 0, 2.5, 1])
    exact, eap = edge_patch(*case), edge_attribution(*case)
    pearson, spearman = exact.agreement(eap)
    assert pearson == pytest.approx(np.corrcoef(exact.effect, eap.effect)[0, 1]) and -1 <= spearman <= 1
    assert exact.agreement(exact) == pytest.approx((1.0, 1.0))


def test_the_smallest_circuit_is_the_first_k_past_the_share_or_the_largest_asked(case):
    exact = edge_patch(*case)
    curve = faithfulness(*case, exact, ks=range(1, 11))
    found = smallest_circuit(*case, exact, share=0.5, most=10)
    np.testing.assert_allclose(found.curve, curve)
    want = next((k for k in range(1, 11) if curve[k - 1] >= 0.5), None)
    assert found.k == want and found.edges == circuit(exact, k=want or 10)
    assert found.faithfulness == pytest.approx(curve[(want or 10) - 1])
    none = smallest_circuit(*case, exact, share=1e9, most=3)
    assert none.k is None and none.edges == circuit(exact, k=3)
    alone = discovery.circuit_faithfulness(*case, [], exact.graph.names(), circuit(exact, k=4))
    np.testing.assert_allclose(alone, [0.0, 1.0, faithfulness(*case, exact, ks=[4])[0]], atol=1e-5)
