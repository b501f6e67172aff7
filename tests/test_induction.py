"""experiments.induction on its smoke preset, two seeds: both models train, every claim is reported per
seed (none decided at this budget), the figure and the viewer are written; and the claims' arithmetic
on records shaped like a finished run's: the half-way steps and the window."""
import json

import numpy as np
import pytest

from experiments import induction


@pytest.mark.slow
def test_the_smoke_run_trains_both_models_and_reports_every_claim_per_seed(tmp_path):
    assert induction.main(["--preset", "smoke", "--seeds", "2", "--no-progress", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "induction"
    results = json.loads((folder / "results.json").read_text())
    assert [r["name"] for r in results["rows"]] == ["one_layer", "two_layers"]
    assert len(results["claims"]) == 10 and all(c["seeds"]["of"] == 2 for c in results["claims"])
    assert all(not c["decided"] for c in results["claims"])
    two = results["rows"][1]
    assert np.asarray(two["final"]["prefix"]).shape == (2, 8) and len(two["history"]) == 2
    assert len(results["per_seed"]) == 2 and {"k_top", "removed_by_induction", "circuit"} <= set(results["per_seed"][0])
    assert (folder / "induction.png").exists() and (folder / "induction.html").exists()


def test_the_half_way_step_is_where_a_figure_has_moved_half_its_way():
    history = [{"step": s, "loss": [[v]]} for s, v in ((100, 4.0), (200, 3.9), (300, 2.4), (400, 1.0))]
    assert induction.steps_at_half(history, "loss", 0, lambda v: v[0]) == 300     # 2.5 passed at 300
    rising = [{"step": s, "score": [v]} for s, v in ((100, 0.0), (200, 0.2), (300, 0.7))]
    assert induction.steps_at_half(rising, "score", 0) == 300
    assert induction.steps_at_half(rising[:1], "score", 0) == 100      # nothing moved: the first step


def test_the_claims_fail_where_their_figures_do():
    good = dict(one_layer_max_prefix=0.02, induction_prefix=0.7, window_gap=1.0, rise_step=2000, fall_step=2100,
                removed_by_induction=0.8, removed_by_previous=0.9, k_pair_is_circuit=1.0, k_over_baseline=0.1,
                found_circuit=1.0, has_induction_heads=1.0, has_k_edge=1.0)
    assert all(c["passed"] for c in induction.claims({"all": good}))
    bad = dict(good, one_layer_max_prefix=0.3, window_gap=3.0, k_pair_is_circuit=0.0, has_k_edge=0.5)
    assert [c["passed"] for c in induction.claims({"all": bad})] == [False, True, False, True, True, False, True,
                                                                      True, True, False]


def test_the_corrupted_text_changes_every_token_of_the_first_copy_and_nothing_else():
    from attention_jax.data.repeats import repeated_segments
    ev = repeated_segments(0, 0, batch=6, length=32, vocab=11, shortest=3, longest=8)
    x = induction.corrupted(ev, 11)
    first = np.zeros_like(x, bool)
    for row, (f, s) in enumerate(zip(ev["first"], ev["span"])):
        first[row, f:f + s] = True
    assert (x[first] != ev["x"][first]).all() and (x[~first] == ev["x"][~first]).all()
    assert x.min() >= 0 and x.max() < 11


def test_a_claim_on_a_gap_too_small_or_too_noisy_to_measure_says_so_and_never_passes():
    """At --steps 2 the in-context gain is a thousandth of a nat (or below zero): a share of it is noise scaled
    up, so the ablation and circuit claims read "not measurable" and fail, and the window has no rise to time."""
    good = dict(one_layer_max_prefix=0.02, induction_prefix=0.7, window_gap=1.0, rise_step=2000, fall_step=2100,
                removed_by_induction=0.8, removed_by_previous=0.9, k_pair_is_circuit=1.0, k_over_baseline=0.1,
                found_circuit=1.0, has_induction_heads=1.0, has_k_edge=1.0)
    nan = float("nan")
    unmeasured = dict(good, window_gap=nan, removed_by_induction=nan, removed_by_previous=nan, found_circuit=nan,
                      has_induction_heads=nan, has_k_edge=nan)
    claims = induction.claims({"all": unmeasured})
    said = [c for c in claims if c["measured"].startswith(induction.NOT_MEASURABLE)]
    assert len(said) == 6 and not any(c["passed"] for c in said)
    flat = [{"step": s, "prefix": [np.full(8, 0.02)], "repeat_loss": [4.2]} for s in (1, 2)]
    assert not induction.moved_enough(flat, 0, 2, 4, 3)
    risen = [dict(flat[0]), {"step": 3, "prefix": [np.r_[np.zeros(7), 0.8]], "repeat_loss": [1.0]}]
    assert induction.moved_enough(risen, 0, 2, 4, 3)


def test_the_noise_of_a_gap_is_its_bootstrap_standard_error_over_sequences():
    rng = np.random.default_rng(0)
    n, T = 400, 6
    high, low = rng.normal(1.0, 1.0, (n, T)), rng.normal(0.0, 1.0, (n, T))
    where = np.ones((n, T), bool)
    se = induction.spread(high, where, low, where)
    assert se == pytest.approx(np.sqrt(2 / (n * T)), rel=0.15)       # two independent means of n·T unit normals
    assert induction.spread(high, where, high, where) == 0.0            # a gap of a thing with itself: no noise
