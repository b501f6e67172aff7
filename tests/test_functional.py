"""The functional core: parity with torch in numbers, and the properties the chapter states."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import functional as F
from attention_jax.errors import ConfigError
from attention_jax.speed.chunked import memory_efficient_attention


def normal(rng, *shape, std=1.0):
    return (std * rng.standard_normal(shape)).astype(np.float32)


def to_torch(x):
    import torch        # the tests that call this take the `torch` fixture: skipped without the oracle
    return torch.from_numpy(np.array(x, np.float32))


# --- parity with torch --------------------------------------------------------------------

@pytest.mark.parametrize("case", ["scaled", "unscaled", "float_bias", "causal", "causal_with_bias"])
def test_attention_matches_torch_sdpa(case, rng, parity, torch):
    q, k, v = (normal(rng, 2, 3, 7, 8) for _ in range(3))
    bias = normal(rng, 3, 7, 7) if "bias" in case else None
    causal = case.startswith("causal")
    ours = F.attention(q, k, v, bias=bias, mask=F.causal_mask(7) if causal else None, scale=case != "unscaled")

    attn_mask = to_torch(bias) if bias is not None else None
    if causal:
        allowed = torch.ones(7, 7, dtype=torch.bool).tril()
        attn_mask = allowed if attn_mask is None else attn_mask.masked_fill(~allowed, float("-inf"))
    theirs = torch.nn.functional.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), attn_mask=attn_mask,
                                             scale=1.0 if case == "unscaled" else None)
    parity(f"F.attention vs sdpa ({case})", ours, theirs)


def test_attention_with_causal_mask_matches_torch_is_causal(rng, parity, torch):
    q, k, v = (normal(rng, 2, 3, 7, 8) for _ in range(3))
    theirs = torch.nn.functional.scaled_dot_product_attention(to_torch(q), to_torch(k), to_torch(v), is_causal=True)
    parity("F.attention vs sdpa (is_causal=True)", F.attention(q, k, v, mask=F.causal_mask(7)), theirs)


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_torch(with_bias, rng, parity, torch):
    x, scale, bias = 3.0 + normal(rng, 2, 5, 16, std=2.0), normal(rng, 16), normal(rng, 16)
    b = bias if with_bias else None
    theirs = torch.nn.functional.layer_norm(to_torch(x), (16,), to_torch(scale), to_torch(b) if with_bias else None, eps=1e-5)
    parity(f"layer_norm vs torch (bias={with_bias})", F.layer_norm(x, scale, b), theirs)


def test_gelu_matches_torch_exact_gelu(parity, torch):
    x = np.linspace(-6, 6, 201, dtype=np.float32)
    parity("gelu vs torch exact gelu", F.gelu(x), torch.nn.functional.gelu(to_torch(x), approximate="none"))


def test_softmax_jacobian_matches_torch_autograd(rng, parity, torch):
    scores = normal(rng, 3, 6, std=2.0)
    ours = jax.jit(F.softmax_jacobian)(scores)
    for r, row in enumerate(scores):
        theirs = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), to_torch(row))
        parity(f"softmax_jacobian vs torch jacobian (row {r})", ours[r], theirs, atol=1e-6)


def test_softmax_jacobian_is_diag_w_minus_outer_w(rng):
    scores = normal(rng, 2, 3, 6, std=2.0)
    w = jax.nn.softmax(scores, axis=-1)
    analytic = jax.vmap(jax.vmap(lambda w: jnp.diag(w) - jnp.outer(w, w)))(w)
    jac = jax.jit(F.softmax_jacobian)(scores)
    chex.assert_shape(jac, (2, 3, 6, 6))
    chex.assert_trees_all_close(jac, analytic, atol=1e-6)


@pytest.mark.slow
def test_softmax_jacobian_under_a_mask_is_diag_w_minus_outer_w_of_the_masked_weights(rng):
    scores, mask = normal(rng, 5, 5), F.causal_mask(5)
    w = F.masked_softmax(scores, mask)
    analytic = jax.vmap(lambda w: jnp.diag(w) - jnp.outer(w, w))(w)
    chex.assert_trees_all_close(jax.jit(F.softmax_jacobian)(scores, mask), analytic, atol=1e-6)


def test_softmax_jacobian_trace_vanishes_as_a_row_saturates(rng):
    row = normal(rng, 16)
    jacobian = jax.jit(F.softmax_jacobian)
    traces = [float(jnp.trace(jacobian(row * t))) for t in (1.0, 10.0, 100.0)]
    assert traces[0] > traces[1] > traces[2]
    assert traces[2] < 1e-6


# --- the uniform average ------------------------------------------------------------------

def test_uniform_causal_weights_rows_sum_to_one_and_upper_triangle_is_exactly_zero():
    w = np.asarray(F.uniform_causal_weights(9))
    chex.assert_trees_all_close(w.sum(-1), np.ones(9), atol=1e-6)
    assert np.all(np.triu(w, k=1) == 0.0)
    chex.assert_trees_all_close(np.diag(w), 1.0 / np.arange(1, 10), atol=1e-7)


def test_prefix_mean_loop_equals_matmul_equals_masked_softmax_of_zeros(rng):
    x = normal(rng, 8, 4)
    loop = np.stack([x[: t + 1].mean(0) for t in range(8)])
    matmul = F.uniform_causal_weights(8) @ x
    softmax_of_zeros = F.masked_softmax(jnp.zeros((8, 8)), F.causal_mask(8)) @ x
    chex.assert_trees_all_close(matmul, loop, atol=1e-6)
    chex.assert_trees_all_close(softmax_of_zeros, loop, atol=1e-6)


def test_uniform_average_is_blind_to_order_within_the_window(rng):
    x = normal(rng, 12, 6)
    shuffled = x[rng.permutation(12)]
    w = F.uniform_causal_weights(12)
    chex.assert_trees_all_close((w @ shuffled)[-1], (w @ x)[-1], atol=1e-6)


# --- self-attention without positions -----------------------------------------------------

def _self_attention(x, wq, wk, wv, mask=None):
    return F.attention(x @ wq, x @ wk, x @ wv, mask=mask)


@pytest.mark.slow
def test_self_attention_without_mask_or_positions_is_permutation_equivariant(rng):
    x, wq, wk, wv = normal(rng, 10, 16), normal(rng, 16, 8), normal(rng, 16, 8), normal(rng, 16, 8)
    perm = rng.permutation(10)
    chex.assert_trees_all_close(_self_attention(x[perm], wq, wk, wv), _self_attention(x, wq, wk, wv)[perm],
                                atol=1e-5)


def test_causal_self_attention_last_output_is_invariant_to_permuting_earlier_positions(rng):
    x, wq, wk, wv = normal(rng, 10, 16), normal(rng, 16, 8), normal(rng, 16, 8), normal(rng, 16, 8)
    shuffled = np.concatenate([x[:-1][rng.permutation(9)], x[-1:]])
    mask = F.causal_mask(10)
    out, out_shuffled = _self_attention(x, wq, wk, wv, mask), _self_attention(shuffled, wq, wk, wv, mask)
    chex.assert_trees_all_close(out_shuffled[-1], out[-1], atol=1e-5)
    assert not np.allclose(out_shuffled[:-1], out[:-1], atol=1e-3)   # earlier rows do see the order


# --- masks, scores, masked_softmax --------------------------------------------------------

def test_causal_mask_allows_exactly_the_past_and_present():
    np.testing.assert_array_equal(F.causal_mask(4), np.tril(np.ones((4, 4), bool)))


def test_attention_scores_divide_by_sqrt_d_only_when_scale_is_true(rng):
    q, k = normal(rng, 2, 5, 9), normal(rng, 2, 4, 9)
    raw = np.einsum("btd,bsd->bts", q, k)
    chex.assert_trees_all_close(F.attention_scores(q, k, scale=False), raw, atol=1e-5)
    chex.assert_trees_all_close(F.attention_scores(q, k, scale=True), raw / 3.0, atol=1e-5)


def test_masked_softmax_gives_exact_zeros_where_masked_and_rows_sum_to_one(rng):
    scores, mask = normal(rng, 3, 6, 6, std=5.0), F.causal_mask(6)
    w = np.asarray(F.masked_softmax(scores, mask))
    assert np.all(w[:, ~np.asarray(mask)] == 0.0)
    chex.assert_trees_all_close(w.sum(-1), np.ones((3, 6)), atol=1e-6)
    chex.assert_trees_all_close(F.masked_softmax(scores), jax.nn.softmax(scores, axis=-1), atol=1e-6)


def test_masked_softmax_fully_masked_row_gives_zeros_and_a_finite_gradient(rng):
    scores = normal(rng, 2, 4)
    mask = np.array([[True, False, True, False], [False] * 4])
    w = F.masked_softmax(scores, mask)
    np.testing.assert_array_equal(w[1], np.zeros(4))
    grad = jax.jit(jax.grad(lambda s: jnp.sum(F.masked_softmax(s, mask) * jnp.arange(4.0))))(scores)
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[1], np.zeros(4))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_masked_softmax_in_half_precision_is_finite_and_normalised(dtype, rng):
    # up to ±6e4: exp of these would overflow even float32, let alone half precision
    scores = jnp.asarray(np.clip(normal(rng, 4, 8, 8, std=3e4), -6e4, 6e4), dtype)
    mask = F.causal_mask(8)
    w = F.masked_softmax(scores, mask)
    assert w.dtype == dtype
    assert np.all(np.isfinite(np.asarray(w, np.float32)))
    assert np.all(np.asarray(w, np.float32)[..., ~np.asarray(mask)] == 0.0)
    chex.assert_trees_all_close(jnp.sum(w.astype(jnp.float32), -1), jnp.ones((4, 8)), atol=2e-2)


@pytest.mark.slow
def test_masked_softmax_composes_with_jit_vmap_and_grad(rng):
    scores, mask = normal(rng, 3, 5, 5), F.causal_mask(5)
    eager = F.masked_softmax(scores, mask)
    chex.assert_trees_all_close(jax.jit(F.masked_softmax)(scores, mask), eager, atol=1e-6)
    chex.assert_trees_all_close(jax.vmap(F.masked_softmax, in_axes=(0, None))(scores, mask), eager, atol=1e-6)
    weights = normal(rng, 5)
    grad = jax.jit(jax.grad(lambda s: jnp.sum(F.masked_softmax(s, mask) * weights)))(scores)
    assert np.all(np.isfinite(grad))
    # softmax ignores a shift of its row, so each row of the gradient sums to zero
    chex.assert_trees_all_close(grad.sum(-1), np.zeros((3, 5)), atol=1e-6)
    assert np.all(np.asarray(grad)[:, ~np.asarray(mask)] == 0.0)


def test_attention_weights_add_the_bias_before_masking(rng):
    q, k = normal(rng, 4, 8), normal(rng, 4, 8)
    bias = np.triu(np.full((4, 4), 1e4, np.float32), k=1)   # a huge bias on the future alone
    w = F.attention_weights(q, k, mask=F.causal_mask(4), bias=bias)
    chex.assert_trees_all_close(w, F.attention_weights(q, k, mask=F.causal_mask(4)), atol=1e-6)


def test_attention_can_return_its_weights(rng):
    q, k, v = normal(rng, 5, 4), normal(rng, 5, 4), normal(rng, 5, 3)
    out, w = F.attention(q, k, v, mask=F.causal_mask(5), return_weights=True)
    chex.assert_shape([out, w], [(5, 3), (5, 5)])
    chex.assert_trees_all_close(out, w @ v, atol=1e-6)


# --- integer inputs are promoted, never truncated ---------------------------------------

INT_DTYPES = [jnp.int8, jnp.int32, jnp.uint8]


def ints(rng, *shape, low=-4, high=5):
    return rng.integers(low, high, size=shape).astype(np.int32)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_masked_softmax_of_integer_scores_is_the_float32_softmax(dtype, rng):
    scores = jnp.asarray(ints(rng, 3, 6, 6, low=0), dtype)
    for mask in (None, F.causal_mask(6)):
        w = F.masked_softmax(scores, mask)
        assert w.dtype == jnp.float32
        np.testing.assert_array_equal(w, F.masked_softmax(scores.astype(jnp.float32), mask))
    assert float(jnp.min(jnp.sum(F.masked_softmax(scores), -1))) > 0.99  # not truncated to 0


@pytest.mark.slow
def test_masked_softmax_of_bool_scores_promotes_and_a_bool_or_int_mask_stays_a_mask():
    scores = jnp.array([[True, False, True, False]])
    w = F.masked_softmax(scores)
    assert w.dtype == jnp.float32
    np.testing.assert_array_equal(w, F.masked_softmax(scores.astype(jnp.float32)))
    bool_mask = jnp.array([[True, True, False, False]])
    masked = F.masked_softmax(jnp.array([[3, 1, 2, 7]]), bool_mask)
    assert masked.dtype == jnp.float32
    np.testing.assert_array_equal(masked[0, 2:], [0.0, 0.0])           # masked, not weighted
    chex.assert_trees_all_close(masked[0, :2], jax.nn.softmax(jnp.array([3.0, 1.0])), atol=1e-7)
    np.testing.assert_array_equal(F.masked_softmax(jnp.array([[3, 1, 2, 7]]), bool_mask.astype(jnp.int32)),
                                  masked)                               # a 0/1 mask means the same


@pytest.mark.parametrize("scale", [False, True], ids=["unscaled", "scaled"])
def test_attention_of_integer_inputs_equals_its_float32_version(scale, rng):
    q, k, v = ints(rng, 2, 5, 4), ints(rng, 2, 5, 4), ints(rng, 2, 5, 3)
    f32 = [x.astype(np.float32) for x in (q, k, v)]
    mask = F.causal_mask(5)
    scores = F.attention_scores(q, k, scale=scale)
    assert scores.dtype == jnp.float32
    np.testing.assert_array_equal(scores, F.attention_scores(*f32[:2], scale=scale))
    w = F.attention_weights(q, k, mask=mask, scale=scale)
    assert w.dtype == jnp.float32
    np.testing.assert_array_equal(w, F.attention_weights(*f32[:2], mask=mask, scale=scale))
    out, w = F.attention(q, k, v, mask=mask, scale=scale, return_weights=True)
    want_out, want_w = F.attention(*f32, mask=mask, scale=scale, return_weights=True)
    assert out.dtype == w.dtype == jnp.float32
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(w, want_w)


def test_integer_products_do_not_overflow_before_the_softmax():
    q = jnp.full((2, 3), 100, jnp.int8)  # 100·100·3 = 30000 overflows int8 many times over
    chex.assert_trees_all_close(F.attention_scores(q, q, scale=False), jnp.full((2, 2), 30000.0))


@pytest.mark.slow
def test_softmax_jacobian_and_layer_norm_promote_integer_inputs(rng):
    scores = ints(rng, 2, 5)
    mask = np.array([[True, True, False, True, True], [True] * 5])
    jac = F.softmax_jacobian(scores, mask)   # jax.jacobian itself refuses integer inputs
    assert jac.dtype == jnp.float32
    np.testing.assert_array_equal(jac, F.softmax_jacobian(scores.astype(np.float32), mask))
    x = ints(rng, 3, 8)
    y = F.layer_norm(x, jnp.ones(8), jnp.zeros(8))
    assert y.dtype == jnp.float32
    np.testing.assert_array_equal(y, F.layer_norm(x.astype(np.float32), jnp.ones(8), jnp.zeros(8)))
    assert float(jnp.max(jnp.abs(y))) > 0.5  # normalised values, not truncated to 0 and ±1


@pytest.mark.slow
def test_float_inputs_keep_their_dtype(rng):
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        q, k, v = (jnp.asarray(normal(rng, 4, 4), dtype) for _ in range(3))
        assert F.masked_softmax(q).dtype == dtype
        assert F.attention(q, k, v, scale=False).dtype == dtype
        assert F.layer_norm(q, jnp.ones(4, dtype), None).dtype == dtype


# --- positions ----------------------------------------------------------------------------

@pytest.mark.slow
def test_rope_keeps_vector_norms(rng):
    x = normal(rng, 2, 3, 20, 16)
    chex.assert_trees_all_close(jnp.linalg.norm(F.apply_rope(x), axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)


@pytest.mark.slow
def test_rope_scores_depend_only_on_the_offset(rng):
    q, k = normal(rng, 1, 16), normal(rng, 1, 16)

    def score(t, i):
        return float((F.apply_rope(q, jnp.array([t])) @ F.apply_rope(k, jnp.array([i])).T)[0, 0])

    for t, i, s in [(3, 1, 5), (7, 7, 11), (9, 2, 20), (4, 0, 1)]:
        assert score(t + s, i + s) == pytest.approx(score(t, i), abs=1e-4)
    assert score(5, 1) != pytest.approx(score(5, 3), abs=1e-3)   # ... and the offset does matter


@pytest.mark.slow
def test_rope_default_positions_are_zero_to_n_and_position_zero_is_the_identity(rng):
    x = normal(rng, 6, 8)
    chex.assert_trees_all_close(F.apply_rope(x), F.apply_rope(x, jnp.arange(6)), atol=1e-6)
    chex.assert_trees_all_close(F.apply_rope(x)[0], x[0], atol=0)


def test_rope_rotates_each_pair_by_position_times_frequency():
    x = np.zeros((1, 4), np.float32)
    x[0, 0] = x[0, 2] = 1.0                                        # unit vectors along each pair's first axis
    out = np.asarray(F.apply_rope(x, jnp.array([3])))
    theta = 3.0 * 10000.0 ** (-np.array([0, 2]) / 4)
    np.testing.assert_allclose(out[0], [np.cos(theta[0]), np.sin(theta[0]), np.cos(theta[1]), np.sin(theta[1])],
                               atol=1e-6)


def test_rope_rejects_an_odd_feature_size():
    with pytest.raises(ValueError, match="even"):
        F.apply_rope(jnp.zeros((4, 7)))


def _press_reference_slopes(n):
    """ALiBi's reference implementation (ofirpress/attention_with_linear_biases)."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (get_slopes_power_of_2(closest_power_of_2)
            + _press_reference_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2])


def test_alibi_slopes_for_eight_heads_are_two_to_the_minus_one_to_minus_eight():
    chex.assert_trees_all_close(F.alibi_slopes(8), 2.0 ** -np.arange(1, 9), atol=0)


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 7, 12, 16, 20])
def test_alibi_slopes_match_press_reference_recipe(n_heads):
    chex.assert_trees_all_close(F.alibi_slopes(n_heads), np.float32(_press_reference_slopes(n_heads)), rtol=1e-6)


def test_alibi_bias_is_zero_on_the_diagonal_and_minus_slope_times_distance_below():
    bias, slopes = np.asarray(F.alibi_bias(4, 6)), np.asarray(F.alibi_slopes(4))
    chex.assert_shape(bias, (4, 6, 6))
    t, i = np.tril_indices(6)
    np.testing.assert_array_equal(bias[:, np.arange(6), np.arange(6)], 0.0)
    np.testing.assert_allclose(bias[:, t, i], -slopes[:, None] * (t - i)[None, :], rtol=1e-6)


@pytest.mark.parametrize("d", [16, 15])
def test_sinusoidal_positions_match_the_vaswani_formula(d):
    p, j = np.arange(50)[:, None], np.arange(d)[None, :]
    angle = p / 10000.0 ** ((j - j % 2) / d)                      # column 2i and 2i+1 share 2i/d
    expected = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    pe = F.sinusoidal_positions(50, d)
    chex.assert_shape(pe, (50, d))
    chex.assert_trees_all_close(pe, expected.astype(np.float32), atol=1e-5)


def test_a_causal_mask_of_some_queries_against_more_keys_is_the_triangle_s_rows():
    full = np.asarray(F.causal_mask(7))
    np.testing.assert_array_equal(F.causal_mask(7, 7), full)
    np.testing.assert_array_equal(F.causal_mask(2, 7, positions=jnp.array([3, 4])), full[3:5])   # decoding
    np.testing.assert_array_equal(F.causal_mask(3, 2, positions=jnp.array([-1, 0, 5])),
                                  [[False, False], [True, False], [True, True]])
    with pytest.raises(ConfigError, match="keys >= 0"):
        F.causal_mask(3, -1)


# --- per-position layers ------------------------------------------------------------------

def test_dense_is_x_times_kernel_plus_bias(rng):
    x, w, b = normal(rng, 2, 3, 4), normal(rng, 4, 5), normal(rng, 5)
    chex.assert_trees_all_close(F.dense(x, w, b), x @ w + b, atol=1e-6)
    chex.assert_trees_all_close(F.dense(x, w), x @ w, atol=1e-6)
    chex.assert_trees_all_close(F.dense(x[0, 0], w, b), x[0, 0] @ w + b, atol=1e-6)     # one vector
    # forward mode too: the model as built differentiates either way
    _, tangent = jax.jvp(lambda x: F.dense(x, w, b), (x,), (jnp.ones_like(x),))
    chex.assert_trees_all_close(tangent, jnp.ones_like(x) @ w, atol=1e-5)


def test_half_precision_dense_accumulates_in_float32_and_rounds_once(rng):
    x, w, b = (jnp.asarray(normal(rng, *s), jnp.bfloat16) for s in ((3, 64), (64, 8), (8,)))
    y = F.dense(x, w, b)
    f32 = lambda a: np.asarray(a, np.float32)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(f32(y), f32(jnp.asarray(f32(x) @ f32(w) + f32(b), jnp.bfloat16)), rtol=2**-7)


def test_layer_norm_keeps_half_precision_dtype(rng):
    x = jnp.asarray(normal(rng, 3, 16, std=100.0), jnp.bfloat16)
    y = F.layer_norm(x, jnp.ones(16), jnp.zeros(16))
    assert y.dtype == jnp.bfloat16
    chex.assert_trees_all_close(jnp.mean(y.astype(jnp.float32), -1), jnp.zeros(3), atol=2e-2)


# --- dtypes at the edges (found by an API audit) ---------------------------------------------

@pytest.mark.slow
def test_dense_and_rope_promote_integer_inputs_rather_than_truncate():
    np.testing.assert_allclose(np.asarray(F.dense(jnp.array([[1, 0, 2]]), jnp.full((3, 2), 0.4))), [[1.2, 1.2]],
                               rtol=1e-6)
    x = jnp.arange(12).reshape(1, 3, 4)
    rotated = F.apply_rope(x)
    assert rotated.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(rotated), np.asarray(F.apply_rope(x.astype(jnp.float32))))


@pytest.mark.slow
def test_float16_scores_are_taken_in_float32_where_the_product_overflows():
    """q·k of 157k passes float16's 65,504 though q·k/√d (~20k) fits: the scores stay finite."""
    q = (jax.random.normal(jax.random.key(0), (1, 2, 7, 64)) * 40).astype(jnp.float16)
    assert float(jnp.max(jnp.abs(jnp.einsum("...td,...sd->...ts", q.astype(jnp.float32), q.astype(jnp.float32))))) > 65504
    out = F.attention(q, q, q, mask=F.causal_mask(7))
    assert out.dtype == jnp.float16 and bool(jnp.isfinite(out).all())
    want = memory_efficient_attention(q, q, q, causal=True)          # float32 inside
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [pytest.param(jnp.bfloat16, marks=pytest.mark.slow), jnp.float16])
def test_half_precision_attention_with_a_float32_bias_stays_half(dtype):
    q = jax.random.normal(jax.random.key(1), (1, 2, 5, 8)).astype(dtype)
    bias = F.alibi_bias(2, 5)
    assert bias.dtype == jnp.float32
    assert F.attention(q, q, q, mask=F.causal_mask(5), bias=bias).dtype == dtype
    assert F.attention_weights(q, q, mask=F.causal_mask(5), bias=bias).dtype == dtype


@pytest.mark.slow
def test_edge_sizes_are_answered_or_refused_in_words():
    assert F.sinusoidal_positions(0, 4).shape == (0, 4) and F.sinusoidal_positions(3, 0).shape == (3, 0)
    with pytest.raises(ValueError, match="at least one head"):
        F.alibi_slopes(0)
    with pytest.raises(ValueError, match="chunks of at least one position"):
        memory_efficient_attention(jnp.ones((4, 2)), jnp.ones((4, 2)), jnp.ones((4, 2)), chunk_size=0)


def test_shapes_that_do_not_fit_and_a_plus_inf_score_are_refused_in_one_line():
    from attention_jax.errors import ConfigError
    with pytest.raises(ConfigError, match="n >= 0"):
        F.causal_mask(-1)
    with pytest.raises(ConfigError, match="width 4 cannot score keys of width 5"):
        F.attention(jnp.ones((3, 4)), jnp.ones((3, 5)), jnp.ones((3, 5)))
    with pytest.raises(ConfigError, match=r"mask of shape \(2, 2\) does not fit scores of shape \(3, 3\)"):
        F.masked_softmax(jnp.zeros((3, 3)), jnp.ones((2, 2), bool))
    with pytest.raises(ConfigError, match=r"\+inf"):
        F.masked_softmax(jnp.array([0.0, jnp.inf]))
    np.testing.assert_array_equal(F.masked_softmax(jnp.array([0.0, -jnp.inf])), [1.0, 0.0])   # -inf is a mask
