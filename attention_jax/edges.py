"""The model as a graph of edges: who writes into the residual stream, and whose input reads it.

    graph = edges.graph_of(model)            # senders, receivers, and every edge between them
    others = edges.outputs(model, corrupted)  # every sender's output on another text
    logits = edges.run(model, graph, tokens, others, graph.mask(["0.h1->logits"]))   # that term from `others`

Senders are the embedding (tokens and positions), each head's output (its share of the output
projection: z_h · W_O[h]) or the whole mixer where it has no heads (the average), and each
feed-forward network. Receivers are each head's query, key and value inputs apart, the mixer's
input where it has no heads, each feed-forward network's input, and the logits. In a residual,
pre-norm model a receiver's input is the sum of its senders' outputs (and the output projections'
biases, which no edge carries): `run` computes it that way, so patching an edge is replacing one
sender's term in one receiver's input by that sender's output in another run (the residual
rewrite), and every edge patched at once is the other run. With no edge patched it is the model,
to float rounding (the sum is taken in another order).

A post-norm model normalises the stream after each sub-layer, `LN(x + f(x))`, so no input past
the first is a sum of outputs: there each LayerNorm is a node too ("0.ln1", "0.ln2"), whose input
is the sum of the stream before it and what the sub-layer wrote, and the heads, the FFN and the
logits read the latest LayerNorm's output alone (one edge each).
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from attention_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Graph:
    """Senders and receivers by name, in the order the model computes them, and the edges as
    (sender, receiver) index pairs: pre-norm, a sender feeds every receiver after it (a head does not
    feed its own block's heads); post-norm, see the module's text."""
    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    edges: tuple[tuple[int, int], ...]

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
            raise ConfigError(f"the graph has no edge {name!r}; its edges read like {self.names()[0]!r}") from None

    def mask(self, which) -> np.ndarray:
        """float32 [senders, receivers]: 1 at each edge in `which` (indices into `edges`, or names)."""
        out = np.zeros((len(self.senders), len(self.receivers)), np.float32)
        for e in which:
            s, r = self.edges[self.index(e) if isinstance(e, str) else int(e)]
            out[s, r] = 1.0
        return out


def _check(model) -> None:
    cfg = model.config
    if not cfg.residual:
        raise ConfigError("the model has no residual stream (residual=False): no input is a sum of senders' "
                          "outputs, so it has no edges to patch")


def graph_of(model) -> Graph:
    """The edge graph of `model` (`LanguageModel`); a model whose inputs are not sums is refused in one line."""
    _check(model)
    cfg = model.config
    if _post(cfg):
        return _post_graph(model)
    senders, receivers, edges = ["embed"], [], []
    for i, block in enumerate(model.blocks):
        before = len(senders)                # a block's mixer reads what was written before it
        if block.mixer is not None and cfg.heads_used:
            heads = [f"{i}.h{h}" for h in range(cfg.heads_used)]
            ins = [f"{head}.{c}" for c in "qkv" for head in heads]         # [q of every head, k..., v...]
        elif block.mixer is not None:
            heads, ins = [f"{i}.mixer"], [f"{i}.mixer"]
        else:
            heads, ins = [], []
        for r in ins:
            edges += [(s, len(receivers)) for s in range(before)]
            receivers.append(r)
        senders += heads
        if block.ffn is not None:
            edges += [(s, len(receivers)) for s in range(len(senders))]
            receivers.append(f"{i}.ffn")
            senders.append(f"{i}.ffn")
    edges += [(s, len(receivers)) for s in range(len(senders))]
    receivers.append("logits")
    return Graph(tuple(senders), tuple(receivers), tuple(edges))


def _post(cfg) -> bool:
    return cfg.layer_norm and cfg.norm == "post"


def _post_graph(model) -> Graph:
    """A post-norm model's graph: each LayerNorm's input the stream before it plus what its sub-layer wrote."""
    cfg, senders, receivers, edges = model.config, ["embed"], [], []
    stream = 0                                # the sender every head, FFN and the logits read

    def receive(name, sources):
        edges.extend((s, len(receivers)) for s in sources)
        receivers.append(name)

    def write(name):
        senders.append(name)
        return len(senders) - 1
    for i, block in enumerate(model.blocks):
        if block.mixer is not None:
            heads = [f"{i}.h{h}" for h in range(cfg.heads_used)] if cfg.heads_used else [f"{i}.mixer"]
            for r in ([f"{head}.{c}" for c in "qkv" for head in heads] if cfg.heads_used else heads):
                receive(r, [stream])
            written = [write(h) for h in heads]
            receive(f"{i}.ln1", [stream, *written])
            stream = write(f"{i}.ln1")
        if block.ffn is not None:
            receive(f"{i}.ffn", [stream])
            ffn = write(f"{i}.ffn")
            receive(f"{i}.ln2", [stream, ffn])
            stream = write(f"{i}.ln2")
    receive("logits", [stream])
    return Graph(tuple(senders), tuple(receivers), tuple(edges))


def _heads(block, ln, x, cfg):
    """A block's heads from their own inputs x [3 * H, B, T, D] (q's, k's, v's): each head's output [H, B, T, D]
    and the output projection's bias (or 0)."""
    mixer = block.mixer
    w, b = mixer.head_weights(), mixer.head_biases()
    x = x.reshape(3, cfg.heads_used, *x.shape[1:])
    q, k, v = (jnp.einsum("HBTD,HDd->BHTd", ln(x[j]), w[c]) + b[c][None, :, None] for j, c in enumerate("qkv"))
    z = mixer._attend(q, k, v)                                             # [B, H, T, d]
    if w["o"] is None:                                                    # one head: its output is the stream's width
        return z.swapaxes(0, 1), 0.0
    return jnp.einsum("BHTd,HdD->HBTD", z, w["o"]), _out_bias(block)


def _out_bias(block):
    """The bias a block's output projection adds to the stream (no edge carries it), or 0."""
    if block.mixer.head_weights()["o"] is None:
        return 0.0
    return 0.0 if block.mixer.out.bias is None else block.mixer.out.bias[...]


def receiver_node(name: str) -> tuple[str, str | None]:
    """A receiver's node and which of its inputs it is: "1.h2.k" -> ("1.h2", "k"); "1.ffn" -> ("1.ffn", None)."""
    node, _, role = name.rpartition(".")
    return (node, role) if role in ("q", "k", "v") and node else (name, None)


def block_of(name: str, n_layers: int) -> int:
    """The block a sender or receiver belongs to: -1 for the embedding, n_layers for the logits."""
    return -1 if name == "embed" else n_layers if name == "logits" else int(name.split(".")[0])


def run(model, graph: Graph, tokens, others, mask):
    """Logits [B, T, V] of `tokens` through the residual rewrite, where each edge (s, r) with mask[s, r]
    = m takes (1 - m) of s's output in this run and m of s's output in the other run, `others`
    [senders, B, T, D] (`outputs`). mask 0: the model; 1 everywhere: the other run."""
    if mask.shape != (len(graph.senders), len(graph.receivers)):
        raise ConfigError(f"the mask is {tuple(mask.shape)} and the graph has {len(graph.senders)} senders and "
                          f"{len(graph.receivers)} receivers: make it with graph.mask(edges)")
    return _forward(model, tokens, others, mask)[0]


def outputs(model, tokens):
    """Every sender's output on `tokens`, [senders, B, T, D]: what `run` patches in from this run."""
    return _forward(model, tokens, None, None)[1]


def run_edge(model, graph: Graph, tokens, others, edge, *, start: int = 0, mine=None):
    """`run` with the one edge (sender, receiver) = `edge` (an int pair, traced or not) patched: the same
    logits, the other run's term added to that one receiver alone, not a mask summed over every sender.
    `start`: an edge into block `start` or later (the logits: `n_layers`) changes nothing before that
    block, so the run begins there from `mine`, every sender's output on `tokens` (`outputs`)."""
    if not start:
        return _forward(model, tokens, others, None, edge)[0]
    before = lambda names: sum(1 for n in names if block_of(n, model.config.n_layers) < start)
    return _forward(model, tokens, others, None, edge, (start, before(graph.senders), before(graph.receivers), mine))[0]


def _forward(model, tokens, others, mask, edge=None, begin=None):
    """(logits, every sender's output); `mask` and `edge` None: no edge patched. `begin`: (block, senders
    and receivers before it, this run's sender outputs) to start at that block."""
    if _post(model.config):
        return _forward_post(model, tokens, others, mask, edge, begin)
    cfg, ln = model.config, (lambda norm: (lambda x: x) if norm is None else norm)
    start = 0 if begin is None else begin[0]
    if begin is None:
        outs, bias, r = [model.embed(tokens)], 0.0, 0
    else:
        _, senders, r, mine = begin
        outs = list(mine[:senders])
        bias = sum((_out_bias(b) for b in model.blocks[:start] if b.mixer is not None and cfg.heads_used), 0.0)

    def inputs(n):                       # the next n receivers' inputs [n, B, T, D]
        here = jnp.stack(outs)
        stream = here.sum(0) + bias
        if edge is not None:             # its sender is written before its receiver reads, or it is elsewhere
            s, at = jnp.minimum(edge[0], len(outs) - 1), edge[1] - r
            hit = (edge[0] < len(outs)) & (at >= 0) & (at < n)
            delta = jnp.where(hit, others[s] - here[s], 0.0)
            return stream[None] + jnp.where((jnp.arange(n) == at)[:, None, None, None], delta[None], 0.0)
        if mask is None:
            return jnp.broadcast_to(stream, (n, *stream.shape))
        return stream[None] + jnp.einsum("sr,sBTD->rBTD", mask[:len(outs), r:r + n], others[:len(outs)] - here)
    for block in list(model.blocks)[start:]:
        if block.mixer is not None and cfg.heads_used:
            heads, b = _heads(block, ln(block.ln1), inputs(3 * cfg.heads_used), cfg)
            r, bias = r + 3 * cfg.heads_used, bias + b
            outs += list(heads)
        elif block.mixer is not None:
            outs.append(block.mixer(ln(block.ln1)(inputs(1)[0])))
            r += 1
        if block.ffn is not None:
            outs.append(block.ffn(ln(block.ln2)(inputs(1)[0])))
            r += 1
    return model.unembed(inputs(1)[0]), jnp.stack(outs)


def _forward_post(model, tokens, others, mask, edge, begin):
    """`_forward` of a post-norm model: each receiver's input the sum of its own senders' outputs."""
    cfg, start = model.config, 0 if begin is None else begin[0]
    if begin is None:
        outs, r = [model.embed(tokens)], 0
    else:
        _, senders, r, mine = begin
        outs = list(mine[:senders])
    stream = len(outs) - 1                   # the last output before a block is its stream: a LayerNorm's, or embed

    def inputs(n, senders, bias=0.0):        # the next n receivers' inputs [n, B, T, D], each reading `senders`
        here, which = jnp.stack([outs[s] for s in senders]), np.asarray(senders)
        x = here.sum(0) + bias
        if edge is not None:
            at, hit = edge[1] - r, which == edge[0]
            delta = jnp.where(hit.any() & (at >= 0) & (at < n), others[edge[0]] - here[jnp.argmax(hit)], 0.0)
            return x[None] + jnp.where((jnp.arange(n) == at)[:, None, None, None], delta[None], 0.0)
        if mask is None:
            return jnp.broadcast_to(x, (n, *x.shape))
        return x[None] + jnp.einsum("sr,sBTD->rBTD", mask[which, r:r + n], others[which] - here)

    def write(value):
        outs.append(value)
        return len(outs) - 1
    for block in list(model.blocks)[start:]:
        if block.mixer is not None:
            if cfg.heads_used:
                heads, bias = _heads(block, lambda x: x, inputs(3 * cfg.heads_used, [stream]), cfg)
                r, written = r + 3 * cfg.heads_used, [write(h) for h in heads]
            else:
                bias, written, r = 0.0, [write(block.mixer(inputs(1, [stream])[0]))], r + 1
            stream, r = write(block.ln1(inputs(1, [stream, *written], bias)[0])), r + 1
        if block.ffn is not None:
            ffn, r = write(block.ffn(inputs(1, [stream])[0])), r + 1
            stream, r = write(block.ln2(inputs(1, [stream, ffn])[0])), r + 1
    return model.unembed(inputs(1, [stream])[0]), jnp.stack(outs)
