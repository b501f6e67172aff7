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
    logits, computed with the model's own blocks, the other run's term of that sender added to that one
    receiver's input. `start`: the edge goes into block `start` or later (the logits: `n_layers`), so
    the run begins there, from the stream `mine` (every sender's output on `tokens`, `outputs`;
    computed here when None) gives it: under `vmap` over edges, computed once."""
    cfg = model.config
    mine = outputs(model, tokens) if mine is None else mine
    delta = others[edge[0]] - mine[edge[0]]
    first = {block_of(name, cfg.n_layers): r for r, name in reversed(list(enumerate(graph.receivers)))}
    x = _stream_at(model, graph, mine, start)
    for i, block in list(enumerate(model.blocks))[start:]:
        x = _block_with_edge(block, cfg, x, delta, edge[1] - first.get(i, -10**6))
    return model.unembed(x + jnp.where(edge[1] == first[cfg.n_layers], 1.0, 0.0) * delta)   # into the logits


def _stream_at(model, graph: Graph, mine, start: int):
    """The residual stream entering block `start` (the logits: `n_layers`) in the run whose sender outputs
    are `mine`: pre-norm, their sum and the output projections' biases; post-norm, the last one's."""
    cfg = model.config
    before = sum(1 for n in graph.senders if block_of(n, cfg.n_layers) < start)
    if _post(cfg):
        return mine[before - 1]
    heads = [b for b in model.blocks[:start] if b.mixer is not None and cfg.heads_used]
    return mine[:before].sum(0) + sum((_out_bias(b) for b in heads), 0.0)


def _block_with_edge(block, cfg, x, delta, at):
    """One block as the model computes it, with `delta` added to the input of its `at`-th receiver (in the
    graph's order; none when `at` falls outside the block)."""
    post, slot = _post(cfg), 0
    into = lambda k: jnp.where(at == k, 1.0, 0.0) * delta          # the delta, where receiver k is the one
    if block.mixer is not None:
        ln = (lambda v: v) if post or block.ln1 is None else block.ln1
        if cfg.heads_used:
            y, slot = _heads_with_edge(block.mixer, ln, x, delta, at, cfg.heads_used), 3 * cfg.heads_used
        else:
            y, slot = block.mixer(ln(x + into(0))), 1
        x, slot = (block.ln1(x + y + into(slot)), slot + 1) if post else (x + y, slot)
    if block.ffn is not None:
        ln = (lambda v: v) if post or block.ln2 is None else block.ln2
        y = block.ffn(ln(x + into(slot)))
        x = block.ln2(x + y + into(slot + 1)) if post else x + y
    return x


def _heads_with_edge(mixer, ln, x, delta, at, H: int):
    """The mixer's output [B, T, D] with receiver `at` (q of every head, then k's, then v's) fed its own
    input x + delta; the other heads' inputs x. Only that head's projection is computed twice."""
    q, k, v = mixer.project(ln(x))                                 # [B, H, T, d] each
    w, b = mixer.head_weights(), mixer.head_biases()
    role, head = jnp.clip(at // H, 0, 2), at % H
    weight = jnp.stack([w["q"], w["k"], w["v"]])[role, head]        # [D, d]
    own = jnp.einsum("BTD,Dd->BTd", ln(x + delta), weight) + jnp.stack([b["q"], b["k"], b["v"]])[role, head]
    hit = (at >= 0) & (at < 3 * H) & (jnp.arange(H) == head)[:, None, None]
    q, k, v = (jnp.where(hit & (role == c), own[:, None], a) for c, a in enumerate((q, k, v)))
    return mixer.output(mixer._attend(q, k, v))


def _forward(model, tokens, others, mask):
    """(logits, every sender's output); `mask` None: no edge patched."""
    if _post(model.config):
        return _forward_post(model, tokens, others, mask)
    cfg, ln = model.config, (lambda norm: (lambda x: x) if norm is None else norm)
    outs, bias, r = [model.embed(tokens)], 0.0, 0

    def inputs(n):                       # the next n receivers' inputs [n, B, T, D]
        here = jnp.stack(outs)
        stream = here.sum(0) + bias
        if mask is None:
            return jnp.broadcast_to(stream, (n, *stream.shape))
        return stream[None] + jnp.einsum("sr,sBTD->rBTD", mask[:len(outs), r:r + n], others[:len(outs)] - here)
    for block in model.blocks:
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


def _forward_post(model, tokens, others, mask):
    """`_forward` of a post-norm model: each receiver's input the sum of its own senders' outputs."""
    cfg, outs, r = model.config, [model.embed(tokens)], 0
    stream = 0                               # the sender every head, FFN and the logits read

    def inputs(n, senders, bias=0.0):        # the next n receivers' inputs [n, B, T, D], each reading `senders`
        here, which = jnp.stack([outs[s] for s in senders]), np.asarray(senders)
        x = here.sum(0) + bias
        if mask is None:
            return jnp.broadcast_to(x, (n, *x.shape))
        return x[None] + jnp.einsum("sr,sBTD->rBTD", mask[which, r:r + n], others[which] - here)

    def write(value):
        outs.append(value)
        return len(outs) - 1
    for block in model.blocks:
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
