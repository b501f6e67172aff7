"""experiments.patching on its smoke preset: the three sweeps timed on both libraries (the edges on both of
TransformerLens' loops), equal to float32 rounding, with the speed claim per sweep (the smoke preset decides
none of them); each estimate from gradients scored against exact edge patching, and no faithfulness curve on
a random model's noise gap."""
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
    assert speed[-1]["batched_ms"] > 0 and speed[-1]["batched_ratio"] > 0 and speed[0]["batched_ms"] == ""
    estimates = [r for r in results["rows"] if r["kind"] == "estimate"]
    assert [r["method"] for r in estimates] == ["EAP", "EAP-IG-inputs, 4 steps", "EAP-IG-activations, 4 steps",
                                                "mask-gradient IG, 4 steps"]
    assert all(0.5 < r["spearman"] <= 1 and r["misses"].count("->") == 3 for r in estimates)
    assert not [r for r in results["rows"] if r["kind"] in ("faithfulness", "acdc")]   # no curve on a noise gap
    assert (tmp_path / "patching" / "estimates.png").stat().st_size > 10_000
