"""attention_jax.layers: Dense is x·W + b with PyTorch's or GPT-2's initialisation (and a compute
dtype for mixed precision), LayerNorm is the by-hand normalisation, Hook and CausalMask are the
points inspection swaps, and check_ids refuses token ids outside [0, V) naming the id."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.errors import DataError
from attention_jax.layers import Bidirectional, CausalMask, Dense, Hook, LayerNorm, check_ids, embedding_init


@pytest.mark.parametrize("init", ["torch", "gpt2"])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_is_x_times_w_plus_b(init, bias, rng):
    layer = Dense(12, 5, bias=bias, init=init, rngs=nnx.Rngs(0))
    if bias:
        layer.bias[...] = jnp.asarray(rng.standard_normal(5), jnp.float32)   # gpt2 starts at zero: make it count
    else:
        assert layer.bias is None
    x = rng.standard_normal((2, 3, 12)).astype(np.float32)
    w = np.asarray(layer.kernel[...], np.float64)
    want = x @ w + (np.asarray(layer.bias[...], np.float64) if bias else 0.0)
    y = layer(jnp.asarray(x))
    assert y.shape == (2, 3, 5) and y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


def test_torch_init_is_uniform_within_one_over_root_fan_in_for_weights_and_biases():
    d_in, d_out = 64, 512
    layer = Dense(d_in, d_out, bias=True, init="torch", rngs=nnx.Rngs(0))
    bound = d_in ** -0.5
    for name, p in (("kernel", layer.kernel[...]), ("bias", layer.bias[...])):
        p = np.asarray(p)
        assert p.dtype == np.float32, name
        assert np.abs(p).max() <= bound, name                         # nn.Linear's U(-1/√fan_in, 1/√fan_in)
        assert np.abs(p).max() > 0.98 * bound, name                   # and it fills the range: not a narrower one
    kernel = np.asarray(layer.kernel[...])
    np.testing.assert_allclose(kernel.std(), bound / np.sqrt(3), rtol=0.02)   # the uniform's std, 32,768 draws
    assert abs(kernel.mean()) < 0.01 * bound
    assert not np.array_equal(np.asarray(layer.bias[...]), np.zeros(d_out))


def test_gpt2_init_is_normal_with_std_0_02_and_zero_biases():
    layer = Dense(64, 512, bias=True, init="gpt2", rngs=nnx.Rngs(0))
    kernel = np.asarray(layer.kernel[...])
    np.testing.assert_allclose(kernel.std(), 0.02, rtol=0.02)
    assert abs(kernel.mean()) < 1e-3 and np.abs(kernel).max() > 3 * 0.02   # a normal's tails, not a uniform
    np.testing.assert_array_equal(np.asarray(layer.bias[...]), np.zeros(512, np.float32))


@pytest.mark.parametrize("init, std", [("torch", 1.0), ("gpt2", 0.02)])
def test_embedding_init_is_normal_with_the_inits_std(init, std):
    table = np.asarray(embedding_init(init)(jax.random.key(0), (256, 64)))
    np.testing.assert_allclose(table.std(), std, rtol=0.02)
    assert abs(table.mean()) < 0.02 * std


def test_initialisation_depends_on_the_key_only():
    a, b = (Dense(8, 8, bias=True, init="torch", rngs=nnx.Rngs(s)) for s in (0, 0))
    c = Dense(8, 8, bias=True, init="torch", rngs=nnx.Rngs(1))
    np.testing.assert_array_equal(a.kernel[...], b.kernel[...])
    assert not np.array_equal(a.kernel[...], c.kernel[...])


def test_a_compute_dtype_multiplies_in_it_and_keeps_float32_parameters(rng):
    layer = Dense(16, 8, bias=True, init="torch", rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    assert layer.kernel[...].dtype == layer.bias[...].dtype == jnp.float32
    x = rng.standard_normal((4, 16)).astype(np.float32)
    y = layer(jnp.asarray(x))
    assert y.dtype == jnp.bfloat16
    bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
    want = bf16(x) @ bf16(layer.kernel[...]) + bf16(layer.bias[...])       # the same rounded numbers in float32
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_a_by_hand_normalisation(bias, rng):
    norm = LayerNorm(10, bias=bias, eps=1e-5)
    assert (norm.bias is None) == (not bias)
    x = (3.0 + 5.0 * rng.standard_normal((2, 4, 10))).astype(np.float32)   # off-centre and wide: the stats matter
    # At init (scale 1, bias 0) it is the plain normalisation: mean 0, biased variance 1 per vector.
    plain = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), plain, rtol=1e-5, atol=1e-5)
    scale = rng.standard_normal(10).astype(np.float32)
    norm.scale[...] = jnp.asarray(scale)
    shift = rng.standard_normal(10).astype(np.float32)
    if bias:
        norm.bias[...] = jnp.asarray(shift)
    want = plain * scale + (shift if bias else 0.0)
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)


def test_layer_norm_eps_is_added_to_the_variance():
    x = jnp.asarray([[1.0, -1.0]])        # variance 1: the output is 1/√(1 + eps)
    for eps in (1e-5, 1.0, 3.0):
        np.testing.assert_allclose(np.asarray(LayerNorm(2, bias=False, eps=eps)(x)),
                                   [[1 / np.sqrt(1 + eps), -1 / np.sqrt(1 + eps)]], rtol=1e-6)


def test_a_hook_is_the_identity():
    x = jnp.arange(6.0).reshape(2, 3)
    assert Hook()(x) is x


def test_the_causal_mask_sees_the_past_and_present_and_bidirectional_sees_everything():
    mask = np.asarray(CausalMask()(5))
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, np.tril(np.ones((5, 5), bool)))   # row t: positions 0..t
    assert CausalMask.causal and not Bidirectional.causal
    assert Bidirectional()(5) is None                                    # no mask at all
    assert isinstance(Bidirectional(), CausalMask)                       # so it can take the mask's place


@pytest.mark.parametrize("bad", [50, 51, -1, -7])
def test_check_ids_refuses_an_id_outside_the_vocabulary_naming_it(bad):
    tokens = np.array([[0, 3, bad, 49]])
    with pytest.raises(DataError) as info:
        check_ids(tokens, 50)
    message = str(info.value)
    assert message.startswith(f"token id {bad} is outside the vocabulary [0, 50)") and "\n" not in message
    assert "tokenizer" in message                                        # and says how to fix it


def test_check_ids_accepts_the_edges_of_the_vocabulary_and_an_empty_batch():
    check_ids(np.array([0, 49]), 50)
    check_ids(jnp.array([[0, 49]]), 50)                                  # device arrays too
    check_ids(np.zeros((0, 8), np.int32), 50)
    with pytest.raises(DataError, match="token id -3 is outside"):       # the negative one named when both are off
        check_ids(np.array([-3, 99]), 50)


@pytest.mark.parametrize("ids", [np.array([1.0, 2.0]), np.array([True, False]), jnp.array([[0.5]])])
def test_check_ids_refuses_ids_that_are_no_integers(ids):
    """A float would be truncated and a boolean read as 0 or 1: refused, traced or not."""
    with pytest.raises(DataError, match="token ids must be integers, got (float|bool)") as info:
        check_ids(ids, 50)
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="token ids must be integers"):
        jax.jit(lambda t: check_ids(t, 50))(jnp.asarray(ids))


def test_check_ids_costs_nothing_inside_a_compiled_function():
    """Traced ids cannot be checked (nor refused): the engine checks batches on the host."""
    f = jax.jit(lambda t: (check_ids(t, 5), t + 1)[1])
    np.testing.assert_array_equal(f(jnp.array([7, 9])), [8, 10])
