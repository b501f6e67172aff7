"""attention_jax.train.engine's ProgramCache: Engines handed one share their compiled programs (and
only those of one configuration); an Engine without one compiles its own; every compiled function
computes with the engine's speed swapped in, and trains the model as built with `speed=None`."""

import dataclasses

import numpy as np
import pytest

from attention_jax.speed import Speed
from attention_jax.train import Engine, ProgramCache

from helpers import MC, TC, batch


def test_engines_handed_one_cache_share_their_compiled_programs():
    """A second Engine for a configuration the cache holds traces nothing again; one differing only in
    the loop's bookkeeping shares too, one with another learning rate or speed does not."""
    cache = ProgramCache()
    first = Engine(MC, TC, programs=cache)
    first.step(first.init([0]), batch(first))
    traced = first._step._cache_size()
    again = Engine(MC, dataclasses.replace(TC, checkpoint_every=7, log_every=3, eval_every=2), programs=cache)
    state, metrics = again.step(again.init([0]), batch(again))
    assert again._step is first._step and again._step._cache_size() == traced
    assert np.isfinite(float(metrics["loss"]))
    other = Engine(MC, dataclasses.replace(TC, lr=TC.lr * 2), programs=cache)
    assert other._step is not first._step and other._nll is not first._nll
    assert Engine(MC, TC, programs=cache, speed=Speed(form="reference"))._step is not first._step
    assert Engine(MC, TC)._step is not first._step       # no cache: programs of its own
    assert len(cache) == 3


def test_a_cache_keeps_its_most_recently_used_and_forgets_when_cleared():
    cache = ProgramCache(maxsize=2)
    a, b, c = (Engine(MC, dataclasses.replace(TC, lr=lr), programs=cache)._step for lr in (1e-3, 2e-3, 3e-3))
    assert len(cache) == 2 and Engine(MC, dataclasses.replace(TC, lr=3e-3), programs=cache)._step is c
    assert Engine(MC, dataclasses.replace(TC, lr=1e-3), programs=cache)._step is not a    # evicted: made anew
    cache.clear()
    assert len(cache) == 0


@pytest.mark.slow
def test_speed_none_trains_the_model_as_built_to_the_same_numbers():
    eng, ref = Engine(MC, TC), Engine(MC, TC, speed=None)
    _, fast_metrics = eng.step(eng.init([0]), batch(eng))
    _, ref_metrics = ref.step(ref.init([0]), batch(ref))
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose(float(fast_metrics[k]), float(ref_metrics[k]), rtol=1e-5)
