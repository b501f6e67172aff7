"""experiments.estimates: the FLOPs counted from a config are XLA's own count of the step (to 5%),
the utilisation is nanoGPT's published run by the same count, and docs/performance.md's table and
docs/estimates.json are what the module makes now; the device check's line names its device."""
import dataclasses
import json

import numpy as np
import pytest

from attention_jax.config import TrainConfig
from attention_jax.train import Engine
from experiments import estimates
from experiments.configs import LADDER


@pytest.mark.parametrize("name", ["average", "heads", "two_blocks"])
def test_the_count_is_xla_s_count_of_a_training_step_to_5_percent(name):
    """XLA's count of the step built for a GPU (its fused attention scores the whole T x T), with
    the products' few elementwise neighbours (softmax, LayerNorm, AdamW) that the count leaves out."""
    config = next(r.config for r in LADDER if r.name == name)
    tc = TrainConfig(batch_size=64)                       # the paper preset's
    engine = Engine(config, tc, backend="cuda")
    x = np.zeros((tc.batch_size, config.context), np.int32)
    analysis = engine._step.lower(engine.init([0]), engine.shard([{"x": x, "y": x}])).compile().cost_analysis()
    xla = (analysis[0] if isinstance(analysis, list) else analysis)["flops"]
    ours = estimates.step_flops(config, tc.batch_size)
    assert ours == pytest.approx(xla, rel=0.05), (ours, xla)


def test_the_utilisation_is_nanogpt_s_training_flops_over_its_three_minutes_on_an_a100():
    flops = estimates.step_flops(estimates.NANOGPT, 64) * 5000
    assert flops / 1e15 == pytest.approx(5.81, abs=0.01)            # 6 x 10.6 M params + attention, 82 M tokens
    assert estimates.utilisation() == pytest.approx(flops / (180 * 312e12))
    assert 0.10 < estimates.utilisation() < 0.11


def test_the_docs_table_and_the_results_file_are_what_the_module_makes():
    data = estimates.estimate()
    assert json.loads(estimates.RESULTS.read_text()) == json.loads(json.dumps(data)), \
        "docs/estimates.json is stale: python -m experiments.estimates --write"
    assert estimates.page_block(estimates.PAGE.read_text()) == estimates.block(data), \
        "docs/performance.md's estimates are stale: python -m experiments.estimates --write"
    ladder = data["runs"]["ladder --preset paper"]
    assert ladder["minutes"]["T4"] == pytest.approx(ladder["tflop"] / (65 * data["utilisation"]) / 60, rel=1e-2)    # to 0.01 min
    assert all("(est.)" in line for line in estimates.table(data).splitlines()[2:5])


def test_the_notebook_run_is_three_ladders_and_two_small_tables():
    runs = estimates.estimate()["runs"]
    notebook = runs["the notebook (paper: ladder x 3 seeds, tiny GPT, induction)"]["tflop"]
    assert 3 * runs["ladder --preset paper"]["tflop"] < notebook < 3.5 * runs["ladder --preset paper"]["tflop"]


@pytest.mark.parametrize("kind, device, dtype", [("Tesla T4", "T4", "float16"), ("NVIDIA H100 80GB HBM3", "H100", "bfloat16"),
                                                 ("NVIDIA A100-SXM4-40GB", "A100", "bfloat16"), ("TPU v5 lite", "TPU v5e-1", "bfloat16")])
def test_the_device_check_s_line_names_its_device_and_a_second_try(kind, device, dtype):
    line = estimates.for_device(kind)
    assert f"the {device}'s" in line and f"({dtype})" in line and "with a second try" in line


def test_a_device_without_a_published_peak_says_so():
    assert estimates.for_device("cpu").startswith("estimate: no published peak here for 'cpu'")


def test_each_device_s_dtype_is_the_one_dtype_for_gives_it():
    from attention_jax.speed import Backend, dtype_for
    said = {"T4": Backend("cuda", 7.5), "L4": Backend("cuda", 8.9), "A100": Backend("cuda", 8.0),
            "H100": Backend("cuda", 9.0), "TPU v5e-1": "tpu"}
    assert {d.name: d.dtype for d in estimates.DEVICES} == {k: dtype_for(b)[0] for k, b in said.items()}
    assert [dataclasses.replace(d).peak for d in estimates.DEVICES] == [65.0, 121.0, 312.0, 989.0, 197.0]
