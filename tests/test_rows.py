"""experiments.harness.rows: a finished row reopens its trained model, gains measurements it lacked
from its checkpoint, and is trusted only when its record is intact and its own (smoke preset, one
row); a table trains on your own text (--corpus): the results name the corpus and show no book
figures, the claims are still checked; a file that cannot be a corpus is one line, exit 2."""

import contextlib
import io
import json
import pathlib

import numpy as np
import pytest

from experiments.harness import rows
from experiments.harness.experiment import SMOKE_HELD_OUT_TOKENS
from attention_jax.train import text_task
from experiments import ladder
from experiments.configs import by_name, LADDER

SEED_TEXT = pathlib.Path(__file__).resolve().parents[1] / "README.md"
ROW = "heads"


@pytest.fixture(autouse=True)
def isolated(bpe_cache, corpus_folder, monkeypatch):
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(corpus_folder))


def train(out, *extra):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = ladder.main(["--preset", "smoke", "--no-progress", "--rows", ROW, "--out", str(out), *extra])
    assert code == 0, err.getvalue()
    return json.loads((out / "ladder" / "results.json").read_text())["rows"][0], err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, bpe_cache, corpus_folder):
    out = tmp_path_factory.mktemp("rows")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))
        mp.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
        record, _ = train(out)
    return out, record


def splits():
    """The smoke preset's splits: its held-out split is the first SMOKE_HELD_OUT_TOKENS."""
    from attention_jax.data import load_tokens, resolve_corpus, train_val_split
    train, val = train_val_split(load_tokens(resolve_corpus(None), verbose=False))
    return train, val[:SMOKE_HELD_OUT_TOKENS]


def table(folder):
    """The smoke ladder's Table over `folder`, as the command line makes it (seed 0, no progress bars)."""
    from experiments.harness.experiment import Context
    return rows.Table(Context(args=None, name="ladder", preset="smoke", settings=ladder.PRESETS["smoke"],
                              folder=folder, progress=False))


def smoke_row():
    """(config, training config, task) of the smoke ladder's ROW, as the command line trains it."""
    train_split, val = splits()
    cfg, tc = by_name(LADDER, ROW).config, ladder.PRESETS["smoke"]
    return cfg, tc, text_task(train_split, val, batch_size=tc.batch_size, context=cfg.context,
                              train_eval_windows=tc.train_eval_windows)


@pytest.mark.slow
def test_load_model_reproduces_the_rows_val_perplexity_exactly(trained):
    out, record = trained
    folder = out / "ladder"
    engine, state = table(folder).restore(record)
    _, val = splits()
    assert float(engine.perplexity(state, val)[0]) == record["val_ppl"]
    model = rows.load_model(record, folder)                   # a Result's record and folder, as the notebook does
    model.eval()
    x = val[:64].reshape(2, 32)
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(engine.logits(state, x)), atol=1e-5)


@pytest.mark.slow
def test_a_finished_smoke_row_keeps_its_last_checkpoint_alone(trained):
    """A smoke run of every table left about 300 MB of plumbing checkpoints, two steps a row; its
    last alone reopens the row (a finished row resumes nothing). Other presets keep one to fall
    back to."""
    out, record = trained
    kept = (out / "ladder" / "runs" / record["key"] / "checkpoints").iterdir()
    assert sorted(p.name for p in kept) == [str(record["steps"])]
    assert ladder.PRESETS["smoke"].checkpoint_every < record["steps"]     # it saved one before
    assert (rows.keeps("smoke"), rows.keeps("cpu"), rows.keeps("paper")) == (1, 2, 2)
    model = rows.load_model(record, out / "ladder")       # the row's first seed when none is named
    assert model.config.n_heads == by_name(LADDER, ROW).config.n_heads


@pytest.mark.slow
def test_a_measure_added_later_is_computed_from_the_checkpoint(trained):
    out, record = trained
    folder = out / "ladder"
    cfg, tc, task = smoke_row()
    _, val = splits()
    measure = {"at_64": lambda engine, state: {"ppl": engine.perplexity(state, val, context=64).tolist()}}
    again = table(folder).train(ROW, cfg, train_config=tc, task=task, measures=measure)
    assert again["cached"] and again["final"] == record["final"]
    engine, state = table(folder).restore(record)      # the same measure, taken by hand from the checkpoint
    assert again["measures"]["at_64"]["ppl"] == engine.perplexity(state, val, context=64).tolist()
    saved = json.loads((folder / "rows" / f"{record['key']}.json").read_text())
    assert saved["measures"]["at_64"] == again["measures"]["at_64"]       # kept for the next run


@pytest.mark.slow
def test_a_finished_row_whose_checkpoint_is_gone_is_retrained_alone_when_reopened(trained, tmp_path, capsys):
    """The record alone serves a table that only reads figures; a table that reopens the model
    (or measures it anew) trains that row again, saying so, instead of asking for --fresh."""
    import shutil
    out, record = trained
    folder = tmp_path / "ladder"
    shutil.copytree(out / "ladder", folder)
    shutil.rmtree(folder / "runs" / record["key"] / "checkpoints")
    cfg, tc, task = smoke_row()
    _, val = splits()
    again = lambda **kw: table(folder).train(ROW, cfg, train_config=tc, task=task, **kw)
    assert again()["cached"]                                 # figures only: the record is enough
    capsys.readouterr()
    retrained = again(reopen=True)
    assert not retrained["cached"] and retrained["final"] == record["final"]   # CPU training repeats exactly
    assert f"row {ROW!r} is finished but its checkpoint cannot be reopened" in capsys.readouterr().err
    model = table(folder).load_model(retrained)                # the retrained row's own weights, reopened
    engine, state = table(folder).restore(retrained)
    assert float(engine.perplexity(state, val)[0]) == retrained["final"]["val_ppl"][0]
    model.eval()
    x = val[:64].reshape(2, 32)
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(engine.logits(state, x)), atol=1e-5)
    assert again(reopen=True)["cached"]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "not_json", "foreign", "figure_changed"])
def test_a_damaged_or_foreign_record_is_retrained_saying_why(tmp_path, damage):
    first, _ = train(tmp_path)
    path = tmp_path / "ladder" / "rows" / f"{first['key']}.json"
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "not_json":
        path.write_bytes(b"\xff\xfe binary \x00")
    elif damage == "foreign":
        foreign = json.loads(text)
        foreign["config"]["d_model"] = 64
        path.write_text(json.dumps(foreign))
    else:                      # still valid JSON, the same row, one figure off: the digest catches it
        changed = json.loads(text)
        changed["final"]["val_ppl"][0] /= 10
        path.write_text(json.dumps(changed))
    again, err = train(tmp_path)
    assert "damaged or belongs to another row; training it again" in err and str(path) in err
    assert not again["cached"]
    assert (again["train_ppl"], again["val_ppl"]) == (first["train_ppl"], first["val_ppl"])   # resumed, not guessed


@pytest.mark.slow
def test_a_record_without_a_digest_is_trained_again_not_trusted(trained, tmp_path, capsys):
    """Its figures could have been edited by anyone: the row is trained again (from its checkpoint)."""
    import shutil
    out, record = trained
    folder = tmp_path / "ladder"
    shutil.copytree(out / "ladder", folder)
    path = folder / "rows" / f"{record['key']}.json"
    data = json.loads(path.read_text())
    assert len(data.pop("digest")) == 64
    path.write_text(json.dumps(data))
    cfg, tc, task = smoke_row()
    again = table(folder).train(ROW, cfg, train_config=tc, task=task)
    assert not again["cached"] and again["final"] == record["final"]          # recomputed, the same figures
    assert "is damaged or belongs to another row; training it again" in capsys.readouterr().err
    assert len(json.loads(path.read_text())["digest"]) == 64                 # and written with its digest


def _snapshot(folder: pathlib.Path) -> list:
    """Every file and folder under `folder`, with its size and modification time."""
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def _mismatch(folder: pathlib.Path, record: dict, how: str) -> dict:
    """Make the row's checkpoint in `folder` disagree with its record in one way; the record to reopen with."""
    run = folder / "runs" / record["key"]
    if how == "another_run":            # the finished step's checksum names another run
        sums = json.loads((run / "checksums.json").read_text())
        sums[str(record["steps"])]["run"] = "0" * 16
        (run / "checksums.json").write_text(json.dumps(sums))
    elif how == "damaged_run_json":
        (run / "run.json").write_text("{")
    elif how == "flipped_bytes":
        step = run / "checkpoints" / str(record["steps"])
        big = max((f for f in step.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
        data = bytearray(big.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2: len(data) // 2 + 64])
        big.write_bytes(bytes(data))
    elif how == "other_record":         # a record whose training config is not the checkpoint's
        record = json.loads(json.dumps(record))
        record["fingerprint"]["seeds"] = [7]
    return record


@pytest.mark.slow
@pytest.mark.parametrize("how", ["another_run", "damaged_run_json", "flipped_bytes", "other_record"])
def test_reopening_a_row_whose_checkpoint_does_not_match_its_record_moves_nothing(trained, tmp_path, how):
    """A read (load_model, restore) refuses in one line naming the mismatch and the fix; the checkpoint
    stays where it was, byte for byte (it had been moved to damaged/, or deleted with a damaged run.json)."""
    import shutil
    from attention_jax.errors import CheckpointError
    out, record = trained
    folder = tmp_path / "ladder"
    shutil.copytree(out / "ladder", folder)
    record = _mismatch(folder, record, how)
    before = _snapshot(folder)
    with pytest.raises(CheckpointError) as refused:
        rows.load_model(record, folder)
    said = str(refused.value)
    assert "\n" not in said and f"row {ROW!r}" in said and "--fresh" in said, said
    assert _snapshot(folder) == before
    assert not (folder / "runs" / record["key"] / "damaged").exists()


# Keys made by the code before ModelConfig's attention fields moved to the speed swap (4a4ef29):
# a row finished then is still finished now.
KEYS_BEFORE = [("layer_norm", {}, "cpu", [0], None, "layer_norm-f3d08d6f8dbd"),
               ("two_blocks", {}, "cpu", [0, 1, 2], {"corpus": "mine", "sha256": "ab"}, "two_blocks-6b2f01b1f2e8"),
               ("tiny", {"form": "chunked", "chunk": 64}, "smoke", [0], None, "tiny-be5d0d765679"),
               ("tanh", {"matmul_dtype": "bfloat16"}, "smoke", [0], None, "tanh-b3f70290628c")]


@pytest.mark.parametrize("name, speed, preset, seeds, task, key", KEYS_BEFORE, ids=[k[0] for k in KEYS_BEFORE])
def test_a_row_keeps_the_key_it_had_before_its_attention_form_left_the_config(name, speed, preset, seeds, task, key):
    import dataclasses
    from attention_jax.speed import Speed
    from experiments.configs import LADDER_BUDGETS, TINY_GPT
    config = {"layer_norm": LADDER[8].config, "two_blocks": LADDER[9].config, "tiny": TINY_GPT,
              "tanh": dataclasses.replace(TINY_GPT, gelu="tanh")}[name]
    assert rows.row_key(name, config, LADDER_BUDGETS[preset], preset, seeds, task, Speed(**speed)) == key
    assert rows.unspelled(rows.spelled(config, Speed(**speed))) == (config, Speed(**speed))


@pytest.mark.slow
def test_an_unfinished_row_of_another_version_trains_from_the_start_saying_so(trained, tmp_path, capsys):
    """Its checkpoint folder names its run otherwise (an older run.json): not resumed, not refused."""
    import shutil
    out, record = trained
    folder = tmp_path / "ladder"
    shutil.copytree(out / "ladder", folder)
    (folder / "rows" / f"{record['key']}.json").unlink()                   # the row is not finished
    run = folder / "runs" / record["key"] / "run.json"
    old = json.loads(run.read_text())
    old["model"]["attention"] = "auto"                                      # as the config spelled it once
    run.write_text(json.dumps(old))
    cfg, tc, task = smoke_row()
    again = table(folder).train(ROW, cfg, train_config=tc, task=task)
    assert "written by another version of this code; training that row from the start" in capsys.readouterr().err
    assert again["resumed_from"] == 0 and again["final"] == record["final"]


def run_ladder(tmp_path, *args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ladder.main(["--preset", "smoke", "--no-progress", "--out", str(tmp_path / "out"), *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_a_table_trains_on_your_own_text(tmp_path):
    text = tmp_path / "my text.txt"
    text.write_text(SEED_TEXT.read_text(encoding="utf-8") * 3, encoding="utf-8")   # ~60 KB of English
    code, out, err = run_ladder(tmp_path, "--corpus", str(text), "--rows", "no_context,average")
    assert code == 0, err
    assert "corpus: my text.txt" in out and "no book figures" in out
    results = json.loads((tmp_path / "out" / "ladder" / "results.json").read_text())
    assert results["config"]["data"]["corpus"] == "my text.txt" and not results["config"]["data"]["book_figures"]
    assert [r["book_val_ppl"] for r in results["rows"]] == [None, None]
    assert len(results["claims"]) == 1                     # no_context vs average is still checked
    assert "book" not in results["claims"][0]["measured"]   # the book's ≈4x is about its corpus, not yours
    table = (tmp_path / "out" / "ladder" / "table.md").read_text()
    assert "59.71" not in table and "≈248" not in table


@pytest.mark.parametrize("content, expect", [
    (None, "no such file"),
    ("folder", "a folder, not a file"),
    (b"", "the file is empty"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "binary file"),
    ("caf\xe9 latin-1 text".encode("latin-1"), "not UTF-8 text"),
    (b"far too short to fill one window. " * 20, "is too small"),
])
def test_a_file_that_cannot_be_a_corpus_is_one_line_and_exit_2(tmp_path, content, expect):
    path = tmp_path / "corpus.txt"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    code, out, err = run_ladder(tmp_path, "--corpus", str(path), "--rows", "no_context")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error:") and expect in err, err
    assert not (tmp_path / "out" / "ladder" / "rows").exists()      # nothing trained, nothing cached


@pytest.mark.slow
def test_only_the_smoke_preset_reads_a_slice_of_the_held_out_split(tmp_path, corpus_folder):
    """The harness turns the preset into a value (held_out_tokens); the table reads that, not the preset's name."""
    from attention_jax.data import load_tokens, resolve_corpus, train_val_split
    from experiments.harness.experiment import SMOKE_HELD_OUT_TOKENS
    from experiments.harness.rows import Table
    _, val = train_val_split(load_tokens(resolve_corpus(corpus_folder), verbose=False))
    for preset, want in (("smoke", SMOKE_HELD_OUT_TOKENS), ("cpu", None), ("paper", None)):
        args = ladder.EXPERIMENT.parser().parse_args(["--preset", preset, "--out", str(tmp_path), "--data",
                                                      str(corpus_folder)])
        ctx = ladder.EXPERIMENT.context(args)
        assert ctx.held_out_tokens == want
        got = Table.on_corpus(ctx).splits[1]
        assert len(got) == (want or len(val)) and (got == val[:len(got)]).all()   # the first tokens, in order
    ctx.held_out_tokens = 1000
    assert len(Table.on_corpus(ctx, longest=4096).splits[1]) == 2 * 4097           # two of the longest windows
