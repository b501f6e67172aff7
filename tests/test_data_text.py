"""attention_jax.data.text: your own text as a corpus. A UTF-8 file is named by its sha256 and
marked as the chapter's corpus only when it is tiny-shakespeare; a file that cannot be a corpus
(missing, a folder, empty, binary, not UTF-8) is refused with one DataError line naming it."""

import hashlib

import pytest

from attention_jax.data import CORPUS_NAME
from attention_jax.data.text import CorpusInfo, check_text_file
from attention_jax.errors import DataError


def test_a_text_file_is_named_by_its_hash_and_is_not_the_books_corpus(tmp_path):
    path = tmp_path / "my notes.txt"
    text = "Attention is a weighted average.\nCafé, naïve, 東京: any UTF-8 will do.\n"
    path.write_text(text, encoding="utf-8")
    info = check_text_file(path)
    assert info == CorpusInfo(path.absolute(), hashlib.sha256(text.encode("utf-8")).hexdigest(), False)
    assert info.name == "my notes.txt"
    assert info.identity() == {"corpus": "my notes.txt", "sha256": info.sha256}   # rows on it get their own keys


def test_the_chapters_corpus_is_recognised_by_its_hash_not_its_name(corpus_folder, tmp_path):
    info = check_text_file(corpus_folder / CORPUS_NAME)
    assert info.default and info.name == "tiny-shakespeare" and info.identity() == {}   # the keys predate --corpus
    renamed = tmp_path / "plays.txt"
    renamed.write_bytes((corpus_folder / CORPUS_NAME).read_bytes())
    assert check_text_file(renamed).default                        # the same bytes under another name
    renamed.write_bytes((corpus_folder / CORPUS_NAME).read_bytes() + b"\n")
    assert not check_text_file(renamed).default                    # one byte more: your own text


@pytest.mark.parametrize("content, expect", [
    (None, "no such file"),
    ("folder", "a folder, not a file"),
    (b"", "the file is empty"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "this looks like a binary file (it holds NUL bytes)"),
    ("caf\xe9 latin-1 text".encode("latin-1"), "not UTF-8 text (byte 3 cannot be decoded)"),
], ids=["missing", "folder", "empty", "binary", "latin-1"])
def test_a_file_that_cannot_be_a_corpus_is_one_line_naming_it(tmp_path, content, expect):
    path = tmp_path / "corpus.txt"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError) as info:
        check_text_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {expect}") and "\n" not in message, message


def test_a_byte_past_the_sniffed_head_that_is_not_utf8_is_still_refused(tmp_path, monkeypatch):
    """Only the first SNIFF_BYTES are searched for NUL bytes; the whole file must still decode."""
    import attention_jax.data.text as text
    monkeypatch.setattr(text, "SNIFF_BYTES", 4)
    path = tmp_path / "late.txt"
    path.write_bytes(b"plain text, then \xff")
    with pytest.raises(DataError, match="not UTF-8 text \\(byte 17 cannot be decoded\\)"):
        check_text_file(path)


def test_a_pipe_is_not_a_missing_file(tmp_path):
    import os
    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        check_text_file(fifo)
