"""The √d ablation on the smoke preset: rows, columns, claims and per-seed verdicts (one run of
two rows, two seeds, six steps), the score statistics by hand, and the claims on hand-made records,
failing ones included."""

import math
import re

import numpy as np
import pytest

from experiments.harness import report
from experiments import scale_ablation as sa

T = 128


@pytest.fixture(scope="module")
def run(smoke_run):
    return smoke_run(sa, "--rows", "d32,d1024", "--seeds", "2")


@pytest.mark.slow
def test_rows_columns_claims_and_per_seed_verdicts(run):
    code, stdout, folder, results = run
    assert code == 0, stdout
    rows = results["rows"]
    assert [r["name"] for r in rows] == ["d32", "d1024"]
    assert [r["d_head"] for r in rows] == [32, 1024]
    for r in rows:
        s, u = np.array(r["val_scaled_seeds"]), np.array(r["val_unscaled_seeds"])
        assert len(s) == len(u) == 2 and np.all(np.isfinite(s)) and np.all(np.isfinite(u))
        np.testing.assert_allclose(r["gain_seeds"], u - s, rtol=1e-9)     # paired: seed i with seed i
        assert math.isclose(r["gain"], float(np.mean(u - s)), rel_tol=1e-9)
        # the two runs differ only in ÷√d
        cfgs = {way: run["config"] for way, run in r["runs"].items()}
        assert cfgs["scaled"]["scale"] and not cfgs["unscaled"]["scale"]
        assert {k: v for k, v in cfgs["scaled"].items() if k != "scale"} == \
               {k: v for k, v in cfgs["unscaled"].items() if k != "scale"}
    d32, d1024 = (r["runs"]["scaled"]["config"] for r in rows)
    assert (d32["n_heads"], d32["layer_norm"]) == (4, True)
    assert (d1024["n_heads"], d1024["d_head"], d1024["layer_norm"], d1024["d_model"]) == (1, 1024, False, 128)
    table = (folder / "table.md").read_text()
    for header in ("val ppl ÷√d", "val ppl no ÷", "gain (no ÷ − ÷√d)", "book gain", "score std init",
                   "score std trained", "entropy init", "entropy trained", "> 0.99 init", "> 0.99 trained"):
        assert header in table
    for book in ("21 → 5147", "→ 3.44", "99.9%", "≈0"):       # the book's figures beside ours
        assert book in table
    assert re.search(r"\| d1024 \|.*\|\s+17 \|$", table, re.M)
    claims = results["claims"]
    assert [c["claim"].split(" (")[0] for c in claims] == [
        "÷√d makes no meaningful difference at d_head 32",
        "÷√d gains at least 5 points at d_head 1024",
        "without ÷√d the d_head 1024 head collapses: > 90% of rows put > 0.99 on one token after training",
        "with ÷√d the score std stays within an order of magnitude of 1"]
    for c in claims:   # every claim checked on each seed's own figures
        seeds = c["seeds"]
        assert seeds["of"] == 2 and len(seeds["passed"]) == len(seeds["margins"]) == 2
        assert seeds["held"] == sum(seeds["passed"]) and seeds["smallest_margin"] == min(seeds["margins"])
    assert stdout.count("seeds, smallest margin") == len(claims)
    for png in ("scores.png", "perplexity.png"):
        assert (folder / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_before_and_after_statistics_are_sane(run):
    rows = run[3]["rows"]
    for r in rows:
        for way in ("scaled", "unscaled"):
            for when in ("before", "after"):
                for i in range(2):
                    assert 0 <= r[f"entropy_{when}_{way}_seeds"][i] <= math.log(T)
                    assert 0 <= r[f"frozen_{when}_{way}_seeds"][i] <= 1
                    assert r[f"score_std_{when}_{way}_seeds"][i] > 0
            run_ = r["runs"][way]     # "after" is the final evaluation, the last point of the curve
            assert run_["history"][-1]["step"] == run_["steps"]
            assert run_["history"][-1]["score_std"] == r[f"score_std_after_{way}_seeds"]
        # "before" is the initialisation: the same weights both ways, so the scores differ by exactly √d
        ratio = np.array(r["score_std_before_unscaled_seeds"]) / np.array(r["score_std_before_scaled_seeds"])
        np.testing.assert_allclose(ratio, math.sqrt(r["d_head"]), rtol=1e-4)
        assert r["entropy_before_scaled"] > r["entropy_before_unscaled"]
    d1024 = rows[1]
    # PyTorch's init without LayerNorm: q, k entries of variance 2/3, so std (2/3)·√1024 = 21.3 (book: 21)
    assert 19 < d1024["score_std_before_unscaled"] < 24
    assert d1024["frozen_before_unscaled"] > 0.3 and d1024["frozen_before_scaled"] < 0.01


def test_score_statistics_by_hand():
    rng = np.random.default_rng(0)
    B, H, n = 2, 3, 6
    scores = rng.normal(size=(B, H, n, n)).astype(np.float32)
    causal = np.tril(np.ones((n, n), bool))
    future_junk = np.where(causal, scores, 1e6)            # entries past the mask must not count
    uniform = np.where(causal, 1.0, 0.0) / causal.sum(-1, keepdims=True) * np.ones((B, H, 1, 1))
    got = {k: float(v) for k, v in sa.score_stats(future_junk, uniform).items()}
    assert math.isclose(got["score_std"], float(scores[..., causal].std()), rel_tol=1e-5)
    assert math.isclose(got["entropy"], sa.uniform_entropy(n), rel_tol=1e-6)
    assert got["frozen"] == 0.0
    one_hot = np.zeros((B, H, n, n), np.float32)
    one_hot[..., np.arange(n), np.arange(n)] = 1.0          # every row on its own token
    got = {k: float(v) for k, v in sa.score_stats(scores, one_hot).items()}
    assert got["entropy"] == 0.0 and got["frozen"] == 1.0
    almost = one_hot * 0.975 + uniform * 0.025                # max <= 0.9875 on every row past row 0
    assert float(sa.score_stats(scores, almost)["frozen"]) == 0.0
    assert math.isclose(sa.uniform_entropy(2), math.log(2) / 1)


def _record(gain, *, scaled=40.0, frozen=0.999, std_before=0.67, std_after=3.44):
    return {"gain": gain, "val_scaled": scaled, "val_unscaled": scaled + gain,
            "frozen_after_unscaled": frozen, "frozen_before_unscaled": 0.6,
            "score_std_before_scaled": std_before, "score_std_after_scaled": std_after}


def _verdicts(records):
    return {c["claim"].split(" (")[0]: (c["passed"], c["margin"]) for c in sa.claims(records)}


def test_claims_follow_the_book_and_can_fail():
    book_like = {"d32": _record(-0.3, std_before=0.33, std_after=0.9), "d128": _record(0.5),
                 "d256": _record(18.0), "d1024": _record(17.0)}
    verdicts = _verdicts(book_like)
    assert len(verdicts) == 5 and all(ok for ok, _ in verdicts.values())
    assert verdicts["÷√d makes no meaningful difference at d_head 32"][1] == pytest.approx(1.7)
    assert verdicts["÷√d gains at least 5 points at d_head 256"][1] == pytest.approx(13.0)
    broken = {"d32": _record(-2.5, std_after=0.9), "d256": _record(4.0), "d1024": _record(6.0, frozen=0.85),
              "d128": _record(0.0, std_after=12.0)}
    verdicts = _verdicts(broken)
    assert [k for k, (ok, _) in verdicts.items() if not ok] == [
        "÷√d makes no meaningful difference at d_head 32",     # |−2.5| ≥ 2: unscaled clearly ahead also fails
        "÷√d gains at least 5 points at d_head 256",
        "without ÷√d the d_head 1024 head collapses: > 90% of rows put > 0.99 on one token after training",
        "with ÷√d the score std stays within an order of magnitude of 1"]
    assert all(m < 0 for ok, m in verdicts.values() if not ok)
    assert verdicts["with ÷√d the score std stays within an order of magnitude of 1"][1] == \
        pytest.approx(1 - math.log10(12.0))
    assert _verdicts({"d128": _record(30.0)}) == {   # no claim on d_head 128 but the std one
        "with ÷√d the score std stays within an order of magnitude of 1": (True, pytest.approx(1 - math.log10(3.44)))}


def test_claims_are_checked_per_seed():
    def seeded(g1, g2, frozen=(0.99, 0.95)):
        r = _record((g1 + g2) / 2, frozen=sum(frozen) / 2)
        r.update(gain_seeds=[g1, g2], val_scaled_seeds=[40.0, 40.0], val_unscaled_seeds=[40 + g1, 40 + g2],
                 frozen_after_unscaled_seeds=list(frozen))
        return r
    records = {"d32": seeded(0.5, 2.5), "d1024": seeded(9.0, 3.0, frozen=(0.99, 0.8))}
    claims = {c["claim"].split(" (")[0]: c for c in report.claims_across_seeds(sa.claims, records, 2)}
    d32 = claims["÷√d makes no meaningful difference at d_head 32"]
    assert d32["passed"] and d32["seeds"]["passed"] == [True, False] and d32["seeds"]["held"] == 1
    assert d32["seeds"]["smallest_margin"] == pytest.approx(-0.5)
    gain = claims["÷√d gains at least 5 points at d_head 1024"]
    assert gain["passed"] and gain["seeds"]["passed"] == [True, False]
    collapse = claims["without ÷√d the d_head 1024 head collapses: > 90% of rows put > 0.99 on one token after "
                      "training"]
    assert not collapse["passed"] and collapse["seeds"]["passed"] == [True, False]
    assert "holds in 1 of 2 seeds" in report.format_claims(list(claims.values()))
