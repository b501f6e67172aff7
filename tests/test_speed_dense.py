"""attention_jax.speed.dense: the dense layer with a hand-written backward gives the numbers of x·W (+ b)
left to autodiff (`functional.dense`, the model as built), per seed under vmap too, and its bfloat16 path equals float32 arithmetic on the
same rounded numbers up to the final rounding."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import functional as F
from attention_jax.speed import dense as kernels


@pytest.mark.parametrize("n_in, n_out, bias", [(8, 24, True), pytest.param(24, 8, True, marks=pytest.mark.slow),
                                              pytest.param(16, 16, False, marks=pytest.mark.slow)])
def test_dense_gradients_equal_plain_einsum_gradients(n_in, n_out, bias, rng):
    x = rng.standard_normal((3, 5, n_in)).astype(np.float32)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal((n_out,)).astype(np.float32) if bias else None
    probe = rng.standard_normal((3, 5, n_out)).astype(np.float32)

    def plain(x, w, b):
        y = jnp.einsum("...i,io->...o", x, w)
        return y if b is None else y + b

    loss = lambda f: (lambda x, w, b: jnp.sum(jnp.sin(f(x, w, b)) * probe))
    argnums = (0, 1, 2) if bias else (0, 1)
    ours = jax.jit(jax.grad(loss(kernels.dense), argnums))(x, w, b)
    theirs = jax.jit(jax.grad(loss(plain), argnums))(x, w, b)
    chex.assert_trees_all_close(kernels.dense(x, w, b), F.dense(x, w, b), atol=1e-6)
    chex.assert_trees_all_close(ours, theirs, atol=1e-5)
    # and per seed under vmap, as the engine trains several seeds at once
    ws = np.stack([w, 2 * w])
    per_seed = jax.vmap(lambda w: jax.grad(loss(kernels.dense), 1)(x, w, b))(ws)
    chex.assert_trees_all_close(per_seed, jax.vmap(lambda w: jax.grad(loss(plain), 1)(x, w, b))(ws), atol=1e-5)


@pytest.mark.parametrize("lead", [pytest.param((6,), marks=pytest.mark.slow), (3, 5),
                                  pytest.param((2, 3, 4), marks=pytest.mark.slow)])
@pytest.mark.parametrize("n_in, n_out", [(8, 24), (24, 8)])
def test_bfloat16_dense_equals_float32_on_the_same_rounded_numbers(lead, n_in, n_out, rng):
    # The low-precision path (float32 accumulation, transposed operands copied first on a
    # CPU) against float32 arithmetic on the same bfloat16 inputs: only the final rounding
    # of each result to bfloat16 may differ.
    bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
    x, w, b = (bf16(rng.standard_normal(s)) for s in ((*lead, n_in), (n_in, n_out), (n_out,)))
    probe = bf16(rng.standard_normal((*lead, n_out)))

    def loss(x, w, b):
        return jnp.sum(kernels.dense(x, w, b).astype(jnp.float32) * probe)

    low = [jnp.asarray(a, jnp.bfloat16) for a in (x, w, b)]
    y = jax.jit(kernels.dense)(*low)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), x @ w + b, rtol=1e-2, atol=1e-2)
    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(*low)
    expected = jax.grad(loss, (0, 1, 2))(x, w, b)
    for g, e in zip(grads, expected):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_bfloat16_products_in_a_float32_layer_round_the_products_inputs_alone(lead, rng):
    # operands=bfloat16: x, W and (backward) dy are rounded to bfloat16 for each product, which
    # accumulates in float32; the output, the bias and every gradient stay float32, unrounded.
    bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((*lead, 24), (24, 8), (8,)))
    dy = rng.standard_normal((*lead, 8)).astype(np.float32)
    y, pull = jax.vjp(lambda x, w, b: kernels.dense(x, w, b, operands=jnp.bfloat16), x, w, b)
    dx, dw, db = pull(dy)
    assert {a.dtype for a in (y, dx, dw, db)} == {jnp.dtype(jnp.float32)}
    xr, wr, dyr = bf16(x), bf16(w), bf16(dy)
    np.testing.assert_allclose(y, xr @ wr + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, dyr @ wr.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, xr.reshape(-1, 24).T @ dyr.reshape(-1, 8), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, dy.reshape(-1, 8).sum(0), rtol=1e-6, atol=1e-6)     # dy itself, not rounded
    assert not np.allclose(y, x @ w + b, rtol=1e-5, atol=1e-5)     # the rounding is there to see


def test_a_vector_input_is_one_row_and_its_jacobian_is_the_kernel_transposed(rng):
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((5,), (5, 3), (3,)))
    y = kernels.dense(x, w, b)
    assert y.shape == (3,)
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kernels.dense(x, w), x @ w, rtol=1e-5, atol=1e-6)       # no bias
    np.testing.assert_allclose(jax.jacrev(kernels.dense)(x, w, b), w.T, rtol=1e-6)     # dy/dx = Wᵀ, exactly
    # reverse mode only, as every custom_vjp: forward mode is refused, not silently wrong
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(lambda x: kernels.dense(x, w, b), (x,), (x,))
