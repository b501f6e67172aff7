"""attention_jax.train.distributed. In one process (fast): nothing to join without a coordinator,
this process writes, host data placed and read back whole. More than one process (slow): two CPU
processes (one device each, a loopback coordinator) train exactly as one process with two
devices; only process 0 writes files; orbax saves and restores across them; a preemption notice
saves one agreed step."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax.train import distributed
from helpers import mlir_prelude

REPO = pathlib.Path(__file__).resolve().parents[1]

# -- one process ----------------------------------------------------------------------------

def test_without_a_coordinator_there_is_nothing_to_join(monkeypatch):
    started = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: started.append((a, kw)))
    assert distributed.initialize() is False and started == []
    assert distributed.initialize(None, 2, 1) is False and started == []     # a count alone names no one to join


def test_a_process_number_outside_the_count_is_refused_before_any_wait(monkeypatch):
    from attention_jax.errors import ConfigError
    waited = []
    monkeypatch.setattr(distributed, "_wait_for", lambda address, timeout: waited.append(address))
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: waited.append("jax"))
    with pytest.raises(ConfigError, match=r"process_id=5 is outside 0 \.\. 1 for num_processes=2"):
        distributed.initialize("127.0.0.1:9", 2, 5, timeout=30)
    assert waited == []


def test_the_coordinator_and_the_counts_are_handed_to_jax_as_given(monkeypatch):
    started, updated = [], []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: started.append((a, kw)))
    monkeypatch.setattr(jax.config, "update", lambda *a: updated.append(a))   # leave this process's settings alone
    waited = []
    monkeypatch.setattr(distributed, "_wait_for", lambda address, timeout: waited.append((address, timeout)))
    assert distributed.initialize("127.0.0.1:9", 2, 1, timeout=7) is True
    assert started == [(("127.0.0.1:9",), {"num_processes": 2, "process_id": 1, "initialization_timeout": 7})]
    assert waited == [("127.0.0.1:9", 7)]                                     # process 1 waits for process 0
    assert updated == [("jax_cpu_collectives_implementation", "gloo")]       # CPU processes talk over TCP
    assert distributed.initialize("127.0.0.1:9", 2, 0) is True and len(waited) == 1   # process 0 is the coordinator
    assert distributed.initialize(auto=True) is True and started[-1] == ((), {"initialization_timeout": 60})


def test_one_process_writes_and_reads_its_arrays_back_whole():
    assert jax.process_count() == 1 and distributed.is_writer()
    host = np.arange(12, dtype=np.float32).reshape(4, 3)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = distributed.put(host, sharding)
    assert isinstance(placed, jax.Array) and placed.sharding == sharding
    tree = {"a": placed, "b": [jnp.int32(3)], "key": jax.random.key(1)}
    back = distributed.to_host({"a": tree["a"], "b": tree["b"]})
    assert type(back["a"]) is np.ndarray and type(back["b"][0]) is np.ndarray
    np.testing.assert_array_equal(back["a"], host)
    mine = distributed.local(tree)
    np.testing.assert_array_equal(mine["a"], host)
    assert jnp.issubdtype(mine["key"].dtype, jax.dtypes.prng_key)        # PRNG keys stay keys
    np.testing.assert_array_equal(jax.random.key_data(mine["key"]), jax.random.key_data(jax.random.key(1)))
    distributed.barrier("alone")                                          # one process: returns at once


# -- more than one process -----------------------------------------------------------------

SCRIPT = """
import json, sys
import numpy as np
from attention_jax.train.distributed import initialize, is_writer, to_host
pid, n, port, work, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if n > 1:
    initialize(f"127.0.0.1:{port}", n, pid)
import jax
from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.train import Engine, fit, text_task
mc = ModelConfig(vocab_size=64, context=16, d_model=32, n_heads=2)
tc = TrainConfig(steps=4, batch_size=8, lr=1e-2, eval_batch=8, checkpoint_every=2, log_every=1, train_eval_windows=8)
tokens = np.random.default_rng(0).integers(0, 64, 4096).astype(np.int32)
task = text_task(tokens[:3000], tokens[3000:], batch_size=8, context=16, train_eval_windows=8)
engine = Engine(mc, tc)
first = fit(engine, task, workdir=work, progress=False)
again = fit(engine, task, workdir=work, progress=False)          # resumes from the saved final step
scanned = fit(engine, task, workdir=work + "-scanned", progress=False, steps_per_call=2)   # as on a GPU/TPU
params = {jax.tree_util.keystr(p): np.asarray(a) for p, a in
          jax.tree_util.tree_leaves_with_path(to_host(jax.tree.map(lambda x: x, first.state)))
          if a.dtype.kind == "f"}
if is_writer():
    np.savez(out, **params)
    print("RESULT " + json.dumps({"processes": jax.process_count(), "devices": jax.device_count(),
                                  "losses": [m["loss"] for m in first.train_log], "final": first.final,
                                  "resumed_from": again.resumed_from, "again": again.final,
                                  "scanned": {"per_call": scanned.steps_per_call, "final": scanned.final,
                                              "losses": [m["loss"] for m in scanned.train_log]}}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distributed")
    script = folder / "train.py"
    script.write_text(mlir_prelude() + SCRIPT)   # helpers.py: speed only
    base = dict(os.environ, JAX_PLATFORMS="cpu",
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    port = str(free_port())

    def start(pid, n, devices, name):
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
        return subprocess.Popen([sys.executable, str(script), str(pid), str(n), port, str(folder / name / "work"),
                                 str(folder / name / "params.npz")], cwd=REPO, env=dict(base, XLA_FLAGS=flags),
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    procs = {"one process, two devices": [start(0, 1, 2, "single")],
             "two processes": [start(0, 2, 1, "multi"), start(1, 2, 1, "multi")]}
    got = {}
    for name, group in procs.items():
        outs = [p.communicate(timeout=600) for p in group]
        for p, (stdout, stderr) in zip(group, outs):
            assert p.returncode == 0, stderr[-3000:]
        line = next(l for stdout, _ in outs for l in stdout.splitlines() if l.startswith("RESULT "))
        key = "single" if name.startswith("one") else "multi"
        got[key] = json.loads(line[7:]) | {"params": dict(np.load(folder / key / "params.npz")),
                                            "work": folder / key / "work",
                                            "printed": sum(l.startswith("RESULT ") for s, _ in outs for l in s.splitlines())}
    return got


@pytest.mark.slow
def test_two_processes_train_like_one_process_with_two_devices(runs):
    one, two = runs["single"], runs["multi"]
    assert (one["processes"], one["devices"]) == (1, 2) and (two["processes"], two["devices"]) == (2, 2)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    assert set(two["params"]) == set(one["params"])
    for name, value in one["params"].items():
        np.testing.assert_allclose(two["params"][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(two["final"]["val_ppl"], one["final"]["val_ppl"], rtol=1e-5)


@pytest.mark.slow
def test_two_processes_run_several_steps_per_call_like_one(runs):
    """Two steps in one compiled call (`fit` on a GPU/TPU), the batches' step axis over two processes."""
    one, two = runs["single"], runs["multi"]
    assert one["scanned"]["per_call"] == two["scanned"]["per_call"] == 2
    for run in (one, two):
        np.testing.assert_allclose(run["scanned"]["losses"], one["losses"], rtol=1e-5)
        np.testing.assert_allclose(run["scanned"]["final"]["val_ppl"], one["final"]["val_ppl"], rtol=1e-5)


@pytest.mark.slow
def test_only_process_0_writes_and_checkpoints_restore_across_processes(runs):
    two = runs["multi"]
    assert two["printed"] == 1
    assert two["resumed_from"] == 4 and two["again"] == two["final"]
    lines = (two["work"] / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(l)["step"] for l in lines]
    assert steps == [1, 2, 3, 4, 4, 4], steps          # 4 steps, the final evaluation, and the resumed one: once each
    assert sorted(p.name for p in (two["work"] / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]


PREEMPT_SCRIPT = """
import dataclasses, json, os, signal, sys
import numpy as np
from attention_jax.train.distributed import initialize
pid, port, work = int(sys.argv[1]), sys.argv[2], sys.argv[3]
initialize(f"127.0.0.1:{port}", 2, pid)
from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import Preempted
from attention_jax.train import Engine, fit, text_task
mc = ModelConfig(vocab_size=64, context=16, d_model=32, n_heads=2)
tc = TrainConfig(steps=64, batch_size=8, lr=1e-2, eval_batch=8, checkpoint_every=32, log_every=8,
                 train_eval_windows=8)
tokens = np.random.default_rng(0).integers(0, 64, 4096).astype(np.int32)
task = text_task(tokens[:3000], tokens[3000:], batch_size=8, context=16, train_eval_windows=8)
noticed = []

def sample(seed, step):
    if pid == 1 and step == 10 and not noticed:   # what a scheduler sends before taking a machine back
        noticed.append(step)
        os.kill(os.getpid(), signal.SIGTERM)
    return task.sample(seed, step)

engine = Engine(mc, tc)
out = {"pid": pid}
try:
    fit(engine, dataclasses.replace(task, sample=sample), workdir=work, progress=False, steps_per_call=4)
    out["preempted"] = None
except Preempted as e:
    out["preempted"], out["message"] = e.step, str(e)
out["saved"] = sorted(int(p) for p in os.listdir(os.path.join(work, "checkpoints")) if p.isdigit())
again = fit(engine, task, workdir=work, progress=False, steps_per_call=4)
out["resumed_from"], out["final"] = again.resumed_from, again.final
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.slow
def test_a_preemption_notice_saves_one_agreed_step_on_every_process_and_stops(tmp_path):
    """SIGTERM to one of two processes (as a scheduler sends it), four steps per call: JAX's
    runtime tells both; both save the same step, at the end of a call, stop, and resume there."""
    script = tmp_path / "preempt.py"
    script.write_text(mlir_prelude() + PREEMPT_SCRIPT)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(pid), port, str(tmp_path / "work")], cwd=REPO,
                              env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for pid in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-3000:]
    got = [json.loads(next(l for l in stdout.splitlines() if l.startswith("RESULT "))[7:]) for stdout, _ in outs]
    step = got[0]["preempted"]
    assert step is not None and got[1]["preempted"] == step, got       # one step, agreed by both
    assert 10 < step < 64 and step % 4 == 0    # after the notice (it arrives when it arrives), at a call's end
    assert step in got[0]["saved"] and "into the same workdir" in got[0]["message"]
    assert got[0]["resumed_from"] == got[1]["resumed_from"] == step
    assert got[0]["final"] == got[1]["final"]


def test_a_coordinator_nobody_listens_at_is_one_line_within_the_deadline():
    import socket
    import time
    from attention_jax.errors import ConfigError
    from attention_jax.train.distributed import _wait_for
    with socket.socket() as s:                     # a port that was free a moment ago: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(ConfigError, match=f"no coordinator answered at 127.0.0.1:{port} within 1 s"):
        _wait_for(f"127.0.0.1:{port}", 1.0)
    assert time.monotonic() - t < 5
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        _wait_for("nowhere", 1.0)
