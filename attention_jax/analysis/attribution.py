"""Every edge's effect estimated from gradients: EAP, EAP-IG over the inputs or the activations, and
integrated gradients over the edge masks, each under its own name and as its paper defines it.

    eap = edge_attribution(model, clean, corrupted, metric)             # Syed et al. 2023:
                                                                        # one gradient
    ig = eap_ig(model, clean, corrupted, metric, steps=5)               # Hanna et al. 2024 (MIB's
                                                                        # EAP-IG-inputs)
    acts = eap_ig(model, clean, corrupted, metric, over="activations")  # MIB's EAP-IG-activations
    masks = mask_ig(model, clean, corrupted, metric, steps=16)          # auto-circuit's, over the
                                                                        # edge masks

Each scores an edge (s, r) as (s's output on the corrupted text - on the clean one) · the metric's
gradient at r's input, summed over the batch's positions and width. They differ in where the
gradient is taken: EAP at the clean run; EAP-IG-inputs averaged over the clean text run with its
input embedding moved from the corrupted one's towards its own (k/steps, k = 0 .. steps - 1);
EAP-IG-activations averaged over runs in which one node's output (the embedding, one block's
attention or feed-forward output) at a time is moved from corrupted to clean (k/steps, k = 1 ..
steps), every node in turn; `mask_ig` averages the gradient with respect to every edge's share of
the corrupted output along every edge patched by alpha (its effects sum to the whole
clean-corrupted change). EAP-IG's own code divides once more by the batch size: the ranks agree.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.analysis import edges as E
from attention_jax.analysis.checks import finite, whole
from attention_jax.analysis.discovery import EdgeScores, prepare, recorded
from attention_jax.analysis.inspect import patched
from attention_jax.analysis.patching import map_batches
from attention_jax.errors import ConfigError


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric"))
def _mask_gradients(graphdef, state, tokens, others, alphas, *, graph, metric):
    """d metric / d mask at each mask alpha · (every edge), for each of `alphas` [N]:
    [N, senders, receivers]."""
    model, every = nnx.merge(graphdef, state), jnp.asarray(graph.mask(range(len(graph.edges))))
    grad = jax.grad(lambda m: metric(E.run(model, graph, tokens, others, m)))
    return jax.vmap(lambda a: grad(a * every))(alphas)


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric", "names"))
def _moved_gradients(graphdef, state, tokens, diff, ends, nodes, alphas, *, graph, metric, names):
    """d metric / d mask of `E.run_added` (the difference `diff` fixed) at mask 0, in the run whose
    hook point names[nodes[i]] is moved to alphas[i] · clean + (1 - alphas[i]) · corrupted (`ends`:
    name -> (clean, corrupted) values): [N, senders, receivers]."""
    zero = jnp.zeros((len(graph.senders), len(graph.receivers)))

    def one(node, alpha):
        model = nnx.merge(graphdef, state)
        move = lambda j, n: lambda v: jnp.where(node == j,
                                                alpha * ends[n][0] + (1 - alpha) * ends[n][1], v)
        with patched(model, {n: move(j, n) for j, n in enumerate(names)}):
            return jax.grad(lambda m: metric(E.run_added(model, graph, tokens, diff, m)))(zero)
    return jax.vmap(one)(nodes, alphas)


def _scores(at, grads, method: str) -> EdgeScores:
    """EdgeScores from d metric / d mask [senders, receivers], with the clean metric as its base."""
    base = finite("the clean run", at.under(at.graph.mask([])[None]))[0]
    s, r = np.asarray(at.graph.edges).T
    return EdgeScores(at.graph, finite("a gradient", np.asarray(grads, np.float64)[s, r]), method,
                      float(base))


def edge_attribution(model, clean, corrupted, metric, *, ablation: str = "resample") -> EdgeScores:
    """EAP (Syed et al. 2023): every edge's effect estimated by the gradient at none patched;
    `ablation`: what a patched edge carries (`discovery.prepare`)."""
    at = prepare(model, clean, corrupted, metric, ablation)
    g = _mask_gradients(at.graphdef, at.state, at.tokens, at.others, jnp.zeros(1), graph=at.graph,
                        metric=at.metric)[0]
    return _scores(at, g, "eap")


def mask_ig(model, clean, corrupted, metric, *, steps: int = 16,
            ablation: str = "resample") -> EdgeScores:
    """Integrated gradients over the edge masks (auto-circuit's "mask gradient" IG): the gradient
    with respect to every edge's share, averaged at `steps` midpoints from none patched to every
    edge patched."""
    steps = whole("steps", steps)
    at = prepare(model, clean, corrupted, metric, ablation)
    run = lambda a: _mask_gradients(at.graphdef, at.state, at.tokens, at.others, jnp.asarray(a),
                                    graph=at.graph, metric=at.metric)
    alphas = ((np.arange(steps) + 0.5) / steps).astype(np.float32)
    # A gradient holds about three forwards' activations: a batch of them is a third
    # of the forwards'.
    return _scores(at, map_batches(run, alphas, None, max(1, at.side // 3)).mean(0), "mask_ig")


OVER = ("inputs", "activations")


def eap_ig(model, clean, corrupted, metric, *, steps: int = 5, over: str = "inputs") -> EdgeScores:
    """EAP with integrated gradients (Hanna et al. 2024): the corrupted-minus-clean output of each
    sender times the metric's gradient at the receiver's input, averaged over `steps` runs of the
    clean text whose input embedding (`over="inputs"`, the paper's and MIB's EAP-IG-inputs) or each
    node's output in turn (`over="activations"`, MIB's EAP-IG-activations) is moved from
    corrupted to clean."""
    steps = whole("steps", steps)
    if over not in OVER:
        raise ConfigError(f"over={over!r}; choose 'inputs' (Hanna et al.'s) or 'activations'")
    at = prepare(model, clean, corrupted, metric)
    names = ["blocks.0.resid_pre"] + ([] if over == "inputs" else [
        f"blocks.{i}.{part}_out" for i, b in enumerate(model.blocks) for part, there in
        (("mixer", b.mixer), ("ffn", b.ffn)) if there is not None])
    clean_run, other_run = (recorded(at, tokens, names) for tokens in (at.tokens, at.corrupted))
    diff = at.others - recorded(at, at.tokens).senders
    ends = {n: (clean_run[n], other_run[n]) for n in names}
    k = np.arange(steps) if over == "inputs" else np.arange(1, steps + 1)
    nodes = np.repeat(np.arange(len(names)), steps).astype(np.int32)
    alphas = np.tile(k / steps, len(names)).astype(np.float32)
    run = lambda b: _moved_gradients(at.graphdef, at.state, at.tokens, diff, ends,
                                     jnp.asarray(b[:, 0], jnp.int32), jnp.asarray(b[:, 1]),
                                     graph=at.graph, metric=at.metric, names=tuple(names))
    points = np.stack([nodes, alphas], 1)
    grads = map_batches(run, points, None, max(1, at.side // 3)).mean(0)
    return _scores(at, grads, f"eap_ig_{over}")
