"""Training a table on your own text (--corpus): it trains, the results name the corpus and show no
book figures, the claims are still checked; a file that cannot be a corpus is one line, exit 2."""

import contextlib
import io
import json
import pathlib

import pytest

from experiments import ladder

SEED_TEXT = pathlib.Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(autouse=True)
def isolated(bpe_cache, monkeypatch):
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))


def run(tmp_path, *args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = ladder.main(["--preset", "smoke", "--no-progress", "--out", str(tmp_path / "out"), *args])
    return code, out.getvalue(), err.getvalue()


def test_a_table_trains_on_your_own_text(tmp_path):
    text = tmp_path / "my text.txt"
    text.write_text(SEED_TEXT.read_text(encoding="utf-8") * 3, encoding="utf-8")   # ~60 KB of English
    code, out, err = run(tmp_path, "--corpus", str(text), "--rows", "no_context,average")
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
    code, out, err = run(tmp_path, "--corpus", str(path), "--rows", "no_context")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error:") and expect in err, err
    assert not (tmp_path / "out" / "ladder" / "rows").exists()      # nothing trained, nothing cached


def test_only_the_smoke_preset_reads_a_slice_of_the_held_out_split():
    import numpy as np
    from experiments.harness.tables import SMOKE_VAL_TOKENS, held_out
    val = np.arange(46_000)
    assert held_out(val, "cpu") is val and held_out(val, "paper") is val
    np.testing.assert_array_equal(held_out(val, "smoke"), val[:SMOKE_VAL_TOKENS])    # the first tokens, in order
    assert len(held_out(val, "smoke", longest=4096)) == 2 * 4097                     # two of the longest windows
    assert len(held_out(val[:1000], "smoke")) == 1000                                 # a short split stays whole
