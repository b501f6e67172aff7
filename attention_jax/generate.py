"""Text from a trained model: one token at a time, each drawn from its next-token distribution.

    ids = generate(model, tokenizer.encode("ROMEO:").ids, 100, key=jax.random.key(0), temperature=0.8)
    print(tokenizer.decode(ids))

One compiled program per (model structure, prompt length, number of tokens): a `lax.scan`
over the new tokens. Each step feeds the model a window of exactly `context` tokens: while
the text is shorter, the text so far left-aligned and padded on the right (under the causal
mask no position that is read sees the padding), then its last `context` tokens; the logits
are read at the last real position. There is no key/value cache: every step recomputes its
window, O(context) work a token, which the chapter's small models afford and which leaves the
model's code as the chapter writes it.
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


def next_token(logits, key, temperature, *, greedy: bool = False, top_k: int | None = None) -> jax.Array:
    """One id drawn from softmax(logits / temperature) over [V] logits, among the `top_k` most likely
    when given (ties at the k-th value kept); `greedy`: the argmax, no key used."""
    logits = logits.astype(jnp.float32)
    if greedy:
        return jnp.argmax(logits).astype(jnp.int32)
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][-1]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits / temperature).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "prompt_len", "n", "greedy", "top_k"))
def _generate(graphdef, state, buf, key, temperature, *, prompt_len: int, n: int, greedy: bool, top_k):
    model = nnx.merge(graphdef, state)
    model.eval()                           # the merged copy: dropout off, the caller's model untouched
    B, T = buf.shape[0], model.config.context
    draw = jax.vmap(lambda logits, key: next_token(logits, key, temperature, greedy=greedy, top_k=top_k))

    def step(carry, i):
        buf, key = carry
        length = prompt_len + i            # tokens so far
        begin = jnp.maximum(length - T, 0)
        window = jax.lax.dynamic_slice(buf, (0, begin), (B, T))
        logits = model(window)[:, length - 1 - begin]
        key, sub = jax.random.split(key)
        keys = sub[None] if B == 1 else jax.random.split(sub, B)   # one row: the draws of a 1-D prompt
        return (buf.at[:, length].set(draw(logits, keys)), key), None

    (buf, _), _ = jax.lax.scan(step, (buf, key), jnp.arange(n))
    return buf


def generate(model, prompt, n: int, *, key=None, temperature: float = 1.0, top_k: int | None = None) -> np.ndarray:
    """The prompt's ids followed by `n` generated ones, as an int32 array.

    `prompt`: ids [P], or [B, P] for B prompts of one length, answered together ([B, P + n]).
    `temperature` 0 is greedy decoding (no key needed); otherwise `key` (a `jax.random.key`)
    makes the draw, the same key the same text. `top_k`: draw among the k most likely ids only.
    """
    prompt = np.asarray(prompt)
    vocab = model.config.vocab_size
    if prompt.ndim not in (1, 2) or not prompt.shape[-1] or not len(prompt) \
            or not np.issubdtype(prompt.dtype, np.integer):
        raise ConfigError(f"the prompt must be token ids, [P] or [B, P] with P >= 1, got shape {prompt.shape} "
                          f"of {prompt.dtype}")
    check_ids(prompt, vocab)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"n={n!r}: the number of tokens to generate must be a whole number >= 0")
    if not (isinstance(temperature, (int, float, np.integer, np.floating)) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and 1 <= top_k <= vocab):
        raise ConfigError(f"top_k={top_k!r} must be a whole number from 1 to the vocabulary's {vocab}")
    if temperature > 0 and key is None:
        raise ConfigError("sampling at temperature > 0 needs a key, e.g. key=jax.random.key(0) (temperature=0: greedy)")
    if any(isinstance(m, Bidirectional) for _, m in nnx.iter_modules(model)):
        raise ConfigError("the model sees the future (a bidirectional mask is swapped in): generating one token "
                          "at a time needs the causal mask; generate outside the ablation")
    rows = np.atleast_2d(prompt)
    P, T = rows.shape[1], model.config.context
    buf = np.zeros((len(rows), max(T, P + n)), np.int32)
    buf[:, :P] = rows
    graphdef, state = nnx.split(model)
    out = _generate(graphdef, state, jnp.asarray(buf), jax.random.key(0) if key is None else key,
                    jnp.float32(temperature or 1.0), prompt_len=P, n=int(n), greedy=temperature == 0,
                    top_k=None if top_k is None else int(top_k))
    out = np.asarray(out[:, :P + n])
    return out[0] if prompt.ndim == 1 else out
