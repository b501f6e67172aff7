"""attention_jax.decoding.memory: a batch that cannot fit is refused in one line, before its cache,
its text or its logits are allocated."""

import dataclasses
import time

import jax
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.decoding import memory
from attention_jax.decoding.generate import Decoder, generate
from attention_jax.decoding.kv_cache import cached
from attention_jax.errors import ConfigError
from attention_jax.model import LanguageModel

CONFIG = ModelConfig(vocab_size=64, context=16, d_model=32, n_layers=2, n_heads=4)


@pytest.mark.parametrize("change", [{}, dict(mixer="head"), dict(mixer="average"), dict(dtype="bfloat16")])
def test_the_cache_s_bytes_are_those_the_cache_allocates(change):
    config = dataclasses.replace(CONFIG, **change)
    model = LanguageModel(config, rngs=nnx.Rngs(0))
    decoding = cached(model, 3, 10)
    kept = [a for p, a in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Cache))
            if "clock" not in jax.tree_util.keystr(p)]
    assert memory.cache_bytes(config, 3, 10) == sum(a.nbytes for a in kept) > 0
    decoding.undo()


def test_the_bound_counts_the_cache_the_prompts_logits_and_the_text():
    need = memory.needed(CONFIG, 5, 7, 4, cache=True)
    assert need == {"cache": memory.cache_bytes(CONFIG, 5, 10), "logits": 4 * 5 * 7 * 64, "text": 4 * 5 * 11}
    uncached = memory.needed(CONFIG, 5, 7, 40, cache=False)                  # a window a step, the text past it
    assert uncached == {"cache": 0, "logits": 4 * 5 * 16 * 64, "text": 4 * 5 * 47}


def test_a_batch_past_the_machine_is_refused_in_one_line_before_it_is_allocated():
    """A cache of ten million rows would have been killed by the system for memory, with no line."""
    model = LanguageModel(CONFIG, rngs=nnx.Rngs(0))
    began = time.perf_counter()
    with pytest.raises(ConfigError, match=r"a cache of 10000000 row\(s\) of 16 slots needs at least [0-9.]+ GiB "
                                          r"\(the key/value cache [0-9.]+ GiB\), and [0-9.]+ [GM]iB is free; decode "
                                          "fewer rows at once") as err:
        cached(model, 10**7, 16)
    assert "\n" not in str(err.value) and time.perf_counter() - began < 5
    assert not any(type(m).__name__ == "CachedAttention" for _, m in nnx.iter_modules(model))   # nothing swapped


def test_generate_and_a_decoder_ask_before_they_decode(monkeypatch):
    model = LanguageModel(CONFIG, rngs=nnx.Rngs(0))
    decoder = Decoder(model)
    monkeypatch.setattr(memory, "_free", lambda: 1000)
    prompts = np.ones((3, 4), np.int32)
    for cache in (True, False):
        for run in (lambda: generate(model, prompts, 5, temperature=0, cache=cache),
                    lambda: decoder(prompts, 5, temperature=0, cache=cache)):
            with pytest.raises(ConfigError, match=r"decoding 3 row\(s\) of up to 4 \+ 5 ids needs at least [0-9.]+ MiB "
                                                  r"\(.*the logits .*\), and 0.0 MiB is free; decode fewer rows"):
                run()
    assert decoder._made == {}                                             # no cache was made
    monkeypatch.setattr(memory, "_free", lambda: None)                     # a machine that does not say: decode
    assert [t.shape for t in decoder(prompts, 5, temperature=0)] == [(9,)] * 3
