"""Training engine and loop: the step's metrics, weighted losses, resume bit for bit, refused
checkpoints, N seeds by vmap, data parallel over two devices, config checks, warmup, a
diverging run stopped, and perplexity by hand.

Everything is smoke-sized (a 1-block model of width 32 on random tokens). Compiling is
what costs time on a CPU, so the engines are built once per module and handed to `fit`.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.data import eval_windows
from attention_jax.errors import CheckpointError, ConfigError, DataError, TrainingDiverged
from attention_jax.train import Engine, TrainConfig, cross_entropy, fit, make_optimizer, text_task, unstack_seed
from attention_jax.train import loop

REPO = pathlib.Path(__file__).resolve().parents[1]
V, T = 64, 16
MC = ModelConfig(vocab_size=V, context=T, d_model=32, n_heads=2)
TC = TrainConfig(steps=8, batch_size=8, lr=1e-2, checkpoint_every=3, log_every=2,
                 train_eval_windows=16, eval_batch=16)
_rng = np.random.default_rng(0)
TRAIN = _rng.integers(0, V, 4096).astype(np.int32)
VAL = _rng.integers(0, V, 40 * T + 1).astype(np.int32)   # 40 windows: 16 + 16 + a ragged 8
PINNED = [4.411236763000488, 0.5659857392311096, 0.1958429217338562]   # loss, grad norm, block 0's, step 1


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    """No test here may touch the user's cache (fit should not, but make sure)."""
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "attention_jax_cache"))


@pytest.fixture(scope="module")
def engine():
    """engine(model_config, n_seeds) -> one compiled Engine per pair, shared by the module."""
    made = {}

    def get(model_config: ModelConfig = MC, n_seeds: int = 1) -> Engine:
        if (model_config, n_seeds) not in made:
            made[model_config, n_seeds] = Engine(model_config, TC, n_seeds=n_seeds)
        return made[model_config, n_seeds]
    return get


def task(tc=TC):
    return text_task(TRAIN, VAL, batch_size=tc.batch_size, context=T, train_eval_windows=tc.train_eval_windows)


def run(model_config=MC, train_config=TC, *, engine=None, seeds=(0,), **kw):
    engine = engine or Engine(model_config, train_config, n_seeds=len(seeds))
    return fit(engine, task(train_config), seeds=seeds, progress=False, **kw)


def batch(eng, seeds=(0,), step=0, tokens=TRAIN):
    return eng.shard([task().sample(s, step) for s in seeds])


def leaves(state) -> list[tuple[str, np.ndarray]]:
    """(path, array) for every leaf; typed PRNG keys as their raw key data."""
    out = []
    for path, a in jax.tree_util.tree_leaves_with_path(state):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a = jax.random.key_data(a)
        out.append((jax.tree_util.keystr(path), np.asarray(a)))
    return out


def assert_same_state(got, want):
    got, want = leaves(got), leaves(want)
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, a), (_, b) in zip(got, want):
        np.testing.assert_array_equal(a, b, err_msg=path)


def one_line(err: Exception) -> str:
    message = str(err)
    assert "\n" not in message, message  # the CLI prints it alone
    return message


# -- resume ------------------------------------------------------------------------------

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
    eng = Engine(mc, tc)
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


# -- several steps per call ---------------------------------------------------------------

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


def test_the_lab_reads_steps_per_call_from_the_environment_and_refuses_nonsense(monkeypatch):
    from experiments.harness.experiment import STEPS_PER_CALL_ENV, steps_per_call_from_env
    monkeypatch.delenv(STEPS_PER_CALL_ENV, raising=False)
    assert steps_per_call_from_env() is None
    monkeypatch.setenv(STEPS_PER_CALL_ENV, "2")
    assert steps_per_call_from_env() == 2
    for bad in ("0", "-3", "two", "²"):
        monkeypatch.setenv(STEPS_PER_CALL_ENV, bad)
        with pytest.raises(ConfigError, match=STEPS_PER_CALL_ENV) as err:
            steps_per_call_from_env()
        one_line(err.value)


@pytest.fixture(scope="module")
def engine12():
    return Engine(MC, TC12)


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


def test_several_steps_per_call_with_vmapped_seeds_and_dropout():
    """Metrics [K, seeds] and block norms [K, seeds, blocks] come back one record per step."""
    mc = dataclasses.replace(MC, dropout=0.1)
    eng = Engine(mc, TC12, n_seeds=2)
    one = run(mc, TC12, engine=eng, seeds=(0, 1), steps_per_call=1)
    four = run(mc, TC12, engine=eng, seeds=(0, 1), steps_per_call=4)
    assert [m["step"] for m in four.train_log] == list(range(1, 13))
    assert all(len(m["loss"]) == 2 and np.shape(m["block_grad_norm"]) == (2, 1) for m in four.train_log)
    np.testing.assert_allclose([m["loss"] for m in four.train_log], [m["loss"] for m in one.train_log], rtol=1e-5)
    np.testing.assert_allclose(four.final["val_ppl"], one.final["val_ppl"], rtol=1e-4)


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


class FakePreemption:
    """orbax's manager as far as `Checkpoints.due` asks it, with a notice agreed for one step."""
    def __init__(self, at):
        self.at, self.asked = at, []

    def reached_preemption(self, step):
        self.asked.append(step)
        return step == self.at

    def latest_step(self):
        return None


def test_checkpoints_are_due_on_the_interval_and_on_a_preemption_inside_a_call(tmp_path):
    from attention_jax.train import Checkpoints
    ckpt = Checkpoints(tmp_path, 4, {"run": 1}, resume=False)
    assert not ckpt.preemptible                                  # no distributed runtime, no notices
    assert [s for s in range(1, 10) if ckpt.due(s)] == [4, 8]    # and not orbax's first-step save
    ckpt.close()
    ckpt.preemptible, ckpt.manager = True, FakePreemption(at=6)
    assert not ckpt.due(3, since=1) and ckpt.manager.asked == [1, 2, 3]
    assert ckpt.due(7, since=4) and ckpt.manager.asked[3:] == [4, 5, 6, 7]   # every step, in order
    assert not ckpt.due(10, since=8)
    ckpt.manager = FakePreemption(at=8)       # a notice met on an interval step still stops the run
    assert ckpt.due(8, since=5) and ckpt.preempted


def test_several_steps_per_call_resume_bit_for_bit(tmp_path, monkeypatch, engine12):
    """Killed inside its second call (whose input state is gone), the run resumes from step
    4 and ends exactly where an unbroken four-per-call run ends; a run stopped off the grid
    (step 5, one step per call) realigns with single steps and then calls four at a time."""
    reference = run(MC, TC12, engine=engine12, workdir=tmp_path / "unbroken", steps_per_call=4)
    real, calls = engine12.steps, []

    def killed_in_second_call(state, b):
        calls.append(1)
        out = real(state, b)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return out

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(engine12, "steps", killed_in_second_call)
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


def test_checkpoint_of_another_configuration_is_refused(tmp_path, engine):
    work = tmp_path / "run"
    first = run(engine=engine(), workdir=work)
    folder = str((work / "checkpoints").absolute())
    for mc, tc, seeds in [(MC, dataclasses.replace(TC, lr=2e-2), [0]),
                          (dataclasses.replace(MC, d_model=16), TC, [0]),
                          (MC, TC, [1])]:
        with pytest.raises(CheckpointError) as info:
            run(mc, tc, seeds=seeds, workdir=work)
        message = one_line(info.value)
        assert folder in message and "another configuration" in message
        assert "delete that folder or choose another --out" in message
    # The refused runs left the checkpoint and its fingerprint as they were.
    assert run(engine=engine(), workdir=work).final == first.final
    # Without a fingerprint, orbax's own structure check still refuses another model.
    (work / "run.json").unlink()
    with pytest.raises(CheckpointError) as info:
        run(dataclasses.replace(MC, n_layers=2), workdir=work)
    message = one_line(info.value)
    assert folder in message and f"step {TC.steps}" in message and "delete that folder" in message
    # resume=False is the way out: the old checkpoint is dropped and training starts at 0.
    fresh = run(engine=engine(), seeds=[1], workdir=work, resume=False)
    assert fresh.resumed_from == 0
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_ppl" in r] == [TC.steps]   # the old run's lines are gone


# -- seeds -------------------------------------------------------------------------------

def test_init_op_by_op_is_the_compiled_init_bit_for_bit(engine):
    """Engine.init runs op by op on one device (compiling it costs as much as the step); the
    parameters and optimizer state are the bits the compiled program gives, per seed too."""
    for n_seeds, seeds in ((1, [3]), (2, [0, 5])):
        eng = engine(MC, n_seeds)
        compiled = jax.jit(jax.vmap(eng._init_one) if eng.vmapped else eng._init_one)(eng._keys(seeds))
        assert_same_state(eng.init(seeds), compiled)


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


# -- devices -----------------------------------------------------------------------------

DEVICE_SCRIPT = """
import dataclasses, json, traceback
import jax, numpy as np
from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.data import get_batch
from attention_jax.train import Engine, TrainConfig

mc = ModelConfig(vocab_size=64, context=16, d_model=32, n_heads=2)
tc = TrainConfig(steps=3, batch_size=8, lr=1e-2, eval_batch=8)
tokens = np.random.default_rng(0).integers(0, 64, 2048).astype(np.int32)
out = {"devices": jax.device_count()}
try:
    Engine(mc, dataclasses.replace(tc, batch_size=3))
    out["odd_batch"] = None
except ConfigError as e:
    out["odd_batch"] = str(e)

def train(seeds, steps, scanned=False):
    engine = Engine(mc, tc, n_seeds=len(seeds))
    state, losses = engine.init(seeds), []
    batches = [[dict(zip(("x", "y"), get_batch(tokens, seed=s, step=step, batch_size=8, context=16)))
                for s in seeds] for step in range(steps)]
    if scanned:      # every step in one call
        b = engine.shard_steps(batches)
        state, metrics = engine.steps(state, b)
        losses, x = np.asarray(metrics["loss"]).tolist(), b["x"]
    for per_seed in ([] if scanned else batches):
        b = engine.shard(per_seed)
        state, metrics = engine.step(state, b)
        losses.append(np.asarray(metrics["loss"]).tolist())
        x = b["x"]
    return {"losses": losses, "batch_devices": len(x.sharding.device_set),
            "batch_shard": list(x.sharding.shard_shape(x.shape)),
            "state_devices": min(len(a.sharding.device_set) for a in jax.tree.leaves(state)),
            "ppl": engine.perplexity(state, tokens[:8 * 16 + 1]).tolist(),
            "eval_shard": list(engine._windows(np.zeros((8, 16), np.int32)).sharding.shard_shape((8, 16))),
            "logits": np.asarray(engine.logits(state, tokens[:64].reshape(4, 16)))[..., :3].round(5).tolist()}

for name, seeds, steps in [("one_seed", [0], 3), ("two_seeds", [0, 1], 2)]:
    for scanned in (False, True):
        try:
            out[name + "_scanned" * scanned] = train(seeds, steps, scanned)
        except Exception as e:  # recorded, so the other checks still run
            out[name + "_scanned" * scanned] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def on_devices(tmp_path_factory):
    """The script above run with 1 and with 2 (forced host) CPU devices: {n: its RESULT}."""
    script = tmp_path_factory.mktemp("devices") / "devices.py"
    script.write_text(DEVICE_SCRIPT)

    def start(n):
        # XLA_FLAGS already carries the suite's optimisation level 0 (conftest); add the devices.
        flags = f"--xla_force_host_platform_device_count={n}"
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        return subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    procs = {n: start(n) for n in (1, 2)}       # both at once: each is mostly compiling
    got = {}
    for n, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        got[n] = json.loads(next(l for l in stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert got[1]["devices"] == 1 and got[2]["devices"] == 2
    return got


def test_batch_that_does_not_split_over_devices_is_refused(on_devices):
    assert on_devices[1]["odd_batch"] is None          # one device: any batch size
    message = on_devices[2]["odd_batch"]
    assert message is not None, "batch_size=3 on 2 devices was accepted"
    assert "batch_size=3" in message and "2 devices" in message and "multiple" in message
    assert "\n" not in message


@pytest.mark.parametrize("run_name, per_device", [("one_seed", [4, T]), ("two_seeds", [2, 4, T]),
                                                   ("one_seed_scanned", [3, 4, T]), ("two_seeds_scanned", [2, 2, 4, T])],
                         ids=["one_seed", "two_seeds_vmapped", "one_seed_steps_in_one_call", "two_seeds_in_one_call"])
def test_two_devices_train_like_one(on_devices, run_name, per_device):
    """Also with every step in one call (`Engine.steps`): the batch split on its batch axis,
    not the step or seed axis, and the same losses as one step per call."""
    # measured: max relative loss difference 2.3e-7, perplexities identical to the last digit
    one, two = on_devices[1][run_name], on_devices[2][run_name]
    assert "error" not in one, one["error"]
    assert "error" not in two, two["error"]
    assert one["batch_devices"] == 1
    assert two["batch_devices"] == 2 and two["batch_shard"] == per_device   # the batch axis is split
    assert one["eval_shard"] == [8, T] and two["eval_shard"] == [4, T]      # and so are evaluation windows
    assert two["state_devices"] == 2   # parameters and optimizer state replicated on both
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    np.testing.assert_allclose(two["ppl"], one["ppl"], rtol=1e-5)
    np.testing.assert_allclose(two["logits"], one["logits"], atol=2e-5)   # windows split, logits whole
    if run_name.endswith("_scanned"):
        np.testing.assert_allclose(one["losses"], on_devices[1][run_name[:-len("_scanned")]]["losses"], rtol=1e-5)


# -- configuration and optimizer ---------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("steps", 0), ("batch_size", -1), ("log_every", 0), ("checkpoint_every", 0),
    ("train_eval_windows", 0), ("eval_batch", 0), ("lr", 0.0), ("warmup_steps", -1), ("grad_clip", -0.5),
    ("eval_every", -1), ("weight_decay", -0.1)])
def test_train_config_refuses_impossible_values(field, value):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{field: value})
    assert isinstance(info.value, ValueError)
    message = one_line(info.value)
    assert message.startswith("invalid TrainConfig") and field in message


def applied_lrs(tc: TrainConfig, n: int) -> list[float]:
    """Adam's step for a constant gradient of 1 is exactly lr (bias correction makes m̂/√v̂ = 1)."""
    tx, params = make_optimizer(tc), jnp.zeros(3)
    opt_state, out = tx.init(params), []
    for _ in range(n):
        updates, opt_state = tx.update(jnp.ones(3), opt_state, params)
        out.append(-float(updates[0]))
    return out


def test_warmup_rises_linearly_then_holds():
    lrs = applied_lrs(TrainConfig(lr=0.01, warmup_steps=4, weight_decay=0.0), 7)
    np.testing.assert_allclose(lrs, [0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01], rtol=1e-4, atol=1e-12)
    np.testing.assert_allclose(applied_lrs(TrainConfig(lr=0.01, weight_decay=0.0), 2), [0.01, 0.01], rtol=1e-4)


def test_cosine_warms_up_then_decays_to_its_floor():
    tc = TrainConfig(steps=10, lr=0.01, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1, weight_decay=0.0)
    lrs = applied_lrs(tc, 11)
    np.testing.assert_allclose(lrs[:3], [0.0, 0.005, 0.01], rtol=1e-4, atol=1e-12)
    assert all(a > b for a, b in zip(lrs[2:10], lrs[3:11]))          # strictly down after warmup
    np.testing.assert_allclose(lrs[6], 0.001 + 0.009 * 0.5, rtol=1e-4)  # halfway: the cosine's midpoint
    np.testing.assert_allclose(lrs[10], 0.001, rtol=1e-4)              # the floor, lr * min_lr_ratio


@pytest.mark.parametrize("change, start", [
    ({"schedule": "linear"}, "invalid TrainConfig: schedule='linear'; choose 'constant' or 'cosine'"),
    ({"min_lr_ratio": 1.5}, "invalid TrainConfig: min_lr_ratio=1.5 must be in [0, 1]"),
    ({"schedule": "cosine", "steps": 10, "warmup_steps": 10}, "invalid TrainConfig: warmup_steps=10 leaves")])
def test_schedule_refuses_impossible_values(change, start):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**change)
    assert one_line(info.value).startswith(start)


# -- evaluation --------------------------------------------------------------------------

def by_hand(model, tokens, max_windows=None) -> float:
    model.eval()
    x, y = eval_windows(tokens, T, max_windows=max_windows)
    logp = jax.nn.log_softmax(np.asarray(model(jnp.asarray(x)), np.float64), axis=-1)
    nll = -np.take_along_axis(np.asarray(logp), y[..., None], axis=-1)
    return float(np.exp(nll.mean()))


def test_perplexity_is_exp_mean_nll_by_hand(engine):
    # Dropout 0.1 in the config: evaluation must switch it off, as the by-hand model does.
    eng = engine(dataclasses.replace(MC, dropout=0.1))
    state = eng.init([0])
    state, _ = eng.step(state, batch(eng))           # not the init: make the logits uneven
    for max_windows in (None, 5):                    # 40 windows (16+16+8) and 5 (< eval_batch)
        got = eng.perplexity(state, VAL, max_windows=max_windows)
        assert got.shape == (1,)
        np.testing.assert_allclose(got[0], by_hand(eng.model(state), VAL, max_windows), rtol=1e-5)
    assert eng.perplexity(state, VAL)[0] == eng.perplexity(state, VAL)[0]   # no dropout noise
    # Vmapped: one value per seed, each that seed's own perplexity.
    eng2 = engine(MC, 2)
    stacked = eng2.init([0, 1])
    got = eng2.perplexity(stacked, VAL)
    assert got.shape == (2,) and got[0] != got[1]
    for i in range(2):
        np.testing.assert_allclose(got[i], by_hand(eng2.model(stacked, i), VAL), rtol=1e-5)


# -- the step and its metrics -------------------------------------------------------------

def plain_step(eng, state, b):
    """The step as written before it reported metrics: mean cross-entropy, AdamW, nothing else."""
    model, opt = nnx.merge(eng.graphdef, state)
    loss, grads = nnx.value_and_grad(lambda m: cross_entropy(m(b["x"]), b["y"]).mean())(model)
    opt.update(model, grads)
    return nnx.state((model, opt)), loss, grads


# XLA's default code generation, which users get: the suite compiles with older loop emitters
# (conftest.py), under which these two programs round one LayerNorm bias update 1 ulp apart.
DEFAULT_CODEGEN = {"xla_cpu_use_fusion_emitters": True}


def test_the_step_is_bit_identical_to_the_plain_step(engine):
    eng = engine()
    state, b = eng.init([0]), batch(eng)
    plain = jax.jit(lambda s, b: plain_step(eng, s, b)).lower(state, b).compile(compiler_options=DEFAULT_CODEGEN)
    want, want_loss, _ = plain(eng.init([0]), b)
    got, metrics = eng._step.lower(state, b).compile(compiler_options=DEFAULT_CODEGEN)(state, b)
    assert float(metrics["loss"]) == float(want_loss)
    assert_same_state(got, want)


def test_one_step_reports_its_metrics_pinned_for_seed_0(engine):
    eng = engine()
    _, m = eng.step(eng.init([0]), batch(eng))
    assert set(m) == {"loss", "lr", "grad_norm", "block_grad_norm"} and m["block_grad_norm"].shape == (1,)
    # measured on this code at seed 0 (CPU); a change of model, init, data or loss moves them
    np.testing.assert_allclose([float(m["loss"]), float(m["grad_norm"]), float(m["block_grad_norm"][0])],
                               PINNED, rtol=1e-4)
    assert float(m["lr"]) == pytest.approx(TC.lr)


def test_grad_norm_per_block_is_the_norm_of_that_blocks_gradient():
    mc = dataclasses.replace(MC, n_layers=3)
    eng = Engine(mc, TC)
    state, b = eng.init([0]), batch(eng)
    _, _, grads = jax.jit(lambda s, b: plain_step(eng, s, b))(eng.init([0]), b)
    by_hand = [np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads["blocks"][i])))
               for i in range(3)]
    every = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)))
    _, m = eng.step(state, b)
    np.testing.assert_allclose(np.asarray(m["block_grad_norm"]), by_hand, rtol=1e-5)
    np.testing.assert_allclose(float(m["grad_norm"]), every, rtol=1e-5)
    assert every > max(by_hand)          # the embeddings and the output layer have gradients too


def test_token_weights_score_only_the_weighted_positions(engine):
    eng = engine()
    b = task().sample(0, 0)
    w = np.zeros_like(b["x"], np.float32)
    w[:, 5] = 1.0                                        # one answer token per window, as the Winograd toy
    weighted = {**b, "weights": w}
    _, m = eng.step(eng.init([0]), eng.shard([weighted]))
    logits = eng.model(eng.init([0]))(jnp.asarray(b["x"]))
    by_hand = np.asarray(cross_entropy(logits, jnp.asarray(b["y"])))[:, 5].mean()
    np.testing.assert_allclose(float(m["loss"]), by_hand, rtol=1e-5)
    # Targets at unweighted positions change nothing: the same update, bit for bit.
    other = {**weighted, "y": np.where(w > 0, b["y"], (b["y"] + 1) % V).astype(np.int32)}
    first, _ = eng.step(eng.init([0]), eng.shard([weighted]))
    second, _ = eng.step(eng.init([0]), eng.shard([other]))
    assert_same_state(first, second)
    plain, _ = eng.step(eng.init([0]), eng.shard([b]))   # and without weights every position counts
    with pytest.raises(AssertionError):
        assert_same_state(first, plain)
    # Several steps in one call carry the weights too: two weighted steps, the same losses.
    _, two = eng.steps(eng.init([0]), eng.shard_steps([[weighted], [other]]))
    state, _ = eng.step(eng.init([0]), eng.shard([weighted]))
    _, after = eng.step(state, eng.shard([other]))
    np.testing.assert_allclose(np.asarray(two["loss"]), [float(m["loss"]), float(after["loss"])], rtol=1e-5)


def test_nll_sums_and_counts_give_perplexity_and_bits(engine):
    eng = engine()
    state, _ = eng.step(eng.init([0]), batch(eng))
    x, y = eval_windows(VAL, T)
    total, count = eng.nll(state, x, y)
    assert count[0] == x.size
    np.testing.assert_allclose(np.exp(total / count), eng.perplexity(state, VAL), rtol=1e-12)
    w = np.zeros(x.shape, np.float32)
    w[:, -1] = 1
    total_w, count_w = eng.nll(state, x, y, w)
    assert count_w[0] == len(x) and total_w[0] < total[0]


def test_engine_model_is_a_usable_model_with_the_states_weights(engine):
    eng = engine(MC, 2)
    state, _ = eng.step(eng.init([0, 1]), batch(eng, seeds=(0, 1)))
    x = jnp.asarray(eval_windows(VAL, T)[0][:3])
    for seed in (0, 1):
        model = eng.model(state, seed)
        model.eval()
        np.testing.assert_allclose(model(x), eng.logits(state, x)[seed], atol=1e-5)


def test_ids_outside_the_vocabulary_are_refused_where_batches_are_made(engine):
    eng = engine()
    b = task().sample(0, 0)
    b["x"][0, 0] = V
    with pytest.raises(DataError) as info:
        eng.shard([b])
    assert f"token id {V} is outside the vocabulary [0, {V})" in one_line(info.value)


def test_a_diverging_run_stops_with_one_line_and_keeps_its_last_good_checkpoint(tmp_path):
    tc = dataclasses.replace(TC, lr=1e9, steps=40, log_every=10, checkpoint_every=1)
    with pytest.raises(TrainingDiverged) as info:
        run(MC, tc, workdir=tmp_path / "run")
    message = one_line(info.value)
    assert "diverged at step" in message and "lr=1e+09" in message and "--lr" in message
    step = info.value.step
    saved = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and max(saved) < step                     # nothing at or past the bad step was saved
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(m["loss"]) for m in metrics)   # no non-finite line, and no final evaluation
    assert not any("val_ppl" in m for m in metrics)
