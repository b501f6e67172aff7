"""attention_jax.train.programs: Engines handed one ProgramCache share their compiled programs (and
only those of one configuration); an Engine without one compiles its own; every compiled function
computes with the engine's speed swapped in, and trains the model as built with `speed=None`."""

import dataclasses

import numpy as np
import pytest

from attention_jax.speed import Speed
from attention_jax.train import Engine, ProgramCache
from attention_jax.train.programs import OPTIMIZER_FIELDS

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
    assert again.programs is first.programs and again._step._cache_size() == traced
    assert np.isfinite(float(metrics["loss"]))
    other = Engine(MC, dataclasses.replace(TC, lr=TC.lr * 2), programs=cache)
    assert other.programs is not first.programs and other._step is not first._step
    assert Engine(MC, TC, programs=cache, speed=Speed(form="reference")).programs is not first.programs
    assert Engine(MC, TC).programs is not first.programs       # no cache: programs of its own
    assert len(cache) == 3


def test_a_cache_keeps_its_most_recently_used_and_forgets_when_cleared():
    cache = ProgramCache(maxsize=2)
    a, b, c = (Engine(MC, dataclasses.replace(TC, lr=lr), programs=cache).programs for lr in (1e-3, 2e-3, 3e-3))
    assert len(cache) == 2 and Engine(MC, dataclasses.replace(TC, lr=3e-3), programs=cache).programs is c
    assert Engine(MC, dataclasses.replace(TC, lr=1e-3), programs=cache).programs is not a    # evicted: made anew
    cache.clear()
    assert len(cache) == 0


def test_the_key_holds_every_field_the_optimizer_reads():
    """A TrainConfig field the optimizer reads and the key left out would serve one lr's program to another."""
    import inspect
    from attention_jax.train import programs
    read = {f for f in TC.__dataclass_fields__
            if f"tc.{f}" in inspect.getsource(programs.lr_schedule) + inspect.getsource(programs.make_optimizer)}
    assert read == set(OPTIMIZER_FIELDS) - {"steps"} | ({"steps"} & read)
    assert {"log_every", "eval_every", "checkpoint_every", "train_eval_windows", "eval_batch"}.isdisjoint(OPTIMIZER_FIELDS)


@pytest.mark.slow
def test_speed_none_trains_the_model_as_built_to_the_same_numbers():
    eng, ref = Engine(MC, TC), Engine(MC, TC, speed=None)
    _, fast_metrics = eng.step(eng.init([0]), batch(eng))
    _, ref_metrics = ref.step(ref.init([0]), batch(ref))
    for k in ("loss", "grad_norm"):
        np.testing.assert_allclose(float(fast_metrics[k]), float(ref_metrics[k]), rtol=1e-5)
    assert Engine(MC, TC, speed=None).programs.speed is None
