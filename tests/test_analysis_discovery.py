"""attention_jax.analysis.discovery: every edge's exact effect equals TransformerLens' loop of patched forwards on
the same weights and its own path patch; the scores are of the model as it is (live hook patches in force); what
is not a number is refused. Pre- and post-norm alike."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import ConfigError
from attention_jax.analysis import discovery
from attention_jax.analysis.attribution import edge_attribution
from attention_jax.analysis.discovery import EdgeScores, edge_patch, patch_paths
from attention_jax.analysis.inspect import ablate, run_with_cache
from attention_jax.analysis.patching import normalized_logit_diff
from attention_jax.errors import NotMeasurable
from attention_jax.model import LanguageModel

from helpers import discovery_case, gpt2_texts, tl_bridge


@pytest.fixture(scope="module", params=["pre", "post"])
def case(request):
    return discovery_case(request.param)


def test_each_edge_alone_is_its_own_path_patch(case):
    exact = edge_patch(*case, batch_size=7)              # 7 does not divide the edges: the last batch filled up
    assert exact.clean == pytest.approx(1.0, abs=1e-5) and exact.method == "exact"
    picks = [0, 5, len(exact.graph.edges) - 1, int(np.argmax(np.abs(exact.effect)))]
    alone = patch_paths(*case, *[[i] for i in picks])
    np.testing.assert_allclose(alone - exact.clean, exact.effect[picks], atol=1e-5)
    assert np.abs(exact.effect).max() > 0.05                 # some edge matters
    every = patch_paths(*case, range(len(exact.graph.edges)))
    assert every[0] == pytest.approx(0.0, abs=1e-4)           # every edge patched: the corrupted run


def test_models_whose_inputs_are_not_sums_and_bad_arguments_are_refused(case):
    model, clean, corrupted, metric = case
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


def test_a_correlation_with_constant_scores_is_refused(case):
    exact = edge_patch(*case)
    flat = EdgeScores(exact.graph, np.zeros_like(exact.effect), "flat", exact.clean)
    for a, b in ((exact, flat), (flat, exact)):
        with pytest.raises(NotMeasurable, match="flat scores are all 0"):
            a.agreement(b)


def test_a_metric_that_is_not_finite_is_refused_never_ranked(case):
    """A NaN clean metric would give all-NaN scores, ranked and pruned as if real: refused in one line."""
    model, clean, corrupted, metric = case
    nan = lambda logits: metric(logits) * jnp.nan
    for score in (lambda: edge_patch(model, clean, corrupted, nan), lambda: edge_attribution(model, clean, corrupted,
                                                                                            nan),
                  lambda: patch_paths(model, clean, corrupted, nan, [0])):
        with pytest.raises(NotMeasurable, match="not finite"):
            score()


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_discovery_scores_the_model_as_it_is_live_hook_patches_included(norm):
    """Inside an ablation (a head zeroed), the clean metric is the ablated model's and each edge's effect
    is its path patch on the ablated model; the edges of the zeroed head then carry nothing."""
    model, clean, corrupted, metric = discovery_case(norm)
    plain = edge_patch(model, clean, corrupted, metric)
    with ablate(model, heads={0: [1]}):
        ablated_metric = float(metric(model(jnp.asarray(clean))))
        exact = edge_patch(model, clean, corrupted, metric)
        eap = edge_attribution(model, clean, corrupted, metric)
        picks = [int(np.argmax(np.abs(exact.effect))), 3]
        alone = patch_paths(model, clean, corrupted, metric, *[[i] for i in picks])
    assert exact.clean == pytest.approx(ablated_metric, abs=1e-5) and abs(exact.clean - plain.clean) > 1e-3
    np.testing.assert_allclose(alone - exact.clean, exact.effect[picks], atol=1e-5)
    from_head = [i for i, n in enumerate(exact.graph.names()) if n.startswith("0.h1->")]
    assert np.abs(exact.effect[from_head]).max() < 1e-5 and np.abs(eap.effect[from_head]).max() < 1e-5   # rounding
    assert np.abs(plain.effect[from_head]).max() > 1e-4        # without the ablation they do carry something


def test_zero_and_mean_ablation_patch_in_zeros_and_the_corrupted_texts_mean():
    """Every edge patched: with zero ablation the logits read the output biases alone; with mean ablation the
    corrupted texts' mean stream (a pre-norm stream is the sum of its senders)."""
    model, clean, corrupted, metric = discovery_case("pre")
    every = range(len(edge_patch(*(model, clean, corrupted, metric)).graph.edges))
    _, cache = run_with_cache(model, jnp.asarray(corrupted), ["final"])
    biases = sum(b.mixer.out.bias[...] for b in model.blocks)
    zero = model.unembed(jnp.broadcast_to(biases, cache["final"].shape))
    mean = model.unembed(jnp.broadcast_to(cache["final"].mean(0, keepdims=True), cache["final"].shape))
    for ablation, logits in (("zero", zero), ("mean", mean)):
        got = patch_paths(model, clean, corrupted, metric, every, ablation=ablation)[0]
        assert got == pytest.approx(float(metric(logits)), abs=1e-4), ablation
    with pytest.raises(ConfigError, match="ablation='noise'"):
        edge_patch(model, clean, corrupted, metric, ablation="noise")
