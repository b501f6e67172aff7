"""The model as a graph of edges: who writes into the residual stream, and whose input reads it.

    graph = edges.graph_of(model)            # senders, receivers, and every edge between them
    others = edges.outputs(model, corrupted)  # every sender's output on another text
    logits = edges.run(model, graph, tokens, others,
                       graph.mask(["0.h1->logits"]))   # that term from `others`

Senders are the embedding (tokens and positions), each head's output (its share of the output
projection: z_h · W_O[h]) or the whole mixer where it has no heads (the average), and each
feed-forward network. Receivers are each head's query, key and value inputs apart, the mixer's
input where it has no heads, each feed-forward network's input, and the logits. In a residual,
pre-norm model a receiver's input is the sum of its senders' outputs (and the output projections'
biases, which no edge carries), so patching an edge is replacing one sender's term in one
receiver's input by that sender's output in another run (the residual rewrite), and every edge
patched at once is the other run. With no edge patched it is the model, to float rounding.

A post-norm model (`config.post_norm`) normalises the stream after each sub-layer, `LN(x + f(x))`,
so no input past the first is a sum of outputs: there each LayerNorm is a node too ("0.ln1",
"0.ln2"), whose input is the stream before it plus what the sub-layer wrote, and the heads, the FFN
and the logits read the latest LayerNorm's output alone (one edge each).

Every function here runs the model's own forward, `model(tokens)`, with the edge twins of
`analysis.edge_twins` swapped in at the places the graph names (live hook patches stay in force):
`graph_of` is the one place that knows the names, their order and where each lives in the model.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.analysis import edge_twins
from attention_jax.errors import ConfigError
from attention_jax.swap import swap, twins


class Place(NamedTuple):
    """What happens at one path of the model: the receivers read there (with the senders they read)
    and whether one input each is handed on (`split`: a head mixer's), the senders written there,
    and the block whose entering stream passes there (n_layers: the final stream)."""
    reads: tuple[int, ...] = ()
    sources: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    stream: int | None = None
    split: bool = False
    norm: str | None = None     # a head mixer's: the norm its inputs pass on the way in (ln1)


@dataclasses.dataclass(frozen=True)
class Graph:
    """Senders and receivers by name, in the order the model computes them, the edges as (sender,
    receiver) index pairs, and `places`: (model path, `Place`) for the twins. Pre-norm, a sender
    feeds every receiver after it (a head does not feed its own block's heads); post-norm, see the
    module's text."""
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    edges: tuple[tuple[int, int], ...]
    places: tuple[tuple[str, Place], ...] = ()

    def names(self) -> list[str]:
        """Each edge as "sender->receiver", e.g. "0.h1->1.h0.k"."""
        return list(self._places)

    @functools.cached_property
    def _places(self) -> dict[str, int]:
        return {f"{self.senders[s]}->{self.receivers[r]}": i for i, (s, r) in enumerate(self.edges)}

    def index(self, name: str) -> int:
        """An edge's place in `edges`, from its name."""
        try:
            return self._places[name]
        except KeyError:
            raise ConfigError(f"the graph has no edge {name!r}; its edges read like "
                              f"{self.names()[0]!r}") from None

    def select(self, which) -> list[int]:
        """Edge indices from names, whole-number indices, or a boolean array over `edges` (NumPy's
        way); anything else (a fraction, an index past the graph, a mask of another
        graph) in one line."""
        if isinstance(which, (str, bytes)):
            which = [which]
        try:
            items = list(np.asarray(which).reshape(-1)) if isinstance(which, np.ndarray) \
                else list(which)
        except TypeError:
            raise ConfigError(f"edges {which!r}: give a list of names or indices, "
                              "or a boolean array") from None
        if items and all(isinstance(e, (bool, np.bool_)) for e in items):
            if np.shape(which) != (len(self.edges),):
                raise ConfigError(f"a boolean selection must have one entry per edge "
                                  f"({len(self.edges)}), got shape {np.shape(which)}")
            return [int(i) for i in np.flatnonzero(items)]
        return [self._one(e) for e in items]

    def _one(self, e) -> int:
        if isinstance(e, str):
            return self.index(e)
        if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer)):
            raise ConfigError(f"edge {e!r} is neither a name nor a whole-number index: give names "
                              f"such as {self.names()[0]!r} or indices 0 .. {len(self.edges) - 1}")
        if not 0 <= e < len(self.edges):
            raise ConfigError(f"edge index {e} is outside the graph's {len(self.edges)} edges "
                              f"(0 .. {len(self.edges) - 1})")
        return int(e)

    def mask(self, which) -> np.ndarray:
        """float32 [senders, receivers]: 1 at each edge of `which` (`select`'s: names,
        indices, booleans)."""
        out = np.zeros((len(self.senders), len(self.receivers)), np.float32)
        for e in self.select(which):
            out[self.edges[e]] = 1.0
        return out


def head_inputs(block: int, heads: int) -> list[str]:
    """The receivers of a head mixer, in the order of its fused q|k|v columns: every head's q, then
    k's, then v's ("0.h0.q", "0.h1.q", ..., "0.h1.v")."""
    return [f"{block}.h{h}.{c}" for c in "qkv" for h in range(heads)]


def graph_of(model) -> Graph:
    """The edge graph of `model` (`LanguageModel`); a model whose inputs are not sums is
    refused in one line."""
    cfg = model.config
    if not cfg.residual:
        raise ConfigError("the model has no residual stream (residual=False): no input is a sum of "
                          "senders' outputs, so it has no edges to patch")
    g = _Builder(post=cfg.post_norm)
    g.places["blocks.0.hook_resid_pre"] = Place(writes=(g.write("embed"),), stream=0)
    for i, block in enumerate(model.blocks):
        if i:
            g.places[f"blocks.{i}.hook_resid_pre"] = Place(stream=i)
        if block.mixer is not None:
            pre = f"blocks.{i}.ln1" if block.ln1 is not None and not cfg.post_norm else None
            g.sublayer(f"blocks.{i}", "mixer", i, cfg.heads_used, norm=pre)
        if block.ffn is not None:
            g.sublayer(f"blocks.{i}", "ffn", i, 0)
    g.places["hook_final"] = Place(reads=(g.read("logits", g.stream()),), sources=g.stream(),
                                   stream=cfg.n_layers)
    return Graph(tuple(g.senders), tuple(g.receivers), tuple(g.edges), tuple(g.places.items()))


class _Builder:
    """Senders, receivers and edges as a forward pass meets them; `stream()`: the senders the next
    receiver reads (pre-norm: every one so far; post-norm: the latest LayerNorm, or
    the embedding)."""

    def __init__(self, post: bool):
        self.post, self.senders, self.receivers, self.edges, self.places = post, [], [], [], {}
        self.latest = 0

    def write(self, name: str) -> int:
        self.senders.append(name)
        return len(self.senders) - 1

    def read(self, name: str, sources) -> int:
        self.edges += [(s, len(self.receivers)) for s in sources]
        self.receivers.append(name)
        return len(self.receivers) - 1

    def stream(self) -> tuple[int, ...]:
        return (self.latest,) if self.post else tuple(range(len(self.senders)))

    def sublayer(self, at: str, part: str, i: int, heads: int, norm: str | None = None) -> None:
        """A mixer (its heads, or itself) or a feed-forward network, and in post-norm its LayerNorm;
        `norm`: the path of the norm a head mixer's inputs pass on the way in (pre-norm's)."""
        sources = self.stream()
        names = head_inputs(i, heads) if heads else [f"{i}.{part}"]
        reads = tuple(self.read(n, sources) for n in names)
        hook_in, hook_out = (f"{at}.hook_mixer_in", f"{at}.hook_mixer_out") if part == "mixer" \
            else (f"{at}.hook_ffn_in", f"{at}.hook_ffn_out")
        self.places[hook_in] = Place(reads=reads, sources=sources, split=bool(heads))
        writes = tuple(self.write(n)
                       for n in ([f"{i}.h{h}" for h in range(heads)] or [f"{i}.{part}"]))
        self.places[f"{at}.mixer" if heads else hook_out] = Place(
            reads=reads if heads else (), writes=writes, norm=norm if heads else None)
        if self.post:
            norm = f"{i}.ln{1 if part == 'mixer' else 2}"
            into = (self.latest, *writes)
            self.places[f"{at}.ln{norm[-1]}"] = Place(reads=(self.read(norm, into),), sources=into,
                                                      writes=(self.write(norm),))
            self.latest = len(self.senders) - 1


def receiver_node(name: str) -> tuple[str, str | None]:
    """A receiver's node and which of its inputs it is: "1.h2.k" -> ("1.h2", "k"); "1.ffn" ->
    ("1.ffn", None)."""
    node, _, role = name.rpartition(".")
    return (node, role) if role in ("q", "k", "v") and node else (name, None)


def block_of(name: str, n_layers: int) -> int:
    """The block a sender or receiver belongs to: -1 for the embedding, n_layers for the logits."""
    return -1 if name == "embed" else n_layers if name == "logits" else int(name.split(".")[0])


class Recorded(NamedTuple):
    """One run's every sender output [senders, B, T, D] and the stream entering each block and the
    final one [n_layers + 1, B, T, D]."""
    senders: jax.Array
    streams: jax.Array


def _twinned(model, graph: Graph, rule):
    """A copy of `model` (its arrays shared, the caller's model untouched, so any transform may
    trace it) with the edge twins of `rule` in at the graph's places."""
    if graph != graph_of(model):
        raise ConfigError("the graph is not this model's: make it with edges.graph_of(model)")
    copy = nnx.merge(*nnx.split(model))
    swap(copy, twins(copy, edge_twins.TWINS, places=dict(graph.places), rule=rule, within=copy))
    return copy


def record(model, tokens, graph: Graph | None = None) -> Recorded:
    """Every sender's output and every block's entering stream on `tokens`, through the
    model as it is."""
    rule = edge_twins.Record()
    _twinned(model, graph or graph_of(model), rule)(tokens)
    stack = lambda kept: jnp.stack([kept[i] for i in range(len(kept))])
    return Recorded(stack(rule.outs), stack(rule.streams))


def outputs(model, tokens):
    """Every sender's output on `tokens`, [senders, B, T, D]: what `run` patches in
    from this run."""
    return record(model, tokens).senders


def run(model, graph: Graph, tokens, others, mask):
    """Logits [B, T, V] of `tokens` through the residual rewrite, where each edge (s, r) with
    mask[s, r] = m takes (1 - m) of s's output in this run and m of s's output in the other run,
    `others` [senders, B, T, D] (`outputs`). mask 0: the model; 1 everywhere: the other run."""
    mask, others = _checked(graph, tokens, mask, others, "others")
    return _twinned(model, graph, edge_twins.Masked(others, mask))(tokens)


def run_added(model, graph: Graph, tokens, diff, mask):
    """Logits [B, T, V] of `tokens` with mask[s, r] · diff[s] added to each receiver r's input, for
    each of its senders s: `diff` [senders, B, T, D] fixed in advance (EAP-IG's
    corrupted-minus-clean outputs), where `run` reads this run's outputs. mask 0: the model."""
    mask, diff = _checked(graph, tokens, mask, diff, "diff")
    return _twinned(model, graph, edge_twins.Added(diff, mask))(tokens)


def _checked(graph: Graph, tokens, mask, outputs, name: str):
    """The mask and the senders' outputs as arrays, if they fit the graph and the tokens: a list is
    read as the array it spells; a mask of another graph, or outputs of another batch, is
    refused in one line."""
    if np.shape(mask) != (len(graph.senders), len(graph.receivers)):
        raise ConfigError(f"the mask is {tuple(np.shape(mask))} and the graph has "
                          f"{len(graph.senders)} senders and {len(graph.receivers)} receivers: "
                          "make it with graph.mask(edges)")
    if np.shape(outputs)[:3] != (len(graph.senders), *np.shape(tokens)):
        raise ConfigError(f"{name} is {tuple(np.shape(outputs))}: it must be every sender's output "
                          f"on texts of the tokens' shape, [{len(graph.senders)}, "
                          f"{', '.join(map(str, np.shape(tokens)))}, D] "
                          "(edges.outputs of the other run)")
    return jnp.asarray(mask, jnp.float32), jnp.asarray(outputs)


def run_edge(model, graph: Graph, tokens, others, edge, *, start: int = 0,
             mine: Recorded | None = None):
    """`run` with the one edge (sender, receiver) = `edge` (an int pair, traced or not) patched:
    the same logits, computed with the model's own blocks from block `start` (the edge must go into
    it or a later one; the logits: `n_layers`), beginning from the stream `mine` (`record` of
    `tokens`; made here when None) gives it: under `vmap` over edges, made once."""
    n = model.config.n_layers
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start <= n:
        raise ConfigError(f"start={start!r} must be a block from 0 to {n} (the logits' {n}) at or "
                          "before the edge's")
    if not isinstance(edge, jax.core.Tracer):
        _check_edge(graph, edge, start, n)
    mine = record(model, tokens, graph) if mine is None else mine
    delta = others[edge[0]] - mine.senders[edge[0]]
    model, x = _twinned(model, graph, edge_twins.OneEdge(edge, delta)), mine.streams[start]
    for block in list(model.blocks)[start:]:
        x = block(x)
    return model.unembed(x)


def _check_edge(graph: Graph, edge, start: int, n: int) -> None:
    pair = tuple(int(v) for v in np.asarray(edge).reshape(-1))
    if pair not in set(graph.edges):
        raise ConfigError(f"edge={pair} is no (sender, receiver) pair of the graph: "
                          "take one of graph.edges")
    into = block_of(graph.receivers[pair[1]], n)
    if start > into:
        raise ConfigError(f"start={start} is past the edge's receiver ({graph.receivers[pair[1]]}, "
                          f"block {into}): start at block {into} or before")
