"""Which paths carry it: every edge patched, exactly or by gradients, and the circuit they name.

    metric = patching.normalized_logit_diff(model, clean, corrupted, answer, wrong)   # clean 1, corrupted 0
    exact = edge_patch(model, clean, corrupted, metric)       # the metric with each edge patched
    eap = edge_attribution(model, clean, corrupted, metric)   # estimated: one forward, one backward
    kept = circuit(exact, k=20)                               # the top 20 edges that reach the logits
    greedy = acdc(model, clean, corrupted, metric, threshold=0.01)   # ACDC: patch away what changes little
    faithfulness(model, clean, corrupted, metric, exact, ks=[5, 10, 20])   # the circuit alone
    found = smallest_circuit(model, clean, corrupted, metric, exact, share=0.8)   # the fewest that recover 80%

The clean text runs, and a patched edge carries its sender's output from the corrupted run
(ACDC's and edge attribution patching's direction: what breaks the behaviour). Every result is
`effect`: the change of the metric that patching the edge makes (exact), or its estimate
(`edge_attribution`: the metric's gradient with respect to the edge's share of the corrupted
output, at none patched (EAP, Syed et al. 2023), or averaged along the straight line from none
patched to every edge patched (`steps`: integrated gradients over the edges, whose effects then
sum to the whole clean-corrupted change)). Each is one compiled program over the edge graph
(`attention_jax.analysis.edges`), the edges vmapped side by side in memory-bounded batches.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.analysis import edges as E
from attention_jax.errors import ConfigError
from attention_jax.analysis.inspect import deterministic
from attention_jax.analysis.patching import check_metric, in_batches, side_by_side, token_pair


@dataclasses.dataclass(frozen=True)
class EdgeScores:
    """`effect` [edges]: the metric's change with each edge of `graph` patched; `clean`: the metric unpatched."""
    graph: E.Graph
    effect: np.ndarray
    method: str
    clean: float

    def top(self, k: int) -> list[str]:
        """The k edges of largest |effect|, by name, largest first."""
        names = self.graph.names()
        return [names[i] for i in np.argsort(-np.abs(self.effect), kind="stable")[:k]]

    def agreement(self, other: "EdgeScores") -> tuple[float, float]:
        """(Pearson, Spearman) between these effects and `other`'s on the same edges (ties share a rank)."""
        if other.graph != self.graph:
            raise ConfigError("the two scores are over different graphs: score the same model's edges")
        pearson = np.corrcoef(self.effect, other.effect)[0, 1]
        return float(pearson), float(np.corrcoef(_ranks(self.effect), _ranks(other.effect))[0, 1])


def _ranks(a: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank (Spearman's)."""
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a))
    _, tie, count = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(tie, ranks) / count)[tie]


def _setup(model, clean, corrupted, metric):
    model = deterministic(model)
    clean, corrupted = token_pair(model, clean, corrupted)
    graph = E.graph_of(model)
    keyed = check_metric(metric, (*clean.shape, model.config.vocab_size))
    graphdef, state = nnx.split(model)
    others = _outputs(graphdef, state, jnp.asarray(corrupted))
    return _Setup(graph, keyed, graphdef, state, jnp.asarray(clean), others)


@dataclasses.dataclass(frozen=True)
class _Setup:
    graph: E.Graph
    metric: object
    graphdef: object
    state: object
    tokens: jax.Array
    others: jax.Array          # every sender's output on the corrupted text

    def under(self, masks) -> np.ndarray:
        """The metric with each mask [N, senders, receivers] applied."""
        return np.asarray(_patched(self.graphdef, self.state, self.tokens, self.others, jnp.asarray(masks),
                                   graph=self.graph, metric=self.metric), np.float64)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _outputs(graphdef, state, tokens):
    return E.outputs(nnx.merge(graphdef, state), tokens)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _record(graphdef, state, tokens):
    return E.record(nnx.merge(graphdef, state), tokens)


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric"))
def _patched(graphdef, state, tokens, others, masks, *, graph, metric):
    """The metric with each mask [N, senders, receivers] applied, side by side."""
    model = nnx.merge(graphdef, state)
    return jax.vmap(lambda m: metric(E.run(model, graph, tokens, others, m)))(masks)


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric", "start"))
def _one_edge(graphdef, state, tokens, others, mine, pairs, *, graph, metric, start):
    """The metric with each single edge of `pairs` [N, 2] patched, side by side; each edge goes into block
    `start` (n_layers: the logits), so the run begins there."""
    model = nnx.merge(graphdef, state)
    return jax.vmap(lambda p: metric(E.run_edge(model, graph, tokens, others, p, start=start, mine=mine)))(pairs)


def _side_by_side(model, shape) -> int:
    # Each patched forward holds every head's own q, k and v input: three streams a head beside the block's.
    return max(1, side_by_side(model.config, shape) // (1 + max(1, model.config.heads_used)))


def edge_patch(model, clean, corrupted, metric, *, batch_size: int | None = None) -> EdgeScores:
    """The exact effect of patching each edge alone: the metric of the clean run with that edge's sender
    output taken from the corrupted run, minus the clean metric. `batch_size`: patched forwards side by
    side (default: as many as fit in `patching.MEMORY`)."""
    at = _setup(model, clean, corrupted, metric)
    g, n = at.graph, model.config.n_layers
    mine = _record(at.graphdef, at.state, at.tokens)
    pairs = np.asarray(g.edges, np.int32)
    into = np.array([E.block_of(g.receivers[r], n) for r in pairs[:, 1]])
    values = np.zeros(len(pairs))
    for start in np.unique(into):       # an edge changes nothing before its receiver's block: begin there
        run = lambda p, start=int(start): _one_edge(at.graphdef, at.state, at.tokens, at.others, mine, jnp.asarray(p),
                                                    graph=g, metric=at.metric, start=start)
        values[into == start] = in_batches(run, pairs[into == start], batch_size, _side_by_side(model, at.tokens.shape))
    base = float(at.under(at.graph.mask([])[None])[0])
    return EdgeScores(at.graph, np.asarray(values, np.float64) - base, "exact", base)


def patch_paths(model, clean, corrupted, metric, *sets) -> np.ndarray:
    """The metric with each set of edges (names or indices) patched at once: path patching. One value a set."""
    if not sets:
        raise ConfigError("give at least one set of edges to patch (a list of names or indices; [] patches none)")
    at = _setup(model, clean, corrupted, metric)
    return at.under(np.stack([at.graph.mask(s) for s in sets]))


@functools.partial(jax.jit, static_argnames=("graphdef", "graph", "metric", "steps"))
def _gradients(graphdef, state, tokens, others, *, graph, metric, steps):
    model, every = nnx.merge(graphdef, state), jnp.asarray(graph.mask(range(len(graph.edges))))
    grad = jax.grad(lambda m: metric(E.run(model, graph, tokens, others, m)))
    if steps is None:
        return grad(jnp.zeros_like(every))
    alphas = (jnp.arange(steps) + 0.5) / steps               # the midpoint rule along none -> every edge
    return jax.lax.map(lambda a: grad(a * every), alphas).mean(0)


def edge_attribution(model, clean, corrupted, metric, *, steps: int | None = None) -> EdgeScores:
    """Every edge's effect estimated from gradients: at none patched (EAP; `steps` None), or integrated
    over `steps` points from none patched to every edge patched (EAP with integrated gradients)."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1):
        raise ConfigError(f"steps={steps!r} must be a whole number >= 1 (None: the gradient at the clean run)")
    at = _setup(model, clean, corrupted, metric)
    g = _gradients(at.graphdef, at.state, at.tokens, at.others, graph=at.graph, metric=at.metric, steps=steps)
    s, r = np.asarray(at.graph.edges).T
    base = float(at.under(at.graph.mask([])[None])[0])
    return EdgeScores(at.graph, np.asarray(g, np.float64)[s, r], "eap" if steps is None else f"eap_ig{steps}", base)


def circuit(scores: EdgeScores, *, k: int | None = None, threshold: float | None = None) -> list[str]:
    """The edges of largest |effect| (the top `k`, or every one at or past `threshold`), less those not on
    a path of kept edges to the logits: by name, largest first."""
    if (k is None) == (threshold is None):
        raise ConfigError("give k (the number of edges) or threshold (the least |effect| kept), one of them")
    size = np.abs(scores.effect)
    order = np.argsort(-size, kind="stable")
    chosen = order[:k] if k is not None else order[size[order] >= threshold]
    return _reaching(scores.graph, chosen)


def _reaching(g: E.Graph, chosen) -> list[str]:
    """The edges of `chosen` (indices, in their order) on a path of chosen edges to the logits, by name."""
    node = [E.receiver_node(r)[0] for r in g.receivers]
    live, kept = {"logits"}, set()
    for e in sorted(chosen, key=lambda e: -g.edges[e][0]):     # later senders first: their liveness is known
        s, r = g.edges[e]
        if node[r] in live:
            kept.add(int(e))
            live.add(g.senders[s])
    names = g.names()
    return [names[e] for e in chosen if int(e) in kept]


def acdc(model, clean, corrupted, metric, *, threshold: float) -> list[str]:
    """ACDC's greedy pruning (Conmy et al. 2023), with the task's metric: from the whole model, each edge in
    turn (receivers from the logits back, each one's senders latest first) is patched for good when that
    moves the metric by less than `threshold` from the circuit left so far. The edges never patched, less
    those off every path to the logits, by name. One patched forward an edge, one after another (each
    decision depends on the ones before), every one the same compiled program."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) or not threshold >= 0:
        raise ConfigError(f"threshold={threshold!r} must be a number >= 0 (the largest change of the metric an "
                          "edge may make and still be patched away)")
    at = _setup(model, clean, corrupted, metric)
    g = at.graph
    patched = g.mask([])
    current = float(at.under(patched[None])[0])
    for e in sorted(range(len(g.edges)), key=lambda e: (-g.edges[e][1], -g.edges[e][0])):
        trial = patched.copy()
        trial[g.edges[e]] = 1.0
        value = float(at.under(trial[None])[0])
        if abs(value - current) < threshold:
            patched, current = trial, value
    return _reaching(g, [e for e, (s, r) in enumerate(g.edges) if patched[s, r] == 0])


def faithfulness(model, clean, corrupted, metric, scores: EdgeScores, ks) -> np.ndarray:
    """For each k, the circuit of `circuit(scores, k=k)` alone (every other edge patched from the corrupted
    run): its share of the clean-corrupted gap in the metric, (m - m_corrupted) / (m_clean - m_corrupted)."""
    return circuit_faithfulness(model, clean, corrupted, metric, *[circuit(scores, k=int(k)) for k in ks])


def circuit_faithfulness(model, clean, corrupted, metric, *circuits) -> np.ndarray:
    """Each circuit (a list of edge names or indices) alone, every other edge patched from the corrupted
    run: its share of the clean-corrupted gap in the metric. One patched forward a circuit, side by side."""
    at = _setup(model, clean, corrupted, metric)
    every = at.graph.mask(range(len(at.graph.edges)))
    m = at.under(np.stack([np.zeros_like(every), every] + [every - at.graph.mask(c) for c in circuits]))
    return (m[2:] - m[1]) / (m[0] - m[1])


@dataclasses.dataclass(frozen=True)
class Found:
    """`smallest_circuit`'s answer: the circuit's edges, how many top edges it took (None: no k up to the
    most asked recovers the share, and `edges` is the largest's circuit), and the faithfulness at each k."""
    edges: list[str]
    k: int | None
    curve: np.ndarray

    @property
    def faithfulness(self) -> float:
        return float(self.curve[(self.k or len(self.curve)) - 1])


def smallest_circuit(model, clean, corrupted, metric, scores: EdgeScores, *, share: float = 0.8,
                     most: int = 20) -> Found:
    """The circuit of the fewest top edges of `scores` (k = 1 .. `most`) that alone recovers `share` of the
    clean-corrupted gap; where none does, the top `most` edges' circuit, with k None."""
    ks = list(range(1, min(most, len(scores.graph.edges)) + 1))
    curve = faithfulness(model, clean, corrupted, metric, scores, ks)
    k = next((k for k, f in zip(ks, curve) if f >= share), None)
    return Found(circuit(scores, k=k or ks[-1]), k, curve)
