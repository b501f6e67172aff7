"""experiments.generation on its smoke preset: both decoding paths timed, and ours raced against
transformers' generate on one tiny GPT-2's weights, with the same greedy tokens (batch 1 and a batch
of four unequal prompts, each row as alone) and every setting's floor from the measured bandwidth."""
import json

import numpy as np
import pytest

from experiments import generation, generation_versus

pytestmark = pytest.mark.slow      # an experiment run end to end


def test_the_smoke_run_races_transformers_on_the_same_weights(tmp_path):
    assert generation.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "generation" / "results.json").read_text())
    v = results["versus"]
    assert v["tokens_equal"] == {"1": True, "4": True} and v["batch_equals_alone"]
    assert v["transformers_batch_equals_alone"] and v["bf16_same_tokens"] <= v["new"]
    settings = {(r["who"], r["weights"], r["batch"]) for r in v["rows"]}
    assert settings == {(w, d, b) for b in (1, 4) for w, d in (("ours", "float32"), ("ours", "bfloat16"), ("ours", "int8"),
                                                                ("transformers", "float32"))}
    assert v["bandwidth_gbs"] == max(v["bandwidth_probes"].values())     # the fastest read is the floor
    for r in v["rows"]:    # the floor is the bytes over the bandwidth measured in the run
        assert np.isclose(r["floor_ms"], r["mb"] * 2**20 / (v["bandwidth_gbs"] * 1e9) * 1e3)
        assert r["of_floor"] > 1 and r["ms"] > 0
    mb = {(r["weights"], r["batch"]): r["mb"] for r in v["rows"] if r["who"] == "ours"}
    assert all(mb[("int8", b)] < mb[("bfloat16", b)] < mb[("float32", b)] for b in (1, 4))   # fewer bytes a matrix
    assert v["int8_same_tokens"] <= v["new"] and 0 < v["int8_logit_diff"] < v["logit_std"]
    claims = [c["claim"] for c in results["claims"]]
    assert any("transformers' on the same weights" in c for c in claims) and len(claims) == 6
    assert "ours against transformers" in (tmp_path / "generation" / "table.md").read_text()


def test_the_bandwidth_probes_are_plausible_numbers():
    rates = generation_versus.bandwidth(megabytes=64, rounds=3)
    assert set(rates) == {"sum", "row sums", "row times matrix"}
    assert all(0.1 < gbs < 10_000 for gbs in rates.values()), rates
