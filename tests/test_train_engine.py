"""attention_jax.train.engine: the compiled init, step and evaluation. The step's metrics
(pinned for seed 0, per-block gradient norms), weighted losses, the step bit for bit against
a plain one, perplexity and NLL by hand, the optimizer's warmup and cosine schedule, ids
outside the vocabulary, and data parallel over two (forced host) devices.

Everything is smoke-sized (helpers: a 1-block model of width 32 on random tokens). Compiling
is what costs time on a CPU; engines of one configuration share their compiled programs.
"""

import contextlib
import dataclasses
import io
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

from attention_jax.data import eval_windows
from attention_jax.errors import DataError
from attention_jax.train import Engine, TrainConfig, cross_entropy, make_optimizer

from helpers import MC, T, TC, V, VAL, assert_same_state, batch, forward, mlir_prelude, new_engine, one_line, task

REPO = pathlib.Path(__file__).resolve().parents[1]
PINNED = [4.411236763000488, 0.5659857392311096, 0.1958429217338562]   # loss, grad norm, block 0's, step 1




@pytest.mark.slow
def test_init_op_by_op_is_the_compiled_init_bit_for_bit(engine):
    """Engine.init runs op by op on one device (compiling it costs as much as the step); the
    parameters and optimizer state are the bits the compiled program gives, per seed too."""
    for n_seeds, seeds in ((1, [3]), (2, [0, 5])):
        eng = engine(MC, n_seeds)
        one = eng._init_one
        compiled = jax.jit(jax.vmap(one) if eng.vmapped else one)(eng._keys(seeds))
        assert_same_state(eng.init(seeds), compiled)


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


def by_hand(model, tokens, max_windows=None) -> float:
    model.eval()
    x, y = eval_windows(tokens, T, max_windows=max_windows)
    from scipy.special import log_softmax   # here, not at the top: every xdist worker collects every file
    logp = log_softmax(np.asarray(forward(model, jnp.asarray(x)), np.float64), axis=-1)
    nll = -np.take_along_axis(logp, y[..., None], axis=-1)
    return float(np.exp(nll.mean()))


@pytest.mark.slow
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


def plain_step(eng, state, b):
    """The step as written before it reported metrics: mean cross-entropy, AdamW, nothing else (with
    the engine's faster forms swapped in, as its own step has them)."""
    from attention_jax.speed import fast
    model, opt = nnx.merge(eng.graphdef, state)
    with fast(model, eng.speed):
        loss, grads = nnx.value_and_grad(lambda m: cross_entropy(m(b["x"]), b["y"]).mean())(model)
    opt.update(model, grads)
    return nnx.state((model, opt)), loss, grads


# XLA's default code generation, which users get: the suite compiles with older loop emitters
# (conftest.py), under which these two programs round one LayerNorm bias update 1 ulp apart. An XLA
# that has only the fusion emitters (jax >= 0.11) knows no such option: its default is the one.
DEFAULT_CODEGEN = {"xla_cpu_use_fusion_emitters": True} if "xla_cpu_use_fusion_emitters" in \
    os.environ.get("XLA_FLAGS", "") else {}


@pytest.mark.slow
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


@pytest.mark.slow
def test_grad_norm_per_block_is_the_norm_of_that_blocks_gradient():
    mc = dataclasses.replace(MC, n_layers=3)
    eng = new_engine(mc, TC)
    state, b = eng.init([0]), batch(eng)
    _, _, grads = jax.jit(lambda s, b: plain_step(eng, s, b))(eng.init([0]), b)
    by_hand = [np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads["blocks"][i])))
               for i in range(3)]
    every = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)))
    _, m = eng.step(state, b)
    np.testing.assert_allclose(np.asarray(m["block_grad_norm"]), by_hand, rtol=1e-5)
    np.testing.assert_allclose(float(m["grad_norm"]), every, rtol=1e-5)
    assert every > max(by_hand)          # the embeddings and the output layer have gradients too


@pytest.mark.slow
def test_token_weights_score_only_the_weighted_positions(engine):
    eng = engine()
    b = task().sample(0, 0)
    w = np.zeros_like(b["x"], np.float32)
    w[:, 5] = 1.0                                        # one answer token per window, as the Winograd toy
    weighted = {**b, "weights": w}
    _, m = eng.step(eng.init([0]), eng.shard([weighted]))
    logits = forward(eng.model(eng.init([0])), jnp.asarray(b["x"]))
    by_hand = np.asarray(jax.jit(cross_entropy)(logits, jnp.asarray(b["y"])))[:, 5].mean()
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


@pytest.mark.slow
def test_engine_model_is_a_usable_model_with_the_states_weights(engine):
    eng = engine(MC, 2)
    state, _ = eng.step(eng.init([0, 1]), batch(eng, seeds=(0, 1)))
    x = jnp.asarray(eval_windows(VAL, T)[0][:3])
    for seed in (0, 1):
        model = eng.model(state, seed)
        np.testing.assert_allclose(forward(model, x), eng.logits(state, x)[seed], atol=1e-5)


def test_engine_model_reads_with_dropout_off_and_patches(engine):
    """A model with dropout from `Engine.model` gave other logits each call, and patching it raised JAX's
    TraceContextError: it comes in eval mode, deterministic, and every analysis runs on it."""
    from attention_jax.analysis.patching import activation_patch, logit_diff
    config = dataclasses.replace(MC, dropout=0.2)
    eng = new_engine(config)
    model = eng.model(eng.init([0]))
    x = jnp.asarray(eval_windows(VAL, T)[0][:2])
    np.testing.assert_array_equal(forward(model, x), forward(model, x))
    sweep = activation_patch(model, np.asarray(x), np.asarray(x)[::-1], lambda logits: logit_diff(logits, 1, 2), into="corrupted")
    assert np.isfinite(sweep.values).all()


def test_ids_outside_the_vocabulary_are_refused_where_batches_are_made(engine):
    eng = engine()
    b = task().sample(0, 0)
    b["x"][0, 0] = V
    with pytest.raises(DataError) as info:
        eng.shard([b])
    assert f"token id {V} is outside the vocabulary [0, {V})" in one_line(info.value)


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
    """The script above with 2 (forced host) CPU devices in a process of its own, and with 1 in this
    one (the suite's own single CPU device) meanwhile: {n: its RESULT}."""
    script = tmp_path_factory.mktemp("devices") / "devices.py"
    script.write_text(mlir_prelude() + DEVICE_SCRIPT)   # helpers.py: speed only
    # XLA_FLAGS already carries the suite's optimisation level 0 (conftest); add the devices.
    flags = "--xla_force_host_platform_device_count=2"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    here = io.StringIO()
    with contextlib.redirect_stdout(here):
        exec(compile(DEVICE_SCRIPT, str(script), "exec"), {"__name__": "__main__"})
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    result = lambda text: json.loads(next(line for line in text.splitlines() if line.startswith("RESULT "))[7:])
    got = {1: result(here.getvalue()), 2: result(stdout)}
    assert got[1]["devices"] == 1 and got[2]["devices"] == 2
    return got


@pytest.mark.slow
def test_batch_that_does_not_split_over_devices_is_refused(on_devices):
    assert on_devices[1]["odd_batch"] is None          # one device: any batch size
    message = on_devices[2]["odd_batch"]
    assert message is not None, "batch_size=3 on 2 devices was accepted"
    assert "batch_size=3" in message and "2 devices" in message and "multiple" in message
    assert "\n" not in message


@pytest.mark.slow
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


def test_what_a_step_cannot_train_on_is_refused_in_one_line(engine):
    from attention_jax.errors import ConfigError
    from helpers import task
    engine = engine()
    good = task().sample(0, 0)                                   # a host batch of the engine's shape
    x, y = (np.asarray(good[k]) for k in ("x", "y"))
    cases = [({"x": x}, ConfigError, "needs 'x' and 'y'"),
             ({"x": x.astype(np.float32), "y": y}, DataError, "holds float32 values"),
             ({"x": np.concatenate([x, x[:2]]), "y": np.concatenate([y, y[:2]])}, ConfigError, "has shape"),
             ({"x": x, "y": y, "weights": -np.ones(x.shape)}, DataError, "non-negative"),
             ({"x": x, "y": y, "weights": np.zeros(x.shape)}, DataError, "all zero")]
    for host, error, said in cases:
        with pytest.raises(error, match=said) as err:
            engine.shard([host])
        one_line(err.value)
    with pytest.raises(ConfigError, match="0 seed"):
        engine.init([])
    with pytest.raises(ConfigError, match="one shape"):
        engine.nll(engine.init([0]), x, y[:, :-1])


def test_what_an_engine_would_silently_misread_is_refused(engine):
    """nll weights [W, 1] counted one position a window (perplexity 2.2e12 for 34.8); a seed past the state
    was clamped to the last; a batch [3, 4, T] trained as 12 windows; ids past the vocabulary gave logits."""
    from attention_jax.errors import ConfigError
    from helpers import task
    two = engine(MC, 2)
    state = two.init([0, 1])
    x, y = (np.asarray(task().sample(0, 0)[k])[:6] for k in ("x", "y"))
    for weights in (np.ones((6, 1)), -np.ones(x.shape), np.full(x.shape, np.nan)):
        with pytest.raises(DataError, match="weights must be finite, non-negative and shaped like x") as err:
            two.nll(state, x, y, weights)
        one_line(err.value)
    for seed in (2, -1, True):
        with pytest.raises(ConfigError, match="this engine holds 2 seed"):
            two.model(state, seed)
    one = engine()
    good = task().sample(0, 0)
    wide = {k: np.stack([good[k][:4]] * 3) for k in ("x", "y")}            # [3, 4, T]: 12 windows
    with pytest.raises(ConfigError, match=r"has shape \(3, 4, 16\)"):
        one.shard([wide])
    with pytest.raises(DataError, match="outside the vocabulary"):
        one.logits(one.init([0]), np.full((2, T), V))


SCALE = 1.0


def scaled_loss(logits, targets, weights=None):
    from attention_jax.train import token_loss
    return SCALE * token_loss(logits, targets, weights)


def test_engines_sharing_programs_do_not_share_a_loss_whose_global_changed():
    """Two Engines of one ProgramCache with a loss reading a global: the second was served the first's
    compiled step (a loss of 3.66 where 366 is right)."""
    global SCALE
    from attention_jax.train import ProgramCache
    cache = ProgramCache()
    losses = []
    try:
        for SCALE in (1.0, 100.0):
            eng = Engine(MC, TC, loss=scaled_loss, programs=cache)
            _, metrics = eng.step(eng.init([0]), batch(eng))
            losses.append(float(metrics["loss"]))
    finally:
        SCALE = 1.0
    assert losses[1] == pytest.approx(100 * losses[0], rel=1e-5) and len(cache) == 2


def test_a_state_a_step_consumed_is_refused_not_a_deleted_buffer_error(engine):
    from attention_jax.errors import ConfigError
    engine = engine()
    state = engine.init([0])
    new, _ = engine.step(state, batch(engine))
    with pytest.raises(ConfigError, match="consumed by an earlier step"):
        engine.step(state, batch(engine))
    engine.step(new, batch(engine))                          # the returned one goes on


def test_the_cosine_schedule_reaches_its_floor_one_step_past_the_last():
    """As its config says (optax counts steps from 0): the last step uses a little more than lr * min_lr_ratio."""
    from attention_jax.train import lr_schedule
    tc = TrainConfig(lr=1.0, schedule="cosine", steps=4, min_lr_ratio=0.1)
    lrs = [float(lr_schedule(tc)(s)) for s in range(5)]
    assert lrs[0] == 1.0 and lrs[3] > 0.1 and lrs[4] == pytest.approx(0.1)
