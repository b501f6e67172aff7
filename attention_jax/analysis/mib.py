"""MIB's format and scores: edge scores as EAP-IG's graph file, and a circuit's CPR and CMD.

    data = to_graph_json(scores, circuit(scores, k=20), d_model=model.config.d_model)
    save(data, "importances.json")                            # what MIB's circuit track reads
    scores, kept = from_graph_json(json.load(open("importances.json")), edges.graph_of(model))
    cpr_cmd(model, clean, corrupted, metric, scores)          # {"k", "cpr", "cmd", ...}

MIB (Mueller et al., ICML 2025) reads circuits in EAP-IG's graph format (hannamw/EAP-IG,
src/eap/graph.py: `Graph.from_model`, `to_json`, `from_json`): {"cfg": {n_layers, n_heads,
parallel_attn_mlp, d_model}, "nodes": {name: {"in_graph"}}, "edges": {name: {"score",
"in_graph"}}}. Nodes: "input" (our "embed"), "a{l}.h{h}" (our "{l}.h{h}"), "m{l}" (our "{l}.ffn"),
"logits"; an edge into a head names the input, "a0.h1->a1.h0<k>" (our "0.h1->1.h0.k"). Its
graph of sequential blocks is ours edge for edge for a pre-norm model with heads and an MLP in
every block: the input feeds every node (the logits too), a head feeds its block's MLP and every
later block but not its own block's heads, the logits read every node. Anything else is refused
in one line: a post-norm model (LayerNorm nodes), an average mixer (no heads), a block with no
MLP, a file of parallel blocks (whose MLPs do not read their block's heads), a file with an edge
the graph lacks or lacking one it has.

Signs: MIB scores edges with a loss, the negated logit difference (MIB-circuit-track
scripts/run_attribution.py, `loss=True`), so an edge that carries the behaviour scores above 0,
where `effect` (the change of a metric that is higher where the model does the task) is below.
So the file's score is -effect, or effect where `lower_is_better` (a divergence). A key of ours
beside EAP-IG's three, which its `from_json` ignores, keeps the method, clean value and sign.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from attention_jax.analysis import edges as E
from attention_jax.analysis.checks import MIN_GAP, number, whole
from attention_jax.analysis.discovery import EdgeScores
from attention_jax.analysis.faithfulness import circuit_faithfulness
from attention_jax.analysis.pruning import circuit
from attention_jax.errors import ConfigError

MIB_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)   # shares of all edges
OURS = "attention_jax"          # the key beside cfg, nodes and edges that EAP-IG does not read


def eap_ig_graph(n_layers: int, n_heads: int) -> tuple[list[str], list[str]]:
    """EAP-IG's node and edge names of sequential blocks, in `Graph.from_model`'s order."""
    nodes, edges, stream = ["input"], [], ["input"]
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        edges += [f"{s}->{a}<{c}>" for s in stream for a in heads for c in "qkv"]
        stream += heads
        edges += [f"{s}->m{layer}" for s in stream]
        stream.append(f"m{layer}")
        nodes += [*heads, f"m{layer}"]
    return [*nodes, "logits"], [*edges, *(f"{s}->logits" for s in stream)]


def _node(name: str) -> str:
    """Our node as EAP-IG names it: "embed" -> "input", "1.h0" -> "a1.h0", "1.ffn" -> "m1"."""
    if name in ("embed", "logits"):
        return "input" if name == "embed" else name
    block, part = name.split(".", 1)
    return f"m{block}" if part == "ffn" else f"a{block}.{part}"


def eap_ig_name(edge: str) -> str:
    """One of our edge names as EAP-IG writes it: "0.h1->1.h0.k" -> "a0.h1->a1.h0<k>"."""
    sender, receiver = edge.split("->")
    node, role = E.receiver_node(receiver)
    return f"{_node(sender)}->{_node(node)}" + (f"<{role}>" if role else "")


def _mapped(graph: E.Graph) -> tuple[int, int, dict[str, int]]:
    """(n_layers, n_heads, EAP-IG's name of each edge, in its order -> our index) of `graph`, which
    must be EAP-IG's graph of that shape: refused in one line where it is not."""
    odd = next((n for n in graph.senders if n.endswith((".mixer", ".ln1", ".ln2"))), None)
    if odd:
        raise ConfigError(f"the graph has node {odd!r}, which EAP-IG's graph (MIB's format) lacks: "
                          "it holds heads and MLPs alone, so write a pre-norm model with heads")
    layers = len({n.split(".")[0] for n in graph.senders if n != "embed"})
    heads = sum(n.startswith("0.h") for n in graph.senders)
    ours = {eap_ig_name(n): i for i, n in enumerate(graph.names())}
    want = eap_ig_graph(layers, heads)[1]
    if set(ours) != set(want):
        lack = next(n for n in want if n not in ours)
        raise ConfigError(f"EAP-IG's graph of {layers} blocks of {heads} heads has {lack!r}, which "
                          "this graph lacks: MIB's format needs heads and an MLP in every block")
    return layers, heads, {n: ours[n] for n in want}


def to_graph_json(scores: EdgeScores, circuit: list[str] | None = None, *, d_model: int,
                  lower_is_better: bool = False) -> dict:
    """`scores`, and `circuit`'s edges in the graph, as EAP-IG's `Graph.to_json` writes them
    (`d_model`: its reader sizes neuron masks by it). A node is in the graph as EAP-IG prunes: it
    sends a circuit edge and receives one (the input needs none); the logits always are."""
    g = scores.graph
    layers, heads, order = _mapped(g)
    kept = set(g.select(circuit or []))
    sends = {_node(g.senders[g.edges[e][0]]) for e in kept}
    gets = {_node(E.receiver_node(g.receivers[g.edges[e][1]])[0]) for e in kept}
    sign = 1.0 if lower_is_better else -1.0
    return {"cfg": {"n_layers": layers, "n_heads": heads, "parallel_attn_mlp": False,
                    "d_model": whole("d_model", d_model)},
            "nodes": {n: {"in_graph": n == "logits" or (n in sends and (n == "input" or n in gets))}
                      for n in eap_ig_graph(layers, heads)[0]},
            "edges": {n: {"score": sign * float(scores.effect[i]), "in_graph": i in kept}
                      for n, i in order.items()},
            OURS: {"method": scores.method, "lower_is_better": bool(lower_is_better),   # no NaN:
                   "clean": scores.clean if np.isfinite(scores.clean) else None}}     # JSON's


def save(data: dict, path) -> pathlib.Path:
    """`to_graph_json`'s dict written as JSON to `path`, which EAP-IG's `Graph.from_json` reads."""
    path = pathlib.Path(path)
    path.write_text(json.dumps(data))
    return path


def from_graph_json(data: dict, graph: E.Graph, *, lower_is_better: bool | None = None):
    """(EdgeScores, circuit) from an EAP-IG graph file's dict, over `edges.graph_of(model)`; the
    circuit: its edges in the graph, by our names, in the graph's order. `lower_is_better`: the
    sign (None: as a file of ours says, else MIB's, effect = -score). A missing score reads as 0, as
    MIB's loader reads it; a node- or neuron-level file is refused."""
    if not isinstance(data, dict) or not {"cfg", "nodes", "edges"} <= set(data):
        raise ConfigError("the data is no EAP-IG graph file: it needs keys cfg, nodes and edges")
    layers, heads, order = _mapped(graph)
    cfg, edges = data["cfg"], data["edges"]
    if cfg.get("parallel_attn_mlp") or (cfg.get("n_layers"), cfg.get("n_heads")) != (layers, heads):
        raise ConfigError(f"the file's graph (cfg {cfg}) is not this one ({layers} sequential "
                          f"blocks of {heads} heads): read it with the graph of its model")
    if any({"score", "neurons"} & set(node) for node in data["nodes"].values()):
        raise ConfigError("the file scores nodes or neurons, which edge scores cannot hold: "
                          "give an edge-level file")
    stray = sorted(set(edges) - set(order)) or sorted(set(order) - set(edges))
    if stray:
        raise ConfigError(f"the file and the graph differ in edge {stray[0]!r}: read it with the "
                          "graph of the model it was made for")
    ours = data.get(OURS) or {}
    lower = ours.get("lower_is_better", False) if lower_is_better is None else lower_is_better
    try:
        raw = np.array([edges[n].get("score", 0.0) for n in order], np.float64)
    except (TypeError, ValueError):
        raw = np.array([np.nan])
    if not np.isfinite(raw).all():
        raise ConfigError("an edge's score in the file is not a finite number: give numbers")
    effect = np.empty(len(order))
    effect[list(order.values())] = raw * (1.0 if lower else -1.0)
    clean = ours.get("clean")
    scores = EdgeScores(graph, effect, ours.get("method", "eap-ig file"),
                        float("nan") if clean is None else float(clean))
    kept = sorted(i for n, i in order.items() if edges[n].get("in_graph"))
    return scores, [graph.names()[i] for i in kept]


def _sizes(sizes) -> list[float]:
    """MIB's x-axis checked: two or more shares of all edges, rising, each in (0, 1]."""
    try:
        xs = [number("a size", s) for s in sizes]
    except TypeError:
        xs = []
    if len(xs) < 2 or not all(0 < a < b for a, b in zip(xs, xs[1:])) or not 0 < xs[-1] <= 1:
        raise ConfigError(f"sizes={sizes!r} must be two or more rising shares of all edges in "
                          "(0, 1], such as MIB_SIZES")
    return xs


def areas(sizes, cpr_curve, cmd_curve) -> tuple[float, float]:
    """(CPR, CMD) by MIB's rule, the trapezoid rule over the sizes (shares of all edges, a linear
    axis): CPR the area under the faithfulness curve, CMD the area between it and 1, |1 - f|;
    summed as MIB sums them (MIB-circuit-track-autoeval eval_results/print_scores.py)."""
    xs, cpr, cmd = _sizes(sizes), 0.0, 0.0
    for i in range(len(xs) - 1):
        dx = xs[i + 1] - xs[i]
        cpr += dx * ((cpr_curve[i] + cpr_curve[i + 1]) / 2)
        cmd += dx * ((abs(1.0 - cmd_curve[i]) + abs(1.0 - cmd_curve[i + 1])) / 2)
    return float(cpr), float(cmd)


def cpr_cmd(model, clean, corrupted, metric, scores: EdgeScores, *, sizes=MIB_SIZES,
            min_gap: float = MIN_GAP, batch_size: int | None = None) -> dict:
    """MIB's CPR and CMD of `scores`: at each size the top int(size * edges) edges (MIB's rounding
    down), less those off every path to the logits (`pruning.circuit`), alone (its faithfulness).
    As MIB's evaluation does, CPR's circuits take the largest signed scores (the edges that most
    carry the behaviour: the smallest effect, or the largest where `metric.lower_is_better`), CMD's
    the largest |effect|. {"sizes", "k", "cpr_curve", "cmd_curve", "cpr", "cmd"}, JSON's types."""
    xs = _sizes(sizes)
    if E.graph_of(model) != scores.graph:
        raise ConfigError("the scores are of another model's graph: score this model's edges")
    ks = [int(x * len(scores.graph.edges)) for x in xs]
    loss = scores.effect if getattr(metric, "lower_is_better", False) else -scores.effect
    rank = np.empty(len(loss))        # its size orders as the signed score: circuit() ranks by size
    rank[np.argsort(-loss, kind="stable")] = np.arange(len(loss), 0, -1)
    signed = dataclasses.replace(scores, effect=rank)
    circuits = [circuit(signed, k=k) for k in ks] + [circuit(scores, k=k) for k in ks]
    f = circuit_faithfulness(model, clean, corrupted, metric, *circuits, min_gap=min_gap,
                             batch_size=batch_size).tolist()
    cpr, cmd = areas(xs, f[:len(ks)], f[len(ks):])
    return {"sizes": xs, "k": ks, "cpr_curve": f[:len(ks)], "cmd_curve": f[len(ks):],
            "cpr": cpr, "cmd": cmd}
