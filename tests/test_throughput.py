"""experiments/throughput.py on its smoke preset, and the fast paths it measures giving the
same numbers as the plain formulas (attention_jax.kernels: dense's hand-written backward;
attention scored in two causal halves)."""
from __future__ import annotations

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax import functional as F
from experiments import throughput


def test_smoke_run_prints_one_json_line_and_writes_the_claim(tmp_path, capsys, monkeypatch):
    # Two steps per call, as a GPU/TPU runs several (a CPU's default is one): times per step.
    monkeypatch.setenv("ATTENTION_JAX_STEPS_PER_CALL", "2")
    assert throughput.main(["--preset", "smoke", "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))
    for key in ("ms_per_step", "tokens_per_s", "mfu", "flops_per_s", "peak_flops", "torch_ms_per_step", "ratio"):
        assert summary[key] > 0, key
    assert summary["backend"] == "cpu" and summary["devices"] >= 1 and summary["steps_per_call"] == 2
    assert summary["allocator"] and "mallopt" in summary["allocators_found"]   # glibc's is always there
    assert summary["tokens_per_s"] == pytest.approx(8 * 128 / summary["ms_per_step"] * 1e3)
    results = json.loads((tmp_path / "throughput" / "results.json").read_text())
    names = [r["name"] for r in results["rows"]]
    assert {"ours", "ours, loss only", "ours, 1 device", "torch", "torch + mallopt"} <= set(names)
    by = {r["name"]: r for r in results["rows"]}
    assert by["ours"]["per_call"] == by["ours, 1 device"]["per_call"] == 2 and by["torch"]["per_call"] == 1
    assert -0.5 < summary["metrics_cost"] < 1.0          # measured, whatever its sign on a busy machine
    assert results["claims"][0]["claim"] == throughput.CLAIM
    assert f"ratio {summary['ratio']:.2f}" in results["claims"][0]["measured"]


def test_without_torch_it_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert throughput.main(["--preset", "smoke", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "--no-torch" in err


def test_the_model_flop_count_is_palms_formula():
    # 6·N + 12·L·T·d per token, N = 477,696 parameters less the two embedding tables.
    n = 477_696 - 1024 * 128 - 128 * 128
    assert n == 330_240 and 64 * 128 * (6 * n + 12 * 128 * 128) == pytest.approx(17.84e9, rel=1e-3)


def test_cpu_devices_split_the_batch_and_keep_32_sequences_each():
    n = throughput.cpu_devices(64)
    assert n in (1, 2) and throughput.cpu_devices(8) == 1 and throughput.cpu_devices(96) in (1, 2, 3)


@pytest.mark.parametrize("n_in, n_out, bias", [(8, 24, True), (24, 8, True), (16, 16, False)])
def test_dense_gradients_equal_plain_einsum_gradients(n_in, n_out, bias, rng):
    x = rng.standard_normal((3, 5, n_in)).astype(np.float32)
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    b = rng.standard_normal((n_out,)).astype(np.float32) if bias else None
    probe = rng.standard_normal((3, 5, n_out)).astype(np.float32)

    def plain(x, w, b):
        y = jnp.einsum("...i,io->...o", x, w)
        return y if b is None else y + b

    loss = lambda f: (lambda x, w, b: jnp.sum(jnp.sin(f(x, w, b)) * probe))
    argnums = (0, 1, 2) if bias else (0, 1)
    ours = jax.jit(jax.grad(loss(F.dense), argnums))(x, w, b)
    theirs = jax.jit(jax.grad(loss(plain), argnums))(x, w, b)
    chex.assert_trees_all_close(F.dense(x, w, b), plain(x, w, b), atol=1e-6)
    chex.assert_trees_all_close(ours, theirs, atol=1e-5)
    # and per seed under vmap, as the engine trains several seeds at once
    ws = np.stack([w, 2 * w])
    per_seed = jax.vmap(lambda w: jax.grad(loss(F.dense), 1)(x, w, b))(ws)
    chex.assert_trees_all_close(per_seed, jax.vmap(lambda w: jax.grad(loss(plain), 1)(x, w, b))(ws), atol=1e-5)


@pytest.mark.parametrize("lead", [(6,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("n_in, n_out", [(8, 24), (24, 8)])
def test_bfloat16_dense_equals_float32_on_the_same_rounded_numbers(lead, n_in, n_out, rng):
    # The low-precision path (float32 accumulation, transposed operands copied first on a
    # CPU) against float32 arithmetic on the same bfloat16 inputs: only the final rounding
    # of each result to bfloat16 may differ.
    bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
    x, w, b = (bf16(rng.standard_normal(s)) for s in ((*lead, n_in), (n_in, n_out), (n_out,)))
    probe = bf16(rng.standard_normal((*lead, n_out)))

    def loss(x, w, b):
        return jnp.sum(F.dense(x, w, b).astype(jnp.float32) * probe)

    low = [jnp.asarray(a, jnp.bfloat16) for a in (x, w, b)]
    y = jax.jit(F.dense)(*low)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), x @ w + b, rtol=1e-2, atol=1e-2)
    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(*low)
    expected = jax.grad(loss, (0, 1, 2))(x, w, b)
    for g, e in zip(grads, expected):
        assert g.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e), rtol=1e-2, atol=2e-2)


def test_a_contestant_that_fails_is_reported_with_its_reason_not_a_traceback(capfd):
    from experiments.throughput.worker import take_turns
    got = take_turns({"broken": (["jax", "--no-such-flag"], {}, "-")},
                     {"batch": 1, "warmup": 1, "rounds": 1, "steps": 1})
    assert got["broken"]["failed"] and "--no-such-flag" in got["broken"]["reason"]
    assert "Traceback" not in capfd.readouterr().err


def test_hlo_ops_name_each_instruction_with_its_shape_and_origin():
    from experiments.throughput.profile import hlo_ops
    text = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(jnp.ones((8, 4)), jnp.ones((4, 16))).compile().as_text()
    ops = hlo_ops(text)
    assert any(shape == "f32[8,16]" and "dot_general" in origin for shape, origin in ops.values())
    assert all(shape == "tuple" or "[" in shape for shape, _ in ops.values())


def test_op_times_are_per_step_and_longest_first(tmp_path):
    import gzip
    from experiments.throughput.profile import op_times
    events = [{"ph": "X", "name": "dot.1", "dur": 3000}, {"ph": "X", "name": "dot.1", "dur": 1000},
              {"ph": "X", "name": "fusion.2", "dur": 6000}, {"ph": "i", "name": "marker"}]
    trace = tmp_path / "t.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert op_times(str(trace), steps=2) == [("fusion.2", 3.0, 0.5), ("dot.1", 2.0, 1.0)]


def test_the_profile_command_lists_the_steps_xla_ops():
    import os
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "experiments.throughput.profile", "--batch", "8", "--steps", "1",
                          "--top", "40", "--attention", "reference", "--dtype", "float32"], capture_output=True, text=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"},
                         cwd=__import__("pathlib").Path(__file__).resolve().parents[1], timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("cpu, 1 device(s), batch 8, reference attention, float32:") and "ms a step" in lines[0]
    rows = lines[2:]
    assert len(rows) == 40 and all(float(r.split()[0]) > 0 for r in rows)
    assert any("dot_general" in r for r in rows)                       # the matmuls are among the longest
    bad = subprocess.run([sys.executable, "-m", "experiments.throughput.profile", "--steps", "0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error:")
