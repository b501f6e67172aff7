"""GPT-2-style byte-level BPE trained on the corpus, with an on-disk cache of the ids.

Training takes seconds and encoding a megabyte takes about as long again; every
run on a corpus needs the same ids, so both are done once per (corpus, vocab) and kept.
The cache folder is keyed by the corpus hash, so an edited corpus can never be served
stale ids, and every write is temp-file + os.replace so a killed run leaves either the
old file or the new one, never half of one. A manifest records each file's sha256 as
written: a cached file that no longer matches (damaged, or swapped for another valid one)
is rebuilt, never trusted, and tokens are trusted only beside the tokenizer that made them.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import threading

import numpy as np
import tokenizers

from attention_jax.data.corpus import cache_dir, new_file, sha256_file
from attention_jax.errors import ConfigError, DataError

TOKENIZER_FILE = "tokenizer.json"
TOKENS_FILE = "tokens.npy"
MANIFEST_FILE = "manifest.json"   # the sha256 of each file as written:
                                  # a file that differs is rebuilt
MIN_FREQUENCY = 2  # pairs seen once are noise; with this setting the corpus gives 459,792 ids
LONGEST = 256      # characters without a space that BPE training takes as one run (longer: cut)
_LONG_RUN = re.compile(rf"\S{{{LONGEST + 1},}}")
PIECE = 1 << 20    # characters encoded at a time:
                   # the encoder holds ~200 bytes a character while it works
_SAFE_CUT = re.compile(r"\S(?=\n)")


def _folder(corpus: pathlib.Path, vocab_size: int, cache: pathlib.Path | None) -> pathlib.Path:
    if int(vocab_size) < 257:
        raise ConfigError(f"BPE vocab_size {vocab_size} is too small; use at least 257 "
                          "(256 bytes + merges)")
    # The corpus's own hash (not the expected constant) so small test corpora get their own key.
    root = pathlib.Path(cache) if cache is not None else cache_dir()
    try:
        folder = root / f"bpe-{sha256_file(pathlib.Path(corpus))[:16]}-v{int(vocab_size)}"
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = " ".join(str(err).split())
        raise DataError(f"cannot prepare the token cache for {corpus} ({reason}); "
                        "check the corpus path and set ATTENTION_JAX_CACHE=FOLDER to "
                        "a writable folder") from None
    return folder


def _atomic_write(target: pathlib.Path, write) -> None:
    """Call write(tmp_path) on a sibling temp file, then rename it over `target`."""
    fd, tmp = new_file(target.parent, f".{target.name}-")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _train(corpus: pathlib.Path, vocab_size: int) -> tokenizers.Tokenizer:
    """Train the BPE. No special tokens and no prefix space: GPT-2's byte-level defaults,
    which are the settings that reproduce the chapter's token count. A text with a run of more
    than LONGEST characters without a space (a line of letters, a minified file) is one "word"
    to BPE, whose training on it took minutes with no end in sight: such a text trains on its
    runs cut into pieces of LONGEST. Training runs in a thread of its own, so that a Ctrl-C is
    answered at once (the library holds Python's main thread for the whole of it otherwise)."""
    bpe = tokenizers.ByteLevelBPETokenizer(add_prefix_space=False)
    options = dict(vocab_size=vocab_size, min_frequency=MIN_FREQUENCY, special_tokens=[],
                   show_progress=False)
    text = _read_text(corpus)
    if _LONG_RUN.search(text) is None:
        _interruptible(lambda: bpe.train([str(corpus)], **options))
    else:
        cut = (text[i:i + LONGEST] for i in range(0, len(text), LONGEST))
        _interruptible(lambda: bpe.train_from_iterator(cut, **options))
    return bpe._tokenizer  # the plain Tokenizer inside the convenience wrapper


def _interruptible(work) -> None:
    """`work()` in a daemon thread, the caller waiting in slices so that Ctrl-C reaches it within
    0.1 s (the thread is left to finish, or to end with the process)."""
    failed = []

    def run():
        try:
            work()
        except BaseException as e:       # handed to the caller, which raises it
            failed.append(e)
    thread = threading.Thread(target=run, daemon=True, name="bpe-training")
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failed:
        raise failed[0]


def pieces(text: str, size: int = PIECE):
    """`text` in pieces of about `size` characters, each cut just before a line break that follows a
    character other than a space: where GPT-2's pre-tokenizer cuts anyway, so the pieces' ids are
    the whole text's (a test checks it). Where no such place comes within `size` more,
    cut at `size`."""
    start = 0
    while start < len(text):
        end = start + size
        if end >= len(text):
            yield text[start:]
            return
        found = _SAFE_CUT.search(text, end, end + size)
        cut = found.start() + 1 if found else end
        yield text[start:cut]
        start = cut


def _read_tokenizer(path: pathlib.Path) -> tokenizers.Tokenizer | None:
    if not path.is_file():
        return None
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception:  # the Rust loader raises a bare Exception on any corrupt json
        return None


def _manifest(folder: pathlib.Path) -> dict:
    try:
        found = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def _record(folder: pathlib.Path, name: str) -> None:
    """Note the sha256 of a file just written, so a later change to it is noticed."""
    manifest = _manifest(folder)
    manifest[name] = sha256_file(folder / name)
    if name == TOKENIZER_FILE:
        manifest.pop(TOKENS_FILE, None)   # ids made by an earlier tokenizer are not this one's
    _atomic_write(folder / MANIFEST_FILE,
                  lambda tmp: pathlib.Path(tmp).write_text(json.dumps(manifest, indent=1)))


def _intact(folder: pathlib.Path, name: str) -> bool:
    """The cached file exists and is byte for byte what this cache wrote."""
    path = folder / name
    if not path.is_file():
        return False
    if _manifest(folder).get(name) == sha256_file(path):
        return True
    print(f"note: {path} is damaged or not this cache's own; rebuilding it", file=sys.stderr,
          flush=True)
    return False


def _tokenizer_and_flag(corpus, vocab_size, folder) -> tuple[tokenizers.Tokenizer, bool]:
    """The cached tokenizer, training and storing it if absent, unreadable or changed;
    flag = trained."""
    path = folder / TOKENIZER_FILE
    tok = _read_tokenizer(path) if _intact(folder, TOKENIZER_FILE) else None
    if tok is not None:
        return tok, False
    trained = _train(pathlib.Path(corpus), int(vocab_size))
    _atomic_write(path, lambda tmp: trained.save(tmp))
    _record(folder, TOKENIZER_FILE)
    return trained, True


def load_tokenizer(corpus, *, vocab_size: int = 1024, cache=None) -> tokenizers.Tokenizer:
    """The corpus's BPE tokenizer (trained on first use); decode samples with `.decode(ids)`."""
    return _tokenizer_and_flag(corpus, vocab_size, _folder(corpus, vocab_size, cache))[0]


def _read_tokens(path: pathlib.Path, vocab: int) -> np.ndarray | None:
    """Cached ids, or None if missing or not plausibly ours (wrong dtype/shape/range)."""
    if not path.is_file():
        return None
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if ids.dtype != np.int32 or ids.ndim != 1 or ids.size == 0:
        return None
    if ids.min() < 0 or ids.max() >= vocab:
        return None
    return ids


def _read_text(corpus: pathlib.Path) -> str:
    try:
        return pathlib.Path(corpus).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = " ".join(str(err).split())
        raise DataError(f"cannot read corpus {corpus} as UTF-8 text ({reason}); "
                        "supply the original file") from None


def load_tokens(corpus: pathlib.Path, *, vocab_size: int = 1024, cache: pathlib.Path | None = None,
                verbose: bool = True) -> np.ndarray:
    """The whole corpus as int32 BPE ids [N], from the cache when possible."""
    corpus = pathlib.Path(corpus)
    folder = _folder(corpus, vocab_size, cache)
    tok, trained = _tokenizer_and_flag(corpus, vocab_size, folder)
    path = folder / TOKENS_FILE
    # Ids from an earlier tokenizer are not trusted once the tokenizer had to be retrained.
    ids = None if trained or not _intact(folder, TOKENS_FILE) \
        else _read_tokens(path, tok.get_vocab_size())
    text = _read_text(corpus) if (ids is None or verbose) else ""
    status = "cached"
    if ids is None:
        # In pieces: encoding a 30 MB corpus whole held 6 GB; the pieces' ids are the whole text's.
        parts = [np.asarray(tok.encode(piece).ids, dtype=np.int32) for piece in pieces(text)]
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        if ids.size == 0:
            raise DataError(f"corpus {corpus} is empty; supply the original file")

        def save(tmp: str) -> None:
            with open(tmp, "wb") as handle:  # a file object stops np.save appending ".npy"
                np.save(handle, ids, allow_pickle=False)

        _atomic_write(path, save)
        _record(folder, TOKENS_FILE)
        status = "trained" if trained else "encoded"
    if verbose:
        print(f"corpus: {len(text):,} chars -> {ids.size:,} tokens "
              f"({len(text) / ids.size:.2f} chars/token), BPE vocab {int(vocab_size)} [{status}]",
              flush=True)
    return ids
