"""experiments.harness.trained: a row a table trained, found by name, preset, seed and flags and
reopened from its checkpoint, training nothing: `EXPERIMENT.reopen(row, ...)` and `--reopen ROW`.
A row that is not there is one line naming the command (or call) that trains it; of several that
fit, the one the table's results.json shows, then the newest; every training table hands over its
tokenizer."""

import dataclasses
import json
import os
import pathlib

import numpy as np
import pytest

from attention_jax.errors import ConfigError
from experiments import all as every, induction, inside_tiny_gpt, ladder, winograd
from experiments.configs import LADDER, by_name
from experiments.harness import reopen, rows, trained

ROW = "layer_norm"       # the ladder's viewed row: its run reopens it for the viewer, at its seed
SMOKE_LADDER = "python -m experiments.ladder --preset smoke"


def record(name="heads", preset="smoke", seeds=(0,), steps=None, task=None):
    """A finished row's record as the row cache writes it (key and digest), its figures made up."""
    cfg, tc = by_name(LADDER, "heads").config, ladder.PRESETS[preset]
    tc = dataclasses.replace(tc, steps=steps) if steps else tc
    r = {"name": name, "key": rows.row_key(name, cfg, tc, preset, seeds, task),
         "config": rows.spelled(cfg, rows.Speed()), "train_config": dataclasses.asdict(tc),
         "seeds": list(seeds), "task": task or {}, "final": {"val_ppl": [9.0]}, "fingerprint": {},
         "steps": tc.steps, "params": 1}
    return {**r, "digest": reopen.digest(r)}


def asked(folder, row="heads", preset="smoke", **kw):
    return trained.Asked("ladder", [r.name for r in LADDER], row, preset, folder, **kw)


def test_a_record_says_its_own_preset_and_another_version_s_says_none():
    r = record(preset="cpu")
    assert trained.preset_of(r, ladder.PRESETS) == "cpu"
    assert trained.preset_of(record(preset="smoke"), ladder.PRESETS) == "smoke"
    other = {**r, "train_config": {**r["train_config"], "lr": 1.0}}
    assert trained.preset_of(other, ladder.PRESETS) is None


def test_the_row_asked_for_is_refused_in_one_line_naming_what_trains_it(tmp_path):
    folder = tmp_path / "ladder"
    nine = {"steps": (9, lambda r: r["train_config"]["steps"] == 9)}
    said = {}
    for why, ask in {"unknown": asked(folder, row="nope"), "untrained": asked(folder, row="average"),
                     "preset": asked(folder, preset="cpu"), "seed": asked(folder, seed=3),
                     "flag": asked(folder, flags=nine),
                     "python": asked(folder, preset="cpu", python=True)}.items():
        with pytest.raises(ConfigError) as info:
            trained.choose(ask, [(record(), 1.0)], ladder.PRESETS)
        said[why] = str(info.value)
        assert "\n" not in said[why]
    out = f"--out {tmp_path}"
    assert said["unknown"].startswith("ladder has no row 'nope'; choose from: no_context, average")
    assert said["untrained"] == (f"ladder row 'average' has not been trained in {folder}; train it "
                                 f"with {SMOKE_LADDER} --rows average {out}")
    assert said["preset"] == (f"ladder row 'heads' has not been trained at the cpu preset in {folder} "
                              "(it is at the smoke preset: --preset smoke); train it with python -m "
                              f"experiments.ladder --preset cpu --rows heads {out}")
    assert said["seed"].endswith("holds seed(s) 0, not seed 3; choose one of those, or train it with "
                                 f"{SMOKE_LADDER} --rows heads --seed 3 {out}")
    assert said["flag"].endswith(f"was not trained with --steps 9; train it with {SMOKE_LADDER} "
                                 f"--rows heads --steps 9 {out}")
    assert said["python"].endswith('(it is at the smoke preset: preset="smoke"); train it with '
                                   f'ladder.EXPERIMENT(preset="cpu", rows="heads", out="{tmp_path}")')


def test_of_several_rows_that_fit_the_one_results_json_shows_wins_then_the_newest(tmp_path):
    folder = tmp_path / "ladder"
    one, three, longer = record(), record(seeds=(0, 1, 2)), record(steps=12)
    found = [(one, 1.0), (three, 3.0), (longer, 2.0)]
    choose = lambda ask: trained.choose(ask, found, ladder.PRESETS)
    assert choose(asked(folder)) is three                                   # the newest
    folder.mkdir()
    shown = {"rows": [{"name": "heads", "key": one["key"]}]}
    (folder / "results.json").write_text(json.dumps(shown))
    assert choose(asked(folder)) is one                                     # the table as last written
    assert choose(asked(folder, seed=2)) is three                           # the one holding seed 2
    assert choose(asked(folder, flags={"steps": (12, lambda r: r["steps"] == 12)})) is longer


def test_a_damaged_or_foreign_record_and_a_measurement_are_passed_over(tmp_path):
    (tmp_path / "rows").mkdir()
    good = record()
    (tmp_path / "rows" / "good.json").write_text(json.dumps(good))
    changed = {**good, "final": {"val_ppl": [1.0]}}                       # its digest no longer holds
    (tmp_path / "rows" / "changed.json").write_text(json.dumps(changed))
    (tmp_path / "rows" / "cut.json").write_text(json.dumps(good)[:40])
    (tmp_path / "rows" / "measured.json").write_text(json.dumps({"key": "init-1", "value": 1}))
    assert [r["key"] for r, _ in trained.records(tmp_path)] == [good["key"]]


def test_a_table_that_trains_nothing_has_no_row_to_reopen():
    from experiments import averaging
    with pytest.raises(ConfigError, match="averaging trains no model to reopen"):
        averaging.EXPERIMENT.reopen("x")


def test_every_training_table_reopens_and_hands_over_its_tokenizer(tmp_path):
    tables = {n: every._module(n).EXPERIMENT for n in every.TRAINING}
    assert all(t.rows and "--reopen" in t.parser().format_help() for t in tables.values())
    assert [n for n, t in tables.items() if t.tokenizer is None] == ["induction"]
    assert induction.EXPERIMENT.tokenizer is None
    args = winograd.EXPERIMENT._arguments({"preset": "smoke", "out": str(tmp_path)})
    words = winograd.EXPERIMENT.tokenizer(winograd.EXPERIMENT.context(args, reading=True))
    sentence = "the animal did not cross the road because it was too tired , so the animal waited ."
    assert words.decode(words.encode(sentence)) == sentence
    chars = inside_tiny_gpt.EXPERIMENT.tokenizer(None)
    assert chars.decode(chars.encode("laba lives in nakmi.")) == "laba lives in nakmi."


# -- a row trained at the smoke preset, seed 1 alone (--seed 1), reopened ---------------------------

@pytest.fixture(scope="module")
def seed_one(tmp_path_factory, bpe_cache, corpus_folder):
    from helpers import smoke_ladder
    out = tmp_path_factory.mktemp("reopen")
    return out, smoke_ladder(out, bpe_cache, corpus_folder, "--rows", ROW, "--seed", "1")[0]


@pytest.fixture
def isolated(bpe_cache, corpus_folder, monkeypatch):
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(corpus_folder))


def listing(folder: pathlib.Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.slow
def test_seed_trains_that_seed_alone_and_its_viewer_reads_it(seed_one):
    out, r = seed_one
    assert r["seeds"] == [1] and (out / "ladder" / "attention.html").is_file()
    steps = sorted(p.name for p in (out / "ladder" / "runs" / r["key"] / "checkpoints").iterdir())
    assert steps == [str(r["steps"])]             # a smoke row keeps its last checkpoint alone


@pytest.mark.slow
def test_reopen_hands_back_the_trained_model_and_its_tokenizer_moving_nothing(seed_one, isolated):
    out, r = seed_one
    before = listing(out)
    got = ladder.EXPERIMENT.reopen(ROW, preset="smoke", out=str(out))
    assert listing(out) == before                  # a read: nothing written, moved or deleted
    assert (got.row, got.seed, got.preset, got.record["key"]) == (ROW, 1, "smoke", r["key"])
    assert got.checkpoint == out / "ladder" / "runs" / r["key"] / "checkpoints" / str(r["steps"])
    engine, state = rows.restore_state(got.record, out / "ladder")
    x = np.arange(64).reshape(2, 32)
    np.testing.assert_allclose(np.asarray(got.model(x)), np.asarray(engine.logits(state, x)),
                               atol=1e-5)
    text = "ROMEO:\nIs the day so young?"
    assert got.tokenizer.decode(got.tokenizer.encode(text).ids) == text
    assert "in Python: ladder.EXPERIMENT.reopen(" in repr(got)


@pytest.mark.slow
def test_the_command_line_says_what_it_reopened_and_where_or_one_line_why_not(seed_one, isolated,
                                                                              capsys):
    out, r = seed_one
    assert ladder.main(["--reopen", ROW, "--preset", "smoke", "--out", str(out)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    where = out / "ladder" / "runs" / r["key"] / "checkpoints" / str(r["steps"])
    assert len(said) == 2 and said[0].startswith(f"reopened ladder row '{ROW}', seed 1 (smoke preset: ")
    assert said[0].endswith(f"{r['params']:,} parameters, from {where}")
    assert said[1] == (f'in Python: ladder.EXPERIMENT.reopen("{ROW}", preset="smoke", seed=1, '
                       f'out="{out}").model, .tokenizer')
    for argv, why in ((["--reopen", "heads"], "has not been trained in"),
                      (["--reopen", ROW, "--seed", "0"], "holds seed(s) 1, not seed 0")):
        assert ladder.main([*argv, "--preset", "smoke", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0] and f"train it with {SMOKE_LADDER}" in err[0]


def test_reopen_is_a_read_of_the_results_folder_a_run_wrote(tmp_path):
    """Without `out`, reopen reads `results`, where the command line writes (a notebook's run
    without `out` writes into a temporary folder instead, which reopen cannot guess)."""
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ConfigError) as info:
            ladder.EXPERIMENT.reopen("heads", preset="smoke")
    finally:
        os.chdir(here)
    assert str(info.value) == (f"ladder row 'heads' has not been trained in "
                               f"{pathlib.Path('results', 'ladder')}; train it with "
                               'ladder.EXPERIMENT(preset="smoke", rows="heads", out="results")')
    assert not (tmp_path / "results").exists()      # a refused reopen leaves no folder behind
