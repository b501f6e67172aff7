"""Text from a trained model: one token at a time, each drawn from its next-token distribution.

    ids = generate(model, tokenizer.encode("ROMEO:").ids, 100, key=jax.random.key(0),
                   temperature=0.8)
    print(tokenizer.decode(ids))

One compiled program per (model structure, prompt shape, number of tokens). By default the
prompt goes through the model once (prefill, with `kv_cache`'s twins swapped into a copy), then
each new token alone, reading the keys and values the cache keeps: O(T) work a token, up to the
model's context. `cache=False` is the reference it is tested against: each step feeds the
model a whole window of `context` tokens (the text so far padded on the right, which the
causal mask hides, or its last `context` tokens), so it also writes past the context.
Either way the model computes with `speed` (default `Speed()`) swapped in, and its weights
laid out as decoding reads them (`decoding.layout`); `speed=None` decodes with the model as
built. `Decoder(model, ...)` prepares the model once for many calls; `generate` prepares it
each call.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.decoding import layout, loops, memory
from attention_jax.decoding.loops import next_token  # noqa: F401  (part of generate's API)
from attention_jax.errors import ConfigError, GenerationInterrupted
from attention_jax.model import Bidirectional, check_ids
from attention_jax.speed import Speed, fast
from attention_jax.speed.backend import backend_of
from attention_jax.swap import swap

MAX_NEW = 1_000_000     # tokens a call: the uncached path holds the whole text, 4 bytes an id a row


def _is_key(key) -> bool:
    """A typed key (jax.random.key) or a raw uint32[2] one (jax.random.PRNGKey)."""
    if not isinstance(key, jax.Array):
        return False
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 0
    return typed or (key.dtype == jnp.uint32 and key.shape == (2,))


WEIGHTS = ("float32", "bfloat16", "float16", "int8")


def _stored(state, weights: str):
    """The parameters as decoding reads them: every matrix (the kernels, the token and position
    tables) rounded to `weights` once, before the first token; vectors (biases, LayerNorms) as they
    are. "int8": each matrix's values become those of its int8 form (`decoding.layout.quantized`, a
    scale per output: a kernel's column, a table's row), held in float32; the decoding layout
    stores the int8."""
    if weights == "float32":
        return state
    if weights == "int8":
        def levels(path, a):
            if a.ndim != 2 or a.dtype != jnp.float32:
                return a
            kernel = "kernel" in [getattr(k, "key", getattr(k, "name", None)) for k in path]
            q, scale = layout.quantized(a.T if kernel else a)   # [out, in]: a kernel's are columns
            wide = q.astype(jnp.float32) * scale[:, None]
            return wide.T if kernel else wide
        return jax.tree_util.tree_map_with_path(levels, state)
    low = jnp.dtype(weights)
    matrix = lambda a: a.ndim >= 2 and a.dtype == jnp.float32
    return jax.tree.map(lambda a: a.astype(low) if matrix(a) else a, state)


@jax.jit
def _finite(params) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(params)]))


def _check_weights(weights) -> None:
    if weights not in WEIGHTS:
        raise ConfigError(f"weights={weights!r}; choose one of {', '.join(map(repr, WEIGHTS))}")


def rounded(model, weights: str = "bfloat16"):
    """A copy of `model` holding its weight matrices as `generate(..., weights=...)` reads them: to
    compare its logits with the model's own (the caller's model is not changed)."""
    _check_weights(weights)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, _stored(state, weights), copy=True)


def _prepared(model, speed, weights, backend):
    """(graphdef, state) of the model to decode with: a copy (the caller's stays untouched), its
    matrices stored in `weights`, dropout off, `speed` swapped in for `backend` and with it
    decoding's layout (`decoding.layout`)."""
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, _stored(state, weights), copy=True)
    model.eval()
    if speed is not None:
        fast(model, speed, backend=backend)
        swap(model, layout.parts(model, int8=weights == "int8", backend=backend))
    return nnx.split(model)


def _prompts(prompt, vocab: int) -> tuple[list[np.ndarray], bool]:
    """The prompt as a list of 1-D id arrays (one per row) and whether it was one prompt (ids [P])
    rather than a batch, or one line why it is none."""
    try:
        array = np.asarray(prompt)
        rows = list(np.atleast_2d(array)) if array.ndim in (1, 2) and array.size else []
    except ValueError:                  # rows of different lengths: NumPy makes no array of them
        array = None
        try:
            rows = [np.asarray(p) for p in prompt]
        except (ValueError, TypeError):
            rows = []
    if not rows or any(r.ndim != 1 or not len(r) or not np.issubdtype(r.dtype, np.integer)
                       for r in rows):
        got = f"shape {array.shape} of {array.dtype}" if array is not None else \
            "rows of other shapes"
        raise ConfigError(f"the prompt must be token ids, [P] or [B, P] with P >= 1, or a list of "
                          f"B prompts of lengths >= 1, got {got}")
    for r in rows:
        check_ids(r, vocab)
    return rows, array is not None and array.ndim == 1


def _padded(rows: list[np.ndarray], width: int, *, left: bool) -> tuple[np.ndarray, np.ndarray]:
    """The rows in one [B, width] int32 array, padded with id 0 (which no query reads) on the left
    or the right, and the column where each row's ids start."""
    buf = np.zeros((len(rows), width), np.int32)
    starts = np.array([width - len(r) if left else 0 for r in rows], np.int32)
    for r, (row, start) in enumerate(zip(rows, starts)):
        buf[r, start:start + len(row)] = row
    return buf, starts


def _check_options(config, n, key, temperature, top_k) -> bool:
    """One line for what cannot be drawn; True where decoding is greedy."""
    vocab = config.vocab_size
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_NEW:
        raise ConfigError(f"n={n!r}: the number of tokens to generate must be a whole number from "
                          f"0 to {MAX_NEW:,}")
    number = isinstance(temperature, (int, float, np.integer, np.floating))
    if isinstance(temperature, (bool, np.bool_)) or not (number and math.isfinite(temperature)
                                                         and temperature >= 0):
        raise ConfigError(f"temperature={temperature!r} must be a finite number >= 0 (0: greedy)")
    if top_k is not None and (isinstance(top_k, (bool, np.bool_)) or
                              not (isinstance(top_k, (int, np.integer)) and 1 <= top_k <= vocab)):
        raise ConfigError(f"top_k={top_k!r} must be a whole number from 1 to the vocabulary's "
                          f"{vocab}")
    greedy = temperature == 0 or np.float32(temperature) == 0   # too small for float32: the limit
    if not greedy and key is None:
        raise ConfigError("sampling at temperature > 0 needs a key, e.g. key=jax.random.key(0) "
                          "(temperature=0: greedy)")
    if key is not None and not _is_key(key):
        raise ConfigError(f"key={key!r} is not a JAX random key; pass one, e.g. "
                          "key=jax.random.key(0)")
    return bool(greedy)


def _checked(config, prompt, n, key, temperature, top_k,
             cache) -> tuple[list[np.ndarray], bool, bool]:
    """The prompt's rows, whether decoding is greedy and whether the prompt was one (its text comes
    back alone), or one line for what cannot be decoded."""
    rows, one = _prompts(prompt, config.vocab_size)
    greedy = _check_options(config, n, key, temperature, top_k)
    P, T = max(len(r) for r in rows), config.context
    if cache and P + n - 1 > T:
        raise ConfigError(f"a prompt of {P} ids and n={n} new ones put {P + n - 1} positions "
                          f"through the model, past its context of {T}: the cache holds the "
                          "context at most; generate(..., cache=False) slides a window of the "
                          "context along the text")
    return rows, greedy, one


def _check_model(model) -> None:
    if any(isinstance(m, Bidirectional) for _, m in nnx.iter_modules(model)):
        raise ConfigError("the model sees the future (a bidirectional mask is swapped in): "
                          "generating one token at a time needs the causal mask; generate outside "
                          "the ablation")


class Decoder:
    """A model made ready to decode, once: a copy of it with its weight matrices stored in `weights`
    and laid out as decoding reads them, dropout off, `speed` swapped in. Calling it is `generate`
    without the model, and without preparing it again (for GPT-2 small, rounding and laying out
    its 500 MB of weights costs about as much as decoding tens of tokens):

        decoder = Decoder(model, weights="bfloat16")
        for prompt in prompts:
            print(tokenizer.decode(decoder(prompt, 50, temperature=0)))

    A snapshot: the model trained further is not seen; make a new one. See `generate` for the
    arguments; `backend`: the devices the decoding program is built for (`speed.backend_of`; None:
    this process's default devices), which choose its forms once, here.
    """

    def __init__(self, model, *, speed: Speed | None = Speed(), weights: str = "float32",
                 backend=None):
        _check_weights(weights)
        _check_model(model)
        self.backend = backend_of(backend)
        if speed is not None:      # a form this model cannot take: one line, before compiling
            speed.form_for(model.config, self.backend)
        self.config, self.speed, self.weights = model.config, speed, weights
        self.graphdef, self.state = _prepared(model, speed, weights, self.backend)
        # The weights as given: they say why logits were not finite.
        self._finite = _finite(nnx.state(model, nnx.Param))
        self._made = {}

    def _cached_model(self, batch: int, length: int):
        """The model with the cache's twins in, for this shape (`loops.cached_model`), made once:
        the graph, the weights and the cache's shapes, not the cache."""
        if (batch, length) not in self._made:
            graph, empty, rest = loops.cached_model(self.graphdef, self.state, batch, length)
            shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), empty)
            self._made[batch, length] = graph, shapes, rest
        return self._made[batch, length]

    def __call__(self, prompt, n: int, *, key=None, temperature: float = 1.0,
                 top_k: int | None = None, cache: bool = True):
        rows, greedy, one = _checked(self.config, prompt, n, key, temperature, top_k, cache)
        texts = self._decode(rows, greedy, n, key, temperature, top_k, cache)
        return texts[0] if one else texts

    def _decode(self, rows: list[np.ndarray], greedy: bool, n: int, key, temperature, top_k,
                cache: bool):
        """Each row's prompt + n new ids (rows and options checked by `_checked`)."""
        lengths = np.array([len(r) for r in rows], np.int32)
        P, T = int(lengths.max()), self.config.context
        memory.check(memory.needed(self.config, len(rows), P, int(n), cache=cache),
                     f"decoding {len(rows)} row(s) of up to {P} + {n} ids",
                     "decode fewer rows at once")
        options = dict(n=int(n), greedy=greedy, top_k=None if top_k is None else int(top_k))
        key = jax.random.key(0) if key is None else key
        temperature = jnp.float32(1.0 if greedy else temperature)
        # With the cache a row's text ends at the last column (padding on the left); without, each
        # row's ends where its own prompt does, and its window slides from there (on the right).
        buf, starts = _padded(rows, P if cache else max(T, P + n), left=cache)
        if cache:
            run = lambda: loops.cached_loop(self._cached_model(len(rows), P + n - 1),
                                            jnp.asarray(buf), jnp.asarray(starts), key, temperature,
                                            **options)
        else:
            run = lambda: loops.windows(self.graphdef, self.state, jnp.asarray(buf),
                                        jnp.asarray(lengths), key, temperature, **options)
        texts = lambda out, done: [np.asarray(out[r, s:s + length + done], np.int32)
                                   for r, (s, length) in enumerate(zip(starts, lengths))]
        try:
            out = buf if n == 0 else run()
        except loops.NotFinite as e:
            raise ConfigError(self._not_finite(e.index)) from None
        except loops.Stopped as e:
            raise GenerationInterrupted(texts(e.out, e.done), e.done, int(n)) from None
        return texts(out, n)

    def _not_finite(self, index: int) -> str:
        """Why the logits of new token `index` were NaN or infinite, and what to do about it."""
        if not bool(self._finite):
            return ("the model's parameters hold NaN or infinite values, so its logits are NaN: it "
                    "cannot decode (a training run that diverged?); load or train a model whose "
                    "weights are finite")
        if self.weights == "float16":
            return (f"the logits of new token {index} are not finite with weights='float16' (past "
                    "float16's 65,504, or NaN): decode with weights='bfloat16' (float32's range in "
                    "half the bytes) or 'float32'")
        return (f"the model's logits for new token {index} are NaN or infinite with "
                f"weights={self.weights!r}; decode with weights='float32', and check the model's "
                "inputs")


def generate(model, prompt, n: int, *, key=None, temperature: float = 1.0,
             top_k: int | None = None, cache: bool = True, speed: Speed | None = Speed(),
             weights: str = "float32", backend=None):
    """The prompt's ids followed by `n` generated ones, as int32: one prompt's text, or a list of
    texts.

    `prompt`: one prompt, ids [P] (answer: its text, an array [P + n]), or a batch of B, as [B, P]
    or a list of B prompts of any lengths (answer: a list of B arrays, each its prompt + n,
    whatever the lengths; `np.stack` them when they are equal). Every row is decoded as it would
    be alone: unequal rows are padded (on the left with the cache, on the right without), and no
    position reads the padding. `temperature` 0 is greedy decoding (no key needed); otherwise
    `key` (a `jax.random.key`) makes the draw, the same key the same text, and each row draws with
    its own part of it. `top_k`: draw among the k most likely ids only.
    `cache`: keep each position's keys and values (O(T) work a token, within the context);
    False runs a whole window a token, and slides it past the context. `speed`: the faster forms
    to decode with (`attention_jax.speed`, and decoding's layout of the weights,
    `decoding.layout`); None: the model as built. With the cache, attention is the model's own
    whatever the form (`Speed.describe(config, decoding=True)`): a query reads the slots its row
    has written, a mask no form takes. `weights`: the dtype the weight matrices are read in
    while decoding ("bfloat16": half the bytes a token reads, each rounded once, the activations
    kept to 16 bits of mantissa and the sums float32's; "int8": a quarter, 255 levels a row of
    [out, in] with a float32 scale each, each row of activations in two int8 parts of its own
    scale; either way a row's numbers are the same alone as in a batch; `decoding.layout` says how
    each is read); the caller's model is not changed. `backend`: the devices to decode on
    (`speed.backend_of`; None: the default ones). Each call prepares the model again;
    `Decoder(model, ...)` prepares it once for many calls.

    A batch whose cache, text and logits pass the free memory is refused in one line before any
    is allocated (`decoding.memory`). Logits that are not finite (float16 weights past their
    range, a model whose weights hold NaN) stop the decoding with one line naming the fix, never a
    run of token 0; Ctrl-C stops it within about a quarter of a second, raising
    `errors.GenerationInterrupted` with the texts drawn so far.
    """
    # Checked before the model is prepared.
    rows, greedy, one = _checked(model.config, prompt, n, key, temperature, top_k, cache)
    decoder = Decoder(model, speed=speed, weights=weights, backend=backend)
    texts = decoder._decode(rows, greedy, n, key, temperature, top_k, cache)
    return texts[0] if one else texts
