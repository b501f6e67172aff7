"""`python -m experiments.all`: every chosen table runs as its own command would, then one REPORT.md
gathers every table, every claim, the figures and the book's figures beside ours."""

import contextlib
import io
import json
import os

import jax
import pytest

from experiments import all as everything


@pytest.mark.slow
def test_all_writes_one_report_with_every_table_claim_and_book_figure(smoke_analysis):
    code, tmp_path = smoke_analysis.code, smoke_analysis.folder   # experiments.all --only averaging,scaling,params (conftest)
    assert code == 0
    report = (tmp_path / "REPORT.md").read_text()
    for name in ("averaging", "scaling", "params"):
        assert f"\n# {name} (preset: smoke)" in report and (tmp_path / name / "results.json").exists()
        backend = json.loads((tmp_path / name / "results.json").read_text())["backend"]   # what ran it, where
        assert backend["backend"] == "cpu" and backend["jax"] == jax.__version__
        assert backend["host"]["cores"] == os.cpu_count()
        took = json.loads((tmp_path / name / "results.json").read_text())["time"]      # and what it cost
        assert 0 < took["compile_s"] + took["trace_and_lower_s"] <= took["wall_s"]   # its own run's, not the process's
    assert "## The book's figures beside ours" in report and "| 1015.562 |" in report and "124,439,808" in report
    assert "## Claims: 27 of 27 claims hold" in report       # exact claims: decided even by the smoke preset
    assert "![scaling: jacobian.png](scaling/jacobian.png)" in report and (tmp_path / "scaling" / "jacobian.png").exists()
    assert "plumbing check" in report                       # smoke says its figures mean nothing
    where = report.split("## Where and how long")[1]         # what ran them, and each one's time
    assert "`backend: cpu" in where and all(f" {name} |" in where for name in ("averaging", "scaling", "params"))


@pytest.mark.slow
def test_an_experiment_that_fails_is_reported_and_the_rest_still_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(tmp_path / "nowhere"))
    with contextlib.redirect_stdout(io.StringIO()):
        code = everything.main(["--preset", "smoke", "--only", "averaging,ladder", "--out", str(tmp_path)])
    assert code == 2
    report = (tmp_path / "REPORT.md").read_text()
    assert "**ladder** did not finish:" in report and "\n# averaging (preset: smoke)" in report
    # An earlier run's results of the one that failed are not shown as this run's.
    (tmp_path / "ladder").mkdir(exist_ok=True)
    (tmp_path / "ladder" / "results.json").write_text(json.dumps({"name": "ladder", "preset": "smoke", "claims": []}))
    (tmp_path / "ladder" / "table.md").write_text("# ladder\nan old table\n")
    with contextlib.redirect_stdout(io.StringIO()):
        everything.main(["--preset", "smoke", "--only", "averaging,ladder", "--out", str(tmp_path)])
    report = (tmp_path / "REPORT.md").read_text()
    assert "did not finish" in report and "an old table" not in report and "# ladder" not in report


def test_unknown_experiments_are_one_line_and_exit_2(tmp_path, capsys):
    assert everything.main(["--only", "ladder,bogus", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown experiment 'bogus'") and len(err.splitlines()) == 1


def test_data_reaches_the_corpus_tables(tmp_path, capsys):
    missing = tmp_path / "elsewhere" / "tinyshakespeare.txt"
    with contextlib.redirect_stdout(io.StringIO()):
        code = everything.main(["--preset", "smoke", "--only", "ladder", "--data", str(missing), "--out", str(tmp_path)])
    assert code == 2
    assert str(missing.parent) in (tmp_path / "REPORT.md").read_text()      # the ladder looked where it was told


def test_every_training_preset_splits_over_a_colab_tpus_eight_devices():
    """The engine lays a batch over every local device and refuses one that does not divide (an
    8-core Colab TPU, or `jax_num_cpu_devices=8`): no preset, smoke included, may be refused there."""
    import importlib

    from attention_jax.config import TrainConfig
    budgets = []
    for name in sorted(everything.TRAINING):
        module = importlib.import_module(f"experiments.{name}")
        budgets += [(f"{name} {preset}", tc.batch_size) for preset, tc in module.EXPERIMENT.presets.items()]
        budgets += [(f"{name} {preset} (short rows)", tc.batch_size)
                    for preset, tc in getattr(module, "SHORT", {}).items() if isinstance(tc, TrainConfig)]
    norms = importlib.import_module("experiments.norms")
    budgets += [(f"norms {preset} (init probe)", batch) for preset, (batch, _, _) in norms.PROBE.items()]
    assert len(budgets) >= 3 * len(everything.TRAINING)
    assert [name for name, batch in budgets if batch % 8] == []


@pytest.mark.slow
def test_a_smoke_report_leaves_what_its_budget_cannot_decide_unchecked(tmp_path, smoke_positions):
    # The positions rows the suite trained once (conftest.smoke_positions): served from the row cache here.
    from helpers import copy_rows
    copy_rows(smoke_positions[2], tmp_path / "positions")
    with contextlib.redirect_stdout(io.StringIO()):
        code = everything.main(["--preset", "smoke", "--only", "averaging,positions", "--out", str(tmp_path)])
    assert code == 0
    report = (tmp_path / "REPORT.md").read_text()
    assert "## Claims: 5 of 5 claims hold; 5 not checked at this budget" in report
    positions = report.split("- **positions**")[1].split("\n# ")[0]
    assert positions.count("**not checked at this budget**") >= 5 and "PASS" not in positions and "FAIL" not in positions
    assert report.count("plumbing check") == 1                                          # said once, not per table
    results = json.loads((tmp_path / "positions" / "results.json").read_text())
    assert results["claims"] and all(c["decided"] is False for c in results["claims"])
    assert all(r["cached"] for r in results["rows"])              # nothing trained: the same figures
    assert [r["ppl"] for r in results["rows"]] == [r["ppl"] for r in smoke_positions[3]["rows"]]


@pytest.mark.slow
def test_without_torch_every_experiment_runs_and_says_what_it_left_unmeasured(tmp_path, without_torch, capsys):
    """torch hidden: parity and throughput run on the base install, each saying in one line what it could
    not measure and how to install it; their comparisons' claims are not checked, never passed."""
    code = everything.main(["--preset", "smoke", "--only", "averaging,parity,throughput", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    for what in ("every comparison with PyTorch", "PyTorch's step"):
        assert f"{what}: not measured, PyTorch is not installed (the test oracles: pip install -e '.[test]'" in out
    parity = json.loads((tmp_path / "parity" / "results.json").read_text())
    assert parity["claims"] and all(c["decided"] is False and c["why"] == "PyTorch is not installed"
                                    for c in parity["claims"])
    assert "not checked: PyTorch is not installed" in (tmp_path / "REPORT.md").read_text()


def test_only_and_skip_leaving_nothing_is_one_line_and_keeps_the_last_report(tmp_path, capsys):
    (tmp_path / "REPORT.md").write_text("the last report")
    assert everything.main(["--preset", "smoke", "--only", "averaging", "--skip", "averaging",
                            "--out", str(tmp_path)]) == 2
    assert "leave no experiment to run" in capsys.readouterr().err
    assert (tmp_path / "REPORT.md").read_text() == "the last report"
