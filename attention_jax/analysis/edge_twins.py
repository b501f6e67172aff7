"""Edge patching as twins on the model's own forward (auto-circuit's way, done by select/replace).

A graph (`analysis.edges`) says where in the model each receiver reads and each sender writes,
by the model's own paths. At those places `TWINS` (a table for `attention_jax.swap.twins`) puts:
- `EdgePoint` at a hook point: the inputs of the receivers read there (a sub-layer's input hook,
  `hook_final` for the logits), the output of the senders written there (the embedding at the
  first block's `hook_resid_pre`, a feed-forward's or average's output hook), and the stream
  entering each block;
- `EdgeHeads` for an attention mixer: each head reads its own q, k and v input (when a rule gives
  one a receiver) and its output, z_h · W_O[h], is a sender's;
- `EdgeNorm` for a post-norm LayerNorm, a receiver and a sender at once.
Every twin calls the part it replaces (a live hook patch included), so with nothing patched the
model computes what it computes without them. A `Rule` shared by the twins of one forward says what
a receiver reads: `Record` (nothing patched; outputs and streams kept), `Masked` (each edge a share
of the other run's term), `Added` (each edge a share of a difference fixed in advance) or
`OneEdge` (one edge's term added to one receiver). The receivers of a
head mixer are in the order of its fused q|k|v columns: every head's q, then every k, then every v.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.layers import Hook, LayerNorm
from attention_jax.model import Head, MultiHeadAttention
from attention_jax.swap import select


class Record:
    """No edge patched: every sender's output, and the stream entering each block, kept by index."""
    keeps = True

    def __init__(self):
        self.outs, self.streams = {}, {}

    def send(self, senders, values):                  # values [len(senders), B, T, D]
        self.outs.update(zip(senders, values))

    def stream(self, i, x):
        self.streams[i] = x

    def receive(self, receivers, sources, x, split):
        return x

    def heads(self, mixer, receivers, x, norm):
        return mixer.project(x)


class Masked(Record):
    """Receiver r reads its stream plus mask[s, r] · (s's output in the other run - in this one),
    for each of its senders s: the residual rewrite. `others` [senders, B, T, D]; `mask`
    [senders, receivers]."""

    def __init__(self, others, mask):
        super().__init__()
        self.others, self.mask = others, mask

    def receive(self, receivers, sources, x, split):
        here = jnp.stack([self.outs[s] for s in sources])
        share = _take(self.mask, sources)[:, receivers[0]:receivers[-1] + 1]
        xs = x[None] + jnp.einsum("sr,sBTD->rBTD", share, _take(self.others, sources) - here)
        return xs if split else xs[0]

    def heads(self, mixer, receivers, x, norm):  # x [3H, B, T, D]: each receiver's own input
        w, b = mixer.head_weights(), mixer.head_biases()
        x = x.reshape(3, -1, *x.shape[1:])
        return tuple(jnp.einsum("HBTD,HDd->BHTd", x[j], w[c]) + b[c][None, :, None]
                     for j, c in enumerate("qkv"))


class Added(Masked):
    """Receiver r reads its stream plus mask[s, r] · diff[s] for each of its senders s: a
    difference fixed in advance (EAP-IG's, the corrupted run's outputs less the clean run's), not
    read off this run, so d metric / d mask[s, r] is diff[s] · (d metric / d r's input) wherever
    this run is. Nothing is kept."""
    keeps = False

    def __init__(self, diff, mask):
        Record.__init__(self)
        self.diff, self.mask = diff, mask

    def send(self, senders, values):
        pass

    def receive(self, receivers, sources, x, split):
        share = _take(self.mask, sources)[:, receivers[0]:receivers[-1] + 1]
        xs = x[None] + jnp.einsum("sr,sBTD->rBTD", share, _take(self.diff, sources))
        return xs if split else xs[0]


def _take(a, rows):
    """a[rows] for rows given as a tuple of ints: a slice where they run on one by one (pre-norm's
    every sender so far), a gather otherwise."""
    if rows == tuple(range(rows[0], rows[0] + len(rows))):
        return a[rows[0]:rows[0] + len(rows)]
    return a[np.asarray(rows)]


class OneEdge(Record):
    """The edge (sender, receiver) = `edge` (ints, traced or not) alone: its receiver reads its
    stream plus `delta`, the sender's output in the other run less this run's (the same, as nothing
    before it is patched). Nothing is kept."""
    keeps = False

    def __init__(self, edge, delta):
        super().__init__()
        self.edge, self.delta, self.moved = edge, delta, {}

    def send(self, senders, values):
        pass

    def _hit(self, receivers):
        return (self.edge[1] >= receivers[0]) & (self.edge[1] <= receivers[-1])

    def receive(self, receivers, sources, x, split):
        moved = x + jnp.where(self._hit(receivers), 1.0, 0.0) * self.delta
        if not split:
            return moved
        # The heads read the stream as it is (the same for every edge into this block, so under
        # vmap computed once); the one receiver's input, moved, waits for `heads`.
        self.moved[receivers[0]] = moved
        return x

    def heads(self, mixer, receivers, x, norm):   # x: the stream, through the block's own norm
        q, k, v = mixer.project(x)                 # [B, H, T, d]: every head from the stream
        w, b = mixer.head_weights(), mixer.head_biases()
        H = q.shape[-3]
        j = jnp.clip(self.edge[1] - receivers[0], 0, 3 * H - 1)
        weight = jnp.stack([w[c] for c in "qkv"]).reshape(3 * H, *w["q"].shape[1:])[j]     # [D, d]
        bias = jnp.stack([b[c] for c in "qkv"]).reshape(3 * H, -1)[j]
        own = jnp.einsum("BTD,Dd->BTd", norm(self.moved.pop(receivers[0])), weight) + bias
        hit = self._hit(receivers) & (jnp.arange(H) == j % H)[:, None, None]
        return tuple(jnp.where(hit & (j // H == c), own[:, None], a)
                     for c, a in enumerate((q, k, v)))


class EdgePoint(nnx.Module):
    """A hook point where receivers read (`reads`, with their senders `sources`), senders write
    (`writes`) or a block's stream enters (`stream`), after the hook it replaces."""

    def __init__(self, hook, rule, place):
        self.reference, self.rule, self.place = hook, rule, place

    def __call__(self, x):
        x, place = self.reference(x), self.place
        if place.stream is not None:
            self.rule.stream(place.stream, x)
        if place.writes:
            self.rule.send(place.writes, x[None])
        return self.rule.receive(place.reads, place.sources, x, place.split) if place.reads else x


class EdgeHeads(nnx.Module):
    """An attention mixer whose heads read what the rule gives them and whose heads' outputs are
    senders; it projects, attends (hooks and all) and outputs through the mixer's own methods."""

    def __init__(self, mixer, rule, place, norm=None):
        self.reference, self.rule, self.place = mixer, rule, place
        # The norm its receivers' inputs pass on the way in (pre-norm's ln1), as a function: the
        # block's own module, which the block calls as ever; the twin calls it on one input apart.
        self.norm = (lambda v: v) if norm is None else (lambda v: norm(v))

    def __call__(self, x):
        mixer, rule = self.reference, self.rule
        z = mixer._attend(*rule.heads(mixer, self.place.reads, x, self.norm))   # [B, H, T, d]
        if rule.keeps:
            o = mixer.head_weights()["o"]
            each = z.swapaxes(0, 1) if o is None else jnp.einsum("BHTd,HdD->HBTD", z, o)
            rule.send(self.place.writes, each)
        return mixer.output(z)


class EdgeNorm(nnx.Module):
    """A post-norm LayerNorm: a receiver (the stream before it plus what its sub-layer wrote)
    and a sender."""

    def __init__(self, norm, rule, place):
        self.reference, self.rule, self.place = norm, rule, place

    def __call__(self, x):
        place = self.place
        y = self.reference(self.rule.receive(place.reads, place.sources, x, False))
        self.rule.send(place.writes, y[None])
        return y


def _twin(kind):
    def make(part, path, *, places, rule, within):
        place = places.get(path)
        if place is None:
            return None
        if kind is EdgeHeads:
            return kind(part, rule, place, select(within, place.norm) if place.norm else None)
        return kind(part, rule, place)
    return make


# Which twin replaces which part (`attention_jax.swap.twins`), where the graph's `places` name
# the path.
TWINS = {Hook: _twin(EdgePoint), Head: _twin(EdgeHeads), MultiHeadAttention: _twin(EdgeHeads),
         LayerNorm: _twin(EdgeNorm)}
