"""tools/ci_legs.py, the recorder each CI leg runs after its pytest: a record from a log with pytest's
summary, and one line and no record from a log without one (it gave a ValueError traceback)."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def ci_legs(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("ci_legs", ROOT / "tools" / "ci_legs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "FOLDER", tmp_path / "logs")
    return module


def test_a_log_with_pytest_s_summary_is_recorded(ci_legs, tmp_path):
    log = tmp_path / "leg.log"
    log.write_text("....\n\x1b[32m===== 700 passed, 13 skipped in 41.20s =====\x1b[0m\n")
    assert ci_legs.main(["whole_suite", str(log), "python -m pytest"]) == 0
    record = json.loads((tmp_path / "logs" / "whole_suite.json").read_text())
    assert record["pytest"] == "700 passed, 13 skipped in 41.20s" and record["command"] == "python -m pytest"


@pytest.mark.parametrize("log", ["no summary", "missing"])
def test_a_log_without_pytest_s_summary_is_one_line_and_records_nothing(ci_legs, tmp_path, capsys, log):
    path = tmp_path / "leg.log"
    if log == "no summary":        # pytest cut short: dots, no closing line
        path.write_text("tests/test_x.py ....\nKilled\n")
    assert ci_legs.main(["newest_jax", str(path), "python -m pytest"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and str(path) in err, err
    assert "nothing recorded" in err and not (tmp_path / "logs").exists()
