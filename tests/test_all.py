"""`python -m experiments.all`: every chosen table runs as its own command would, then one report gathers
every table, every claim, the figures and the book's figures beside ours, saying first what did not run.
A run of every table writes REPORT.md; a run of some writes REPORT-<tables>.md and leaves REPORT.md be."""

import contextlib
import io
import json
import os
import pathlib

import jax
import pytest

from experiments import all as everything


@pytest.mark.slow
def test_all_writes_one_report_with_every_table_claim_and_book_figure(smoke_analysis):
    code, tmp_path = smoke_analysis.code, smoke_analysis.folder   # experiments.all --only averaging,scaling,params (conftest)
    assert code == 0
    report = (tmp_path / "REPORT-averaging-scaling-params.md").read_text()
    assert report.startswith("# attention_jax: averaging, scaling, params\n\nAll 3 tables ran: 27 of 27 claims hold.")
    for name in ("averaging", "scaling", "params"):
        assert f"\n# {name} (preset: smoke)" in report and (tmp_path / name / "results.json").exists()
        backend = json.loads((tmp_path / name / "results.json").read_text())["backend"]   # what ran it, where
        assert backend["backend"] == "cpu" and backend["jax"] == jax.__version__
        assert backend["host"]["cores"] == os.cpu_count()
        took = json.loads((tmp_path / name / "results.json").read_text())["time"]      # and what it cost
        assert 0 < took["compile_s"] + took["trace_and_lower_s"] <= took["wall_s"]   # its own run's, not the process's
    assert "## The book's figures beside ours" in report and "| 1015.562 |" in report and "124,439,808" in report
    assert "## Claims of the 3 tables that ran: 27 of 27 claims hold" in report   # exact: decided even by smoke
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
    report = (tmp_path / "REPORT-averaging-ladder.md").read_text()
    assert "- **ladder** did not run: ATTENTION_JAX_DATA=" in report and "\n# averaging (preset: smoke)" in report
    # An earlier run's results of the one that failed are not shown as this run's.
    (tmp_path / "ladder").mkdir(exist_ok=True)
    (tmp_path / "ladder" / "results.json").write_text(json.dumps({"name": "ladder", "preset": "smoke", "claims": []}))
    (tmp_path / "ladder" / "table.md").write_text("# ladder\nan old table\n")
    with contextlib.redirect_stdout(io.StringIO()):
        everything.main(["--preset", "smoke", "--only", "averaging,ladder", "--out", str(tmp_path)])
    report = (tmp_path / "REPORT-averaging-ladder.md").read_text()
    assert "did not run" in report and "an old table" not in report and "# ladder" not in report


def test_unknown_experiments_are_one_line_and_exit_2(tmp_path, capsys):
    assert everything.main(["--only", "ladder,bogus", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown experiment 'bogus'") and len(err.splitlines()) == 1


def test_seed_reaches_the_training_tables_alone(tmp_path):
    """--seed S (one seed, S) beside --seeds N (0 .. N-1): each training table gets the one given,
    the others neither; both given is one line before anything runs."""
    args, _ = everything.parse(["--seed", "3", "--out", str(tmp_path)])
    assert everything.flags_for("ladder", args)[-2:] == ["--seed", "3"]
    assert "--seed" not in everything.flags_for("averaging", args)
    args, _ = everything.parse(["--seeds", "2", "--out", str(tmp_path)])
    assert everything.flags_for("winograd", args)[-2:] == ["--seeds", "2"]
    assert everything.main(["--seed", "3", "--seeds", "2", "--out", str(tmp_path)]) == 2


def test_data_reaches_the_corpus_tables(tmp_path, capsys):
    missing = tmp_path / "elsewhere" / "tinyshakespeare.txt"
    with contextlib.redirect_stdout(io.StringIO()):
        code = everything.main(["--preset", "smoke", "--only", "ladder", "--data", str(missing), "--out", str(tmp_path)])
    assert code == 2
    assert str(missing.parent) in (tmp_path / "REPORT-ladder.md").read_text()    # the ladder looked where it was told


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
    report = (tmp_path / "REPORT-averaging-positions.md").read_text()
    assert "## Claims of the 2 tables that ran: 5 of 5 claims hold; 5 not checked at this budget" in report
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
    assert "not checked: PyTorch is not installed" in (tmp_path / "REPORT-averaging-parity-throughput.md").read_text()


def test_only_and_skip_leaving_nothing_is_one_line_and_keeps_the_last_report(tmp_path, capsys):
    (tmp_path / "REPORT.md").write_text("the last report")
    assert everything.main(["--preset", "smoke", "--only", "averaging", "--skip", "averaging",
                            "--out", str(tmp_path)]) == 2
    assert "leave no experiment to run" in capsys.readouterr().err
    assert (tmp_path / "REPORT.md").read_text() == "the last report"


# --- what a report says, from tables faked in a second (the real ones run in the slow tests above) ----

def fake_tables(monkeypatch, tables: dict[str, str | None]):
    """`tables` (name -> None to succeed, or the reason it stops) stand in for the chapter's: each that
    succeeds writes results with two passing claims and a figure named like a script, as a table would."""
    from experiments.harness import report

    def run_one(name, args):
        if tables[name] is not None:
            return tables[name]
        claims = [report.claim(f"{name} claim {i}", True, "1") for i in range(2)]
        report.write_results(pathlib.Path(args.out) / name, name, rows=[], claims=claims, tables={"t": "| a |"},
                             preset="smoke", extra={"figures": ["<script>x</script>.png"], "book": []})
        return None
    monkeypatch.setattr(everything, "available", lambda: list(tables))
    monkeypatch.setattr(everything, "run_one", run_one)


def test_a_report_says_first_what_did_not_run(tmp_path, monkeypatch, capsys):
    fake_tables(monkeypatch, {"averaging": None, "scaling": "it crashed: RuntimeError: boom", "params": None})
    assert everything.main(["--preset", "smoke", "--out", str(tmp_path)]) == 2
    lines = (tmp_path / "REPORT.md").read_text().splitlines()
    assert lines[0] == "# attention_jax: every table of the chapter"
    assert lines[2] == ("**1 of 3 tables did not run** (scaling), so every count below is of the 2 that ran: "
                        "4 of 4 claims hold.")                           # the claims of what ran, and saying so
    assert lines[4] == "- **scaling** did not run: it crashed: RuntimeError: boom"
    assert "## Claims of the 2 tables that ran: 4 of 4 claims hold" in lines
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == "did not run: scaling: it crashed: RuntimeError: boom"
    assert err[-1].startswith("error: 1 of 3 tables did not run (scaling); ") and err[-1].endswith(
        "counts the claims of the 2 that ran: 4 of 4 claims hold")


def test_a_table_that_crashes_is_reported_and_the_rest_still_run(tmp_path, monkeypatch, capsys):
    """A bug in one table (not a user error) prints its traceback and is one line in the report."""
    import types

    class Crashing:
        shares_accelerator = False

        def parser(self):
            import argparse
            p = argparse.ArgumentParser()
            p.add_argument("--out"), p.add_argument("--preset")
            return p

        def execute(self, args):
            raise RuntimeError("a bug\nover two lines")
    real = everything._module
    monkeypatch.setattr(everything, "_module", lambda name: types.SimpleNamespace(EXPERIMENT=Crashing())
                        if name == "scaling" else real(name))
    monkeypatch.setattr(everything, "available", lambda: ["scaling", "params"])
    assert everything.main(["--preset", "smoke", "--out", str(tmp_path)]) == 2
    report = (tmp_path / "REPORT.md").read_text()
    assert "- **scaling** did not run: it crashed: RuntimeError: a bug over two lines" in report
    assert "\n# params (preset: smoke)" in report and "Traceback" in capsys.readouterr().err


def test_a_run_of_some_tables_writes_a_report_named_for_them_and_keeps_the_full_report(tmp_path, monkeypatch):
    fake_tables(monkeypatch, {"averaging": None, "scaling": None, "params": None})
    (tmp_path / "REPORT.md").write_text("the report of every table")
    assert everything.main(["--preset", "smoke", "--only", "averaging", "--out", str(tmp_path)]) == 0
    only = (tmp_path / "REPORT-averaging.md").read_text()
    assert only.startswith("# attention_jax: averaging\n\nAll 1 table ran") and "\n# scaling" not in only
    assert "`python -m experiments.all --preset smoke --only averaging`" in only
    assert everything.main(["--preset", "smoke", "--skip", "params", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "REPORT-without-params.md").read_text().startswith(
        "# attention_jax: every table of the chapter but params\n")
    assert (tmp_path / "REPORT.md").read_text() == "the report of every table"
    assert everything.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "REPORT.md").read_text().startswith("# attention_jax: every table of the chapter\n\nAll 3")
