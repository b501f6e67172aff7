"""attention_jax.data.tokenizer: the BPE trained once and cached beside its tokens, reused, and
rebuilt when a cached file is damaged or not its own; the real corpus's token count.

A small synthetic corpus (helpers.SMALL, its hash patched in as the expected one) keeps this
fast; only the token count needs the real file. The cache always lives in tmp_path.
"""

import os
import pathlib

import numpy as np
import pytest

import attention_jax.data as data
from attention_jax.data import corpus as corpus_mod
from attention_jax.data import tokenizer as tok_mod

from helpers import SMALL, isolate_data, put, refuse

# Read before any fixture edits the environment; CI sets a path relative to the repo.
_REPO = pathlib.Path(__file__).resolve().parents[1]
_CANDIDATES = [_REPO / os.environ.get("ATTENTION_JAX_DATA", "."), _REPO.parent / "shared" / "data"]
REAL = next((p / data.CORPUS_NAME for p in _CANDIDATES if (p / data.CORPUS_NAME).is_file()), None)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Fresh cache, no data env var, the synthetic corpus's hash expected, no network."""
    isolate_data(tmp_path, monkeypatch)
    return tmp_path


def test_tokens_are_cached_and_reused(tmp_path, monkeypatch, capsys):
    path, trainer = put(tmp_path / "c"), tok_mod._train
    first = data.load_tokens(path, vocab_size=300)
    assert first.dtype == np.int32 and first.ndim == 1 and "[trained]" in capsys.readouterr().out
    monkeypatch.setattr(tok_mod, "_train", refuse(AssertionError("the cache should have been used")))
    np.testing.assert_array_equal(first, again := data.load_tokens(path, vocab_size=300))
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"corpus: {len(SMALL):,} chars -> {len(first):,} tokens") and line.endswith("[cached]")
    assert data.load_tokenizer(path, vocab_size=300).decode(again.tolist()) == SMALL
    monkeypatch.setattr(tok_mod, "_train", trainer)  # corrupt files must be rebuilt by training
    folder = next(data.cache_dir().glob("bpe-*-v300"))
    (folder / "tokenizer.json").write_text("{ truncated")
    (folder / "tokens.npy").write_bytes(b"\x93NUMPY garbage")
    np.testing.assert_array_equal(data.load_tokens(path, vocab_size=300, verbose=False), first)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "tokenizer.json", "tokens.npy"]  # no temp
    # Another valid tokens file (a shorter, different one) is not this cache's own: re-encoded, not trusted.
    np.save(folder / "tokens.npy", first[: len(first) // 2][::-1].copy())
    np.testing.assert_array_equal(data.load_tokens(path, vocab_size=300, verbose=False), first)
    assert "is damaged or not this cache's own; rebuilding it" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(REAL is None, reason="real corpus not available")
def test_real_corpus_token_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(corpus_mod, "CORPUS_SHA256", data.CORPUS_SHA256)
    ids = data.load_tokens(data.resolve_corpus(REAL), vocab_size=1024, cache=tmp_path / "tok")
    assert len(ids) == 459_792 and ids.max() < 1024
    assert "1,115,394 chars -> 459,792 tokens (2.43 chars/token), BPE vocab 1024" in capsys.readouterr().out


@pytest.mark.skipif(REAL is None, reason="real corpus not available")
@pytest.mark.slow
def test_pieces_cut_where_the_pre_tokenizer_cuts_so_their_ids_are_the_whole_texts(tmp_path):
    """Encoded in pieces (a 30 MB corpus encoded whole held 6 GB): the same ids as the whole text, here
    with pieces of 20,000 characters, 56 cuts."""
    text = REAL.read_text(encoding="utf-8")
    tok = tok_mod._train(REAL, 1024)
    parts = list(tok_mod.pieces(text, 20_000))
    assert "".join(parts) == text and len(parts) > 50
    whole = tok.encode(text).ids
    assert [i for p in parts for i in tok.encode(p).ids] == whole


def test_a_text_without_spaces_trains_in_seconds(tmp_path):
    """A megabyte of letters with no space is one "word" to BPE: its training ran for minutes; its runs
    are cut for training now, and the ids decode back to the text."""
    import time
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list("abcdefghij"), 400_000))
    path = tmp_path / "letters.txt"
    path.write_text(text)
    began = time.perf_counter()
    tok = tok_mod._train(path, 300)
    assert time.perf_counter() - began < 20
    assert tok.decode(tok.encode(text[:5000]).ids) == text[:5000]


@pytest.mark.slow
@pytest.mark.skipif(REAL is None, reason="real corpus not available")
def test_ctrl_c_ends_tokenizer_training_within_a_second(tmp_path):
    """Training on 11 MB takes seconds in the tokenizers library's own code, which a Ctrl-C used not to
    reach until it returned; answered within a second now (the training thread ends with the process)."""
    import _thread
    import threading
    import time
    path = tmp_path / "eleven.txt"
    path.write_text(REAL.read_text(encoding="utf-8") * 10)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    began = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        tok_mod._train(path, 1024)
    assert time.perf_counter() - began < 1.5


MEASURE = """
import pathlib, resource, sys
from attention_jax.data import tokenizer
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = tokenizer.load_tokens(pathlib.Path(sys.argv[1]), cache=pathlib.Path(sys.argv[2]), verbose=False)
print(len(ids), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


@pytest.mark.slow
@pytest.mark.skipif(REAL is None, reason="real corpus not available")
def test_a_large_corpus_is_tokenized_in_memory_a_small_multiple_of_the_file(tmp_path):
    """11 MB of text: the growth of the process's peak memory while training and encoding stays under 12x
    the file (a 30 MB corpus encoded whole took 6 GB, 200x)."""
    import subprocess
    import sys
    path = tmp_path / "eleven.txt"
    path.write_text(REAL.read_text(encoding="utf-8") * 10)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(tmp_path / "cache")], capture_output=True,
                         text=True, timeout=300, check=True)
    count, grown = map(int, out.stdout.split())
    assert count > 4_000_000
    assert grown < 12 * path.stat().st_size, grown / path.stat().st_size
