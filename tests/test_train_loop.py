"""attention_jax.train.loop: `fit` around the engine. A killed run resumes bit for bit, several
steps per call train like one (and resume, and realign off the grid), N seeds by vmap, a
diverging run stops with one line and keeps its last good checkpoint.

Everything is smoke-sized (helpers: a 1-block model of width 32 on random tokens). Compiling
is what costs time on a CPU; engines of one configuration share their compiled programs, and are
handed to `fit`.
"""

import dataclasses
import json

import numpy as np
import pytest

from attention_jax.config import TrainConfig
from attention_jax.errors import ConfigError, TrainingDiverged
from attention_jax.train import Engine, unstack_seed
from attention_jax.train import loop

from helpers import MC, TC, assert_same_state, killed_after, leaves, new_engine, one_line, run, saved_steps


pytestmark = pytest.mark.usefixtures("private_cache")   # no test here may touch the user's cache


@pytest.mark.slow
@pytest.mark.parametrize("dropout, where", [(0.0, "inside"), (0.1, "before"), (0.1, "inside")])
def test_killed_run_resumes_bit_for_bit(tmp_path, monkeypatch, engine, dropout, where):
    """Ctrl-C at step 5, then the same command again, ends exactly where an unbroken run ends.

    "before": the interrupt lands before step 5 runs, so fit saves step 5 on the way out.
    "inside": it lands after the step consumed (donated) the state, so that save fails and
    the run resumes from the last periodic checkpoint (step 3) and redoes steps 4-5.
    With dropout the RNG stream state must be restored too, or the masks would differ.
    """
    mc = dataclasses.replace(MC, dropout=dropout)
    tc = dataclasses.replace(TC, eval_every=2)   # the curve of evaluations must survive the kill too
    eng = new_engine(mc, tc)
    reference = run(mc, tc, engine=eng, workdir=tmp_path / "unbroken")
    assert reference.resumed_from == 0
    assert [h["step"] for h in reference.history] == [2, 4, 6, 8]
    assert reference.history[-1]["val_ppl"] == reference.final["val_ppl"]
    assert [m["step"] for m in reference.train_log] == list(range(1, 9))     # every step's metrics
    counts = [int(a) for p, a in leaves(reference.state) if p.endswith("['rngs']['count'].value")]
    assert len(counts) == (3 if dropout else 0) and all(c >= TC.steps for c in counts)  # streams advanced

    real_step, calls = eng.step, []

    def killed_at_5(state, b):
        calls.append(1)
        if len(calls) == 6 and where == "before":
            raise KeyboardInterrupt
        out = real_step(state, b)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return out

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(eng, "step", killed_at_5)    # the same compiled engine, booby-trapped
        run(mc, tc, engine=eng, workdir=tmp_path / "broken")
    saved = sorted(int(p.name) for p in (tmp_path / "broken" / "checkpoints").iterdir() if p.name.isdigit())
    # "inside": the step-5 state was donated to the step, so the save on the way out fails
    # (silently, by design) and step 3 is the latest; a fit that kept it would save 5.
    expect = 5 if where == "before" else 3
    assert saved[-1] == expect

    resumed = run(mc, tc, engine=eng, workdir=tmp_path / "broken")
    assert resumed.resumed_from == expect > 0 and resumed.steps == TC.steps
    assert_same_state(resumed.state, reference.state)
    assert resumed.final == reference.final
    assert resumed.history == reference.history and resumed.train_log == reference.train_log
    metrics = [json.loads(line) for line in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == TC.steps and metrics[-1]["val_ppl"] == reference.final["val_ppl"]
    # A finished run resumed again does no step and reports the same numbers.
    again = run(mc, tc, engine=eng, workdir=tmp_path / "broken")
    assert again.resumed_from == TC.steps and again.final == reference.final
    assert again.history == reference.history


@pytest.mark.slow
def test_ctrl_c_inside_a_save_leaves_that_step_alone_and_resumes_bit_for_bit(tmp_path, monkeypatch, engine, caplog):
    """Ctrl-C landing inside orbax's save of step 6: orbax's writer threads may still be filling that
    step's temporary folder, so the way out must not save step 6 again (that removed the folder under
    them: a 30-100-line traceback). Step 3 stands; the cut save's leftover folder goes silently at the
    next open, and the resumed run ends exactly where an unbroken one does."""
    import orbax.checkpoint as ocp
    eng = engine(MC, 1)
    reference = run(engine=eng, workdir=tmp_path / "unbroken")
    real_save, asked = ocp.CheckpointManager.save, []

    def cut_at_6(self, step, *a, **kw):
        asked.append(step)
        if step == 6:
            (self.directory / "6.orbax-checkpoint-tmp").mkdir()      # what a cut save leaves behind
            raise KeyboardInterrupt
        return real_save(self, step, *a, **kw)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(ocp.CheckpointManager, "save", cut_at_6)
        run(engine=eng, workdir=tmp_path / "broken")
    assert asked == [3, 6]                              # step 6 asked for once, not again on the way out
    folder = tmp_path / "broken" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["3", "6.orbax-checkpoint-tmp"]
    with caplog.at_level("WARNING"):
        resumed = run(engine=eng, workdir=tmp_path / "broken")
    assert resumed.resumed_from == 3 and "6.orbax-checkpoint-tmp" not in {p.name for p in folder.iterdir()}
    assert not [r for r in caplog.records if "orbax-checkpoint-tmp" in r.getMessage()]
    assert_same_state(resumed.state, reference.state)
    assert resumed.final == reference.final and resumed.train_log == reference.train_log


TC12 = dataclasses.replace(TC, steps=12, checkpoint_every=4, eval_every=4)   # 4 divides all three


def test_steps_per_call_divides_the_run_and_its_intervals():
    choose = loop.choose_steps_per_call
    assert choose(TC12) == 1                                        # a CPU: one step per call
    assert loop.default_steps_per_call("gpu") == loop.default_steps_per_call("tpu") == 16
    assert [choose(TC12, asked=a) for a in (16, 4, 3, 2)] == [4, 4, 2, 2]
    assert choose(dataclasses.replace(TC12, checkpoint_every=3), asked=16) == 1
    assert choose(dataclasses.replace(TC12, checkpoint_every=3), asked=16, checkpoints=False) == 4
    assert choose(TrainConfig(steps=3000, eval_every=500, checkpoint_every=500), asked=16) == 10   # the paper's
    for bad in (0, 2.5, True):
        with pytest.raises(ConfigError, match="steps_per_call") as err:
            choose(TC12, asked=bad)
        one_line(err.value)


@pytest.fixture(scope="module")
def engine12():
    return new_engine(MC, TC12)


def counting(monkeypatch, eng) -> dict:
    """Count the engine's one-step and K-step calls (the compiled ones, unchanged)."""
    calls = {"step": 0, "steps": 0}
    for name in calls:
        real = getattr(eng, name)

        def counted(*a, _name=name, _real=real):
            calls[_name] += 1
            return _real(*a)
        monkeypatch.setattr(eng, name, counted)
    return calls


@pytest.mark.slow
def test_several_steps_per_call_train_like_one(tmp_path, monkeypatch, engine12):
    """Four steps per call: three calls, evaluations and checkpoints on their steps, every
    step's metrics logged, and the same training as one step per call to float rounding."""
    one = run(MC, TC12, engine=engine12, steps_per_call=1)
    calls = counting(monkeypatch, engine12)
    four = run(MC, TC12, engine=engine12, workdir=tmp_path, steps_per_call=4)
    assert calls == {"step": 0, "steps": 3} and (four.steps_per_call, one.steps_per_call) == (4, 1)
    assert [m["step"] for m in four.train_log] == list(range(1, 13))
    assert [h["step"] for h in four.history] == [4, 8, 12]
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [8, 12]  # KEEP 2
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == list(range(1, 13))
    for key in ("loss", "grad_norm", "lr"):   # measured: 1.1e-7 relative at most
        np.testing.assert_allclose([m[key] for m in four.train_log], [m[key] for m in one.train_log], rtol=1e-5)
    for (path, a), (_, b) in zip(leaves(four.state), leaves(one.state)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=path)   # measured 4.8e-6 absolute


@pytest.mark.slow
def test_several_steps_per_call_with_vmapped_seeds_and_dropout():
    """Metrics [K, seeds] and block norms [K, seeds, blocks] come back one record per step."""
    mc = dataclasses.replace(MC, dropout=0.1)
    eng = new_engine(mc, TC12, n_seeds=2)
    one = run(mc, TC12, engine=eng, seeds=(0, 1), steps_per_call=1)
    four = run(mc, TC12, engine=eng, seeds=(0, 1), steps_per_call=4)
    assert [m["step"] for m in four.train_log] == list(range(1, 13))
    assert all(len(m["loss"]) == 2 and np.shape(m["block_grad_norm"]) == (2, 1) for m in four.train_log)
    np.testing.assert_allclose([m["loss"] for m in four.train_log], [m["loss"] for m in one.train_log], rtol=1e-5)
    np.testing.assert_allclose(four.final["val_ppl"], one.final["val_ppl"], rtol=1e-4)


@pytest.mark.slow
def test_a_run_diverging_inside_a_call_names_its_step_and_saves_nothing_past_it(tmp_path):
    tc = dataclasses.replace(TC, lr=1e9, steps=40, log_every=10, checkpoint_every=4)
    steps = {}
    for per_call in (1, 4):
        with pytest.raises(TrainingDiverged) as info:
            run(MC, tc, workdir=tmp_path / str(per_call), steps_per_call=per_call)
        one_line(info.value)
        steps[per_call] = info.value.step
        saved = [int(p.name) for p in (tmp_path / str(per_call) / "checkpoints").iterdir() if p.name.isdigit()]
        assert all(s < info.value.step for s in saved)
    assert steps[4] == steps[1]                 # the first non-finite loss, not the call's end


@pytest.mark.slow
def test_several_steps_per_call_resume_bit_for_bit(tmp_path, monkeypatch, engine12):
    """Killed inside its second call (whose input state is gone), the run resumes from step
    4 and ends exactly where an unbroken four-per-call run ends; a run stopped off the grid
    (step 5, one step per call) realigns with single steps and then calls four at a time."""
    reference = run(MC, TC12, engine=engine12, workdir=tmp_path / "unbroken", steps_per_call=4)
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(engine12, "steps", killed_after(engine12.steps, 2))
        run(MC, TC12, engine=engine12, workdir=tmp_path / "broken", steps_per_call=4)
    resumed = run(MC, TC12, engine=engine12, workdir=tmp_path / "broken", steps_per_call=4)
    assert resumed.resumed_from == 4
    assert_same_state(resumed.state, reference.state)
    assert resumed.final == reference.final and resumed.train_log == reference.train_log

    real_step, taken = engine12.step, []

    def stop_before_6(state, b):
        if len(taken) == 5:
            raise KeyboardInterrupt
        taken.append(1)
        return real_step(state, b)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(engine12, "step", stop_before_6)
        run(MC, TC12, engine=engine12, workdir=tmp_path / "off_grid", steps_per_call=1)
    calls = counting(monkeypatch, engine12)
    realigned = run(MC, TC12, engine=engine12, workdir=tmp_path / "off_grid", steps_per_call=4)
    assert realigned.resumed_from == 5 and calls == {"step": 3, "steps": 1}    # 6, 7, 8; then 9-12
    assert [m["step"] for m in realigned.train_log] == list(range(1, 13))
    np.testing.assert_allclose(realigned.final["val_ppl"], reference.final["val_ppl"], rtol=1e-5)


@pytest.mark.slow
def test_two_seeds_in_one_vmapped_run(engine):
    both = run(engine=engine(MC, 2), seeds=[0, 1])
    single = run(engine=engine(), seeds=[0])
    val, train = both.final["val_ppl"], both.final["train_ppl"]
    assert both.seeds == [0, 1] and len(val) == len(train) == 2
    assert val[0] != val[1] and all(np.isfinite(val + train))
    mean, std = both.mean_std("val_ppl")
    assert mean == pytest.approx(np.mean(val)) and std == pytest.approx(np.std(val, ddof=1))
    assert std > 0
    assert single.mean_std("val_ppl") == (single.final["val_ppl"][0], 0.0)
    # Seed 0 inside the vmapped program is the single-seed run (measured: ~1e-7 relative).
    rel = abs(val[0] - single.final["val_ppl"][0]) / single.final["val_ppl"][0]
    assert rel < 1e-4, f"seed 0: vmapped {val[0]} vs single {single.final['val_ppl'][0]} (rel {rel:.2e})"
    np.testing.assert_allclose(train[0], single.final["train_ppl"][0], rtol=1e-4)
    assert len(both.train_log[0]["block_grad_norm"]) == 2 and len(both.train_log[0]["loss"]) == 2   # per seed
    for (path, a), (_, b) in zip(leaves(unstack_seed(both.state, 0)), leaves(single.state)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=path)  # measured 4e-5


def test_a_diverging_run_stops_with_one_line_and_keeps_its_last_good_checkpoint(tmp_path):
    tc = dataclasses.replace(TC, lr=1e9, steps=40, log_every=10, checkpoint_every=1)
    with pytest.raises(TrainingDiverged) as info:
        run(MC, tc, workdir=tmp_path / "run")
    message = one_line(info.value)
    assert "diverged at step" in message and "lr=1e+09" in message and "--" not in message   # no command line's flag
    step = info.value.step
    saved = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and max(saved) < step                     # nothing at or past the bad step was saved
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(m["loss"]) for m in metrics)   # no non-finite line, and no final evaluation
    assert not any("val_ppl" in m for m in metrics)


# -- the loop's bookkeeping, without training -------------------------------------------------

def test_mean_std_is_the_mean_and_sample_std_over_seeds_in_float64():
    assert loop.mean_std([2.0, 4.0, 9.0]) == pytest.approx((5.0, np.std([2.0, 4.0, 9.0], ddof=1)))
    assert loop.mean_std(np.float32([3.5])) == (3.5, 0.0)                        # one seed: no spread
    mean, _ = loop.mean_std(np.float32([16777216.0, 1.0, 1.0]))    # in float32 each +1 to 2^24 is lost
    assert mean == (16777216.0 + 2.0) / 3


def test_metrics_read_back_stop_at_the_checkpoint_and_skip_damaged_lines(tmp_path):
    step = lambda s, loss: {"step": s, "loss": [loss], "lr": [0.1], "grad_norm": [1.0], "block_grad_norm": [[1.0]]}
    lines = [json.dumps(step(1, 3.0)), json.dumps(step(2, 2.5)), json.dumps({"step": 2, "val_ppl": [40.0]}),
             '{"step": 3, "loss": [2.', "not json", json.dumps({"no_step": 1}), json.dumps({"step": "4"}),
             json.dumps(step(3, 2.0)), json.dumps(step(2, 2.4)),        # step 2 redone after a resume: the last wins
             json.dumps(step(4, 1.9)), json.dumps({"step": 4, "val_ppl": [30.0]}),
             json.dumps({"step": 4, "val_ppl": [30.0], "seconds": 1.0})]  # a finished run's closing line
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(lines) + "\n")
    evals, steps = loop.read_metrics(metrics, 3)
    assert evals == [{"step": 2, "val_ppl": [40.0]}]
    assert [(s["step"], s["loss"]) for s in steps] == [(1, [3.0]), (2, [2.4]), (3, [2.0])]   # nothing past step 3
    assert loop.read_metrics(metrics, 0) == ([], []) and loop.read_metrics(None, 3) == ([], [])
    assert loop.read_metrics(tmp_path / "missing.jsonl", 3) == ([], [])
    evals, steps = loop.read_metrics(metrics, 4)
    assert [e["step"] for e in evals] == [2, 4] and "seconds" not in evals[-1] and steps[-1]["step"] == 4
    # A run whose steps log the loss alone (Engine(step_metrics=False)): its steps are steps, not evaluations.
    metrics.write_text(json.dumps({"step": 1, "loss": [3.0]}) + "\n" + json.dumps({"step": 1, "val_ppl": [9.0]}) + "\n")
    assert loop.read_metrics(metrics, 1) == ([{"step": 1, "val_ppl": [9.0]}], [{"step": 1, "loss": [3.0]}])


def test_fit_refuses_seeds_the_engine_was_not_built_for_before_any_work(tmp_path):
    eng = new_engine(MC, TC)                 # built, not compiled: nothing has run yet
    with pytest.raises(ConfigError) as info:
        run(engine=eng, seeds=(0, 1), workdir=tmp_path / "run")
    assert one_line(info.value) == "2 seed(s) for an engine built for 1; build it with Engine(..., n_seeds=2)"
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_finished_run_reopened_keeps_every_step_and_edited_metrics_retrain_it(tmp_path, capsys):
    first = run(workdir=tmp_path)
    again = run(workdir=tmp_path)                                   # resumed at its last step: nothing to train
    assert again.resumed_from == TC.steps and [m["step"] for m in again.train_log] == list(range(1, TC.steps + 1))
    assert again.train_log == first.train_log and again.history == first.history
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["loss"] = [0.001]                                         # an edited figure in still-valid JSON
    (tmp_path / "metrics.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    redone = run(workdir=tmp_path)
    assert redone.resumed_from == 0 and "changed since step" in capsys.readouterr().err
    assert redone.train_log[0]["loss"] == first.train_log[0]["loss"] != [0.001]


def test_a_stop_event_the_caller_owns_ends_the_run_at_its_next_step_keeping_it(tmp_path, capsys):
    """`fit(stop=event)`: set from elsewhere (a signal handler, say) while step 5 is made, the loop
    stops before step 6 as on Ctrl-C, and keeps step 5's checkpoint; the same call resumes there."""
    import threading
    from helpers import task
    stop, base = threading.Event(), task()

    def sample(seed, step):
        if step == 4:
            stop.set()
        return base.sample(seed, step)

    with pytest.raises(KeyboardInterrupt):
        loop.fit(new_engine(MC, TC), dataclasses.replace(base, sample=sample), workdir=tmp_path, progress=False,
                 stop=stop)
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [3, 5]
    stop.clear()
    capsys.readouterr()
    assert loop.fit(new_engine(MC, TC), base, workdir=tmp_path, progress=False, stop=stop, desc="layer_norm"
                    ).resumed_from == 5
    # Said in one line, though no progress bar shows where the run began.
    assert "layer_norm: resuming at step 5 of 8 from its checkpoint" in capsys.readouterr().err


def test_a_finished_run_keeps_the_checkpoints_it_is_asked_to(tmp_path):
    """Two by default (the last, and one to fall back to); `keep_finished=1`: the trained model alone."""
    from helpers import task
    loop.fit(new_engine(MC, TC), task(), workdir=tmp_path / "two", progress=False)
    assert saved_steps(tmp_path / "two") == [6, 8]
    done = loop.fit(new_engine(MC, TC), task(), workdir=tmp_path / "one", progress=False, keep_finished=1)
    assert saved_steps(tmp_path / "one") == [8]
    again = loop.fit(new_engine(MC, TC), task(), workdir=tmp_path / "one", progress=False, keep_finished=1)
    assert again.resumed_from == 8 and again.final == done.final
    with pytest.raises(ConfigError, match="keep_finished=0 must be a whole number"):
        loop.fit(new_engine(MC, TC), task(), workdir=tmp_path / "none", progress=False, keep_finished=0)
