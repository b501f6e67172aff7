"""How much of the behaviour a circuit carries: the circuit alone, every other edge patched.

    faithfulness(model, clean, corrupted, metric, scores, ks=[5, 10, 20])   # the top-k circuits alone
    found = smallest_circuit(model, clean, corrupted, metric, scores, share=0.8)   # the fewest that recover 80%

Faithfulness is a share of the clean-corrupted gap in the metric, (m - m_corrupted) / (m_clean -
m_corrupted): 1 where the circuit alone behaves as the model, 0 where as the corrupted run. A share
of a gap means nothing where the gap is zero, not finite, or below `min_gap` (in the metric's own
units): there every function here raises `NotMeasurable` instead of returning a number.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from attention_jax.analysis.checks import MIN_GAP, finite, gap, number, whole
from attention_jax.analysis.discovery import EdgeScores, prepare
from attention_jax.analysis.pruning import circuit
from attention_jax.errors import ConfigError

def circuit_faithfulness(model, clean, corrupted, metric, *circuits, min_gap: float = MIN_GAP,
                         batch_size: int | None = None) -> np.ndarray:
    """Each circuit (edge names, indices or a boolean array) alone, every other edge patched from the
    corrupted run: its share of the clean-corrupted gap. One patched forward a circuit, side by side in
    memory-bounded batches (`batch_size`: how many)."""
    at = prepare(model, clean, corrupted, metric)
    every = at.graph.mask(range(len(at.graph.edges)))
    ends = finite("the clean or the corrupted run", at.under(np.stack([np.zeros_like(every), every])))
    width = gap(ends[0], ends[1], min_gap)
    masks = np.stack([every - at.graph.mask(c) for c in circuits]) if circuits else np.zeros((0, *every.shape))
    m = finite("a circuit alone", at.under(masks, batch_size)) if circuits else np.zeros(0)
    return (m - ends[1]) / width


def faithfulness(model, clean, corrupted, metric, scores: EdgeScores, ks, *, min_gap: float = MIN_GAP,
                 batch_size: int | None = None) -> np.ndarray:
    """For each k, the circuit of `pruning.circuit(scores, k=k)` alone: its share of the gap."""
    try:
        ks = list(ks)
    except TypeError:
        raise ConfigError(f"ks={ks!r} must be a list of circuit sizes (whole numbers >= 0)") from None
    circuits = [circuit(scores, k=whole("k", k, least=0)) for k in ks]
    return circuit_faithfulness(model, clean, corrupted, metric, *circuits, min_gap=min_gap, batch_size=batch_size)


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
                     most: int = 20, min_gap: float = MIN_GAP) -> Found:
    """The circuit of the fewest top edges of `scores` (k = 1 .. `most`) that alone recovers `share` of the
    clean-corrupted gap; where none does, the top `most` edges' circuit, with k None."""
    share, most = number("share", share), whole("most", most)
    ks = list(range(1, min(most, len(scores.graph.edges)) + 1))
    curve = faithfulness(model, clean, corrupted, metric, scores, ks, min_gap=min_gap)
    k = next((k for k, f in zip(ks, curve) if f >= share), None)
    return Found(circuit(scores, k=k or ks[-1]), k, curve)
