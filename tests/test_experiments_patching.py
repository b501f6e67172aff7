"""experiments.patching on its smoke preset: the three sweeps timed on both libraries, equal to float32
rounding, with the speed claim per sweep (the smoke preset decides none of them); edge attribution
scored against exact edge patching, and the faithfulness curve of each score's circuits."""
import json

import pytest

from experiments import patching

pytestmark = pytest.mark.slow      # an experiment run end to end


def test_the_smoke_run_times_every_sweep_finds_them_equal_and_scores_the_estimates(tmp_path):
    assert patching.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "patching" / "results.json").read_text())
    speed = [r for r in results["rows"] if r["kind"] == "speed"]
    assert [r["sweep"] for r in speed] == ["resid_pre by position", "z by head", patching.EDGES]
    assert [r["patches"] for r in speed] == [3 * 10, 3 * 4, 262]
    assert all(r["diff"] < patching.AGREE and r["ours_ms"] > 0 and r["tl_ms"] > 0 for r in speed)
    assert [c["claim"].split(" on ")[0] for c in results["claims"]][1:] == \
        ["resid_pre by position", "z by head", patching.EDGES]
    assert all(not c.get("decided", True) for c in results["claims"])
    estimates = [r for r in results["rows"] if r["kind"] == "estimate"]
    assert [r["method"] for r in estimates] == ["EAP", "EAP-IG, 4 steps"]
    assert all(0.5 < r["spearman"] <= 1 and r["misses"].count("->") == 3 for r in estimates)
    curves = [r for r in results["rows"] if r["kind"] == "faithfulness"]
    assert {r["method"] for r in curves} == {"exact", "EAP", "EAP-IG, 4 steps"}
    exact = {r["k"]: r["faithfulness"] for r in curves if r["method"] == "exact"}
    assert exact[1] == pytest.approx(0.0, abs=1e-5) and abs(exact[200] - 1) < 0.1   # one edge: no path yet
    assert (tmp_path / "patching" / "faithfulness.png").stat().st_size > 10_000
    (greedy,) = [r for r in results["rows"] if r["kind"] == "acdc"]
    assert 0 < greedy["edges"] < 262 and {"exact_faithfulness", "EAP_overlap"} <= set(greedy)
