"""How much of the behaviour a circuit carries: the circuit alone, every other edge patched.

    faithfulness(model, clean, corrupted, metric, scores,
                 ks=[5, 10, 20])                             # the top-k circuits alone
    found = smallest_circuit(model, clean, corrupted, metric, scores,
                             share=0.8)                      # the fewest that recover 80%

Faithfulness is a share of the clean-corrupted gap in the metric, (m - m_corrupted) / (m_clean -
m_corrupted): 1 where the circuit alone behaves as the model, 0 where as the corrupted run. A share
of a gap means nothing where the gap is zero, not finite, or below `min_gap` (in the metric's own
units), or where it is within its noise (`gap_interval`: a bootstrap over the texts, for a metric
that gives a value per text, as `patching`'s do): there every function here raises
`NotMeasurable` instead of returning a number.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.analysis import edges as E
from attention_jax.analysis.checks import MIN_GAP, finite, gap, number, whole
from attention_jax.analysis.discovery import EdgeScores, prepare
from attention_jax.analysis.pruning import circuit
from attention_jax.errors import ConfigError, NotMeasurable


@dataclasses.dataclass(frozen=True)
class Gap:
    """The clean-corrupted gap in the metric, and its `level` bootstrap interval over the texts
    (None where the metric gives no value per text: it has no `per_prompt`)."""
    value: float
    low: float | None
    high: float | None
    texts: int

    @property
    def within_noise(self) -> bool:
        return self.low is not None and self.low <= 0.0 <= self.high


def gap_interval(model, clean, corrupted, metric, *, ablation: str = "resample",
                 resamples: int = 1000, level: float = 0.95, seed: int = 0) -> Gap:
    """The metric's clean-corrupted gap (the corrupted end: every edge patched, by `ablation`),
    with a percentile bootstrap over the texts of the batch (the metric's `per_prompt` values of
    both runs, the same texts drawn for both)."""
    resamples, level = whole("resamples", resamples), number("level", level)
    at = prepare(model, clean, corrupted, metric, ablation)
    both = _ends(at.graphdef, at.state, at.tokens, at.others, graph=at.graph)
    value = float(metric(both[0])) - float(metric(both[1]))
    if not hasattr(metric, "per_prompt"):
        return Gap(value, None, None, int(at.tokens.shape[0]))
    each = np.asarray(metric.per_prompt(both[0]) - metric.per_prompt(both[1]), np.float64)
    draws = np.random.default_rng(seed).integers(0, len(each), (resamples, len(each)))
    low, high = np.quantile(each[draws].mean(1), [(1 - level) / 2, (1 + level) / 2])
    return Gap(value, float(low), float(high), len(each))


@functools.partial(jax.jit, static_argnames=("graphdef", "graph"))
def _ends(graphdef, state, tokens, others, *, graph):
    """The logits with no edge patched and with every edge patched: [2, B, T, V]."""
    model, every = nnx.merge(graphdef, state), graph.mask(range(len(graph.edges)))
    return jnp.stack([E.run(model, graph, tokens, others, m)
                      for m in (np.zeros_like(every), every)])


def circuit_faithfulness(model, clean, corrupted, metric, *circuits, min_gap: float = MIN_GAP,
                         batch_size: int | None = None, ablation: str = "resample") -> np.ndarray:
    """Each circuit (edge names, indices or a boolean array) alone, every other edge patched from
    the corrupted run (or as `ablation` says, `discovery.prepare`): its share of the
    clean-corrupted gap. One patched forward a circuit, side by side in memory-bounded batches
    (`batch_size`: how many). A gap below `min_gap`, or whose 95% bootstrap interval over the texts
    holds 0 (a metric with `per_prompt`), is `NotMeasurable`."""
    at = prepare(model, clean, corrupted, metric, ablation)
    every = at.graph.mask(range(len(at.graph.edges)))
    ends = finite("the clean or the corrupted run",
                  at.under(np.stack([np.zeros_like(every), every])))
    width = gap(ends[0], ends[1], min_gap)
    noise = gap_interval(model, clean, corrupted, metric, ablation=ablation)
    if noise.within_noise:
        raise NotMeasurable(f"the clean-corrupted gap {noise.value:.3g} is within its noise "
                            f"(95% bootstrap interval over the {noise.texts} texts: "
                            f"{noise.low:.3g} to {noise.high:.3g}): a share of it is not "
                            "measurable; use more texts, or texts the model tells apart")
    masks = np.stack([every - at.graph.mask(c) for c in circuits]) if circuits \
        else np.zeros((0, *every.shape))
    m = finite("a circuit alone", at.under(masks, batch_size)) if circuits else np.zeros(0)
    return (m - ends[1]) / width


def faithfulness(model, clean, corrupted, metric, scores: EdgeScores, ks, *,
                 min_gap: float = MIN_GAP, batch_size: int | None = None,
                 ablation: str = "resample") -> np.ndarray:
    """For each k, the circuit of `pruning.circuit(scores, k=k)` alone: its share of the gap."""
    try:
        ks = list(ks)
    except TypeError:
        raise ConfigError(f"ks={ks!r} must be a list of circuit sizes "
                          "(whole numbers >= 0)") from None
    circuits = [circuit(scores, k=whole("k", k, least=0)) for k in ks]
    return circuit_faithfulness(model, clean, corrupted, metric, *circuits, min_gap=min_gap,
                                batch_size=batch_size, ablation=ablation)


@dataclasses.dataclass(frozen=True)
class Found:
    """`smallest_circuit`'s answer: the circuit's edges, how many top edges it took (None: no k up
    to the most asked recovers the share, and `edges` is the largest's circuit), and the
    faithfulness at each k."""
    edges: list[str]
    k: int | None
    curve: np.ndarray

    @property
    def faithfulness(self) -> float:
        return float(self.curve[(self.k or len(self.curve)) - 1])


def smallest_circuit(model, clean, corrupted, metric, scores: EdgeScores, *, share: float = 0.8,
                     most: int = 20, min_gap: float = MIN_GAP, ablation: str = "resample") -> Found:
    """The circuit of the fewest top edges of `scores` (k = 1 .. `most`) that alone recovers
    `share` of the clean-corrupted gap; where none does, the top `most` edges'
    circuit, with k None."""
    share, most = number("share", share), whole("most", most)
    ks = list(range(1, min(most, len(scores.graph.edges)) + 1))
    curve = faithfulness(model, clean, corrupted, metric, scores, ks, min_gap=min_gap,
                         ablation=ablation)
    k = next((k for k, f in zip(ks, curve) if f >= share), None)
    return Found(circuit(scores, k=k or ks[-1]), k, curve)
