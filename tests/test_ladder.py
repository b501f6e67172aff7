"""The ladder command end to end, on the smoke preset: files written, rows, parameter
counts, claims, the row cache, --rows, and one-line errors with exit status 2.

Training is paid once: one session fixture (conftest.smoke_ladder) runs the command three
times into one folder, as a user would: `--rows heads,no_context` (trains those two), the
full ladder (trains the other eight, reuses the two), then the full ladder again (trains
nothing). The notebook's test reuses its rows (both files run on one xdist worker).
"""

import contextlib
import io
import json
import math
import time

import pytest

from attention_jax.errors import DataError
from experiments import ladder
from experiments.harness import report

NAMES = [row.name for row in ladder.ROWS]
PARAMS = [263_168, 263_168, 279_552, 279_552, 328_704, 328_704, 345_216, 476_928, 477_696, 675_584]
SMOKE = ["--preset", "smoke", "--no-progress"]
SMOKE_STEPS = ladder.PRESETS["smoke"].steps


@pytest.fixture(autouse=True)
def isolated(bpe_cache, monkeypatch):
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))


@pytest.mark.slow
def test_rows_subset_trains_only_those(smoke_ladder):
    run = smoke_ladder["subset"]
    assert run.code == 0, run.stdout
    assert [r["name"] for r in run.results["rows"]] == ["no_context", "heads"]  # the ladder's order
    assert not any(r["cached"] for r in run.results["rows"])
    assert sorted(run.printed_rows()) == ["heads", "no_context"]
    assert run.trained == ["heads", "no_context"]
    assert run.results["claims"] == []        # no claim compares these two


@pytest.mark.slow
def test_smoke_ladder_writes_table_results_and_plot(smoke_ladder):
    run, folder = smoke_ladder["full"], smoke_ladder["folder"]
    assert run.code == 0, run.stdout
    assert run.stdout.splitlines()[0] == "preset: smoke"
    rows = run.results["rows"]
    assert [r["name"] for r in rows] == NAMES
    assert [r["params"] for r in rows] == PARAMS
    for r in rows:
        assert math.isfinite(r["train_ppl"]) and math.isfinite(r["val_ppl"]), r
        # 6 steps at lr 1e-3: near the guess at initialisation (the uniform one is perplexity 1024; measured
        # 671 to 1260, the residual rows highest), and the held-out and training splits agree (measured
        # within 8%): nothing overfits yet
        assert 1 < r["val_ppl"] < 1.5 * 1024 and r["steps"] == SMOKE_STEPS and r["seeds"] == [0]
        assert abs(math.log(r["val_ppl"] / r["train_ppl"])) < 0.15, r
    # The two rows of the --rows run were reused, the other eight trained now.
    assert [r["name"] for r in rows if r["cached"]] == ["no_context", "heads"]
    assert run.trained == sorted(NAMES)
    assert [r["book_val_ppl"] for r in rows] == [row.book_val_ppl for row in ladder.ROWS]
    assert rows[0]["change"] is None
    assert rows[1]["change"] == pytest.approx(rows[1]["val_ppl"] - rows[0]["val_ppl"])
    claims = run.results["claims"]
    assert isinstance(claims, list) and claims
    for c in claims:
        assert {"claim", "passed", "measured", "margin"} <= set(c)
        assert isinstance(c["claim"], str) and isinstance(c["passed"], bool) and c["measured"]
    said = {c["claim"]: c["measured"] for c in claims}          # the book's figure beside each of ours
    assert "book ≈4x" in said["the average is >= 2x worse than no context"]
    assert "book ≈14" in said["a learned head beats the uniform average + residual"]
    assert "book" not in said["+ FFN improves"]                 # the book gives no figure for it
    assert "38.07 (train 18.77)" in (folder / "table.md").read_text()
    assert run.results["preset"] == "smoke" and run.results["config"]["train"]["steps"] == SMOKE_STEPS
    table = (folder / "table.md").read_text()
    assert table.startswith("# ladder (preset: smoke)") and "## Claims" in table
    assert all(f" {name} |" in table for name in NAMES)
    assert "263,168" in table and "675,584" in table
    assert all(report.safe(c["claim"]) in table for c in claims)          # as Markdown shows it (<: &lt;)
    assert (folder / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    viewer = (folder / "attention.html").read_text()            # the one-block model's heads, interactive
    assert "attentionViewer(" in viewer and '"layers": 1, "heads": 4' in viewer and "https://" not in viewer
    assert "wrote" in run.stdout.splitlines()[-1]


@pytest.mark.slow
def test_same_command_again_is_cached_and_fast(smoke_ladder):
    full, again = smoke_ladder["full"], smoke_ladder["again"]
    assert again.code == 0, again.stdout
    printed = again.printed_rows()
    assert sorted(printed) == sorted(NAMES)
    assert all(line.endswith("(cached)") for line in printed.values()), printed
    assert all(r["cached"] for r in again.results["rows"])
    assert "[cached]" in full.stdout and "[cached]" in again.stdout   # the BPE was trained once
    for a, b in zip(again.results["rows"], full.results["rows"]):
        assert (a["train_ppl"], a["val_ppl"], a["key"]) == (b["train_ppl"], b["val_ppl"], b["key"])
    assert again.results["claims"] == full.results["claims"]
    assert again.seconds < min(20.0, full.seconds / 3), (again.seconds, full.seconds)


@pytest.mark.slow
def test_eval_every_records_curves(tmp_path, smoke_ladder):
    """--eval-every N: train and val perplexity along the way, in results.json and curves.png;
    --lr, --batch-size and --schedule override the preset, and the results say so."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = ladder.main([*SMOKE, "--rows", "no_context", "--eval-every", "2", "--lr", "2e-3",
                            "--batch-size", "4", "--schedule", "cosine", "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "ladder" / "results.json").read_text())
    train = results["config"]["train"]
    assert (train["lr"], train["batch_size"], train["schedule"], train["eval_every"], train["steps"]) == \
        (2e-3, 4, "cosine", 2, 6)
    row, = results["rows"]
    assert [h["step"] for h in row["history"]] == [2, 4, 6]
    assert row["history"][-1]["val_ppl"] == [row["val_ppl"]] and row["history"][-1]["train_ppl"] == [row["train_ppl"]]
    assert row["history"][0]["val_ppl"][0] > row["val_ppl"]     # it learned between step 2 and step 6
    assert (tmp_path / "ladder" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (smoke_ladder["folder"] / "curves.png").exists()     # no curves without --eval-every


@pytest.mark.parametrize("args, start", [
    (["--preset", "nope"], "error: unknown preset 'nope'; choose one of: paper, cpu, smoke"),
    ([*SMOKE, "--rows", "heads,bogus"], "error: unknown row 'bogus'; choose from: no_context"),
    ([*SMOKE, "--seeds", "0"], "error: argument --seeds: 0 must be a positive whole number"),
    ([*SMOKE, "--eval-every", "-5"], "error: argument --eval-every: -5 must be a positive whole number"),
    ([*SMOKE, "--lr", "nan"], "error: argument --lr: nan must be a finite positive number"),
    ([*SMOKE, "--lr", "inf"], "error: argument --lr: inf must be a finite positive number"),
    ([*SMOKE, "--rows", ","], "error: --rows ',' names no row"),
    ([*SMOKE, "--out", ""], "error: --out is empty"),
    ([*SMOKE, "--data", "/nonexistent"], "error: corpus not found at /nonexistent"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, args, start):
    code = ladder.main([*args, "--out", str(tmp_path / "out")] if "--out" not in args else args)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(start), err
    assert not (tmp_path / "out").exists()     # nothing was started, so nothing was written


def test_a_corpus_error_names_the_flag_that_gave_the_path(tmp_path, capsys):
    """The library's messages name no flag; the command line puts its own in (--data, --corpus)."""
    assert ladder.main([*SMOKE, "--data", "/nonexistent", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err        # the path the user gave, not advice to give one
    assert "corpus not found at /nonexistent (the path given as --data PATH): no such file" in err
    with pytest.raises(DataError, match=r"the path given as data=PATH\)"):  # from Python: the keyword, not the flag
        ladder.EXPERIMENT(preset="smoke", data="/nonexistent", out=str(tmp_path))
    missing = tmp_path / "mine.txt"
    assert ladder.main([*SMOKE, "--corpus", str(missing), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --corpus {missing}: no such file")


@pytest.mark.slow
def test_a_learning_rate_that_diverges_stops_the_row_in_one_line_and_caches_nothing(tmp_path, capsys):
    args = [*SMOKE, "--rows", "no_context", "--lr", "1e9", "--out", str(tmp_path)]
    for attempt in range(2):                                  # and the rerun is not served from a cache
        assert ladder.main(args) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        # The rerun resumes from the last good checkpoint (saying so), and stops again: one line of error.
        assert lines[:-1] == ([] if attempt == 0 else ["no_context: resuming at step 3 of 6 from its checkpoint"])
        assert lines[-1].startswith("error: row 'no_context' diverged at step") and "lower it with --lr" in lines[-1]
    assert not (tmp_path / "ladder" / "rows").exists() and not (tmp_path / "ladder" / "results.json").exists()


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path, capsys):
    """By any path to the folder: as typed, through a symlink, through `..`."""
    from experiments.harness import cli
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with cli.exclusive(tmp_path / "real" / "ladder"):
        for out in (tmp_path / "real", tmp_path / "link", tmp_path / "real" / ".." / "link"):
            assert ladder.main([*SMOKE, "--rows", "no_context", "--out", str(out)]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith("error: another run is writing into") and len(err.splitlines()) == 1, err


def test_a_folder_that_cannot_hold_the_lock_or_a_name_too_long_is_one_line(tmp_path, capsys):
    from experiments.harness import cli
    (tmp_path / "ladder").mkdir()
    (tmp_path / "ladder" / cli.LOCK_FILE).mkdir()                 # something else where the lock goes
    assert ladder.main([*SMOKE, "--rows", "no_context", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot hold") and len(err.splitlines()) == 1, err
    assert ladder.main([*SMOKE, "--rows", "no_context", "--out", str(tmp_path / ("x" * 300))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out") and "name too long" in err.lower() and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_ctrl_c_during_the_first_compile_exits_130_without_a_crash(tmp_path, corpus_folder, bpe_cache):
    import os
    import signal
    import subprocess
    import sys
    env = dict(os.environ, ATTENTION_JAX_DATA=str(corpus_folder), ATTENTION_JAX_CACHE=str(tmp_path / "cache"))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)               # a cached program would leave no compile to interrupt
    proc = subprocess.Popen([sys.executable, "-m", "experiments.ladder", *SMOKE, "--rows", "two_blocks",
                             "--out", str(tmp_path / "out")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:                                  # the corpus is loaded: compiling starts now
        if line.startswith("corpus:"):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1].startswith("interrupted: finished results are kept")


@pytest.mark.slow
def test_a_bfloat16_smoke_ladder_row_ends_within_2_percent_of_float32(tmp_path, smoke_ladder):
    """Mixed precision (bf16 compute, float32 parameters and optimizer state) trains to the same place."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = ladder.main([*SMOKE, "--rows", "layer_norm", "--dtype", "bfloat16", "--out", str(tmp_path)])
    assert code == 0
    half = {r["name"]: r for r in json.loads((tmp_path / "ladder" / "results.json").read_text())["rows"]}
    full = {r["name"]: r for r in smoke_ladder["full"].results["rows"]}
    assert list(half) == ["layer_norm"]       # one full pre-norm block: every bfloat16 cast the ladder has
    for name in half:
        assert half[name]["config"]["dtype"] == "bfloat16" and half[name]["key"] != full[name]["key"]
        rel = abs(half[name]["val_ppl"] / full[name]["val_ppl"] - 1)
        assert rel < 0.02, (name, half[name]["val_ppl"], full[name]["val_ppl"])
