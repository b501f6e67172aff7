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


@pytest.mark.slow
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


@pytest.mark.slow
def test_only_the_smoke_preset_reads_a_slice_of_the_held_out_split(tmp_path, corpus_folder):
    """The harness turns the preset into a value (held_out_tokens); the table reads that, not the preset's name."""
    from attention_jax.data import load_tokens, resolve_corpus, train_val_split
    from experiments.harness.experiment import SMOKE_HELD_OUT_TOKENS
    from experiments.harness.tables import Table
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
