"""attention_jax.speed.forms: each form equals the reference equation, forward and gradients, as a
function; which form "auto" is; the fused kernel's choice. (In the model, by the swap: test_speed_swap.)"""

import functools
import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import functional as F
from attention_jax.speed import forms as backends
from attention_jax.speed.backend import Backend
from attention_jax.speed.chunked import memory_efficient_attention


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- the forms as functions --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["causal_halves", "chunked", "fused"])
@pytest.mark.parametrize("causal", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_every_form_equals_the_reference_forward_and_gradients(name, causal, rng):
    q, k, v, g = (jnp.asarray(normal(rng, 2, 3, 9, 8)) for _ in range(4))    # odd T: uneven halves and chunks
    form = functools.partial(backends.chunked, chunk=4) if name == "chunked" else backends.FORMS[name]   # 3 chunks of 9
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, causal=causal) * g)
    # Compiled: one program each, where eager would compile every operation of the form (CPU).
    want, want_grads = jax.jit(jax.value_and_grad(loss(backends.reference), argnums=(0, 1, 2)))(q, k, v)
    got, got_grads = jax.jit(jax.value_and_grad(loss(form), argnums=(0, 1, 2)))(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    chex.assert_trees_all_close(got_grads, want_grads, atol=2e-5)


def test_the_reference_form_is_the_functional_core():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(normal(rng, 3, 6, 4)) for _ in range(3))
    bias = F.alibi_bias(3, 6)
    want = F.attention(q, k, v, mask=F.causal_mask(6), bias=bias)
    np.testing.assert_array_equal(backends.reference(q, k, v, bias=bias), want)


@pytest.mark.slow
def test_causal_halves_skip_a_quarter_that_is_exactly_zero(rng):
    q, k, v = (jnp.asarray(normal(rng, 2, 7, 4)) for _ in range(3))
    out, w = jax.jit(lambda q, k, v: backends.causal_halves(q, k, v, return_weights=True))(q, k, v)
    want_out, want_w = jax.jit(lambda q, k, v: F.attention(q, k, v, mask=F.causal_mask(7), return_weights=True))(q, k, v)
    np.testing.assert_allclose(out, want_out, rtol=1e-6)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
    np.testing.assert_array_equal(w[..., :3, 3:], 0.0)


@pytest.mark.slow
def test_integer_and_half_precision_inputs_of_the_forms():
    ints = jnp.arange(40).reshape(1, 5, 8) % 3
    out, w = jax.jit(lambda x: backends.causal_halves(x, x, x, return_weights=True))(ints)
    want_out, want_w = jax.jit(lambda x: F.attention(x, x, x, mask=F.causal_mask(5), return_weights=True))(
        ints.astype(jnp.float32))
    assert out.dtype == w.dtype == jnp.float32
    np.testing.assert_allclose(out, want_out, rtol=1e-6)
    for dtype in (jnp.bfloat16, jnp.float16):
        q = jax.random.normal(jax.random.key(1), (1, 2, 5, 8)).astype(dtype)
        bias = F.alibi_bias(2, 5)
        half = jax.jit(lambda q: backends.causal_halves(q, q, q, bias=bias))(q)
        fused = jax.jit(lambda q: backends.fused(q, q, q, bias=bias))(q)   # float16: XLA's CPU has no f16·f16->f32
        assert half.dtype == fused.dtype == dtype
        np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(half, np.float32), atol=2e-2)
    mixed = backends.fused(jnp.ones((1, 2, 4, 8), jnp.int32), jnp.ones((1, 2, 4, 8), jnp.float16),
                           jnp.ones((1, 2, 4, 8), jnp.float16))
    assert mixed.dtype == jnp.float32          # one common dtype for the fused kernel


@pytest.mark.slow
def test_sizes_a_form_cannot_take_are_refused_in_words():
    for keys in (3, 5):           # causal self-attention over one window: as many keys as queries
        with pytest.raises(ValueError, match="4 queries need 4 keys"):
            backends.causal_halves(jnp.ones((4, 2)), jnp.ones((keys, 2)), jnp.ones((keys, 2)))
    with pytest.raises(ValueError, match="no bias and no dropout"):
        backends.chunked(jnp.ones((4, 2)), jnp.ones((4, 2)), jnp.ones((4, 2)), bias=jnp.zeros((4, 4)))
    with pytest.raises(ValueError, match="no dropout"):
        backends.fused(jnp.ones((4, 2)), jnp.ones((4, 2)), jnp.ones((4, 2)), dropout=lambda w: w)
    q = jax.random.normal(jax.random.key(2), (37, 16))                  # [T, D]: no head axis, like the others
    np.testing.assert_allclose(jax.jit(lambda q: backends.fused(q, q, q))(q),
                               jax.jit(lambda q: F.attention(q, q, q, mask=F.causal_mask(37)))(q), atol=1e-6)
    with pytest.raises(ValueError, match="chunks of at least one position"):
        memory_efficient_attention(jnp.ones((4, 2)), jnp.ones((4, 2)), jnp.ones((4, 2)), chunk_size=0)


@pytest.mark.parametrize("T, with_bias", [(1, False), (7, True), pytest.param(16, False, marks=pytest.mark.slow)])
def test_attention_in_causal_halves_equals_one_masked_softmax(T, with_bias, rng):
    q, k, v = (rng.standard_normal((2, 3, T, 8)).astype(np.float32) for _ in range(3))
    bias = F.alibi_bias(3, T) if with_bias else None

    def plain(q, k, v):
        w = F.attention_weights(q, k, mask=F.causal_mask(T), bias=bias)
        return F.mix(w, v), w

    def halves(q, k, v):
        return backends.causal_halves(q, k, v, bias=bias, return_weights=True)

    (out, w), (ref_out, ref_w) = jax.jit(halves)(q, k, v), jax.jit(plain)(q, k, v)
    chex.assert_trees_all_close((out, w), (ref_out, ref_w), atol=1e-6)
    assert np.all(np.asarray(w)[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)
    grad = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.cos(f(*a)[0])), (0, 1, 2)))(q, k, v)
    chex.assert_trees_all_close(grad(halves), grad(plain), atol=1e-5)


def test_a_fully_masked_half_gives_zero_weights_not_nan():
    q = k = v = jnp.ones((1, 4, 2))
    attend = jax.jit(lambda q, k, v: backends.causal_halves(q, k, v, bias=jnp.full((4, 4), -jnp.inf),
                                                               return_weights=True))
    out, w = attend(q, k, v)
    assert np.all(np.isfinite(np.asarray(out))) and np.all(np.asarray(w) == 0.0)


# --- which form "auto" is, and the fused kernel ----------------------------------------------------

def test_auto_is_causal_halves_on_a_cpu_and_fused_on_an_accelerator():
    assert backends.choose("auto", backend="cpu") == "causal_halves"
    assert backends.choose("auto", backend="gpu") == backends.choose("auto", backend="tpu") == "fused"
    assert backends.choose("auto", dropout=0.1, backend="gpu") == "causal_halves"   # fused has no dropout
    assert backends.choose("chunked", backend="gpu") == "chunked"


def test_the_fused_kernel_is_cudnn_only_for_half_precision_on_an_nvidia_gpu():
    # JAX's implementation=None is XLA's attention everywhere; cuDNN's flash kernel must be asked for.
    gpu, h100, a100, t4 = Backend("cuda"), Backend("cuda", 9.0), Backend("cuda", 8.0), Backend("cuda", 7.5)
    assert backends.fused_kernel(jnp.bfloat16, 32, gpu) == backends.fused_kernel(jnp.float16, 128, h100) == "cudnn"
    assert backends.fused_kernel(jnp.bfloat16, 32, a100) == backends.fused_kernel(jnp.bfloat16, 32, "gpu") == "cudnn"
    assert backends.kernel_choice(jnp.bfloat16, 32, t4) == \
        ("xla", "cuDNN's flash attention needs compute capability 8.0; this GPU has 7.5")     # a T4
    assert backends.kernel_choice(jnp.float32, 32, h100) == \
        ("xla", "cuDNN's flash attention takes bfloat16/float16; this model computes in float32")
    assert backends.kernel_choice(jnp.bfloat16, 12, gpu)[1].endswith("a multiple of 8 up to 128; this one is 12")
    assert backends.fused_kernel(jnp.bfloat16, 136, gpu) == "xla"                          # nor above 128
    for other in ("tpu", "cpu", "rocm"):
        assert backends.kernel_choice(jnp.bfloat16, 32, other) == ("xla", None)


def test_cudnns_own_refusals_are_asked_before_a_run(cudnn):
    assert backends.cudnn_refusal("bfloat16", 4, 128, 32, True) is None
    why = backends.cudnn_refusal("bfloat16", 4, 127, 32, True)       # a bias over an odd number of positions
    assert why == "NotImplementedError: Unsupported sequence length Q 127, KV 127."


def test_without_cudnn_every_call_is_refused_as_such():
    backends.cudnn_refusal.cache_clear()
    assert backends.cudnn_refusal("bfloat16", 4, 128, 32, False) == "RuntimeError: cuDNN is not detected."


@pytest.mark.slow
def test_a_cudnn_refusal_while_tracing_falls_back_to_xla_with_a_warning(rng):
    q, k, v = (jnp.asarray(normal(rng, 2, 4, 16, 8), jnp.bfloat16) for _ in range(3))
    want = jax.jit(lambda q, k, v: backends.fused(q, k, v, bias=F.alibi_bias(4, 16), implementation="xla"))(q, k, v)
    with pytest.warns(RuntimeWarning, match="cuDNN's attention kernel refused this call .*cuDNN is not detected"):
        got = jax.jit(lambda q, k, v: backends.fused(q, k, v, bias=F.alibi_bias(4, 16), backend="cuda"))(q, k, v)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    with pytest.raises(RuntimeError, match="cuDNN is not detected"):   # asked for by name: no fallback
        backends.fused(q, k, v, implementation="cudnn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")     # no warning: XLA's kernel is chosen up front for ...
        odd = q[..., :15, :]               # ... a bias over an odd number of positions (cuDNN's gradient refuses it)
        jax.jit(lambda x: backends.fused(x, x, x, bias=F.alibi_bias(4, 15), backend="cuda"))(odd)
        with pytest.raises(ValueError):    # a call that is wrong whatever the kernel: its own error, no cuDNN warning
            backends.fused(q, k[..., :4], v)
