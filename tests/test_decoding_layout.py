"""attention_jax.decoding.layout: the weights laid out as decoding reads them give the model's numbers,
and bfloat16 weights round the weights alone, never the activations."""

import dataclasses
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.analysis.inspect import swap
from attention_jax.layers import Dense
from attention_jax.model import LanguageModel
from attention_jax.decoding import layout

from helpers import forward, hlo_computations

generation = importlib.import_module("attention_jax.decoding.generate")
BASE = ModelConfig(vocab_size=101, context=16, d_model=48, n_layers=2, n_heads=4)


def model(**change):
    m = LanguageModel(dataclasses.replace(BASE, **change), rngs=nnx.Rngs(0))
    m.eval()
    return m


@pytest.mark.parametrize("lead", [(1,), (1, 1), (2, 1), (3, 5)])
def test_float32_weights_give_x_times_w_transposed(lead, rng):
    x = rng.standard_normal((*lead, 24)).astype(np.float32)
    w = rng.standard_normal((40, 24)).astype(np.float32)                     # [out, in]
    np.testing.assert_allclose(layout.product(jnp.asarray(x), jnp.asarray(w)), x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lead", [(1, 1), (2, 1), (4, 1), (3, 5)])
def test_bfloat16_weights_round_the_weights_and_not_the_activations(lead, rng):
    """Against float64 arithmetic on the rounded weights and the exact activations: the hi + lo parts
    keep 16 bits of each activation, so the error is far below rounding the activations to bfloat16."""
    x = rng.standard_normal((*lead, 64)).astype(np.float32) * 10
    w = jnp.asarray(rng.standard_normal((96, 64)), jnp.bfloat16)
    exact = x.astype(np.float64) @ np.asarray(w, np.float64).T
    got = np.asarray(layout.product(jnp.asarray(x), w))
    x_rounded = np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float64) @ np.asarray(w, np.float64).T
    assert got.dtype == np.float32 and got.shape == (*lead, 96)
    error, rounding_x = np.abs(got - exact).max(), np.abs(x_rounded - exact).max()
    assert error < rounding_x / 50, (error, rounding_x)


def test_float16_weights_are_held_as_float32_with_their_float16_values(rng):
    layer = Dense(8, 12, bias=True, init="gpt2", rngs=nnx.Rngs(0))
    layer.kernel[...] = layer.kernel[...].astype(jnp.float16)
    twin = layout.DecodingDense(layer)
    assert twin.weight[...].dtype == jnp.float32 and twin.weight[...].shape == (12, 8)
    np.testing.assert_array_equal(twin.weight[...], np.asarray(layer.kernel[...], np.float32).T)
    x = jnp.asarray(rng.standard_normal((2, 8)), jnp.float32)
    np.testing.assert_allclose(twin(x), x @ layer.kernel[...].astype(jnp.float32) + layer.bias[...], rtol=1e-5)


@pytest.mark.parametrize("tie", [True, False])
def test_the_layout_gives_the_logits_of_the_model_as_built(tie, rng):
    m = model(tie_embeddings=tie)
    ids = jnp.asarray(rng.integers(0, BASE.vocab_size, (3, 9)))
    want = forward(m, ids)
    parts = layout.parts(m)
    assert ("token_embed" in parts) == tie and "blocks.0.mixer.qkv" in parts and ("lm_head" in parts) != tie
    undo = swap(m, parts)
    np.testing.assert_allclose(forward(m, ids), want, rtol=1e-5, atol=1e-5)
    undo()
    low = generation.rounded(m, "bfloat16")
    want_low = forward(low, ids)
    swap(low, layout.parts(low))
    assert low.blocks[0].mixer.qkv.weight[...].dtype == jnp.bfloat16
    np.testing.assert_allclose(forward(low, ids), want_low, rtol=1e-4, atol=1e-4 * float(np.std(want_low)))


def test_a_decoder_is_a_snapshot_that_leaves_the_model_alone():
    m = model()
    prompt = np.arange(5) % BASE.vocab_size
    decoder = generation.Decoder(m, weights="bfloat16")
    before = decoder(prompt, 6, temperature=0)
    assert m.blocks[0].mixer.qkv.kernel[...].dtype == jnp.float32 and m.blocks[0].mixer.qkv.kernel[...].shape == (48, 144)
    np.testing.assert_array_equal(before, generation.generate(m, prompt, 6, temperature=0, weights="bfloat16"))
    m.token_embed.embedding[...] = -m.token_embed.embedding[...]                # the model changes; the decoder does not
    np.testing.assert_array_equal(decoder(prompt, 6, temperature=0), before)


def test_int8_levels_give_back_the_matrix_to_half_a_step_of_each_row(rng):
    w = rng.standard_normal((7, 16)).astype(np.float32) * np.arange(1, 8)[:, None]
    w[3] = 0                                                                     # a row of zeros: scale 1, levels 0
    q, scale = layout.quantized(jnp.asarray(w))
    assert q.dtype == jnp.int8 and scale.shape == (7,) and int(jnp.abs(q).max()) == 127
    wide = np.asarray(q, np.float32) * np.asarray(scale)[:, None]
    assert np.all(np.abs(wide - w) <= np.asarray(scale)[:, None] / 2 + 1e-7) and not wide[3].any()
    np.testing.assert_array_equal(layout.quantized(jnp.asarray(wide))[0], q)  # levels of levels: the same


@pytest.mark.parametrize("lead", [(1, 1), (3, 5)])
def test_int8_weights_round_the_weights_and_not_the_activations(lead, rng):
    """Two int8 parts of one scale a row keep ~15 bits of each activation: against float64 on the
    dequantized weights, the error is far below rounding the activations to one int8 part."""
    x = rng.standard_normal((*lead, 64)).astype(np.float32) * 10
    q, scale = layout.quantized(jnp.asarray(rng.standard_normal((96, 64)), jnp.float32))
    wide = np.asarray(q, np.float64) * np.asarray(scale, np.float64)[:, None]
    exact = x.astype(np.float64) @ wide.T
    got = np.asarray(layout.product(jnp.asarray(x), q, scale))
    a = np.abs(x).max(-1, keepdims=True) / 127
    one_part = (np.round(x / a) * a) @ wide.T
    error, rounding_x = np.abs(got - exact).max(), np.abs(one_part - exact).max()
    assert got.dtype == np.float32 and error < rounding_x / 50, (error, rounding_x)


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8"])
def test_a_row_s_product_is_the_same_alone_as_in_a_batch_even_beside_an_outlier(weights, rng):
    """One row goes to XLA's loop on a CPU, several to the matrix kernels: each row rounds its
    activations alike in both (int8's two parts of its own scale, bfloat16's hi + lo), so a row
    alone gives what it gives in a batch to float32's rounding (1e-6 of its largest output), even
    the row whose feature 5 is 10^4 times the rest. Unrounded alone, int8 differed by 4e-5."""
    x = rng.standard_normal((3, 1, 64)).astype(np.float32)
    x[1, 0, 5] = 1e4
    w = jnp.asarray(rng.standard_normal((40, 64)), jnp.float32)
    w, scale = layout.quantized(w) if weights == "int8" else (w.astype(weights), None)
    batch = np.asarray(layout.product(jnp.asarray(x), w, scale))
    for b in range(3):
        alone = np.asarray(layout.product(jnp.asarray(x[b:b + 1]), w, scale))[0]
        assert np.abs(batch[b] - alone).max() <= 1e-6 * np.abs(alone).max(), (b, batch[b] - alone)


def test_int8_decoding_gives_the_logits_of_its_rounded_model(rng):
    m = model(tie_embeddings=True)
    ids = jnp.asarray(rng.integers(0, BASE.vocab_size, (2, 9)))
    exact, low = forward(m, ids), generation.rounded(m, "int8")
    want = forward(low, ids)
    assert 0 < np.abs(want - exact).max() < 0.25 * exact.std()                  # the weights' rounding, stated
    swap(low, layout.parts(low, int8=True))
    assert low.blocks[0].mixer.qkv.weight[...].dtype == jnp.int8 and low.token_embed.embedding[...].dtype == jnp.int8
    np.testing.assert_allclose(forward(low, ids), want, rtol=0, atol=1e-3 * float(np.std(want)))
    np.testing.assert_allclose(low.token_embed(ids), generation.rounded(m, "int8").token_embed(ids), rtol=1e-6)


@pytest.mark.parametrize("weights, lead, rows", [("bfloat16", (2, 1), 4), ("bfloat16", (3, 5), 30),
                                                 ("int8", (2, 1), 4), ("float32", (3, 5), 15)])
def test_the_compiled_product_of_rows_takes_the_weight_as_its_left_operand(weights, lead, rows, rng):
    """[out, rows] out of the dot, the weight streamed as its left operand: without the barrier in
    `_streamed`, XLA folds the transpose into the dot and swaps its operands back ([rows, out])."""
    w = jnp.asarray(rng.standard_normal((40, 24)), jnp.float32)
    w, scale = layout.quantized(w) if weights == "int8" else (w.astype(weights), None)
    x = jnp.zeros((*lead, 24), jnp.float32)
    hlo = jax.jit(layout.product).lower(x, w, scale).compile().as_text()
    out = {tuple(map(int, d.split(","))) for d in re.findall(r"= \w+\[(\d+,\d+)\]\{[\d,]*\} dot\(", hlo)}
    assert out == {(40, rows)}, out


def _fused_ops(hlo: str) -> list[set[str]]:
    """The ops of each fused computation of a compiled program that holds a dot."""
    computations, fused = hlo_computations(hlo)
    ops = [set(re.findall(r"= \w+\[[\d,]*\]\{?[\d,]*\}? ([\w-]+)\(", computations[name])) for name in fused]
    return [o for o in ops if "dot" in o]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the one-row form is XLA's CPU loop")
@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8"])
def test_one_row_reads_the_weight_in_one_loop_that_computes_nothing_else(weights, rng):
    """A row made by other ops (a GELU), a bias added after: the product is one fused loop of the stored
    weight, widened as it is read, and the row as it was written. Without the gather in
    `_widened_row`, the GELU is fused into the loop and redone for every row of the weight; without
    the reduce_precision, the bias pulls the product into a kernel fed a float32 copy of the weight."""
    w = jnp.asarray(rng.standard_normal((40, 24)), jnp.float32)
    w, scale = layout.quantized(w) if weights == "int8" else (w.astype(weights), None)
    x, b = jnp.zeros((1, 1, 24), jnp.float32), jnp.ones((40,), jnp.float32)
    step = jax.jit(lambda x, w, scale, b: layout.product(jax.nn.gelu(x * 3 + 1), w, scale) + b)
    hlo = step.lower(x, w, scale, b).compile().as_text()
    (loop,) = _fused_ops(hlo)
    assert loop <= {"parameter", "bitcast", "convert", "transpose", "copy", "dot"}, loop
    written = re.findall(r"= f32\[(?:40,24|24,40)\]\{[\d,]*\} ([\w-]+)\(", hlo_computations(hlo)[0]["ENTRY"])
    assert set(written) <= {"parameter"}, written                  # no float32 copy of the weight
    got = step(jnp.asarray(rng.standard_normal((1, 1, 24)), jnp.float32), w, scale, b)
    assert got.shape == (1, 1, 40) and bool(jnp.isfinite(got).all())
