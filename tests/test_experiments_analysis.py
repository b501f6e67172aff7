"""The analysis experiments (averaging, scaling, params, parity) on their smoke presets.

Each runs once through its command (averaging, scaling and params by way of `experiments.all`,
the suite's one run of them) into a temporary folder; the tests then read `results.json` and
assert the chapter's numbers, not merely that it ran.
"""
from __future__ import annotations

import json
import sys

import pytest

from experiments import averaging, params, parity, scaling


def _run(module, name, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(name)
    assert module.main(["--preset", "smoke", "--out", str(out)]) == 0
    return _read(module, out / name)


def _read(module, folder) -> dict:
    """A table's results as its command wrote them, checked for what every smoke run must hold."""
    assert (folder / "table.md").exists()
    results = json.loads((folder / "results.json").read_text())
    assert results["preset"] == "smoke"
    smoke = module.PRESETS["smoke"]
    assert {key: results["config"][key] for key in smoke} == smoke       # what it ran with: the preset's settings
    assert results["claims"] and all(c["passed"] for c in results["claims"]), results["claims"]
    results["folder"] = folder
    return results


# averaging, scaling and params as `experiments.all` ran them for the suite (conftest.smoke_analysis):
# each table's command, into one folder; test_all.py checks the report it made of them.
def _from_all(smoke_analysis, module) -> dict:
    assert smoke_analysis.code == 0
    return _read(module, smoke_analysis.folder / module.NAME)


@pytest.fixture(scope="module")
def averaging_results(smoke_analysis):
    return _from_all(smoke_analysis, averaging)


@pytest.fixture(scope="module")
def scaling_results(smoke_analysis):
    return _from_all(smoke_analysis, scaling)


@pytest.mark.slow
def test_averaging_is_order_blind_and_three_ways_equal(averaging_results):
    diffs = [r["diff"] for r in averaging_results["rows"]]
    assert len(diffs) == 4 and max(diffs) < 1e-6
    matrix = averaging_results["averaging_matrix_6x6"]
    assert matrix[5] == pytest.approx([1 / 6] * 6) and matrix[2][3:] == [0.0, 0.0, 0.0]
    assert (averaging_results["folder"] / "averaging_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_scaling_variance_trace_and_frozen_rows(scaling_results):
    rows = {r["d"]: r for r in scaling_results["rows"]}
    assert sorted(rows) == [4, 16, 64, 256, 1024]
    for d, r in rows.items():
        assert abs(r["var"] / d - 1) < 0.03
        assert abs(r["scaled_trace"] - 0.96) < 0.01          # the book's flat 0.96
        assert r["unscaled_jac_err"] < 1e-6 and r["scaled_jac_err"] < 1e-6
    assert rows[1024]["unscaled_frozen"] > 0.5 and rows[1024]["scaled_frozen"] == 0.0
    assert rows[4]["unscaled_trace"] > rows[1024]["unscaled_trace"] * 5
    assert (scaling_results["folder"] / "std_vs_d.png").exists()
    assert (scaling_results["folder"] / "jacobian.png").exists()


@pytest.mark.slow
def test_no_figure_of_the_analysis_tables_has_a_blank_panel(smoke_analysis):
    """Every figure the three tables published has data in every panel (the tiny GPT's are checked
    on its own smoke run, test_inside_tiny_gpt.py)."""
    from experiments.harness import report
    figures = smoke_analysis.figures
    assert set(figures) == {"averaging", "scaling", "params"} and "jacobian.png" in figures["scaling"]
    assert {(table, name): report.empty_axes(fig) for table, kept in figures.items() for name, fig in kept.items()
            if report.empty_axes(fig)} == {}


@pytest.mark.slow
def test_params_counts(smoke_analysis):
    results = _from_all(smoke_analysis, params)
    models = {r["model"]: r for r in results["rows"]}
    assert models["GPT-2 small"]["framework"] == 124_439_808
    assert models["tiny char GPT (lecture)"]["formula"] == models["tiny char GPT (lecture)"]["framework"] == 109_056
    assert models["two_blocks"]["framework"] == 675_584 and models["heads"]["framework"] == 345_216
    assert all(r["formula"] == r["framework"] for r in results["rows"])
    assert {b["d"]: b["framework"] for b in results["blocks"]} == {128: 198_272, 768: 7_087_872}
    assert 0.30 < results["gpt2_token_table_share"] < 0.32
    assert (results["folder"] / "params.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = params.figure(results["rows"], params.formula(params.GPT2_SMALL),
                        {b["d"]: b for b in results["blocks"]}[768])
    labels = fig.axes[1].get_legend_handles_labels()[1]       # GPT-2 small's parts add up to its count
    assert sum(int(label.split(": ")[1].split(" ")[0].replace(",", "")) for label in labels) == 124_439_808


@pytest.mark.slow
def test_parity_with_torch(tmp_path_factory):
    pytest.importorskip("torch")
    results = _run(parity, "parity", tmp_path_factory)
    assert len(results["rows"]) == 4
    assert all(r["diff"] < 1e-5 for r in results["rows"])


def test_parity_without_torch_says_so_and_checks_nothing(tmp_path, without_torch, capsys):
    assert parity.main(["--preset", "smoke", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "every comparison with PyTorch: not measured, PyTorch is not installed" in out
    results = json.loads((tmp_path / "parity" / "results.json").read_text())
    assert all(c["decided"] is False for c in results["claims"]) and "not measured" in results["tables"]["Parity with PyTorch"]


@pytest.mark.parametrize("module", [averaging, scaling, params, parity])
def test_unknown_preset_is_one_line_and_exit_2(module, tmp_path, capsys):
    assert module.main(["--preset", "huge", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: unknown preset 'huge'")
