"""Every artifact the project reads back, damaged in turn (cut short, bytes flipped, swapped for another
valid file of its kind): the next run recovers the undamaged run's numbers exactly, or refuses with one
line and exit 2. Never a traceback, never a silently different number.

One smoke row (no_context) is trained once into a pristine results folder and BPE cache; each case
copies both, damages one file, and runs the same command again.
"""

import contextlib
import io
import json
import pathlib
import shutil

import pytest

from experiments import ladder

pytestmark = pytest.mark.slow      # every test here trains a smoke row and runs it again

ROWS = "no_context"
SMOKE = ladder.PRESETS["smoke"]
LAST = str(SMOKE.steps)       # the smoke row's one checkpoint step kept (rows.keeps)


def command(out: pathlib.Path, rows: str = ROWS) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = ladder.main(["--preset", "smoke", "--no-progress", "--rows", rows, "--out", str(out)])
    return code, err.getvalue()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, corpus_folder, bpe_cache):
    root = tmp_path_factory.mktemp("pristine")
    cache = root / "cache"
    if bpe_cache.exists():     # the session's BPE, when another test trained it already
        shutil.copytree(bpe_cache, cache, ignore=shutil.ignore_patterns("jax-compilation*"), dirs_exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTENTION_JAX_CACHE", str(cache))
        mp.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
        code, err = command(root / "out", "no_context,average")
    assert code == 0, err
    results = json.loads((root / "out" / "ladder" / "results.json").read_text())
    return root, {r["name"]: (r["train_ppl"], r["val_ppl"]) for r in results["rows"]}


def largest_file(folder: pathlib.Path) -> pathlib.Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def damage(path: pathlib.Path, how: str, other: pathlib.Path) -> None:
    if how == "truncate":
        data = path.read_bytes() if path.is_file() else None
        if data is None:                       # a checkpoint step: cut its largest file
            path = largest_file(path)
            data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif how == "flip":
        target = path if path.is_file() else largest_file(path)
        data = bytearray(target.read_bytes())
        for i in range(len(data) // 2, min(len(data), len(data) // 2 + 64)):
            data[i] ^= 0xFF
        target.write_bytes(bytes(data))
    else:                                      # another valid file (or checkpoint step) of the same kind
        if path.is_dir():
            shutil.rmtree(path)
            shutil.copytree(other, path)
        else:
            shutil.copyfile(other, path)


def artifact(root: pathlib.Path, what: str) -> tuple[pathlib.Path, pathlib.Path]:
    """(the file to damage, another valid one of its kind) in a copied results folder / cache."""
    ladder_dir, cache = root / "out" / "ladder", root / "cache"
    record = next((ladder_dir / "rows").glob("no_context-*.json"))
    other_record = next((ladder_dir / "rows").glob("average-*.json"))
    run = next((ladder_dir / "runs").glob("no_context-*"))
    other_run = next((ladder_dir / "runs").glob("average-*"))
    bpe = next(p for p in cache.glob("bpe-*-v1024") if (p / "tokens.npy").exists())
    return {"row record": (record, other_record),
            "final checkpoint": (run / "checkpoints" / LAST, other_run / "checkpoints" / LAST),
            "checkpoint checksums": (run / "checksums.json", other_run / "checksums.json"),
            "run fingerprint": (run / "run.json", other_run / "run.json"),
            "metrics file": (run / "metrics.jsonl", other_run / "metrics.jsonl"),
            "token ids": (bpe / "tokens.npy", bpe / "tokens.npy"),
            "tokenizer": (bpe / "tokenizer.json", bpe / "tokenizer.json")}[what]


WHAT = ["row record", "final checkpoint", "checkpoint checksums", "run fingerprint", "metrics file", "token ids",
        "tokenizer"]


@pytest.mark.parametrize("how", ["truncate", "flip", "swap"])
@pytest.mark.parametrize("what", WHAT)
def test_a_damaged_artifact_is_recovered_or_refused_in_one_line(pristine, tmp_path, monkeypatch, corpus_folder,
                                                                 what, how):
    source, expected = pristine
    if what in ("token ids", "tokenizer") and how == "swap":
        pytest.skip("swapping in another valid file of this kind: see the shortened-ids case in test_data")
    root = tmp_path / "copy"
    shutil.copytree(source, root)
    path, other = artifact(root, what)
    damage(path, how, other)
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(root / "cache"))
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
    code, err = command(root / "out")
    assert "Traceback" not in err
    if code == 2:                                          # refused: one line saying what and how to fix it
        assert len(err.strip().splitlines()) == 1 and err.startswith("error:"), err
        assert what == "run fingerprint" and how == "swap", f"{what}/{how} refused: {err}"
        return
    assert code == 0, err
    results = json.loads((root / "out" / "ladder" / "results.json").read_text())
    got = {r["name"]: (r["train_ppl"], r["val_ppl"]) for r in results["rows"]}
    assert got["no_context"] == expected["no_context"], err   # the undamaged run's numbers, exactly


def test_every_checkpoint_damaged_and_no_record_retrains_quietly_keeping_the_damaged_aside(
        pristine, tmp_path, monkeypatch, corpus_folder):
    """Nothing intact to resume: the run starts afresh and saves its steps again (orbax refuses to
    overwrite a step, so the damaged one moves to damaged/), with one note per damaged step and none
    of the traceback echoes orbax's abandoned reads print."""
    source, expected = pristine
    root = tmp_path / "copy"
    shutil.copytree(source, root)
    record, _ = artifact(root, "row record")
    record.unlink()
    run = next((root / "out" / "ladder" / "runs").glob("no_context-*"))
    damage(run / "checkpoints" / LAST, "flip", None)
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(root / "cache"))
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
    code, err = command(root / "out")
    assert code == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert err.count("is damaged") == 1 and "starting afresh" in err
    results = json.loads((root / "out" / "ladder" / "results.json").read_text())
    assert {r["name"]: (r["train_ppl"], r["val_ppl"]) for r in results["rows"]}["no_context"] == expected["no_context"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [LAST]
    assert sorted(p.name for p in (run / "damaged").iterdir()) == [LAST]
