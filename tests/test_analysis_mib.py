"""attention_jax.analysis.mib: edge scores written as EAP-IG names them (a 2-block, 2-head model
against a hand-written list; GPT-2's shape against MIB's edge count) and read back exactly; models
and files with no EAP-IG counterpart refused in one line; CPR and CMD equal MIB's trapezoids over a
plain loop of patched forwards at MIB's sizes."""
import json

import numpy as np
import pytest
from flax import nnx

from attention_jax import ConfigError
from attention_jax.analysis import edges, mib
from attention_jax.analysis.discovery import EdgeScores, edge_patch, patch_paths
from attention_jax.analysis.pruning import circuit, reaching
from attention_jax.config import ModelConfig
from attention_jax.model import LanguageModel

from helpers import discovery_case

# EAP-IG's names for 2 blocks of 2 heads, in the order its Graph.from_model adds them (hannamw/
# EAP-IG, src/eap/graph.py): a block's heads read every node before it, its MLP those and its heads.
NODES = ["input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1", "logits"]
EDGES = """
input->a0.h0<q> input->a0.h0<k> input->a0.h0<v> input->a0.h1<q> input->a0.h1<k> input->a0.h1<v>
input->m0 a0.h0->m0 a0.h1->m0
input->a1.h0<q> input->a1.h0<k> input->a1.h0<v> input->a1.h1<q> input->a1.h1<k> input->a1.h1<v>
a0.h0->a1.h0<q> a0.h0->a1.h0<k> a0.h0->a1.h0<v> a0.h0->a1.h1<q> a0.h0->a1.h1<k> a0.h0->a1.h1<v>
a0.h1->a1.h0<q> a0.h1->a1.h0<k> a0.h1->a1.h0<v> a0.h1->a1.h1<q> a0.h1->a1.h1<k> a0.h1->a1.h1<v>
m0->a1.h0<q> m0->a1.h0<k> m0->a1.h0<v> m0->a1.h1<q> m0->a1.h1<k> m0->a1.h1<v>
input->m1 a0.h0->m1 a0.h1->m1 m0->m1 a1.h0->m1 a1.h1->m1
input->logits a0.h0->logits a0.h1->logits m0->logits a1.h0->logits a1.h1->logits m1->logits
""".split()


@pytest.fixture(scope="module")
def case():
    return discovery_case("pre")


@pytest.fixture(scope="module")
def exact(case):
    return edge_patch(*case)


def _scores_of(cfg: ModelConfig) -> EdgeScores:
    g = edges.graph_of(LanguageModel(cfg, rngs=nnx.Rngs(0)))
    return EdgeScores(g, np.arange(len(g.edges), dtype=float), "exact", 1.0)


def test_a_two_block_two_head_model_is_written_as_eap_ig_names_it(case):
    g = edges.graph_of(case[0])
    data = mib.to_graph_json(EdgeScores(g, np.zeros(len(g.edges)), "exact", 1.0), d_model=16)
    assert data["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
    assert list(data["nodes"]) == NODES and list(data["edges"]) == EDGES     # EAP-IG's order too
    assert mib.eap_ig_graph(2, 2) == (NODES, EDGES)
    assert mib.eap_ig_name("0.h1->1.h0.k") == "a0.h1->a1.h0<k>"
    assert mib.eap_ig_name("embed->1.ffn") == "input->m1"
    assert not any(e["in_graph"] for e in data["edges"].values())   # as EAP-IG's attribution writes
    assert [n for n, v in data["nodes"].items() if v["in_graph"]] == ["logits"]


def test_gpt2_s_shape_has_mib_s_edge_count():
    """MIB evaluates GPT-2 small over 32491 edges (MIB-circuit-track-autoeval, MIB_circuit_track/
    evaluation.py's EDGE_COUNTS): our graph of 12 blocks of 12 heads maps onto EAP-IG's, 1 to 1."""
    small = _scores_of(ModelConfig(vocab_size=8, context=4, d_model=24, n_heads=12, n_layers=12))
    data = mib.to_graph_json(small, d_model=24)
    assert len(small.graph.edges) == len(data["edges"]) == 32491
    assert len(mib.eap_ig_graph(12, 12)[1]) == 32491


def test_a_round_trip_through_the_file_is_exact(case, exact, tmp_path):
    kept = circuit(exact, k=9)
    for lower in (False, True):
        data = mib.to_graph_json(exact, kept, d_model=16, lower_is_better=lower)
        path = mib.save(data, tmp_path / "c.json")
        back, circ = mib.from_graph_json(json.loads(path.read_text()), exact.graph)
        np.testing.assert_array_equal(back.effect, exact.effect)
        assert (back.method, back.clean) == (exact.method, exact.clean)
        assert circ == [n for n in exact.graph.names() if n in kept] and len(kept) > 3
    data = mib.to_graph_json(exact, kept, d_model=16)
    i = exact.graph.index(kept[0])
    assert data["edges"][mib.eap_ig_name(kept[0])]["score"] == -exact.effect[i]   # a loss's sign
    assert mib.from_graph_json(mib.to_graph_json(exact, d_model=16), exact.graph)[1] == []


def test_a_node_is_in_the_graph_as_eap_ig_prunes(exact):
    """A node is in when it sends a circuit edge and receives one (the input needs none), the logits
    always: 0.h1 sends to the last MLP but receives nothing; that MLP receives but sends nothing."""
    data = mib.to_graph_json(exact, ["embed->0.h0.q", "0.h0->logits", "0.h1->1.ffn"], d_model=16)
    assert [n for n, v in data["nodes"].items() if v["in_graph"]] == ["input", "a0.h0", "logits"]


@pytest.mark.parametrize("cfg, named", [
    (dict(norm="post"), "0.ln1"), (dict(mixer="average"), "0.mixer"),
    (dict(feed_forward=False), "m0")])
def test_a_model_with_no_eap_ig_counterpart_is_refused_in_one_line(cfg, named):
    scores = _scores_of(ModelConfig(vocab_size=8, context=4, d_model=8, n_heads=2, n_layers=2, **cfg))
    with pytest.raises(ConfigError, match=named) as err:
        mib.to_graph_json(scores, d_model=8)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=named):
        mib.from_graph_json({"cfg": {}, "nodes": {}, "edges": {}}, scores.graph)


def test_a_file_of_eap_ig_s_own_is_read_with_its_sign(exact):
    data = mib.to_graph_json(exact, ["0.h0->logits"], d_model=16)
    # as EAP-IG writes it, with one score left out (MIB's loader reads it as 0)
    del data[mib.OURS], data["edges"]["a1.h1->logits"]["score"]
    scores, kept = mib.from_graph_json(data, exact.graph)
    i = exact.graph.index("1.h1->logits")
    np.testing.assert_array_equal(np.delete(scores.effect, i), np.delete(exact.effect, i))
    assert scores.effect[i] == 0 and kept == ["0.h0->logits"]
    assert scores.method == "eap-ig file" and np.isnan(scores.clean)
    flipped, _ = mib.from_graph_json(data, exact.graph, lower_is_better=True)
    np.testing.assert_array_equal(flipped.effect, -scores.effect)


def _edit(data, how):
    data = json.loads(json.dumps(data))
    how(data)
    return data


@pytest.mark.parametrize("how, says", [
    (lambda d: d.pop("edges"), "needs keys cfg, nodes and edges"),
    (lambda d: d["cfg"].update(parallel_attn_mlp=True), "not this one"),
    (lambda d: d["cfg"].update(n_layers=3), "not this one"),
    (lambda d: d["edges"].update({"a1.h0->a1.h1<q>": {"score": 1.0, "in_graph": False}}),
     "'a1.h0->a1.h1<q>'"),
    (lambda d: d["edges"].pop("input->logits"), "'input->logits'"),
    (lambda d: d["nodes"]["m0"].update(neurons=[True] * 16), "nodes or neurons"),
    (lambda d: d["nodes"]["m0"].update(score=0.5), "nodes or neurons"),
    (lambda d: d["edges"]["input->m0"].update(score="high"), "not a finite number"),
    (lambda d: d["edges"]["input->m0"].update(score=float("nan")), "not a finite number")])
def test_a_file_that_does_not_fit_the_graph_is_refused_in_one_line(exact, how, says):
    data = _edit(mib.to_graph_json(exact, d_model=16), how)
    with pytest.raises(ConfigError, match=says) as err:
        mib.from_graph_json(data, exact.graph)
    assert "\n" not in str(err.value)


def test_mib_s_integration_rule_by_hand():
    assert mib.areas([0.5, 1.0], [0.2, 1.0], [0.2, 1.0]) == pytest.approx((0.3, 0.2))
    # a circuit past the model (1.4) counts 0.4 from 1 in CMD, and 1.4 in CPR
    got = mib.areas([0.1, 0.2, 1.0], [0, 1.4, 1], [0, 1.4, 1])
    assert got == pytest.approx((0.07 + 0.96, 0.07 + 0.16))
    assert mib.areas(mib.MIB_SIZES, [1.0] * 10, [1.0] * 10) == pytest.approx((0.999, 0.0))
    for bad in ([0.5], [0.2, 0.1], [0.0, 1.0], [0.5, 1.5], "0.5", [True, 1.0], 3):
        with pytest.raises(ConfigError, match="size"):
            mib.areas(bad, [0, 1], [0, 1])


def test_cpr_and_cmd_are_mib_s_trapezoids_over_a_plain_loop(case, exact):
    """At each of MIB's sizes, the top int(size * 46) edges, CPR's by the signed score (the smallest
    effect first: the metric is higher where the model does the task), CMD's by |effect|, each alone
    (every other edge patched: an edge off every path to the logits changes nothing, so none is
    pruned here)."""
    got = mib.cpr_cmd(*case, exact)
    n = len(exact.graph.edges)
    assert n == 46 and got["k"] == [0, 0, 0, 0, 0, 2, 4, 9, 23, 46]
    assert got["sizes"] == list(mib.MIB_SIZES)
    every = list(range(n))
    clean_m, corrupted_m = patch_paths(*case, [], every)
    curves = {}
    for name, order in (("cpr", np.argsort(exact.effect, kind="stable")),
                        ("cmd", np.argsort(-np.abs(exact.effect), kind="stable"))):
        curve = []
        for k in got["k"]:
            m = patch_paths(*case, [e for e in every if e not in set(order[:k])])[0]
            curve.append((m - corrupted_m) / (clean_m - corrupted_m))
        curves[name] = np.array(curve)
        np.testing.assert_allclose(got[f"{name}_curve"], curve, atol=1e-5)
    x = mib.MIB_SIZES
    assert got["cpr"] == pytest.approx(np.trapezoid(curves["cpr"], x), abs=1e-5)
    assert got["cmd"] == pytest.approx(np.trapezoid(np.abs(1 - curves["cmd"]), x), abs=1e-5)
    np.testing.assert_allclose(curves["cpr"][[0, -1]], [0, 1], atol=1e-5)
    assert not np.allclose(curves["cpr"], curves["cmd"])          # the two rankings differ here


def test_cpr_ranks_by_the_signed_score_and_flips_with_a_divergence(case, exact, monkeypatch):
    seen = []

    def spy(model, clean, corrupted, metric, *circuits, **kw):
        seen.append(circuits)
        return np.linspace(0, 1, len(circuits))
    monkeypatch.setattr(mib, "circuit_faithfulness", spy)
    model, clean, corrupted, metric = case
    got = mib.cpr_cmd(*case, exact, sizes=[0.1, 1.0])
    flat = np.linspace(0, 1, 4)
    assert (got["cpr_curve"], got["cmd_curve"]) == (flat[:2].tolist(), flat[2:].tolist())
    assert (got["cpr"], got["cmd"]) == mib.areas([0.1, 1.0], flat[:2], flat[2:])
    least = np.argsort(exact.effect, kind="stable")[:4]
    most = np.argsort(-exact.effect, kind="stable")[:4]
    assert seen[0][0] == reaching(exact.graph, least)
    assert seen[0][2] == circuit(exact, k=4)
    assert seen[0][0] and set(least) != set(most)

    def divergence(logits):
        return metric(logits)
    divergence.lower_is_better = True
    mib.cpr_cmd(model, clean, corrupted, divergence, exact, sizes=[0.1, 1.0])
    assert seen[1][0] == reaching(exact.graph, most)
    assert seen[1][2] == circuit(exact, k=4)
    with pytest.raises(ConfigError, match="another model's graph"):
        other = ModelConfig(vocab_size=8, context=4, d_model=8, n_heads=2, n_layers=1)
        mib.cpr_cmd(*case, _scores_of(other))
