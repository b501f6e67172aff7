"""experiments.complexity: the columns' arithmetic, the layer it times, the out-of-memory path.

The table's plumbing runs against a stand-in for the child process that returns exact
n² figures, so every derived number can be asserted exactly and in milliseconds; the
real layer and one real child process are measured at a few hundred tokens.
"""
import json
import math

import jax
import numpy as np
import pytest

from experiments.complexity import measure as M
from experiments import complexity


def fake_child(calls, oom_from=None):
    """A child whose time is n²/1000 ms and whose memory is 100·n² bytes (plan: half that)."""
    def run_child(n, variant, *, repeats, chunk_size, expect_bytes=0, budget_bytes=None):
        calls.append((variant, n, expect_bytes))
        row = {"n": n, "variant": variant, "repeats": repeats, "chunk_size": chunk_size,
               "xla_total_bytes": 50 * n * n, "estimate_bytes": max(50 * n * n, expect_bytes)}
        if oom_from and n >= oom_from and variant.startswith("naive"):
            return row | {"oom": True}
        return row | {"ms": n * n / 1000, "rss_peak_bytes": 100 * n * n, "device_peak_bytes": None, "oom": False}
    return run_child


@pytest.mark.slow
def test_columns_ratios_and_exponents_are_exact(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(complexity.command, "run_child", fake_child(calls))
    out = complexity.EXPERIMENT(preset="smoke", max_tokens=300, out=str(tmp_path)).extra
    assert {n for _, n, _ in calls} == {128, 256}                         # --max-tokens respected
    for rows in out["results"].values():
        for r in rows:
            assert r["matrix_mb"] == 8 * r["n"] ** 2 * 4 / 2 ** 20          # one n×n float32 per head
            assert r["peak_mb"] == 100 * r["n"] ** 2 / 2 ** 20
        assert rows[1]["ms_x4"] == pytest.approx(4.0) and rows[1]["mb_x4"] == pytest.approx(4.0)
    for fit in out["exponents"].values():
        assert fit["time"] == pytest.approx(2.0) and fit["memory"] == pytest.approx(2.0)
    # The second row of each variant was told to expect the first row's memory grown by 4.
    assert [e for v, n, e in calls if n == 256] == [4 * 100 * 128 ** 2] * 4
    folder = tmp_path / "complexity"
    saved = json.loads((folder / "results.json").read_text())
    assert saved["exponents"]["naive"]["time"] == pytest.approx(2.0) and len(saved["rows"]) == 8
    assert (folder / "complexity.png").stat().st_size > 0 and not (folder / "partial.jsonl").exists()
    assert "| book ms |" in (folder / "table.md").read_text()
    assert "claims:" not in capsys.readouterr().out        # from the API the Result shows them, once


@pytest.mark.slow
def test_out_of_memory_rows_are_estimated_and_the_rest_goes_on(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(complexity.command, "run_child", fake_child(calls, oom_from=256))
    result = complexity.EXPERIMENT(preset="smoke", out=str(tmp_path))
    out = {**result.extra, "claims": result.claims}
    naive = out["results"]["naive"]
    assert [r.get("ms") is not None for r in naive] == [True, False, False]
    assert ("naive", 512) not in [(v, n) for v, n, _ in calls]             # past the first OOM: no child
    assert naive[2]["estimate_bytes"] == pytest.approx(4 * naive[1]["estimate_bytes"])
    assert all(r.get("ms") is not None for r in out["results"]["memeff"])
    claims = {c["claim"]: c for c in out["claims"]}
    keeps_going = next(c for text, c in claims.items() if "keeps going" in text)
    assert keeps_going["passed"] and "naive up to 128 (then: out of memory)" in keeps_going["measured"]
    assert "out of memory" in (tmp_path / "complexity" / "table.md").read_text()


@pytest.mark.slow
def test_a_naive_layer_stopped_by_the_largest_n_not_memory_says_so(tmp_path, monkeypatch):
    """On a GPU with room to spare, naive reaches the largest n asked for: the claim must not read as memory."""
    monkeypatch.setattr(complexity.command, "run_child", fake_child([]))
    result = complexity.EXPERIMENT(preset="smoke", max_tokens=256, out=str(tmp_path))
    keeps_going = next(c for c in result.claims if "keeps going" in c["claim"])
    assert "naive up to 256 (then: the largest n asked for, not memory)" in keeps_going["measured"]


@pytest.mark.slow
def test_an_interrupted_run_resumes_and_variants_can_be_chosen(tmp_path, monkeypatch, capsys):
    calls, folder = [], tmp_path / "complexity"
    monkeypatch.setattr(complexity.command, "run_child", fake_child(calls))
    folder.mkdir()
    cached = fake_child([])(128, "memeff", repeats=1, chunk_size=512) | {"ms": 123.0, "layer": complexity.LAYER}
    older = fake_child([])(256, "memeff", repeats=1, chunk_size=512)        # a row of the layer before: measured again
    (folder / "partial.jsonl").write_text(json.dumps(cached) + "\n" + json.dumps(older) + "\n")
    result = complexity.EXPERIMENT(preset="smoke", variants="memeff", out=str(tmp_path))
    out = {**result.extra, "claims": result.claims}
    assert list(out["results"]) == ["memeff"] and out["claims"] == []   # claims compare all four
    assert [n for _, n, _ in calls] == [256, 512] and out["results"]["memeff"][0]["ms"] == 123.0
    assert complexity.main(["--preset", "smoke", "--variants", "flash", "--out", str(tmp_path)]) == 2
    assert "unknown variant 'flash'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tiny_memory_budget_stops_the_layer_before_it_runs():
    row = M.measure(256, "naive", repeats=1, chunk_size=128, budget_bytes=1)
    assert row["oom"] and "ms" not in row
    assert row["estimate_bytes"] >= 2 * M.matrix_bytes(256) == 2 * 8 * 256 * 256 * 4


@pytest.mark.slow
def test_memory_efficient_layer_equals_the_naive_layer_forward_and_backward():
    from flax import nnx
    from attention_jax.config import ModelConfig
    from attention_jax.model import MultiHeadAttention
    params, fns = M.layer_functions(chunk_size=128)
    x = jax.random.normal(jax.random.key(0), (1, 300, M.D_MODEL))        # 300: padded to 3 chunks
    naive, memeff = jax.jit(fns["naive"])(params, x), jax.jit(fns["memeff"])(params, x)
    assert float(np.max(np.abs(naive - memeff))) < 1e-4 * float(np.max(np.abs(naive)))
    # naive is our MultiHeadAttention's numbers, by the chapter's one masked softmax
    layer = nnx.merge(nnx.graphdef(MultiHeadAttention(ModelConfig(d_model=M.D_MODEL, n_heads=M.N_HEADS,
                                                                  mixer="heads", positions="none"),
                                                      rngs=nnx.Rngs(0))), params)
    assert float(np.max(np.abs(naive - layer(x)))) < 1e-5 * float(np.max(np.abs(naive)))
    # ...but computed over every score: the compiled plan holds the scores and weights, n×n per
    # head each (the model's causal path skips a quarter of them: ~1.6 matrices).
    n = 256
    plan = jax.jit(fns["naive"]).lower(params, x[:, :n]).compile().memory_analysis()
    assert plan.temp_size_in_bytes >= 2 * M.matrix_bytes(n)
    g_naive, g_memeff = jax.jit(fns["naive_bwd"])(params, x), jax.jit(fns["memeff_bwd"])(params, x)
    for a, b in zip(jax.tree.leaves(g_naive), jax.tree.leaves(g_memeff)):
        assert float(np.max(np.abs(a - b))) <= 1e-4 * max(float(np.max(np.abs(a))), 1e-6)


@pytest.mark.slow
def test_a_child_process_measures_time_and_memory():
    row = M.run_child(256, "memeff", repeats=1, chunk_size=128)
    assert not row["oom"] and row["ms"] > 0 and row["xla_total_bytes"] > 0
    assert row["rss_peak_bytes"] is not None and math.isfinite(row["rss_peak_bytes"])
    assert row["device_peak_bytes"] is None or jax.default_backend() != "cpu"


@pytest.mark.parametrize("tokens", ["64", "129", "255"])
def test_max_tokens_leaving_no_exponent_to_fit_is_one_clear_error(tmp_path, capsys, tokens):
    """Below 256 only the 128-token row runs, and a slope needs two (it printed n^nan, exit 0)."""
    assert complexity.main(["--preset", "smoke", "--max-tokens", tokens, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --max-tokens {tokens}") and "256 or more" in err and "\n" not in err


@pytest.mark.parametrize("backend, inside", [("cpu", None), ("gpu", "highest"), ("tpu", "highest")])
def test_the_table_is_float32_products_on_every_backend(monkeypatch, backend, inside):
    """A GPU's default float32 product is TF32 and a TPU's one bfloat16 pass: the table asks for float32."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    before = jax.config.jax_default_matmul_precision
    with M.float32_products():
        assert jax.config.jax_default_matmul_precision == (inside or before)
    assert jax.config.jax_default_matmul_precision == before


def test_a_memory_budget_that_leaves_no_slope_is_one_line_not_claims_failing_on_nan(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(complexity.command, "run_child", fake_child(calls, oom_from=128))
    # Under the headroom every row keeps free, nothing could run: refused before any process starts.
    code = complexity.main(["--preset", "smoke", "--out", str(tmp_path), "--memory-budget-mb", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--memory-budget-mb 1 leaves" in err and "raise it" in err
    assert calls == [] and f"above {complexity.HEADROOM // 2 ** 20:,}" in err
    # Above it, a budget that stops the naive layers at their first row leaves them no slope to fit.
    code = complexity.main(["--preset", "smoke", "--out", str(tmp_path), "--memory-budget-mb", "3000"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "raise it" in err
    assert "--memory-budget-mb 3000 leaves naive, naive_bwd fewer than two rows" in err
    assert {variant for variant, _, _ in calls} == set(complexity.VARIANTS)      # measured, then refused
    assert not (tmp_path / "complexity" / "results.json").exists()
