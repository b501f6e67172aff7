"""Find the tiny-shakespeare corpus, verify it byte for byte, and fetch it when allowed.

Every experiment's numbers are compared with the book's, so a silently different corpus
(a truncated download, another edition) would make every comparison meaningless. That is
why every copy, wherever it comes from, is checked against one sha256 before use.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import urllib.error
import urllib.request

from attention_jax.errors import DataError

CORPUS_NAME = "tinyshakespeare.txt"
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
CORPUS_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

DATA_ENV = "ATTENTION_JAX_DATA"
CACHE_ENV = "ATTENTION_JAX_CACHE"
DOWNLOAD_TIMEOUT_S = 30.0


def _one_line(text: object) -> str:
    """Collapse whitespace so an OS or network message cannot break the one-line rule."""
    return " ".join(str(text).split())


def _cache_location() -> pathlib.Path:
    """Where the cache lives, without creating it (error hints must not touch the disk).

    $ATTENTION_JAX_CACHE wins so tests and shared machines can redirect it; otherwise the
    XDG convention, which is also what Colab and most Linux laptops expect.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "attention_jax"


def cache_dir() -> pathlib.Path:
    """The per-user cache folder, created on demand."""
    folder = _cache_location()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(
            f"cannot create cache folder {folder} ({_one_line(err)}); "
            f"set {CACHE_ENV}=FOLDER to a writable folder"
        ) from None
    return folder


def sha256_file(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in chunks so a wrong multi-GB path cannot exhaust memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _ways() -> str:
    """The three ways to supply the corpus, naming the exact cache path to drop it at."""
    return (
        f"pass --data PATH, set {DATA_ENV}=FOLDER (a folder holding {CORPUS_NAME}), "
        f"or place it at {_cache_location() / CORPUS_NAME}"
    )


def _verified(path: pathlib.Path) -> pathlib.Path:
    try:
        actual = sha256_file(path)
    except OSError as err:
        raise DataError(f"cannot read corpus {path} ({_one_line(err)}); {_ways()}") from None
    if actual != CORPUS_SHA256:
        raise DataError(
            f"corpus {path} is corrupt or a different file: sha256 {actual}, expected "
            f"{CORPUS_SHA256}; provide a good copy: {_ways()}"
        )
    return path


def _download(target: pathlib.Path) -> pathlib.Path:
    """Fetch CORPUS_URL into `target`, verifying before the file becomes visible.

    The bytes go to a temp file in the same folder and are renamed only after the hash
    matches, so an interrupted or tampered download never masquerades as the cache.
    """
    print(f"downloading {CORPUS_URL} -> {target}", flush=True)
    try:
        with urllib.request.urlopen(CORPUS_URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
            payload = response.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = _one_line(getattr(err, "reason", err))
        raise DataError(
            f"{CORPUS_NAME} not found and the download failed ({reason}); "
            f"{_ways()} (or connect to the internet)"
        ) from None
    actual = hashlib.sha256(payload).hexdigest()
    if actual != CORPUS_SHA256:
        raise DataError(
            f"downloaded {CORPUS_URL} has sha256 {actual}, expected {CORPUS_SHA256}; "
            f"provide a good copy: {_ways()}"
        )
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".corpus-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, target)
    except OSError as err:
        raise DataError(f"cannot write {target} ({_one_line(err)}); {_ways()}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def resolve_corpus(path: str | os.PathLike | None = None, *, download: bool = True) -> pathlib.Path:
    """Locate a verified corpus: explicit path, then $ATTENTION_JAX_DATA, then cache, then web.

    A location the user named (argument or environment) that holds no corpus is an error
    rather than a fall-through, so a typo never quietly trains on some other copy.
    """
    if path is not None:
        given = pathlib.Path(path).expanduser()
        candidate = given / CORPUS_NAME if given.is_dir() else given
        if not candidate.is_file():
            raise DataError(f"corpus not found at {candidate} (the path given); fix it, or {_ways()}")
        return _verified(candidate)
    folder = os.environ.get(DATA_ENV)
    if folder:
        candidate = pathlib.Path(folder).expanduser() / CORPUS_NAME
        if not candidate.is_file():
            raise DataError(f"{DATA_ENV}={folder} holds no {CORPUS_NAME}; fix it, or {_ways()}")
        return _verified(candidate)
    cached = cache_dir() / CORPUS_NAME
    if cached.is_file():
        return _verified(cached)
    if not download:
        raise DataError(f"{CORPUS_NAME} not found and downloading is off; {_ways()} (or connect to the internet)")
    return _download(cached)
