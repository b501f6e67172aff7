"""attention_jax.analysis.patching: a compiled sweep equals patching one activation at a time by hand, for every
hook kind and axis; the reverse direction; the normalised metric's ends; attribution patching agrees
with exact patching where the patches are small; and every sweep equals TransformerLens' on the same
Hugging Face weights (its TransformerBridge, one forward per patch)."""

import dataclasses

import numpy as np
import pytest
import jax.numpy as jnp
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError, DataError, NotMeasurable
from attention_jax.fingerprint import Keyed
from attention_jax.analysis.inspect import patched, run_with_cache
from attention_jax.model import LanguageModel
from attention_jax.analysis.patching import (HOOKS, activation_patch, attribution_patch, logit_diff,
                                            normalized_logit_diff)

from helpers import gpt2_texts, tl_bridge

TINY = ModelConfig(vocab_size=50, context=8, d_model=32, n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def case():
    """A model, two texts differing in one token (position 2), and the metric between them."""
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    clean = np.random.default_rng(0).integers(0, 50, (3, 8))
    corrupted = clean.copy()
    corrupted[:, 2] = (corrupted[:, 2] + 7) % 50
    return model, clean, corrupted, normalized_logit_diff(model, clean, corrupted, 3, 4)


def by_hand(model, clean, corrupted, metric, hook, by):
    """The same sweep as a Python loop: one patched forward per (layer, index), eager."""
    names = [HOOKS[hook][0].format(i=i) for i in range(model.config.n_layers)]
    _, cache = run_with_cache(model, jnp.asarray(clean), names)
    axes = ("batch", *HOOKS[hook][1])
    sizes = {"head": model.config.heads_used, "position": clean.shape[1]}
    grid = [sizes[a] for a in {"position": ["position"], "head": ["head"], "head_position": ["head", "position"]}[by]]
    out = np.zeros([len(names), *grid])
    for idx in np.ndindex(*out.shape):
        layer, rest = idx[0], idx[1:]
        where = [slice(None)] * len(axes)
        for axis, i in zip({"position": ["position"], "head": ["head"],
                            "head_position": ["head", "position"]}[by], rest):
            where[axes.index(axis)] = i
        src = cache[names[layer]]
        with patched(model, {names[layer]: lambda v: v.at[tuple(where)].set(src[tuple(where)])}):
            out[idx] = float(metric(model(jnp.asarray(corrupted))))
    return out


@pytest.mark.parametrize("hook, by", [("resid_pre", "position"), ("z", "head"), ("weights", "head_position"),
                                      pytest.param("ffn_out", "position", marks=pytest.mark.slow),
                                      pytest.param("v", "head_position", marks=pytest.mark.slow)])
def test_a_compiled_sweep_equals_patching_one_activation_at_a_time(case, hook, by):
    model, clean, corrupted, metric = case
    sweep = activation_patch(model, clean, corrupted, metric, hook=hook, by=by, batch_size=5, into="corrupted")   # 5: a ragged last map
    assert sweep.axes == ("layer", *{"position": ("position",), "head": ("head",),
                                     "head_position": ("head", "position")}[by])
    np.testing.assert_allclose(sweep.values, by_hand(model, clean, corrupted, metric, hook, by), atol=2e-4)


def test_the_normalised_metric_is_one_on_the_clean_run_and_zero_on_the_corrupted(case):
    model, clean, corrupted, metric = case
    assert float(metric(model(jnp.asarray(clean)))) == pytest.approx(1.0, abs=1e-5)
    assert float(metric(model(jnp.asarray(corrupted)))) == pytest.approx(0.0, abs=1e-5)
    # the first block's input at the changed position carries all of it; at the others, nothing
    sweep = activation_patch(model, clean, corrupted, metric, hook="resid_pre", by="position", into="corrupted")
    np.testing.assert_allclose(sweep.values[0], np.eye(8)[2], atol=1e-4)      # compiled vs eager: rounding
    assert sweep.max()[1] in ({"layer": 0, "position": 2}, {"layer": 1, "position": 7})
    # the reverse: corrupting the clean run at that position takes it all away
    reverse = activation_patch(model, clean, corrupted, metric, hook="resid_pre", by="position", into="clean")
    np.testing.assert_allclose(reverse.values[0], 1 - np.eye(8)[2], atol=1e-4)


def test_attribution_patching_agrees_with_exact_patching_where_the_patches_are_small():
    """The two texts differ in one token whose embedding is moved a little: every activation's change
    is small, and the first-order estimate is the exact effect to second order."""
    model = LanguageModel(TINY, rngs=nnx.Rngs(1))
    table = model.token_embed.embedding
    table[...] = table[...].at[9].set(table[...][8] + 0.01 * (table[...][9] - table[...][8]))   # 9 is 8, almost
    clean = np.random.default_rng(1).integers(10, 50, (2, 8))
    clean[:, 3] = 8
    corrupted = clean.copy()
    corrupted[:, 3] = 9
    metric = lambda logits: logit_diff(logits, 3, 4)
    for hook, by in (("resid_pre", "position"), ("z", "head"), ("mixer_out", "position")):
        exact = activation_patch(model, clean, corrupted, metric, hook=hook, by=by, into="corrupted").values
        base = float(metric(model(jnp.asarray(corrupted))))
        approx = attribution_patch(model, clean, corrupted, metric, hook=hook, by=by, into="corrupted")
        assert approx.method == "attribution" and approx.values.shape == exact.shape
        np.testing.assert_allclose(approx.values, exact - base, atol=2e-2 * np.abs(exact - base).max())   # 2% of the largest


def test_where_attribution_patching_is_not_exact_it_says_so_by_differing():
    """Large patches through a softmax and LayerNorm: the linear estimate is off (docs/library.md)."""
    model = LanguageModel(TINY, rngs=nnx.Rngs(0))
    clean = np.random.default_rng(0).integers(0, 50, (3, 8))
    corrupted = (clean + 17) % 50
    metric = normalized_logit_diff(model, clean, corrupted, 3, 4)
    exact = activation_patch(model, clean, corrupted, metric, hook="resid_pre", by="position", into="corrupted").values
    approx = attribution_patch(model, clean, corrupted, metric, hook="resid_pre", by="position", into="corrupted").values
    assert np.abs(approx - exact).max() > 0.05


@pytest.mark.parametrize("bad, match", [
    (dict(hook="mlp"), "hook='mlp'; choose one of"),
    (dict(hook="resid_pre", by="head"), "by='head' does not fit hook='resid_pre'"),
    (dict(into="both"), "into='both'"),
])
def test_a_sweep_that_cannot_be_is_refused_in_one_line(case, bad, match):
    model, clean, corrupted, metric = case
    with pytest.raises(ConfigError, match=match) as info:
        activation_patch(model, clean, corrupted, metric, **{"into": "corrupted", **bad})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="into=None: say which run is patched"):
        activation_patch(model, clean, corrupted, metric)         # no direction is assumed: each call says it
    with pytest.raises(ConfigError, match="of one shape"):
        activation_patch(model, clean, corrupted[:, :5], metric, into="corrupted")
    with pytest.raises(NotMeasurable, match="differ by 0 in the metric, below min_gap"):
        normalized_logit_diff(model, clean, clean, 3, 4)
    average = LanguageModel(ModelConfig(vocab_size=50, context=8, mixer="average"), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="has no heads"):
        activation_patch(average, clean, corrupted, metric, hook="z", by="head", into="corrupted")


def test_what_a_compiled_sweep_would_clamp_or_fail_on_is_refused_first(case):
    """Inside the compiled sweep JAX clamps an id past the vocabulary or a position past the text, and
    silently reads another row; these are refused before anything is compiled, one line each."""
    from attention_jax.errors import DataError
    model, clean, corrupted, metric = case
    past = corrupted.copy()
    past[0, 0] = TINY.vocab_size
    with pytest.raises(DataError, match="token id 50 is outside the vocabulary"):
        activation_patch(model, clean, past, metric, into="corrupted")
    with pytest.raises(DataError, match="token id -1 is outside"):
        attribution_patch(model, clean - clean.min() - 1, corrupted, metric, into="corrupted")
    with pytest.raises(DataError, match="token id 50 is outside"):
        normalized_logit_diff(model, clean, corrupted, TINY.vocab_size, 4)
    with pytest.raises(ConfigError, match="position=8 is outside the text's 8 positions"):
        normalized_logit_diff(model, clean, corrupted, 3, 4, position=8)
    for bad, words in ((lambda logits: logits[:, -1, 3], r"returns \(3,\), not one number"),
                       ({"not": "callable"}, "is not callable")):
        for patch in (activation_patch, attribution_patch):
            with pytest.raises(ConfigError, match=words):
                patch(model, clean, corrupted, bad, into="corrupted")
    for size in (0, -2, 1.5):
        with pytest.raises(ConfigError, match=f"batch_size={size!r} must be a whole number >= 1"):
            activation_patch(model, clean, corrupted, metric, batch_size=size, into="corrupted")


ANSWER = 3      # read by `reads_a_global`: a metric's global, changed between two sweeps


def reads_a_global(logits):
    return logit_diff(logits, ANSWER, 4)


def test_a_metric_is_keyed_by_the_values_it_reads_not_by_its_identity(case):
    """A compiled sweep is reused for a metric computing the same (one program), and never for one whose
    global changed since: that sweep equals one with the new value written in."""
    global ANSWER
    from attention_jax.analysis.patching import _sweep
    model, clean, corrupted, _ = case
    ANSWER = 3
    first = activation_patch(model, clean, corrupted, reads_a_global, into="corrupted").values
    compiled = _sweep._cache_size()
    np.testing.assert_array_equal(activation_patch(model, clean, corrupted, reads_a_global, into="corrupted").values, first)
    assert _sweep._cache_size() == compiled                    # the same values: the same program
    try:
        ANSWER = 7
        changed = activation_patch(model, clean, corrupted, reads_a_global, into="corrupted").values
    finally:
        ANSWER = 3
    written = activation_patch(model, clean, corrupted, lambda logits: logit_diff(logits, 7, 4), into="corrupted").values
    np.testing.assert_allclose(changed, written, rtol=1e-6, atol=1e-6)
    assert np.abs(changed - first).max() > 0.1


def test_answers_must_match_the_batch_and_the_vocabulary(case):
    model, clean, corrupted, _ = case                          # 3 texts
    with pytest.raises(ConfigError, match=r"answer has shape \(2,\), and the batch holds 3 text\(s\)"):
        normalized_logit_diff(model, clean, corrupted, np.array([1, 2]), 4)
    with pytest.raises(DataError, match="token ids must be integers, got float"):
        normalized_logit_diff(model, clean, corrupted, 3.0, 4)
    with pytest.raises(DataError, match="token ids must be integers, got bool"):
        activation_patch(model, clean.astype(bool), corrupted, reads_a_global, into="corrupted")
    with pytest.raises(ConfigError, match=r"clean must be token ids \[B, T\]"):      # one text as [T]
        normalized_logit_diff(model, clean[0], corrupted[0], 3, 4)


def test_a_model_with_dropout_is_analysed_with_dropout_off(case):
    """Dropout on would make every patch a different draw (and, inside the compiled sweep, a JAX
    trace error): the analyses copy the model in eval mode; the caller's model stays in training mode."""
    _, clean, corrupted, _ = case
    model = LanguageModel(dataclasses.replace(TINY, dropout=0.3), rngs=nnx.Rngs(0))
    metric = normalized_logit_diff(model, clean, corrupted, 3, 4)
    sweeps = [activation_patch(model, clean, corrupted, metric, into="corrupted").values for _ in range(2)]
    np.testing.assert_array_equal(*sweeps)
    reference = nnx.merge(*nnx.split(model))
    reference.eval()
    np.testing.assert_allclose(sweeps[0], activation_patch(reference, clean, corrupted, metric, into="corrupted").values, atol=1e-6)
    attribution_patch(model, clean, corrupted, metric, into="corrupted")
    assert not model.blocks[0].mixer.attention.dropout.deterministic


@pytest.mark.slow
def test_the_default_batch_of_patches_fits_its_memory_bound():
    """The default side-by-side batch keeps the compiled sweep's scratch memory under `MEMORY` (0.3 GiB
    here), where every patch at once held 5.6 GiB."""
    from attention_jax.analysis import patching
    config = ModelConfig(vocab_size=8192, context=64, d_model=256, n_layers=4, n_heads=8)
    model = LanguageModel(config, rngs=nnx.Rngs(0))
    tokens = np.random.default_rng(0).integers(0, 8192, (8, 64))
    size = patching.side_by_side(config, tokens.shape)
    assert 1 <= size < 4 * 64                                  # fewer than every patch of resid_pre by position
    graphdef, state = nnx.split(model)
    names = tuple(f"blocks.{i}.resid_pre" for i in range(4))
    sources = patching.hook_values(graphdef, state, jnp.asarray(tokens), names=names)
    lowered = patching._sweep.lower(graphdef, state, jnp.asarray(tokens), sources, np.zeros((size, 2), np.int32),
                                    names=names, axes=HOOKS["resid_pre"][1], by="position", metric=Keyed(reads_a_global))
    assert lowered.compile().memory_analysis().temp_size_in_bytes <= 1.5 * patching.MEMORY


# --- TransformerLens on the same weights --------------------------------------------------------

# ours (hook, by) -> TransformerLens' function, and how its axes map onto ours
TL = {("resid_pre", "position"): ("get_act_patch_resid_pre", None),
      ("resid_mid", "position"): ("get_act_patch_resid_mid", None),
      ("mixer_out", "position"): ("get_act_patch_attn_out", None),
      ("ffn_out", "position"): ("get_act_patch_mlp_out", None),
      ("z", "head"): ("get_act_patch_attn_head_out_all_pos", None),
      ("z", "head_position"): ("get_act_patch_attn_head_out_by_pos", (0, 2, 1)),   # theirs [L, pos, H]
      ("q", "head"): ("get_act_patch_attn_head_q_all_pos", None),
      ("k", "head_position"): ("get_act_patch_attn_head_k_by_pos", (0, 2, 1)),
      ("v", "head"): ("get_act_patch_attn_head_v_all_pos", None),
      ("weights", "head"): ("get_act_patch_attn_head_pattern_all_pos", None),
      ("weights", "head_position"): ("get_act_patch_attn_head_pattern_by_pos", None)}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, torch):
    ours, hf, clean, corrupted = gpt2_texts(tmp_path_factory.mktemp("gpt2"))
    return ours, tl_bridge(hf), clean, corrupted


@pytest.mark.slow
def test_every_sweep_equals_transformer_lens_on_the_same_weights(gpt2, torch):
    import transformer_lens.patching as tl_patching
    ours, bridge, clean, corrupted = gpt2
    metric = normalized_logit_diff(ours, clean, corrupted, 5, 6)
    with torch.no_grad():
        clean_logits, clean_cache = bridge.run_with_cache(torch.as_tensor(clean))
        tl_diff = lambda lg: (lg[:, -1, 5] - lg[:, -1, 6]).mean()
        high, low = float(tl_diff(clean_logits)), float(tl_diff(bridge(torch.as_tensor(corrupted))))
        assert high == pytest.approx(metric.clean, rel=1e-4) and low == pytest.approx(metric.corrupted, rel=1e-4)
        tl_metric = lambda lg: (tl_diff(lg) - low) / (high - low)
        for (hook, by), (name, order) in TL.items():
            theirs = getattr(tl_patching, name)(bridge, torch.as_tensor(corrupted), clean_cache, tl_metric).numpy()
            theirs = theirs if order is None else theirs.transpose(order)
            mine = activation_patch(ours, clean, corrupted, metric, hook=hook, by=by, into="corrupted").values
            np.testing.assert_allclose(mine, theirs, atol=2e-4, err_msg=f"{hook} by {by} vs {name}")


def test_ctrl_c_ends_a_long_sweep_at_the_end_of_its_batch(case):
    """The sweep is a compiled call per batch of patches: an interrupt is answered between them (one call
    for the whole sweep held it to the end, 57 s)."""
    import _thread
    import threading
    import time
    from attention_jax.analysis import patching
    model, clean, corrupted, metric = case
    activation_patch(model, clean, corrupted, metric, batch_size=1, into="corrupted")        # compiled before the clock
    calls, real = [], patching._sweep

    def slow(*args, **kwargs):        # each batch made to take 0.2 s, as a big model's would
        calls.append(1)
        time.sleep(0.2)
        return real(*args, **kwargs)
    patching._sweep = slow
    try:
        threading.Timer(0.5, _thread.interrupt_main).start()
        began = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            activation_patch(model, clean, corrupted, metric, batch_size=1, into="corrupted")   # 16 batches: 3.2 s
        assert time.perf_counter() - began < 1.0 and len(calls) < 16
    finally:
        patching._sweep = real
