"""attention_jax.train.loss_scale: float16's dynamic loss scale. A step whose scaled gradients
overflow changes no parameter, moment or step count and halves the scale; a finite one trains
as float32 does (to float16's rounding) and counts towards doubling it; float32 and bfloat16
carry no scale; a killed float16 run resumes bit for bit, its scale included.

Smoke-sized, as test_train_engine (helpers: a 1-block model of width 32 on random tokens).
"""
import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from attention_jax.train import loss_scale

from helpers import MC, TC, assert_same_state, batch, killed_after, leaves, new_engine, run

pytestmark = pytest.mark.usefixtures("private_cache")
F16 = dataclasses.replace(MC, dtype="float16")


def at_scale(eng, state, scale, finite_steps=None):
    """`state` with its loss scale (and count of finite steps) set."""
    model, opt = nnx.merge(eng.graphdef, state)
    opt.loss_scale[...] = np.float32(scale)
    if finite_steps is not None:
        opt.finite_steps[...] = np.int32(finite_steps)
    return nnx.state((model, opt))


def scale_of(eng, state) -> tuple[float, int]:
    _, opt = nnx.merge(eng.graphdef, state)
    return float(opt.loss_scale[...]), int(opt.finite_steps[...])


def trained(state) -> dict:
    """Parameters, moments and step count: what a skipped step must leave alone."""
    return {p: np.asarray(a) for p, a in leaves(state) if "loss_scale" not in p and "finite_steps" not in p}


def test_a_step_whose_gradients_overflow_is_skipped_and_halves_the_scale():
    eng = new_engine(F16, TC)
    state = at_scale(eng, eng.init([0]), 2.0**100, finite_steps=7)   # scale x loss: inf in float32
    before = trained(state)
    after, m = eng.step(state, batch(eng))
    assert int(m["skipped"]) == 1 and float(m["loss_scale"]) == 2.0**100
    assert np.isfinite(float(m["loss"])) and not np.isfinite(float(m["grad_norm"]))
    for path, value in trained(after).items():
        np.testing.assert_array_equal(value, before[path], err_msg=path)
    assert scale_of(eng, after) == (2.0**99, 0)


def test_a_finite_step_trains_as_float32_does_and_counts_towards_doubling():
    eng, ref = new_engine(F16, TC), new_engine(MC, TC)
    state, want = eng.init([0]), ref.init([0])
    got, m = eng.step(state, batch(eng))
    want, w = ref.step(want, batch(ref))
    assert int(m["skipped"]) == 0 and float(m["loss_scale"]) == 2.0**16
    assert scale_of(eng, got) == (2.0**16, 1)
    np.testing.assert_allclose(float(m["loss"]), float(w["loss"]), rtol=1e-3)   # float16's 2^-11
    np.testing.assert_allclose(float(m["grad_norm"]), float(w["grad_norm"]), rtol=1e-2)
    assert trained(got).keys() == trained(want).keys() and not \
        np.array_equal(trained(got)["[0]['lm_head']['kernel'].value"],
                       trained(state := eng.init([0]))["[0]['lm_head']['kernel'].value"])
    # 2,000 finite steps in a row (flax's growth interval): the next finite one doubles the scale.
    grown, _ = eng.step(at_scale(eng, state, 2.0**16, finite_steps=2000), batch(eng))
    assert scale_of(eng, grown) == (2.0**17, 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float32_and_bfloat16_carry_no_scale_and_report_none(dtype):
    eng = new_engine(dataclasses.replace(MC, dtype=dtype), TC)
    state = eng.init([0])
    assert not [p for p, _ in leaves(state) if "loss_scale" in p or "finite_steps" in p]
    _, m = eng.step(state, batch(eng))
    assert set(m) == {"loss", "lr", "grad_norm", "block_grad_norm"}


def test_seeds_keep_a_scale_each():
    eng = new_engine(F16, TC, n_seeds=2)
    state = eng.init([0, 1])
    model, opt = nnx.merge(eng.graphdef, state)
    opt.loss_scale[...] = np.array([2.0**100, 2.0**16], np.float32)    # seed 0 overflows, seed 1 not
    _, m = eng.step(nnx.state((model, opt)), batch(eng, seeds=(0, 1)))
    assert np.asarray(m["skipped"]).tolist() == [1, 0]


def test_the_optimizer_holds_a_scale_only_where_the_dtype_needs_one():
    model = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    assert isinstance(loss_scale.optimizer(model, optax.sgd(0.1), "float16"), loss_scale.ScaledOptimizer)
    assert not isinstance(loss_scale.optimizer(model, optax.sgd(0.1), "bfloat16"), loss_scale.ScaledOptimizer)


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_killed_float16_run_resumes_bit_for_bit_with_its_scale(tmp_path, monkeypatch, dropout):
    """Started at a scale that overflows, so the scale moves (steps skipped, then trained) while the
    run is killed at step 5 and resumed from its step-3 checkpoint: the scale is in the checkpoint."""
    mc = dataclasses.replace(F16, dropout=dropout)
    eng = new_engine(mc, TC)
    init = eng.init
    monkeypatch.setattr(eng, "init", lambda seeds: at_scale(eng, init(seeds), 2.0**21))
    reference = run(mc, TC, engine=eng, workdir=tmp_path / "unbroken")
    skipped = [r["skipped"] for r in reference.train_log]
    assert 0 < sum(skipped) < len(skipped), skipped            # the scale moved during the run
    assert [r["step"] for r in reference.train_log] == list(range(1, TC.steps + 1))
    counts = [int(a) for p, a in leaves(reference.state) if p.endswith("['rngs']['count'].value")]
    assert len(counts) == (3 if dropout else 0) and all(c >= TC.steps for c in counts)  # streams moved
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(eng, "step", killed_after(eng.step, 5))
        run(mc, TC, engine=eng, workdir=tmp_path / "broken")
    resumed = run(mc, TC, engine=eng, workdir=tmp_path / "broken")
    assert resumed.resumed_from == 3
    assert_same_state(resumed.state, reference.state)
    assert resumed.train_log == reference.train_log and resumed.final == reference.final
    assert scale_of(eng, resumed.state) == scale_of(eng, reference.state)
    assert jax.tree.structure(resumed.state) == jax.tree.structure(reference.state)
