"""Which paths carry it: every edge of the graph patched, alone or in sets, exactly.

    metric = patching.normalized_logit_diff(model, clean, corrupted,
                                            answer, wrong)    # clean 1, corrupted 0
    exact = edge_patch(model, clean, corrupted, metric)       # the metric with each edge patched
    exact.top(20), exact.agreement(other)                     # the largest; (Pearson, Spearman)
    patch_paths(model, clean, corrupted, metric, ["0.h1->logits"], exact.top(5))   # sets at once

Direction: the clean text runs, and a patched edge carries its sender's output from the corrupted
run (ACDC's and edge attribution patching's: what breaks the behaviour; `patching`'s sweeps say
theirs with `into`). `effect` is the change of the metric that patching the edge makes. Each
function is one compiled program over the edge graph (`analysis.edges`), the edges vmapped side by
side in memory-bounded batches; the model runs as it is, live hook patches included. The
estimates from gradients are in `analysis.attribution`; what the scores name, and how much of
the behaviour it carries, in `analysis.pruning` and `analysis.faithfulness`.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.analysis import edges as E
from attention_jax.analysis.checks import finite, whole
from attention_jax.analysis.inspect import deterministic
from attention_jax.analysis.patching import (check_metric, hook_values, map_batches, side_by_side,
                                             token_pair)
from attention_jax.errors import ConfigError, NotMeasurable


@dataclasses.dataclass(frozen=True)
class EdgeScores:
    """`effect` [edges]: the metric's change with each edge of `graph` patched; `clean`: the
    metric unpatched."""
    graph: E.Graph
    effect: np.ndarray
    method: str
    clean: float

    def top(self, k: int) -> list[str]:
        """The k edges of largest |effect|, by name, largest first."""
        k = whole("k", k, least=0)
        names = self.graph.names()
        return [names[i] for i in np.argsort(-np.abs(self.effect), kind="stable")[:k]]

    def agreement(self, other: "EdgeScores") -> tuple[float, float]:
        """(Pearson, Spearman) between these effects and `other`'s on the same edges (ties
        share a rank)."""
        if other.graph != self.graph:
            raise ConfigError("the two scores are over different graphs: "
                              "score the same model's edges")
        for scores in (self, other):
            if np.ptp(scores.effect) == 0:
                raise NotMeasurable(f"the {scores.method} scores are all {scores.effect[0]:g}: "
                                    "a correlation with constant scores is not defined")
        pearson = np.corrcoef(self.effect, other.effect)[0, 1]
        return float(pearson), float(np.corrcoef(_ranks(self.effect), _ranks(other.effect))[0, 1])


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank (Spearman's)."""
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a))
    _, tie, count = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(tie, ranks) / count)[tie]


@dataclasses.dataclass(frozen=True)
class Setup:
    """A model, a pair of texts and a metric made ready for edge programs: the graph, the model as
    graphdef and state (compiled programs take them), the clean and corrupted tokens, every
    sender's output on the corrupted text (`others`), and how many patched forwards fit
    side by side."""
    graph: E.Graph
    metric: object
    graphdef: object
    state: object
    tokens: jax.Array
    corrupted: jax.Array
    others: jax.Array
    side: int

    def under(self, masks, batch_size: int | None = None) -> np.ndarray:
        """The metric with each mask [N, senders, receivers] applied, `side` (or
        `batch_size`) at a time."""
        run = lambda m: _patched(self.graphdef, self.state, self.tokens, self.others,
                                 jnp.asarray(m), graph=self.graph, metric=self.metric)
        return np.asarray(map_batches(run, np.asarray(masks, np.float32), batch_size, self.side),
                          np.float64)


ABLATIONS = ("resample", "zero", "mean")


def prepare(model, clean, corrupted, metric, ablation: str = "resample") -> Setup:
    """`Setup` for `model` (dropout off, live hook patches kept) on a clean and a corrupted text.
    What a patched edge carries, `ablation`: its sender's output on the corrupted text
    ("resample"), zero ("zero", ACDC's tracr circuits), or its mean over the corrupted texts at
    each position ("mean")."""
    if ablation not in ABLATIONS:
        raise ConfigError(f"ablation={ablation!r}; choose 'resample' (the corrupted run's "
                          "outputs), 'zero' or 'mean' (their mean over the corrupted texts)")
    model = deterministic(model)
    clean, corrupted = token_pair(model, clean, corrupted)
    graph = E.graph_of(model)
    keyed = check_metric(metric, (*clean.shape, model.config.output_size_used))
    graphdef, state = nnx.split(model)
    others = _recorded(graphdef, state, jnp.asarray(corrupted)).senders
    if ablation != "resample":
        others = jnp.zeros_like(others) if ablation == "zero" else \
            jnp.broadcast_to(others.mean(axis=1, keepdims=True), others.shape)
    # Each patched forward holds every head's own q, k and v input: three streams a head
    # beside the block's.
    side = max(1, side_by_side(model.config, clean.shape) // (1 + max(1, model.config.heads_used)))
    return Setup(graph, keyed, graphdef, state, jnp.asarray(clean), jnp.asarray(corrupted), others,
                 side)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _recorded(graphdef, state, tokens):
    return E.record(nnx.merge(graphdef, state), tokens)


def recorded(at: Setup, tokens, names=None):
    """`tokens`' run of the prepared model: every sender's output and stream (`edges.Recorded`), or
    with `names` the values at those hook points (`patching`'s compiled `run_with_cache`)."""
    if names is None:
        return _recorded(at.graphdef, at.state, tokens)
    return hook_values(at.graphdef, at.state, tokens, names=tuple(names))


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric"))
def _patched(graphdef, state, tokens, others, masks, *, graph, metric):
    """The metric with each mask [N, senders, receivers] applied, side by side."""
    model = nnx.merge(graphdef, state)
    return jax.vmap(lambda m: metric(E.run(model, graph, tokens, others, m)))(masks)


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric", "start"))
def _one_edge(graphdef, state, tokens, others, mine, pairs, *, graph, metric, start):
    """The metric with each single edge of `pairs` [N, 2] patched, side by side; each edge goes
    into block `start` (n_layers: the logits), so the run begins there."""
    model = nnx.merge(graphdef, state)
    return jax.vmap(lambda p: metric(E.run_edge(model, graph, tokens, others, p, start=start,
                                                mine=mine)))(pairs)


def edge_patch(model, clean, corrupted, metric, *, batch_size: int | None = None,
               ablation: str = "resample") -> EdgeScores:
    """The exact effect of patching each edge alone: the metric of the clean run with that edge's
    sender output taken from the corrupted run, minus the clean metric. `batch_size`: patched
    forwards side by side (default: as many as fit in `patching.MEMORY`); `ablation`: what a
    patched edge carries (`prepare`)."""
    at = prepare(model, clean, corrupted, metric, ablation)
    base = finite("the clean run", at.under(at.graph.mask([])[None]))[0]
    g, n = at.graph, model.config.n_layers
    mine = recorded(at, at.tokens)
    pairs = np.asarray(g.edges, np.int32)
    into = np.array([E.block_of(g.receivers[r], n) for r in pairs[:, 1]])
    values = np.zeros(len(pairs))
    for start in np.unique(into):       # an edge changes nothing before its receiver's block:
                                        # begin there
        run = lambda p, start=int(start): _one_edge(at.graphdef, at.state, at.tokens, at.others,
                                                    mine, jnp.asarray(p), graph=g, metric=at.metric,
                                                    start=start)
        values[into == start] = map_batches(run, pairs[into == start], batch_size, at.side)
    return EdgeScores(g, finite("an edge patched", values) - base, "exact", float(base))


def patch_paths(model, clean, corrupted, metric, *sets, batch_size: int | None = None,
                ablation: str = "resample") -> np.ndarray:
    """The metric with each set of edges (names, indices or a boolean array) patched at once: path
    patching. One value a set; the sets run side by side in memory-bounded batches."""
    if not sets:
        raise ConfigError("give at least one set of edges to patch (a list of names or indices; "
                          "[] patches none)")
    at = prepare(model, clean, corrupted, metric, ablation)
    return finite("a set patched", at.under(np.stack([at.graph.mask(s) for s in sets]), batch_size))
