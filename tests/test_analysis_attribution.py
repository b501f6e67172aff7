"""attention_jax.analysis.attribution: each estimate as its paper defines it. EAP is the exact effect's first
order; integrated gradients over the masks add up to the whole change; EAP-IG over the inputs and over the
activations equal plain references written from Hanna et al. (2024) and EAP-IG's code: a loop over the
steps through the model's own hook points here, and TransformerLens' hooks and autograd in the slow tier."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax import ConfigError
from attention_jax.analysis.attribution import eap_ig, edge_attribution, mask_ig
from attention_jax.analysis.discovery import edge_patch, prepare
from attention_jax.analysis.inspect import patched, run_with_cache

from helpers import discovery_case, gpt2_texts, tl_bridge


@pytest.fixture(scope="module", params=["pre", "post"])
def case(request):
    return discovery_case(request.param)


def test_eap_is_the_exact_effects_first_order(case):
    model, clean, corrupted, metric = case
    eap = edge_attribution(*case)
    assert eap.method == "eap"
    g, at = eap.graph, prepare(model, clean, corrupted, metric)
    eps = 0.02                                  # the metric's slope along one edge, by central differences
    for e in (0, int(np.argmax(np.abs(eap.effect)))):
        s, r = g.edges[e]
        mask = np.zeros((2, len(g.senders), len(g.receivers)), np.float32)
        mask[:, s, r] = eps, -eps
        up, down = at.under(mask)
        assert (up - down) / (2 * eps) == pytest.approx(eap.effect[e], rel=1e-2, abs=2e-3)


@pytest.mark.slow
def test_integrated_gradients_over_the_masks_add_up_to_the_whole_change(case):
    ig = mask_ig(*case, steps=32)
    assert ig.method == "mask_ig" and ig.effect.sum() == pytest.approx(0.0 - ig.clean, abs=2e-3)
    assert np.corrcoef(ig.effect, edge_patch(*case).effect)[0, 1] > 0.5


def _senders(model, tokens):
    """Every pre-norm sender's output by the model's own hook points: {name: [B, T, D]}."""
    _, cache = run_with_cache(model, jnp.asarray(tokens))
    out = {"embed": cache["blocks.0.resid_pre"]}
    for i, block in enumerate(model.blocks):
        w = block.mixer.head_weights()
        for h in range(model.config.heads_used):
            out[f"{i}.h{h}"] = jnp.einsum("BTd,dD->BTD", cache[f"blocks.{i}.mixer.z"][:, h], w["o"][h])
        out[f"{i}.ffn"] = cache[f"blocks.{i}.ffn_out"]
    return out


def _reference(model, clean, corrupted, metric, steps, over):
    """EAP-IG as its code computes it, for the edges into the FFNs and the logits (their inputs are hook
    points of the model as built): diff · the gradient at the receiver, averaged over the steps' runs."""
    mine, theirs = _senders(model, clean), _senders(model, corrupted)
    points = {"logits": "final", **{f"{i}.ffn": f"blocks.{i}.ffn_in" for i in range(model.config.n_layers)}}
    moved = ["blocks.0.resid_pre"] + ([] if over == "inputs" else
                                       [f"blocks.{i}.{p}_out" for i in range(model.config.n_layers) for p in ("mixer", "ffn")])
    _, a = run_with_cache(model, jnp.asarray(clean), moved)
    _, b = run_with_cache(model, jnp.asarray(corrupted), moved)
    ks = range(steps) if over == "inputs" else range(1, steps + 1)
    grads, runs = {r: 0.0 for r in points}, 0
    for node in moved:
        for k in ks:
            alpha = k / steps

            def f(deltas, node=node, alpha=alpha):
                fns = {n: (lambda n: lambda v: v + deltas[n])(n) for n in points.values()}
                fns[node] = lambda v: alpha * a[node] + (1 - alpha) * b[node]
                copy = nnx.merge(*nnx.split(model))         # patched inside the trace that differentiates it
                with patched(copy, fns):
                    return metric(copy(jnp.asarray(clean)))
            zeros = {n: jnp.zeros_like(a["blocks.0.resid_pre"]) for n in points.values()}
            g = jax.grad(f)(zeros)
            grads = {r: grads[r] + g[n] for r, n in points.items()}
            runs += 1
    return {f"{s}->{r}": float(jnp.sum((theirs[s] - mine[s]) * grads[r] / runs)) for s in mine for r in points}


@pytest.mark.parametrize("over", ["inputs", "activations"])
def test_eap_ig_equals_its_plain_loop_through_the_models_own_hook_points(over):
    model, clean, corrupted, metric = discovery_case("pre")
    got = eap_ig(model, clean, corrupted, metric, steps=3, over=over)
    assert got.method == f"eap_ig_{over}"
    want = _reference(model, clean, corrupted, metric, 3, over)
    names = got.graph.names()
    shared = [n for n in want if n in names]
    assert len(shared) == 3 + 6 + 7           # into 0.ffn: embed, 0.h0, 0.h1; 1.ffn: six; logits: seven
    np.testing.assert_allclose([got.effect[names.index(n)] for n in shared], [want[n] for n in shared],
                               atol=2e-5 * max(1.0, np.abs(got.effect).max()))
    assert np.abs(got.effect).max() > 1e-3


def test_the_two_eap_ig_variants_and_eap_differ_and_bad_arguments_are_refused(case):
    ins, acts, eap = eap_ig(*case, steps=2), eap_ig(*case, steps=2, over="activations"), edge_attribution(*case)
    assert np.abs(ins.effect - acts.effect).max() > 1e-4 and np.abs(ins.effect - eap.effect).max() > 1e-4
    for bad, why in ((dict(steps=0), "steps=0"), (dict(steps=2.0), "steps=2.0"), (dict(over="outputs"), "over=")):
        with pytest.raises(ConfigError, match=why):
            eap_ig(*case, **bad)
    with pytest.raises(ConfigError, match="steps=True"):
        mask_ig(*case, steps=True)


@pytest.mark.slow
@pytest.mark.parametrize("over", ["inputs", "activations"])
def test_eap_ig_equals_transformer_lens_autograd_on_the_same_weights(tmp_path, torch, over):
    from attention_jax.analysis.patching import normalized_logit_diff
    from experiments.transformer_lens_ref import eap_ig_loop, split_inputs
    ours, hf, clean, corrupted = gpt2_texts(tmp_path)
    metric = normalized_logit_diff(ours, clean, corrupted, 5, 6)
    got = eap_ig(ours, clean, corrupted, metric, steps=4, over=over)
    tl_metric = lambda lg: ((lg[:, -1, 5] - lg[:, -1, 6]).mean() - metric.corrupted) / (metric.clean - metric.corrupted)
    names = got.graph.names()
    want = eap_ig_loop(split_inputs(tl_bridge(hf)), torch.as_tensor(clean), torch.as_tensor(corrupted),
                       [tuple(n.split("->")) for n in names], tl_metric, steps=4, over=over)
    np.testing.assert_allclose(got.effect, want, atol=2e-4 * max(1.0, np.abs(want).max()))
    assert np.abs(want).max() > 1e-3
