"""experiments.circuits_known: ROC areas as the ACDC paper computes them, by hand; corrupted inputs that
leave none in its own place; and the smoke run end to end (tracr, the test extra's oracle)."""
import json

import numpy as np
import pytest

from experiments import circuits_known as ck

from helpers import oracle


def test_the_area_is_the_pessimistic_step_sum_over_pareto_points():
    every, true = [f"e{i}" for i in range(10)], {"e0", "e1"}
    perfect = [[], ["e0"], ["e0", "e1"], every]
    assert ck.area(ck.curve(perfect, true, every)) == 1.0
    # one true edge at FPR 0, the other only with 4 of the 8 others: 0.5 * 1 + 0.5 * (1 - 0.5)
    late = [["e0"], ["e0", "e2", "e3", "e4", "e5", "e1"]]
    assert ck.area(ck.curve(late, true, every)) == pytest.approx(0.75)
    assert ck.point(["e0", "e2"], true, every) == (1 / 8, 1 / 2)
    dominated = late + [["e2", "e3"]]                   # a point below and right of another adds nothing
    assert ck.curve(dominated, true, every) == ck.curve(late, true, every)
    assert ck.area([(0.0, 0.0), (1.0, 1.0)]) == 0.0     # nothing found until everything is: the worst


@pytest.mark.parametrize("name", list(ck.PROGRAMS))
def test_every_corrupted_input_is_another_clean_one(name):
    clean, corrupted = ck.inputs(name, 30)
    assert sorted(map(tuple, clean)) == sorted(map(tuple, corrupted)) and len({tuple(c) for c in clean}) == len(clean)
    assert all(a != b for a, b in zip(clean, corrupted))
    assert ck.inputs(name, 30) == (clean, corrupted)                   # seeded


@pytest.mark.slow
def test_the_smoke_run_judges_every_method_against_the_true_circuit(tmp_path):
    oracle("tracr")
    assert ck.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "circuits_known" / "results.json").read_text())
    rows = results["rows"]
    assert {(r["ablation"], r["method"]) for r in rows} == {
        *(("resample", m) for m in ("the true circuit", "exact", "EAP", "EAP-IG-inputs", "EAP-IG-activations", "ACDC")),
        *(("zero", m) for m in ("the true circuit", "exact", "EAP", "ACDC"))}
    assert all(0 <= r["auc"] <= 1 for r in rows) and results["answers"] == {"frac_prevs": True}
    assert results["true_edges"]["frac_prevs"] == sorted(["embed->0.ffn", "embed->1.h0.q", "embed->1.h0.k",
                                                         "0.ffn->1.h0.v", "1.h0->logits"])
    true = [r for r in rows if r["method"] == "the true circuit"]
    assert all(r["faithfulness"] == pytest.approx(1.0, abs=1e-3) for r in true)
    assert len(results["claims"]) == 6 and (tmp_path / "circuits_known" / "roc.png").stat().st_size > 10_000
