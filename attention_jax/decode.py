"""The compiled decoding loops `generate` runs, and the draw of each next token.

`windows`: uncached, each step a whole window of `context` tokens of each row's text;
`cached`: the prompt in one call (prefill), then one position a step, the keys and values
kept. One `lax.scan` over the new tokens either way; `graphdef` and `state` are a model made
ready to decode (`generate.Decoder`), so no call converts or lays out its weights again.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx


def _argmax(logits) -> jax.Array:
    """jnp.argmax of [V] logits (the first largest; the first NaN if any) in two plain reductions: XLA's
    CPU backend takes about 2.5x their time for argmax's one reduction over (value, index) pairs."""
    top = jnp.max(logits)
    hit = (logits == top) | jnp.isnan(logits)
    return jnp.min(jnp.where(hit, jnp.arange(logits.shape[-1], dtype=jnp.int32), logits.shape[-1]))


def next_token(logits, key, temperature, *, greedy: bool = False, top_k: int | None = None) -> jax.Array:
    """One id drawn from softmax(logits / temperature) over [V] logits, among the `top_k` most likely
    when given (ties at the k-th value kept); `greedy`: the argmax, no key used."""
    logits = logits.astype(jnp.float32)
    if greedy:
        return _argmax(logits)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    # Shifted so the largest is 0 before dividing: a small temperature sends the rest to -inf, never to +inf.
    return jax.random.categorical(key, (logits - jnp.max(logits)) / temperature).astype(jnp.int32)


def _draw(logits, key, temperature, greedy, top_k):
    """One id per row of logits [B, V]: key, sub = split(key); each row draws with its own part of sub."""
    key, sub = jax.random.split(key)
    keys = sub[None] if len(logits) == 1 else jax.random.split(sub, len(logits))   # one row: a 1-D prompt's draws
    draw = jax.vmap(lambda row, k: next_token(row, k, temperature, greedy=greedy, top_k=top_k))
    return draw(logits, keys), key


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "greedy", "top_k"))
def windows(graphdef, state, buf, lengths, key, temperature, *, n: int, greedy: bool, top_k):
    """Uncached: every step runs the model on a whole window of `context` tokens of each row's text
    (`buf`, its prompt `lengths[b]` long, padded on the right, where the causal mask hides it)."""
    model = nnx.merge(graphdef, state)
    B, T = buf.shape[0], model.config.context
    rows = jnp.arange(B)

    def step(carry, i):
        buf, key = carry
        length = lengths + i               # each row's tokens so far
        begin = jnp.maximum(length - T, 0)
        window = jax.vmap(lambda row, at: jax.lax.dynamic_slice(row, (at,), (T,)))(buf, begin)
        token, key = _draw(model(window)[rows, length - 1 - begin], key, temperature, greedy, top_k)
        return (buf.at[rows, length].set(token), key), None

    (buf, _), _ = jax.lax.scan(step, (buf, key), jnp.arange(n))
    return buf


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "greedy", "top_k"))
def cached(graphdef, state, prompt, padding, key, temperature, *, n: int, greedy: bool, top_k):
    """Cached: the prompts (left-padded to one length, `padding[b]` slots in row b) in one call
    (prefill), then one position a step, its keys and values kept."""
    model = nnx.merge(graphdef, state)
    B, P = prompt.shape
    model.init_cache(B, P + n - 1, padding=padding)   # the prompt and every new token but the last are fed back
    logits = model(prompt)[:, -1]
    cached, state = nnx.split(model)

    def step(carry, _):
        # Opaque to XLA each step: else it hoists the weights' conversion to float32 out of the loop,
        # and every token reads float32 weights, whatever dtype they are stored in.
        state, logits, key = jax.lax.optimization_barrier(carry)
        token, key = _draw(logits, key, temperature, greedy, top_k)
        model = nnx.merge(cached, state)
        logits = model(token[:, None])[:, -1]
        return (nnx.state(model), logits, key), token

    (_, logits, key), tokens = jax.lax.scan(step, (state, logits, key), None, length=n - 1)
    last, _ = _draw(logits, key, temperature, greedy, top_k)
    return jnp.concatenate([prompt, tokens.T, last[:, None]], axis=1)
