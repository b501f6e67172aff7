"""attention_jax.analysis.pruning: a circuit keeps only edges on a path to the logits; ACDC equals its greedy
loop written with path patching, by the paper's one-sided rule or the two-sided one; every size and selection
is checked; a Ctrl-C keeps every decision made."""
import re

import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import ConfigError
from attention_jax.analysis import discovery, pruning
from attention_jax.analysis.discovery import EdgeScores, edge_patch, patch_paths
from attention_jax.analysis.edges import Graph
from attention_jax.analysis.pruning import acdc, circuit
from attention_jax.errors import SearchInterrupted

from helpers import discovery_case


@pytest.fixture(scope="module", params=["pre", "post"])
def case(request):
    return discovery_case(request.param)


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


@pytest.mark.parametrize("bad", [-1, True, 2.5, np.float64(3.0), "3", None])
def test_a_circuit_size_that_is_no_count_is_refused(bad):
    """Read with Python's slicing or int(), -1, True and 2.5 would each give another circuit than asked."""
    if bad is None:
        with pytest.raises(ConfigError, match="k .* or threshold"):
            circuit(_scores(), k=None)
        return
    with pytest.raises(ConfigError, match=re.escape(f"k={bad!r} must be a whole number")):
        circuit(_scores(), k=bad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.1, True, "0.5"])
def test_a_threshold_that_is_no_finite_number_is_refused(bad):
    with pytest.raises(ConfigError, match="threshold=.* must be a finite number"):
        circuit(_scores(), threshold=bad)


def test_an_edge_selection_is_read_as_numpy_reads_it_or_refused():
    g = _scores().graph
    chosen = np.zeros(len(g.edges), bool)
    chosen[[1, 4]] = True
    np.testing.assert_array_equal(g.mask(chosen), g.mask([1, 4]))      # a boolean array selects, not 0 and 1
    assert g.select([True] * len(g.edges)) == list(range(len(g.edges)))
    for bad, why in ((np.ones(3, bool), "one entry per edge"), ([1.5], "neither a name nor a whole-number"),
                     ([len(g.edges)], "outside the graph"), ([-1], "outside the graph"), ([True], "one entry per edge"),
                     (["0.h0->9.ffn"], "no edge"), (7, "give a list")):
        with pytest.raises(ConfigError, match=why):
            g.mask(bad)


def _greedy(case, threshold, rule, sign=1.0):
    """ACDC as the paper writes it: one path patch per decision, receivers from the logits back; `sign` -1
    for a metric where lower is better."""
    g = edge_patch(*case).graph
    order = sorted(range(len(g.edges)), key=lambda e: (-g.edges[e][1], -g.edges[e][0]))
    patched, current = [], patch_paths(*case, [])[0]
    for e in order:
        value = patch_paths(*case, patched + [e])[0]
        worse = sign * (current - value)
        if (worse if rule == "one_sided" else abs(worse)) < threshold:
            patched, current = patched + [e], value
    return g, [e for e in range(len(g.edges)) if e not in patched]


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["one_sided", "two_sided"])
def test_acdc_equals_its_greedy_loop_written_with_path_patching(case, rule):
    g, kept = _greedy(case, 0.05, rule)
    names = g.names()
    found = acdc(*case, threshold=0.05, rule=rule)
    assert set(found) == set(pruning.reaching(g, kept)) and 0 < len(found) < len(names)
    assert acdc(*case, threshold=1e9, rule=rule) == []
    with pytest.raises(ConfigError, match="threshold=-1"):
        acdc(*case, threshold=-1)
    with pytest.raises(ConfigError, match="rule='both'"):
        acdc(*case, threshold=0.1, rule="both")


def test_the_one_sided_rule_patches_away_every_edge_that_helps(case):
    """Threshold 0: the two-sided rule keeps every edge that moves the metric at all; the one-sided rule
    still removes each whose patching raises it (or leaves it), so it keeps fewer."""
    two, one = acdc(*case, threshold=0.0, rule="two_sided"), acdc(*case, threshold=0.0)
    assert two == edge_patch(*case).graph.names() and set(one) < set(two)


def test_a_ctrl_c_in_acdc_keeps_every_decision_and_resume_goes_on(case, monkeypatch):
    want = acdc(*case, threshold=0.05)
    calls, under = [0], discovery.Setup.under

    def interrupted(self, masks, batch_size=None):
        calls[0] += 1
        if calls[0] == 20:
            raise KeyboardInterrupt
        return under(self, masks, batch_size)
    monkeypatch.setattr(discovery.Setup, "under", interrupted)
    with pytest.raises(SearchInterrupted) as stopped:
        acdc(*case, threshold=0.05)
    assert isinstance(stopped.value, KeyboardInterrupt) and stopped.value.done == 18 == stopped.value.state.done
    assert "resume=state" in str(stopped.value)
    assert acdc(*case, threshold=0.05, resume=stopped.value.state) == want
    with pytest.raises(ConfigError, match="another graph"):
        acdc(*case, threshold=0.05, resume=pruning.ACDCState(np.zeros((2, 2)), 0.0, 0))


@pytest.mark.slow
def test_acdc_on_the_kl_divergence_worsens_by_rising(case):
    """The paper's metric: an edge goes when patching it raises the divergence from the clean run by less
    than the threshold (a fall always lets it go)."""
    from attention_jax.analysis.patching import kl_divergence
    model, clean, corrupted, _ = case
    kl = (model, clean, corrupted, kl_divergence(model, clean))
    tau = float(kl[3](model(jnp.asarray(corrupted)))) / 20          # a twentieth of the whole divergence
    g, kept = _greedy(kl, tau, "one_sided", sign=-1.0)
    found = acdc(*kl, threshold=tau)
    assert set(found) == set(pruning.reaching(g, kept)) and 0 < len(found) < len(g.edges)
