"""attention_jax.decoding.generate: the compiled loop equals decoding by hand, past the context too, and
each token is drawn from the model's own distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError, DataError
from attention_jax.decoding.generate import generate, next_token
from attention_jax.analysis.inspect import ablate
from attention_jax.model import LanguageModel

from helpers import forward

TINY = ModelConfig(vocab_size=37, context=8, d_model=32, n_layers=1, n_heads=4, positions="learned")


@pytest.fixture(scope="module")
def model():
    m = LanguageModel(TINY, rngs=nnx.Rngs(3))
    leaves, treedef = jax.tree.flatten(nnx.state(m, nnx.Param))   # sharp distributions: no argmax ties
    keys = jax.random.split(jax.random.key(1), len(leaves))
    nnx.update(m, jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))
    return m


@pytest.mark.slow
def test_greedy_equals_decoding_by_hand_across_the_context_boundary(model):
    prompt = [5, 1, 30]
    got = generate(model, prompt, 12, temperature=0, cache=False)   # 15 tokens through a context of 8
    text = list(prompt)
    for _ in range(12):   # the model on the last `context` tokens, unpadded, argmax at the last position
        window = np.asarray(text[-TINY.context:])[None]
        text.append(int(np.asarray(forward(model, jnp.asarray(window)))[0, -1].argmax()))
    assert got.dtype == np.int32 and got.tolist() == text
    assert generate(model, prompt, 12, key=jax.random.key(0), top_k=1, cache=False).tolist() == text   # top-1 = greedy


@pytest.mark.slow
def test_a_key_decides_the_draw(model):   # 22 tokens through a context of 8: the sliding window
    a = generate(model, [2, 3], 20, key=jax.random.key(7), temperature=1.0, cache=False)
    assert a[:2].tolist() == [2, 3] and len(a) == 22 and ((0 <= a) & (a < TINY.vocab_size)).all()
    assert generate(model, [2, 3], 20, key=jax.random.key(7), cache=False).tolist() == a.tolist()
    assert generate(model, [2, 3], 20, key=jax.random.key(8), cache=False).tolist() != a.tolist()
    assert generate(model, [2, 3], 0, temperature=0).tolist() == [2, 3]


def test_draws_follow_the_softmax_at_the_temperature_and_top_k_keeps_the_k_likeliest():
    logits = jnp.asarray([2.0, 1.0, 0.5, -1.0, 0.0])
    keys = jax.random.split(jax.random.key(0), 20_000)
    for temperature in (1.0, 0.5):
        draws = jax.vmap(lambda k: next_token(logits, k, temperature))(keys)
        freq = np.bincount(np.asarray(draws), minlength=5) / len(keys)
        np.testing.assert_allclose(freq, jax.nn.softmax(logits / temperature), atol=0.015)
    draws = np.asarray(jax.vmap(lambda k: next_token(logits, k, 1.0, top_k=2))(keys))
    assert set(draws.tolist()) == {0, 1}
    np.testing.assert_allclose((draws == 0).mean(), jax.nn.softmax(logits[:2])[0], atol=0.015)


def test_what_cannot_be_generated_is_refused_in_one_line(model):
    for empty in ([], [[]], [[[1]]]):
        with pytest.raises(ConfigError, match=r"\[P\] or \[B, P\] with P >= 1"):
            generate(model, empty, 3, temperature=0)
    with pytest.raises(DataError, match="outside the vocabulary"):
        generate(model, [TINY.vocab_size], 3, temperature=0)
    for bad in ({"n": -1}, {"n": 2.5}, {"temperature": -1.0}, {"temperature": float("nan")},
                {"temperature": float("inf")}, {"top_k": 0}, {"top_k": True}, {"temperature": True},
                {"top_k": TINY.vocab_size + 1}):
        kw = {"n": 3, "temperature": 0.0, **bad}
        with pytest.raises(ConfigError):
            generate(model, [1], kw.pop("n"), key=jax.random.key(0), **kw)
    with pytest.raises(ConfigError, match="needs a key"):
        generate(model, [1], 3, temperature=1.0)
    with ablate(model, bidirectional=True), pytest.raises(ConfigError, match="sees the future"):
        generate(model, [1], 3, temperature=0)
    assert generate(model, [1], 3, temperature=0).shape == (4,)     # the ablation put the mask back


@pytest.mark.slow
def test_prompts_of_one_length_are_answered_together_as_each_alone(model):
    prompts = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    together = generate(model, prompts, 20, temperature=0, cache=False)
    assert isinstance(together, list) and [t.shape for t in together] == [(23,)] * 3
    for row, prompt in zip(together, prompts):
        np.testing.assert_array_equal(row, generate(model, prompt, 20, temperature=0, cache=False))
    drawn = generate(model, prompts, 20, key=jax.random.key(1), temperature=1.0, cache=False)
    assert len({tuple(r[3:]) for r in drawn}) == 3              # each row draws with its own key


def test_a_key_that_is_no_key_a_huge_n_and_a_temperature_float32_cannot_hold(model):
    with pytest.raises(ConfigError, match="not a JAX random key"):
        generate(model, [1, 2], 3, key=0, temperature=1.0)
    with pytest.raises(ConfigError, match="from 0 to 1,000,000"):
        generate(model, [1, 2], 10**12, temperature=0)
    greedy = generate(model, [1, 2], 5, temperature=0)
    for tiny in (1e-40, 1e-30):        # float32 0 is the greedy limit; a tiny one must not overflow to garbage
        np.testing.assert_array_equal(generate(model, [1, 2], 5, key=jax.random.key(0), temperature=tiny), greedy)


def test_decoding_with_the_model_as_built_gives_the_tokens_the_speed_swap_gives(model):
    """`generate` decodes with `Speed()` swapped in by default; `speed=None` with the model as built: the
    same greedy tokens (the swap's numbers agree to float rounding, and these logits have no ties)."""
    from attention_jax.speed import Speed
    prompt = [[5, 1, 30], [2, 2, 9]]
    fast = generate(model, prompt, 5, temperature=0)
    np.testing.assert_array_equal(generate(model, prompt, 5, temperature=0, speed=None), fast)
    np.testing.assert_array_equal(generate(model, prompt, 5, temperature=0, speed=Speed(form="chunked", chunk=2)), fast)
    with pytest.raises(ConfigError, match="cannot compute positions='alibi'"):
        generate(LanguageModel(ModelConfig(vocab_size=37, context=8, d_model=32, positions="alibi"), rngs=nnx.Rngs(0)),
                 prompt, 2, temperature=0, speed=Speed(form="chunked"))


def test_logits_that_are_not_finite_are_refused_not_decoded_as_token_0(model):
    """float16 weights whose logits pass 65,504, or a model whose weights hold NaN, gave token 0 again and
    again: refused in one line, naming the fix."""
    loud = nnx.merge(*nnx.split(model), copy=True)
    loud.lm_head.kernel[...] = loud.lm_head.kernel[...] * 3e5                 # past float16's range, not float32's
    assert np.isfinite(np.asarray(forward(loud, jnp.asarray([[1, 2]])))).all()
    for cache in (True, False):
        with pytest.raises(ConfigError, match=r"not finite with weights='float16' .*decode with weights='bfloat16'"):
            generate(loud, [1, 2], 4, temperature=0, weights="float16", cache=cache)
    assert np.isfinite(generate(loud, [1, 2], 4, temperature=0, weights="bfloat16")).all()
    broken = nnx.merge(*nnx.split(model), copy=True)
    broken.blocks[0].mixer.out.kernel[...] = broken.blocks[0].mixer.out.kernel[...] * jnp.nan
    with pytest.raises(ConfigError, match="the model's parameters hold NaN or infinite values") as info:
        generate(broken, [[1, 2], [3, 4]], 6, temperature=0)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_ctrl_c_ends_a_long_generate_within_a_second_keeping_the_tokens_drawn(model):
    """The tokens come in chunks of about a quarter of a second: an interrupt is answered at the next
    chunk's end, and the texts drawn so far come with it, each the start of the uninterrupted text."""
    import _thread
    import threading
    import time
    from attention_jax.errors import GenerationInterrupted
    prompt = [[5, 1, 30], [2, 2]]
    generate(model, prompt, 50, temperature=0, cache=False)                    # compiled before the clock starts
    timer = threading.Timer(1.0, _thread.interrupt_main)
    began = time.perf_counter()
    timer.start()
    with pytest.raises(GenerationInterrupted) as info:
        generate(model, prompt, 200_000, temperature=0, cache=False)
    assert time.perf_counter() - began < 2.0                                   # 1 s, then within a second
    e = info.value
    assert 0 < e.done < 200_000 and [len(t) for t in e.texts] == [3 + e.done, 2 + e.done]
    whole = generate(model, prompt, min(e.done, 64), temperature=0, cache=False)
    for got, want in zip(e.texts, whole):
        np.testing.assert_array_equal(got[:len(want)], want)


def test_one_prompt_gives_its_text_and_a_batch_a_list_checked_once(model, monkeypatch):
    """One return type a kind of input: ids [P] -> its text [P + n]; a batch ([B, P] or a list of any
    lengths) -> a list of B texts. The prompt is read and checked once a call, not again by the Decoder."""
    from attention_jax.decoding import generate as module
    read = []
    monkeypatch.setattr(module, "_prompts", lambda prompt, vocab, f=module._prompts: read.append(1) or f(prompt, vocab))
    one = generate(model, [1, 2, 3], 4, temperature=0)
    assert isinstance(one, np.ndarray) and one.shape == (7,) and one.dtype == np.int32 and len(read) == 1
    for batch in (np.array([[1, 2, 3], [4, 5, 6]]), [[1, 2, 3], [4, 5]], [[1, 2, 3]]):
        texts = generate(model, batch, 4, temperature=0)
        assert isinstance(texts, list) and [t.shape for t in texts] == [(len(p) + 4,) for p in batch]
        np.testing.assert_array_equal(texts[0], one)                 # each row as if alone
    assert len(read) == 4
