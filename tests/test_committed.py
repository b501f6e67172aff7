"""experiments.harness.committed: the committed runs read back. The smoke preset's times hold a
first run (empty caches) and a run with the compiled programs cached; a run that will take more
than a few minutes says first, in one line, how long its committed run took, on how many cores,
and how to stop and resume; a shorter one, or one never committed, says nothing."""

import json

import pytest

from attention_jax.errors import DataError
from experiments import all as every
from experiments.harness import committed

HOST = {"backend": "cpu", "host": {"cores": 2}}
STOP = "Ctrl-C stops it keeping every finished row"


def write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))


@pytest.fixture
def docs(tmp_path, monkeypatch):
    """A docs/results of two tables: the ladder's cpu run (two rows, one of them taken from the row
    cache) and a short measurement's; the smoke times of both runs."""
    monkeypatch.setattr(committed, "RESULTS", tmp_path)
    monkeypatch.setattr(committed, "SMOKE", tmp_path / "smoke_times.json")
    rows = [{"name": "no_context", "seconds": 600.0, "cached": False},
            {"name": "layer_norm", "seconds": 3000.0, "cached": True}]
    write(tmp_path / "ladder" / "results.json", {"preset": "cpu", "claims": [], "rows": rows,
                                                 "time": {"wall_s": 900.0}, "backend": HOST})
    write(tmp_path / "averaging" / "results.json", {"preset": "cpu", "claims": [],
                                                    "time": {"wall_s": 4.0}, "backend": HOST})
    write(tmp_path / "smoke_times.json", {"seconds": {"ladder": 21.0, "averaging": 3.0},
                                          "first_run": {"ladder": 150.0, "averaging": 9.0},
                                          "cores": 2})
    return tmp_path


def test_the_smoke_times_hold_a_first_run_and_a_cached_one(docs):
    smoke = committed.smoke_times()
    assert (smoke.seconds["ladder"], smoke.first_run["ladder"], smoke.cores) == (21.0, 150.0, 2)
    assert committed.took("ladder") == ("2 min", "21 s", "65 min")   # wall + the cached row's
    write(docs / "smoke_times.json", {"seconds": {"ladder": 21.0}, "first_run": [150.0]})
    with pytest.raises(DataError, match="smoke_times.json is damaged"):
        committed.smoke_times()
    write(docs / "smoke_times.json", {"seconds": {"ladder": 21.0}})     # kept before first runs
    assert committed.took("ladder") == (None, "21 s", "65 min")


def test_a_long_run_says_first_how_long_on_how_many_cores_and_how_to_stop_and_resume(docs):
    both = ["no_context", "layer_norm"]
    assert committed.announce("ladder", "cpu", both, training=True, folder=docs / "x") == (
        "ladder, cpu preset: its committed cpu-preset run took 65 min on 2 cores; rows already "
        f"finished in {docs / 'x'} are reused; {STOP} (the row in progress resumes from its last "
        "checkpoint), and the same command resumes")
    assert committed.announce("ladder", "cpu", ["layer_norm"], training=True).startswith(
        "ladder, cpu preset: its committed cpu-preset run of layer_norm took 50 min on 2 cores;")
    assert committed.announce("ladder", "cpu", ["no_context"], training=True).startswith(
        "ladder, cpu preset: its committed cpu-preset run of no_context took 10 min")
    assert committed.announce("ladder", "smoke", training=True).startswith(
        "ladder, smoke preset: its committed first run took 2 min on 2 cores, compiling every "
        "program (21 s with them cached);")
    assert committed.announce("averaging", "cpu") is None                 # 4 s: nothing to say
    assert committed.announce("ladder", "paper", training=True) is None   # no committed paper run
    assert committed.announce("norms", "cpu", training=True) is None      # none of this table
    write(docs / "ladder" / "results.json", "{")
    assert committed.announce("ladder", "cpu", training=True) is None     # --help says it is damaged


def test_a_measurement_says_a_rerun_starts_it_over(docs):
    write(docs / "averaging" / "results.json", {"preset": "cpu", "claims": [], "backend": HOST,
                                                "time": {"wall_s": 500.0}})
    assert committed.announce("averaging", "cpu").endswith(
        "took 8 min on 2 cores; Ctrl-C stops it, and the same command starts it over")


def test_all_adds_its_tables_up_and_says_so_once(docs):
    rest = ("; Ctrl-C stops the run keeping every finished table and row, and the same command "
            "resumes")
    assert every.announce(["averaging", "ladder"], "cpu") == (
        "2 tables, cpu preset: their committed runs took 65 min in all on 2 cores" + rest)
    assert every.announce(["averaging", "ladder", "norms"], "smoke") == (
        "3 tables (2 with a committed run), smoke preset: their committed first runs took 3 min in "
        "all on 2 cores (24 s with their programs cached)" + rest)
    assert every.announce(["averaging"], "cpu") is None


def test_hours_read_as_hours():
    assert [committed.minutes(s) for s in (27, 5160, 14760)] == ["27 s", "86 min", "4.1 h"]
