"""attention_jax.decoding.loops: the compiled loops. The cached loop writes the tokens the windows loop writes,
and keeps the weights as the decoder stores them: no copy of another dtype or layout per call."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.decoding import loops as decode
from attention_jax.config import ModelConfig
from attention_jax.decoding.generate import Decoder
from attention_jax.model import LanguageModel

from helpers import hlo_computations

BASE = ModelConfig(vocab_size=101, context=16, d_model=48, n_layers=2, n_heads=4)


def model(**change):
    return LanguageModel(dataclasses.replace(BASE, **change), rngs=nnx.Rngs(0))


def test_the_cached_loop_writes_the_windows_loop_s_tokens():
    decoder = Decoder(model(positions="rope"), weights="bfloat16")
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, BASE.vocab_size, (2, 5)), jnp.int32)
    options = dict(n=7, greedy=True, top_k=None)
    key, one = jax.random.key(0), jnp.float32(1)
    made = decode.cached_model(decoder.graphdef, decoder.state, 2, 5 + 7 - 1)
    cached = decode.cached_loop(made, prompt, jnp.zeros((2,), jnp.int32), key, one, **options)
    buf = jnp.zeros((2, BASE.context), jnp.int32).at[:, :5].set(prompt)
    windows = decode.windows(decoder.graphdef, decoder.state, buf, jnp.full((2,), 5, jnp.int32), key, one, **options)
    assert cached.shape == (2, 12)
    np.testing.assert_array_equal(cached, windows[:, :12])


def _written(hlo: str) -> set[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of every matrix a compiled program writes to memory: the results of its top-level
    instructions (not those inside a fusion, which stay in registers; not views and parameters)."""
    computations, fused = hlo_computations(hlo)
    top = [body for name, body in computations.items() if name not in fused]
    views = ("parameter", "get-tuple-element", "bitcast", "tuple")
    return {(dtype, tuple(map(int, dims.split(",")))) for body in top
            for dtype, dims, op in re.findall(r"= (\w+)\[(\d+,\d+)\]\{[\d,]*\} ([\w-]+)\(", body) if op not in views}


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_the_weights_stay_as_stored_inside_the_compiled_decode(weights):
    """bfloat16 or int8, [out, in]: no float32 matrix of a weight's shape and no copy of one laid out [in, out]
    anywhere in the program. Without the barrier in `decode.extend`, XLA hoists both out of the loop
    (a float32 token table, the layers copied back to [in, out]), and every token reads them."""
    decoder = Decoder(model(), weights=weights)
    prompt = jnp.zeros((1, 5), jnp.int32)
    graph, empty, rest = decode.cached_model(decoder.graphdef, decoder.state, 1, 8)
    cache, logits = decode.prefill(graph, rest, empty, prompt, jnp.zeros((1,), jnp.int32))
    hlo = decode.extend.lower(graph, rest, cache, logits, jax.random.key(0), jnp.float32(1),
                              jnp.zeros((1, 4), jnp.int32), 0, 3, greedy=True, top_k=None).compile().as_text()
    stored = {tuple(a.shape) for a in jax.tree.leaves(nnx.state(decoder.state, nnx.Param)) if a.ndim == 2}
    written = _written(hlo)
    widened = {shape for dtype, shape in written if dtype == "f32"} & (stored | {s[::-1] for s in stored})
    relaid = {shape for dtype, shape in written if dtype in ("bf16", "s8")} & {s[::-1] for s in stored if s[0] != s[1]}
    assert len(stored) >= 5 and ("f32", (1, 101)) in written and not widened and not relaid, (widened, relaid)


@pytest.mark.parametrize("case", ["random", "ties", "nan", "all -inf", "+inf"])
def test_greedy_is_argmax_first_of_the_largest_and_first_nan(case):
    logits = np.random.default_rng(0).standard_normal(50).astype(np.float32)
    if case == "ties":
        logits[[7, 19, 33]] = logits.max() + 1
    elif case == "nan":
        logits[[11, 40]] = np.nan
    elif case == "all -inf":
        logits[:] = -np.inf
    elif case == "+inf":
        logits[[3, 9]] = np.inf
    got = decode.next_token(jnp.asarray(logits), None, 1.0, greedy=True)
    assert got.dtype == jnp.int32 and int(got) == int(jnp.argmax(jnp.asarray(logits)))
