"""Text from a trained model: one token at a time, each drawn from its next-token distribution.

    ids = generate(model, tokenizer.encode("ROMEO:").ids, 100, key=jax.random.key(0), temperature=0.8)
    print(tokenizer.decode(ids))

One compiled program per (model structure, prompt shape, number of tokens). By default the
prompt goes through the model once (prefill, `LanguageModel.init_cache`), then each new
token alone, reading the keys and values the cache keeps: O(T) work a token, up to the
model's context. `cache=False` is the reference it is tested against: each step feeds the
model a whole window of `context` tokens (the text so far padded on the right, which the
causal mask hides, or its last `context` tokens), so it also writes past the context.
Either way the model computes with `speed` (default `Speed()`) swapped in; `speed=None`
decodes with the model as built.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.errors import ConfigError
from attention_jax.model import Bidirectional, check_ids
from attention_jax.speed import Speed, fast


def next_token(logits, key, temperature, *, greedy: bool = False, top_k: int | None = None) -> jax.Array:
    """One id drawn from softmax(logits / temperature) over [V] logits, among the `top_k` most likely
    when given (ties at the k-th value kept); `greedy`: the argmax, no key used."""
    logits = logits.astype(jnp.float32)
    if greedy:
        return jnp.argmax(logits).astype(jnp.int32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    # Shifted so the largest is 0 before dividing: a small temperature sends the rest to -inf, never to +inf.
    return jax.random.categorical(key, (logits - jnp.max(logits)) / temperature).astype(jnp.int32)


MAX_NEW = 1_000_000     # tokens a call: the uncached path holds the whole text, 4 bytes an id a row


def _is_key(key) -> bool:
    """A typed key (jax.random.key) or a raw uint32[2] one (jax.random.PRNGKey)."""
    if not isinstance(key, jax.Array):
        return False
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 0 or (key.dtype == jnp.uint32
                                                                                  and key.shape == (2,))


def _draw(logits, key, temperature, greedy, top_k):
    """One id per row of logits [B, V]: key, sub = split(key); each row draws with its own part of sub."""
    key, sub = jax.random.split(key)
    keys = sub[None] if len(logits) == 1 else jax.random.split(sub, len(logits))   # one row: a 1-D prompt's draws
    draw = jax.vmap(lambda row, k: next_token(row, k, temperature, greedy=greedy, top_k=top_k))
    return draw(logits, keys), key


WEIGHTS = ("float32", "bfloat16", "float16")


def _stored(state, weights: str):
    """The parameters as decoding reads them: every matrix (the kernels, the token and position tables)
    rounded to `weights` once, before the first token; vectors (biases, LayerNorms) as they are."""
    if weights == "float32":
        return state
    low = jnp.dtype(weights)
    return jax.tree.map(lambda a: a.astype(low) if a.ndim >= 2 and a.dtype == jnp.float32 else a, state)


def _check_weights(weights) -> None:
    if weights not in WEIGHTS:
        raise ConfigError(f"weights={weights!r}; choose one of {', '.join(map(repr, WEIGHTS))}")


def rounded(model, weights: str = "bfloat16"):
    """A copy of `model` holding its weight matrices as `generate(..., weights=...)` reads them: to
    compare its logits with the model's own (the caller's model is not changed)."""
    _check_weights(weights)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, _stored(state, weights), copy=True)


def _merged(graphdef, state, speed, weights="float32"):
    """The model to decode with: a copy (the caller's stays untouched), its matrices stored in `weights`,
    dropout off, `speed` swapped in."""
    model = nnx.merge(graphdef, _stored(state, weights))
    model.eval()
    if speed is not None:
        fast(model, speed)
    return model


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "greedy", "top_k", "speed", "weights"))
def _windows(graphdef, state, buf, lengths, key, temperature, *, n: int, greedy: bool, top_k, speed, weights):
    """Uncached: every step runs the model on a whole window of `context` tokens of each row's text
    (`buf`, its prompt `lengths[b]` long, padded on the right, where the causal mask hides it)."""
    model = _merged(graphdef, state, speed, weights)
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


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "greedy", "top_k", "speed", "weights"))
def _cached(graphdef, state, prompt, padding, key, temperature, *, n: int, greedy: bool, top_k, speed, weights):
    """Cached: the prompts (left-padded to one length, `padding[b]` slots in row b) in one call
    (prefill), then one position a step, its keys and values kept."""
    model = _merged(graphdef, state, speed, weights)
    B, P = prompt.shape
    model.init_cache(B, P + n - 1, padding=padding)   # the prompt and every new token but the last are fed back
    logits = model(prompt)[:, -1]
    cached, state = nnx.split(model)

    def step(carry, _):
        state, logits, key = carry
        token, key = _draw(logits, key, temperature, greedy, top_k)
        model = nnx.merge(cached, state)
        logits = model(token[:, None])[:, -1]
        return (nnx.state(model), logits, key), token

    (_, logits, key), tokens = jax.lax.scan(step, (state, logits, key), None, length=n - 1)
    last, _ = _draw(logits, key, temperature, greedy, top_k)
    return jnp.concatenate([prompt, tokens.T, last[:, None]], axis=1)


def _prompts(prompt, vocab: int) -> list[np.ndarray]:
    """The prompt as a list of 1-D id arrays (one per row), or one line why it is none."""
    try:
        array = np.asarray(prompt)
        rows = list(np.atleast_2d(array)) if array.ndim in (1, 2) and array.size else []
    except ValueError:                              # rows of different lengths: NumPy makes no array of them
        array = None
        try:
            rows = [np.asarray(p) for p in prompt]
        except (ValueError, TypeError):
            rows = []
    if not rows or any(r.ndim != 1 or not len(r) or not np.issubdtype(r.dtype, np.integer) for r in rows):
        got = f"shape {array.shape} of {array.dtype}" if array is not None else "rows of other shapes"
        raise ConfigError(f"the prompt must be token ids, [P] or [B, P] with P >= 1, or a list of B prompts of "
                          f"lengths >= 1, got {got}")
    for r in rows:
        check_ids(r, vocab)
    return rows


def _check_options(model, n, key, temperature, top_k) -> bool:
    """One line for what cannot be drawn; True where decoding is greedy."""
    vocab = model.config.vocab_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_NEW:
        raise ConfigError(f"n={n!r}: the number of tokens to generate must be a whole number from 0 to {MAX_NEW:,}")
    if not (isinstance(temperature, (int, float, np.integer, np.floating)) and math.isfinite(temperature)
            and temperature >= 0):
        raise ConfigError(f"temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and 1 <= top_k <= vocab):
        raise ConfigError(f"top_k={top_k!r} must be a whole number from 1 to the vocabulary's {vocab}")
    greedy = temperature == 0 or np.float32(temperature) == 0    # too small for float32: the greedy limit
    if not greedy and key is None:
        raise ConfigError("sampling at temperature > 0 needs a key, e.g. key=jax.random.key(0) (temperature=0: greedy)")
    if key is not None and not _is_key(key):
        raise ConfigError(f"key={key!r} is not a JAX random key; pass one, e.g. key=jax.random.key(0)")
    if any(isinstance(m, Bidirectional) for _, m in nnx.iter_modules(model)):
        raise ConfigError("the model sees the future (a bidirectional mask is swapped in): generating one token "
                          "at a time needs the causal mask; generate outside the ablation")
    if any(getattr(m, "cache", None) is not None for _, m in nnx.iter_modules(model)):
        raise ConfigError("the model is decoding already (init_cache); call model.drop_cache() first")
    return bool(greedy)


def generate(model, prompt, n: int, *, key=None, temperature: float = 1.0, top_k: int | None = None,
             cache: bool = True, speed: Speed | None = Speed(), weights: str = "float32"):
    """The prompt's ids followed by `n` generated ones, as int32.

    `prompt`: ids [P] (answer [P + n]), [B, P] for B prompts of one length ([B, P + n]), or a list of
    B prompts of different lengths (a list of B arrays, each its prompt + n). Every row is decoded
    as it would be alone: unequal rows are padded (on the left with the cache, on the right
    without), and no position reads the padding. `temperature` 0 is greedy decoding (no key
    needed); otherwise `key` (a `jax.random.key`) makes the draw, the same key the same text, and
    each row draws with its own part of it. `top_k`: draw among the k most likely ids only.
    `cache`: keep each position's keys and values (O(T) work a token, within the context);
    False runs a whole window a token, and slides it past the context. `speed`: the faster forms
    to decode with (`attention_jax.speed`); None: the model as built. `weights`: the dtype the
    weight matrices are read in while decoding ("bfloat16": half the bytes a token reads, each
    rounded once; activations and sums stay float32); the caller's model is not changed.
    """
    rows = _prompts(prompt, model.config.vocab_size)
    _check_weights(weights)
    greedy = _check_options(model, n, key, temperature, top_k)
    lengths = np.array([len(r) for r in rows], np.int32)
    P, T = int(lengths.max()), model.config.context
    if cache and P + n - 1 > T:
        raise ConfigError(f"a prompt of {P} ids and n={n} new ones put {P + n - 1} positions through the model, "
                          f"past its context of {T}: the cache holds the context at most; generate(..., "
                          "cache=False) slides a window of the context along the text")
    if speed is not None:
        speed.form_for(model.config)        # a form this model cannot take: one line, before compiling
    graphdef, state = nnx.split(model)
    options = dict(n=int(n), greedy=greedy, top_k=None if top_k is None else int(top_k), speed=speed,
                   weights=weights)
    key, temperature = jax.random.key(0) if key is None else key, jnp.float32(1.0 if greedy else temperature)
    padding = P - lengths
    if cache:
        left = np.zeros((len(rows), P), np.int32)          # id 0 stands in the padding: no query reads it
        for r, (row, pad) in enumerate(zip(rows, padding)):
            left[r, pad:] = row
        out = left if n == 0 else np.asarray(_cached(graphdef, state, jnp.asarray(left), jnp.asarray(padding), key,
                                                     temperature, **options))
        texts = [out[r, pad:] for r, pad in enumerate(padding)]
    else:
        buf = np.zeros((len(rows), max(T, P + n)), np.int32)
        for r, row in enumerate(rows):
            buf[r, :len(row)] = row
        out = buf if n == 0 else np.asarray(_windows(graphdef, state, jnp.asarray(buf), jnp.asarray(lengths), key,
                                                     temperature, **options))
        texts = [out[r, :length + n] for r, length in enumerate(lengths)]
    texts = [np.asarray(t, np.int32) for t in texts]
    if len(set(lengths.tolist())) > 1:
        return texts
    return texts[0] if np.ndim(prompt) == 1 else np.stack(texts)
