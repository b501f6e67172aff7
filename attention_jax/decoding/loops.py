"""The compiled decoding loops `generate` runs, and the draw of each next token.

`windows`: uncached, each step a whole window of `context` tokens of each row's text;
`cached_loop`: the prompt in one call (`prefill`), then one position a step (`extend`), the
keys and values kept by the key/value cache's twins (`kv_cache.cached`, swapped into a copy:
`cached_model`). `graphdef` and `state` are a model made ready to decode (`generate.Decoder`),
so no call converts or lays out its weights again.

The new tokens come in chunks, each one compiled call of a `while` loop whose length is an
argument (one program for every chunk size): the first chunk a few tokens, each later one as
many as take about `CHUNK_SECONDS` at the rate measured so far. Between chunks the host
checks that every logit drawn from was finite (else `NotFinite`, before more are drawn), and a
Ctrl-C ends the loop at the next chunk's end, the tokens drawn so far kept (`Stopped`).
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.decoding import kv_cache

CHUNK_SECONDS = 0.25     # a Ctrl-C is answered within about this; a chunk costs one call's launch
FIRST_CHUNK = 4


class NotFinite(Exception):
    """The logits of new token `index` (0: the first) were NaN or infinite."""

    def __init__(self, index: int):
        self.index = index
        super().__init__(index)


class Stopped(Exception):
    """Ctrl-C while decoding: `out` holds the tokens written so far, `done` of them new in each
    row."""

    def __init__(self, out: np.ndarray, done: int):
        self.out, self.done = out, done
        super().__init__(done)


def _argmax(logits) -> jax.Array:
    """jnp.argmax of [V] logits (the first largest; the first NaN if any) in two plain reductions:
    XLA's CPU backend takes about 2.5x their time for argmax's one reduction over (value, index)
    pairs."""
    top = jnp.max(logits)
    hit = (logits == top) | jnp.isnan(logits)
    return jnp.min(jnp.where(hit, jnp.arange(logits.shape[-1], dtype=jnp.int32), logits.shape[-1]))


def next_token(logits, key, temperature, *, greedy: bool = False,
               top_k: int | None = None) -> jax.Array:
    """One id drawn from softmax(logits / temperature) over [V] logits, among the `top_k` most
    likely when given (ties at the k-th value kept); `greedy`: the argmax, no key used."""
    logits = logits.astype(jnp.float32)
    if greedy:
        return _argmax(logits)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    # Shifted so the largest is 0 before dividing: a small temperature sends the rest to -inf, never
    # to +inf.
    return jax.random.categorical(key, (logits - jnp.max(logits)) / temperature).astype(jnp.int32)


def _draw(logits, key, temperature, greedy, top_k):
    """One id per row of logits [B, V]: key, sub = split(key); each row draws with its own part of
    sub (one row: sub itself, a 1-D prompt's draws)."""
    key, sub = jax.random.split(key)
    keys = sub[None] if len(logits) == 1 else jax.random.split(sub, len(logits))
    draw = jax.vmap(lambda row, k: next_token(row, k, temperature, greedy=greedy, top_k=top_k))
    return draw(logits, keys), key


def _finite(logits) -> jax.Array:
    return jnp.all(jnp.isfinite(logits))


class Graph:
    """A model's graph as the loops' static argument, hashed once: flax hashes a graph anew at each
    call (about a millisecond for a small model), and each chunk is a call."""

    def __init__(self, graph):
        self.graph, self._hash = graph, hash(graph)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return self is other or isinstance(other, Graph) and self.graph == other.graph


@functools.partial(jax.jit, static_argnums=0)
def _zeros(shapes):
    """The empty cache of `shapes` ((tree, ((shape, dtype), ...))), made in one call, not a leaf a
    call."""
    tree, leaves = shapes
    return jax.tree.unflatten(tree, [jnp.zeros(shape, dtype) for shape, dtype in leaves])


@functools.partial(jax.jit, static_argnames=("graph", "greedy", "top_k"),
                   donate_argnames=("buf",))
def _windows(graph, state, buf, lengths, key, temperature, at, count, *, greedy: bool, top_k):
    """Tokens `at` .. `at + count - 1` (new in each row), each from a whole window of `context`
    tokens of its row's text (`buf`, its prompt `lengths[b]` long, padded on the right, where the
    causal mask hides it): (buf, key, whether every logit drawn from was finite)."""
    model = nnx.merge(graph.graph, state)
    B, T = buf.shape[0], model.config.context
    rows = jnp.arange(B)

    def step(i, carry):
        buf, key, finite = carry
        length = lengths + i               # each row's tokens so far
        begin = jnp.maximum(length - T, 0)
        window = jax.vmap(lambda row, at: jax.lax.dynamic_slice(row, (at,), (T,)))(buf, begin)
        logits = model(window)[rows, length - 1 - begin]
        token, key = _draw(logits, key, temperature, greedy, top_k)
        return buf.at[rows, length].set(token), key, finite & _finite(logits)

    return jax.lax.fori_loop(at, at + count, step, (buf, key, jnp.bool_(True)))


def cached_model(graphdef, state, batch: int, length: int):
    """The model of `graphdef` and `state` with the key/value cache's twins in (`kv_cache.cached`,
    for `batch` rows of `length` slots), split as (its `Graph`, its empty cache, the rest): made
    once a shape, nothing computed; the rest holds `state`'s very arrays. `cached_loop` takes the
    empty cache's shapes alone (`jax.ShapeDtypeStruct`s), so a caller keeping this for later calls
    keeps no cache."""
    model = nnx.merge(graphdef, state)
    kv_cache.cached(model, batch, length)
    graph, empty, rest = nnx.split(model, nnx.Cache, ...)
    return Graph(graph), empty, rest


@functools.partial(jax.jit, static_argnames=("graph",), donate_argnames=("empty",))
def prefill(graph, rest, empty, prompt, padding):
    """The prompts (left-padded to one length, `padding[b]` slots in row b) through the cached model
    (`cached_model`) in one call: (the cache's state, for `extend`; the logits of each row's last
    position [B, V])."""
    model = nnx.merge(graph.graph, empty, rest)
    decoding = kv_cache.Cached.resume(model)
    if decoding.clock is not None:
        decoding.clock.start[...] = padding
    logits = decoding(prompt)[:, -1]
    return nnx.state(model, nnx.Cache), logits


@functools.partial(jax.jit, static_argnames=("graph", "greedy", "top_k"),
                   donate_argnames=("cache", "out"))
def extend(graph, state, cache, logits, key, temperature, out, at, count, *, greedy: bool, top_k):
    """`count` new tokens, each drawn from `logits`, written to `out` [B, N] at column `at` + i and
    fed through the cached model (`graph` merged with `cache` and the rest of its `state`, the
    weights: `cached_model`) for the next logits: (cache, logits, key, out, whether every logit
    drawn from was finite). The weights go in and not out: a call copies none of them."""
    def step(i, carry):
        # Opaque to XLA each step, the weights included: else it hoists their conversion to float32
        # out of the loop, and every token reads float32 weights, whatever dtype they are stored in.
        state, cache, logits, key, out, finite = jax.lax.optimization_barrier(carry)
        token, key = _draw(logits, key, temperature, greedy, top_k)
        model = nnx.merge(graph.graph, cache, state)
        finite = finite & _finite(logits)
        logits = kv_cache.Cached.resume(model)(token[:, None])[:, -1]
        out = jax.lax.dynamic_update_slice(out, token[:, None], (0, i))
        return state, nnx.state(model, nnx.Cache), logits, key, out, finite

    carry = (state, cache, logits, key, out, jnp.bool_(True))
    return jax.lax.fori_loop(at, at + count, step, carry)[1:]


@functools.partial(jax.jit, static_argnames=("greedy", "top_k"))
def last(logits, key, temperature, *, greedy: bool, top_k):
    """The last new token, drawn and not fed back: (tokens [B], whether the logits were finite)."""
    return _draw(logits, key, temperature, greedy, top_k)[0], _finite(logits)


def _chunks(total: int):
    """(at, count) over 0 .. total - 1, each chunk sized to take about CHUNK_SECONDS at the rate the
    chunks before it ran (the caller computes each chunk between one yield and the next)."""
    at, rate = 0, None
    while at < total:
        count = min(FIRST_CHUNK if rate is None else max(1, int(CHUNK_SECONDS * rate)), total - at)
        began = time.perf_counter()
        yield at, count
        took = time.perf_counter() - began
        compiling = rate is None and at == 0 and took > CHUNK_SECONDS
        rate = None if compiling else count / max(took, 1e-6)
        at += count


def cached_loop(made, prompt, padding, key, temperature, *, n: int, greedy: bool,
                top_k) -> np.ndarray:
    """The prompts [B, P] followed by `n` >= 1 new tokens each, [B, P + n], decoded with the cache;
    `made`: `cached_model(graphdef, state, B, P + n - 1)` (every new token but the last is fed
    back), its cache as arrays or their shapes."""
    B, P = prompt.shape
    graph, empty, state = made
    leaves, tree = jax.tree.flatten(empty)
    empty = _zeros((tree, tuple((a.shape, jnp.dtype(a.dtype)) for a in leaves)))   # to prefill
    cache, logits = prefill(graph, state, empty, prompt, padding)
    out, done = jnp.zeros((B, n), jnp.int32), 0
    try:
        for at, count in _chunks(n - 1):
            cache, logits, key, out, finite = extend(graph, state, cache, logits, key, temperature,
                                                     out, at, count, greedy=greedy, top_k=top_k)
            if not bool(finite):       # waits for the chunk: a Ctrl-C meanwhile is raised here
                raise NotFinite(at)
            done = at + count
        token, finite = last(logits, key, temperature, greedy=greedy, top_k=top_k)
        finite = bool(finite)
    except KeyboardInterrupt:
        drawn = np.concatenate([np.asarray(prompt), np.asarray(out)[:, :done]], 1)
        raise Stopped(drawn, done) from None
    if not finite:
        raise NotFinite(n - 1)
    return np.concatenate([np.asarray(prompt), np.asarray(out.at[:, n - 1].set(token))], axis=1)


def windows(graphdef, state, buf, lengths, key, temperature, *, n: int, greedy: bool,
            top_k) -> np.ndarray:
    """Uncached: `n` new tokens for each row of `buf` (its prompt `lengths[b]` long, padded on the
    right), each step a whole window of `context` tokens; the buffer back, [B, max(context, P +
    n)]."""
    done, graph = 0, Graph(graphdef)
    try:
        for at, count in _chunks(n):
            buf, key, finite = _windows(graph, state, buf, lengths, key, temperature, at, count,
                                        greedy=greedy, top_k=top_k)
            if not bool(finite):       # waits for the chunk: a Ctrl-C meanwhile is raised here
                raise NotFinite(at)
            done = at + count
    except KeyboardInterrupt:
        raise Stopped(np.asarray(buf), done) from None
    return np.asarray(buf)
