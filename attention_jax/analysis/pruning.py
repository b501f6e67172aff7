"""From edge scores to a circuit: the top edges that reach the logits, or ACDC's greedy pruning.

    kept = circuit(scores, k=20)                 # the top 20 edges on a path to the logits
    greedy = acdc(model, clean, corrupted, metric,
                  threshold=0.01)                # patch away what changes little

A circuit is a list of edge names. An edge counts only if it lies on a path of kept edges to the
logits: one whose receiver feeds nothing kept cannot change them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from attention_jax.analysis import edges as E
from attention_jax.analysis.checks import finite, number, whole
from attention_jax.analysis.discovery import EdgeScores, prepare
from attention_jax.errors import ConfigError, SearchInterrupted


def circuit(scores: EdgeScores, *, k: int | None = None,
            threshold: float | None = None) -> list[str]:
    """The edges of largest |effect| (the top `k`, or every one at or past `threshold`), less those
    not on a path of kept edges to the logits: by name, largest first."""
    if (k is None) == (threshold is None):
        raise ConfigError("give k (the number of edges) or threshold (the least |effect| kept), "
                          "one of them")
    size = np.abs(scores.effect)
    order = np.argsort(-size, kind="stable")
    if k is not None:
        chosen = order[:whole("k", k, least=0)]
    else:
        chosen = order[size[order] >= number("threshold", threshold)]
    return reaching(scores.graph, chosen)


def reaching(g: E.Graph, chosen) -> list[str]:
    """The edges of `chosen` (indices, in their order) on a path of chosen edges to the
    logits, by name."""
    node = [E.receiver_node(r)[0] for r in g.receivers]
    live, kept = {"logits"}, set()
    for e in sorted(chosen, key=lambda e: -g.edges[e][0]):     # later senders first:
                                                               # their liveness is known
        s, r = g.edges[e]
        if node[r] in live:
            kept.add(int(e))
            live.add(g.senders[s])
    names = g.names()
    return [names[e] for e in chosen if int(e) in kept]


@dataclasses.dataclass(frozen=True)
class ACDCState:
    """Where ACDC stands: the edges patched away so far (a mask), the metric of what is left, and
    how many edges of its order it has decided."""
    patched: np.ndarray
    current: float
    done: int


RULES = ("one_sided", "two_sided")


def acdc(model, clean, corrupted, metric, *, threshold: float, rule: str = "one_sided",
         ablation: str = "resample", resume: ACDCState | None = None) -> list[str]:
    """ACDC's greedy pruning (Conmy et al. 2023): from the whole model, each edge in turn
    (receivers from the logits back, each one's senders latest first) is patched for good when that
    worsens the metric by less than `threshold` from the circuit left so far (the paper's one-sided
    rule: an edge whose patching helps always goes); `rule="two_sided"`: when it moves the metric
    by less than `threshold` either way. Worse is lower, or higher for a metric whose
    `lower_is_better` is true (a divergence, `patching.kl_divergence`). The edges never patched,
    less those off every path to the logits, by name. One patched forward an edge, one after
    another (each decision depends on the ones before), every one the same compiled program;
    `ablation`: what a patched edge carries (`discovery.prepare`). Ctrl-C raises
    `SearchInterrupted`, whose `.state` given back as `resume` goes on where it stopped."""
    threshold = number("threshold", threshold)
    if rule not in RULES:
        raise ConfigError(f"rule={rule!r}; choose 'one_sided' (the paper's) or 'two_sided'")
    at = prepare(model, clean, corrupted, metric, ablation)
    g, sign = at.graph, -1.0 if getattr(metric, "lower_is_better", False) else 1.0
    order = sorted(range(len(g.edges)), key=lambda e: (-g.edges[e][1], -g.edges[e][0]))
    state = resume or ACDCState(g.mask([]),
                                float(finite("the clean run", at.under(g.mask([])[None]))[0]), 0)
    if np.shape(state.patched) != (len(g.senders), len(g.receivers)) \
            or not 0 <= state.done <= len(order):
        raise ConfigError("resume holds another graph's search: resume only the same model, "
                          "texts and metric")
    patched, current, i = np.array(state.patched, np.float32), state.current, state.done
    try:
        while i < len(order):
            trial = patched.copy()
            trial[g.edges[order[i]]] = 1.0
            value = float(finite(f"edge {g.names()[order[i]]} patched", at.under(trial[None]))[0])
            worse = sign * (current - value)
            if (worse if rule == "one_sided" else abs(worse)) < threshold:
                patched, current = trial, value
            i += 1
    except KeyboardInterrupt:       # a decision repeated on resume gives the same answer:
                                    # i may lag by one
        raise SearchInterrupted(ACDCState(patched, current, i), i, len(order)) from None
    return reaching(g, [e for e, (s, r) in enumerate(g.edges) if patched[s, r] == 0])
