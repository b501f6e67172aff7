"""attention_jax.speed.swap: `fast(model)` puts faster forms in and takes them out again. In the model,
every form equals the model as built (forward and gradients) for every position kind; the model's
state, its paths and its hook points other than scores and weights are untouched; decoding, custom
masks and dropout still compute what the model as built does."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.analysis.inspect import hook_names, replaced
from attention_jax.layers import CausalMask, Dense
from attention_jax.model import DotProductAttention, LanguageModel
from attention_jax.speed import FastAttention, FastDense, Speed, fast, forms_of

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4)
B, T = 2, 8


def config(**kw):
    return dataclasses.replace(TINY, **kw)


def tokens(seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 50, (B, T)), jnp.int32)


def kinds(model):
    return [(".".join(map(str, p)), type(m).__name__) for p, m in nnx.iter_modules(model)]


# One compile per (model structure, speed), not one per operation (eager on CPU compiles each op).
@nnx.jit(static_argnums=2)
def logits_and_grads(m, idx, speed):
    def loss(m):
        logits = m(idx)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits
    with fast(m, speed) if speed is not None else replaced(m, {}):
        grads, logits = nnx.grad(loss, has_aux=True)(m)
    return logits, nnx.state(grads, nnx.Param)


POSITIONS = [("heads", "learned"), ("heads", "sinusoidal"), ("heads", "rope"), ("head", "rope"), ("heads", "alibi"),
             ("heads", "none")]


@pytest.mark.parametrize("form", ["causal_halves", "chunked", "fused", "reference"])
@pytest.mark.parametrize("mixer, positions", [POSITIONS[0]] + [pytest.param(*p, marks=pytest.mark.slow)
                                                               for p in POSITIONS[1:]])
def test_every_form_in_the_model_equals_the_model_as_built_forward_and_gradients(form, mixer, positions):
    """"reference" swaps the dense layers alone: their hand-written backward against autodiff's."""
    if form == "chunked" and positions == "alibi":
        pytest.skip("refused by the swap (test_the_forms_a_model_cannot_take_are_refused_in_one_line)")
    model = LanguageModel(config(mixer=mixer, positions=positions), rngs=nnx.Rngs(0))
    idx = tokens()
    want, want_grads = logits_and_grads(model, idx, None)
    got, got_grads = logits_and_grads(model, idx, Speed(form=form, chunk=4))   # T=8: two chunks
    chex.assert_trees_all_close(got, want, atol=2e-5)
    chex.assert_trees_all_close(got_grads, want_grads, atol=2e-5)


@pytest.mark.slow
def test_bfloat16_products_stay_within_their_rounding_of_the_model_as_built():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    idx = tokens()
    want, want_grads = logits_and_grads(model, idx, None)
    got, got_grads = logits_and_grads(model, idx, Speed(matmul_dtype="bfloat16"))
    assert got.dtype == jnp.float32
    err = float(jnp.abs(got - want).max())
    assert 0 < err < 0.05 * float(jnp.abs(want).max())           # rounded, and only by bfloat16's 3 digits
    chex.assert_trees_all_close(got_grads, want_grads, atol=5e-2, rtol=5e-2)


def test_the_swap_keeps_the_state_and_puts_the_model_as_built_back():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    before, state = kinds(model), nnx.state(model)
    handle = fast(model)
    assert set(forms_of(model).values()) == {"causal_halves"}                        # a CPU's "auto"
    assert {k for _, k in kinds(model)} >= {"FastAttention", "FastDense"}
    assert "Dense" not in {k for _, k in kinds(model)}
    # The attention as built stays, held by its twin (which calls it for what no form computes).
    assert all(p.endswith(".reference") for p, k in kinds(model) if k == "DotProductAttention")
    swapped = nnx.state(model)
    assert jax.tree.structure(swapped) == jax.tree.structure(state)        # the same paths, the same variables
    chex.assert_trees_all_equal(swapped, state)
    handle.undo()
    assert kinds(model) == before and set(forms_of(model).values()) == {"reference"}
    with fast(model, form="chunked") as same:
        assert same is model and set(forms_of(model).values()) == {"chunked"}
    assert kinds(model) == before


def test_a_second_swap_leaves_what_is_already_fast_and_undoes_only_its_own():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    with fast(model, form="chunked"):
        inner = fast(model, form="causal_halves")
        assert inner.parts == {} and set(forms_of(model).values()) == {"chunked"}
        inner.undo()
        assert set(forms_of(model).values()) == {"chunked"}
    assert set(forms_of(model).values()) == {"reference"}


def test_a_body_that_raises_still_gets_the_model_as_built_back():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    before = kinds(model)
    with pytest.raises(RuntimeError, match="boom"):
        with fast(model):
            raise RuntimeError("boom")
    assert kinds(model) == before


def test_under_the_swap_the_other_hook_points_stay_and_scores_and_weights_go():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    every = set(hook_names(model))
    with fast(model):
        left = set(hook_names(model))
    assert every - left == {f"blocks.{i}.mixer.attention.{n}" for i in range(2) for n in ("scores", "weights")}
    with fast(model, form="reference"):                  # the dense layers alone: every hook point stays
        assert set(hook_names(model)) == every


def test_speed_reference_with_no_dense_swaps_nothing():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    before = kinds(model)
    with fast(model, form="reference", dense=False) as m:
        assert kinds(m) == before


def test_the_forms_a_model_cannot_take_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="cannot compute positions='alibi'"):
        fast(LanguageModel(config(positions="alibi"), rngs=nnx.Rngs(0)), form="chunked")
    with pytest.raises(ConfigError, match="has no dropout on its weights"):
        fast(LanguageModel(config(dropout=0.1), rngs=nnx.Rngs(0)), form="fused")


def test_decoding_under_the_swap_reads_the_cache_by_the_equation():
    model = LanguageModel(config(positions="rope"), rngs=nnx.Rngs(0))
    text = tokens()
    whole = model(text)
    from attention_jax.decoding.kv_cache import cached
    with fast(model), cached(model, B) as decoding:
        steps = [decoding(text[:, :5])] + [decoding(text[:, t:t + 1]) for t in range(5, T)]
    chex.assert_trees_all_close(jnp.concatenate(steps, axis=1), whole, atol=2e-5)


def test_a_mask_of_its_own_is_applied_under_the_swap_too():
    class Everything(CausalMask):         # every position sees the whole window, as a mask matrix
        causal = False

        def __call__(self, T):
            return jnp.ones((T, T), bool)

    model = LanguageModel(config(n_layers=1), rngs=nnx.Rngs(0))
    with replaced(model, {"blocks.0.mixer.attention.mask": Everything()}):
        seen = model(tokens())
        with fast(model):
            np.testing.assert_allclose(model(tokens()), seen, atol=2e-5)
    assert not np.allclose(seen[:, 0], model(tokens())[:, 0])   # the first position saw the future


@pytest.mark.slow
def test_dropout_under_the_swap_draws_from_the_model_s_own_streams():
    """causal_halves holds the weights, so dropout applies; the streams are the model's (shared)."""
    model = LanguageModel(config(dropout=0.5), rngs=nnx.Rngs(0))
    count = lambda: [int(v[...]) for p, v in nnx.to_flat_state(nnx.state(model)) if p[-1] == "count"]
    before = count()
    with fast(model):
        a = model(tokens())
    assert count() != before and np.isfinite(np.asarray(a)).all()


def test_the_twins_hold_the_very_parameters_they_stand_in_for():
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    dense, attention = model.blocks[0].mixer.qkv, model.blocks[0].mixer.attention
    assert type(dense) is Dense and type(attention) is DotProductAttention
    with fast(model):
        twin, fast_attention = model.blocks[0].mixer.qkv, model.blocks[0].mixer.attention
        assert isinstance(twin, FastDense) and twin.kernel is dense.kernel and twin.bias is dense.bias
        assert isinstance(fast_attention, FastAttention) and fast_attention.mask is attention.mask


@pytest.mark.slow
def test_an_attention_whose_scores_or_weights_are_patched_keeps_the_equation():
    """`fast` (and with it `generate`) dropped a patch on the weights: the fast forms never hold them. Such an
    attention stays as built, and the model computes as patched."""
    import jax.numpy as jnp
    from flax import nnx
    from attention_jax.config import ModelConfig
    from attention_jax.decoding.generate import generate
    from attention_jax.analysis.inspect import patched
    from attention_jax.model import LanguageModel
    from attention_jax.speed import fast, forms_of
    model = LanguageModel(ModelConfig(vocab_size=32, context=16, d_model=16, n_heads=2, n_layers=2), rngs=nnx.Rngs(0))
    x = jnp.arange(12)[None] % 32
    halved = jnp.zeros_like                # every head passes nothing of what it read
    with patched(model, {"blocks.*.mixer.attention.weights": halved}):
        want = model(x)
        with fast(model):
            assert set(forms_of(model).values()) == {"reference"}
            np.testing.assert_allclose(model(x), want, atol=1e-6)
        text = generate(model, [1, 2, 3], 10, temperature=0).tolist()
    plain = generate(model, [1, 2, 3], 10, temperature=0).tolist()
    with patched(model, {"blocks.*.mixer.attention.weights": halved}):
        by_hand = [1, 2, 3]
        for _ in range(10):
            by_hand.append(int(model(jnp.asarray([by_hand]))[0, -1].argmax()))
    assert text == by_hand and text != plain
