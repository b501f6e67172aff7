"""experiments.patching on its smoke preset: both sweeps timed on both libraries, equal to float32
rounding, with the speed claim per sweep (the smoke preset decides none of them)."""
import json

import pytest

from experiments import patching

pytestmark = pytest.mark.slow      # an experiment run end to end


def test_the_smoke_run_times_both_sweeps_and_finds_them_equal(tmp_path):
    assert patching.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "patching" / "results.json").read_text())
    rows = results["rows"]
    assert [r["sweep"] for r in rows] == ["resid_pre by position", "z by head"]
    assert [r["patches"] for r in rows] == [3 * 10, 3 * 4]
    assert all(r["diff"] < patching.AGREE and r["ours_ms"] > 0 and r["tl_ms"] > 0 for r in rows)
    assert [c["claim"].split(" on ")[0] for c in results["claims"]][1:] == ["resid_pre by position", "z by head"]
    assert all(not c.get("decided", True) for c in results["claims"])
