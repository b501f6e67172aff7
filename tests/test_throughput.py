"""experiments/throughput on its smoke preset, its arithmetic (the model's FLOPs, CPU devices for
the batch), a failing contestant, and the profile's op tables. That the fast paths it measures
give the plain formulas' numbers is tested with their modules: test_speed_dense (dense's backward),
test_speed_forms (attention in causal halves)."""
from __future__ import annotations

import json

import os

import jax
import jax.numpy as jnp
import pytest

from experiments import throughput


@pytest.mark.slow
def test_smoke_run_prints_one_json_line_and_writes_the_claim(tmp_path, capsys, monkeypatch):
    # Two steps per call, as a GPU/TPU runs several (a CPU's default is one): times per step.
    monkeypatch.setenv("ATTENTION_JAX_STEPS_PER_CALL", "2")
    # bfloat16 products: ours' dtype is not float32's, so torch's autocast row runs too
    assert throughput.main(["--preset", "smoke", "--out", str(tmp_path), "--json", "--dtype", "bfloat16_matmul"]) == 0
    summary = json.loads(next(line for line in capsys.readouterr().out.splitlines() if line.startswith("{")))
    for key in ("ms_per_step", "tokens_per_s", "mfu", "flops_per_s", "peak_flops", "torch_ms_per_step", "ratio"):
        assert summary[key] > 0, key
    assert summary["backend"] == "cpu" and summary["steps_per_call"] == 2
    assert summary["devices"] == throughput.cpu_devices(summary["batch"])     # smoke's batch 8: one device
    assert summary["flops_per_step"] == summary["batch"] * 128 * (6 * 330_240 + 12 * 128 * 128)   # PaLM's formula
    # the derived columns are what their names say, of the measured milliseconds
    assert summary["flops_per_s"] == pytest.approx(summary["flops_per_step"] / summary["ms_per_step"] * 1e3)
    assert summary["mfu"] == pytest.approx(summary["flops_per_s"] / summary["peak_flops"])
    assert summary["mfu_float32"] == pytest.approx(summary["flops_per_s"] / summary["peak_flops_float32"])
    assert summary["dtype"] == "bfloat16_matmul"
    assert summary["ratio"] == pytest.approx(summary["ms_per_step"] / summary["torch_ms_per_step"])
    assert summary["allocator"] and "mallopt" in summary["allocators_found"]   # glibc's is always there
    assert summary["tokens_per_s"] == pytest.approx(8 * 128 / summary["ms_per_step"] * 1e3)
    results = json.loads((tmp_path / "throughput" / "results.json").read_text())
    names = [r["name"] for r in results["rows"]]
    assert {"ours", "ours, loss only", "torch", "torch + mallopt",
            "torch + mallopt, bfloat16 autocast"} <= set(names) or "mimalloc" in summary["allocators_found"]
    assert "ours, 1 device" not in names          # ours is on one device already: no second timing of it
    by = {r["name"]: r for r in results["rows"]}
    assert by["ours"]["per_call"] == 2 and by["torch"]["per_call"] == 1
    assert -0.5 < summary["metrics_cost"] < 1.0          # measured, whatever its sign on a busy machine
    assert results["claims"][0]["claim"] == throughput.CLAIM
    assert f"ratio {summary['ratio']:.2f}" in results["claims"][0]["measured"]
    assert by["torch"]["dtype"] == "float32" and any(r["dtype"] == "bfloat16 autocast" for r in results["rows"])
    assert [c["claim"][:30] for c in results["claims"][2:]] == ["JAX step at least 1.15x as fas",
                                                                "JAX step's MFU at least 0.6 of"]


@pytest.mark.parametrize("on_cpu, units, dtypes", [
    (True, ["AMX", "AVX512-BF16"], ["bfloat16_matmul", "float32"]), (True, ["AVX512-BF16"], ["bfloat16_matmul", "float32"]),
    (True, [], ["float32"]), (True, None, ["float32"]), (False, ["AMX"], ["float32"])])
def test_auto_dtype_times_bfloat16_products_only_on_a_cpu_with_bfloat16_units(on_cpu, units, dtypes):
    assert throughput.auto_dtypes(on_cpu, units) == dtypes


@pytest.mark.slow
def test_without_torch_ours_runs_alone_and_says_so(tmp_path, without_torch, capsys):
    import json
    assert throughput.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    assert "PyTorch's step: not measured, PyTorch is not installed" in capsys.readouterr().out
    claims = json.loads((tmp_path / "throughput" / "results.json").read_text())["claims"]
    assert [c["decided"] for c in claims if "PyTorch" in c["claim"]] == [False] * 3


def test_the_model_flop_count_is_palms_formula():
    # 6·N + 12·L·T·d per token, N = 477,696 parameters less the two embedding tables.
    from attention_jax.parameters import count_params, param_breakdown
    from experiments.configs import ONE_BLOCK
    parts = param_breakdown(ONE_BLOCK)
    assert count_params(ONE_BLOCK) == sum(parts.values()) == 477_696          # the model the benchmark times
    assert (parts["token_embed"], parts["position_embed"]) == (1024 * 128, 128 * 128)
    n = sum(count for part, count in parts.items() if part not in ("token_embed", "position_embed"))
    assert n == 477_696 - 1024 * 128 - 128 * 128 == 330_240
    assert 64 * 128 * (6 * n + 12 * 128 * 128) == pytest.approx(17.84e9, rel=1e-3)


@pytest.mark.parametrize("cores, batch, devices", [
    (1, 64, 1), (2, 64, 2), (2, 8, 1), (2, 96, 2), (3, 96, 3), (16, 96, 3), (16, 64, 2), (16, 31, 1),
    (16, 100, 2),     # three would divide 100 unevenly: the largest divisor up to 3
    (3, 64, 2)])
def test_cpu_devices_split_the_batch_and_keep_32_sequences_each(monkeypatch, cores, batch, devices):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert throughput.cpu_devices(batch) == devices


def test_cpu_devices_here_are_one_per_core_up_to_the_batch_over_32():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert throughput.cpu_devices(64) == min(cores, 2) and throughput.cpu_devices(8) == 1


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


@pytest.mark.slow
def test_the_profile_command_lists_the_torch_twins_ops_too(capsys):
    pytest.importorskip("torch")
    from experiments.throughput import profile
    assert profile.main(["--torch", "--batch", "4", "--steps", "1", "--top", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("torch cpu, ") and "batch 4, float32:" in lines[0] and "ms a step" in lines[0]
    rows = lines[2:]
    assert len(rows) == 8 and all(float(r.split()[0]) >= 0 for r in rows)
    assert any("aten::mm" in r or "aten::addmm" in r for r in rows)      # its matmuls are among the longest


@pytest.mark.slow
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


@pytest.mark.parametrize("devices, timed_on_one", [(2, True), (1, False)])
def test_the_one_device_row_is_timed_only_when_ours_runs_on_several(monkeypatch, devices, timed_on_one):
    monkeypatch.setattr(throughput.lineup, "cpu_devices", lambda batch: devices)
    rows = throughput.contestants({"batch": 64}, "system", torch=False, one_device=True)
    assert rows["ours"][0][:3] == ["jax", "--devices", str(devices)]
    assert ("ours, 1 device" in rows) == timed_on_one
    if timed_on_one:
        assert rows["ours, 1 device"][0] == ["jax", "--devices", "1", *rows["ours"][0][3:]]
