"""Find the tiny-shakespeare corpus, verify it byte for byte, and fetch it when allowed.

Every experiment's numbers are compared with the book's, so a silently different corpus
(a truncated download, another edition) would make every comparison meaningless. That is
why every copy, wherever it comes from, is checked against one sha256 before use.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import pathlib
import tempfile
import threading
import urllib.error
import urllib.request

from attention_jax.errors import DataError

CORPUS_NAME = "tinyshakespeare.txt"
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
CORPUS_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"

DATA_ENV = "ATTENTION_JAX_DATA"
CACHE_ENV = "ATTENTION_JAX_CACHE"
# The whole download, name lookup and connection included, must end within this many
# seconds: urllib's own timeout bounds each socket operation only, so a server trickling a
# byte every few seconds would never trip it (and the name lookup ignores it altogether).
DOWNLOAD_TIMEOUT_S = 60.0
# The corpus is 1.1 MB; an answer far larger is not it, and must not fill memory or disk.
DOWNLOAD_MAX_BYTES = 8 * 1024 * 1024
_DOWNLOAD_CHUNK = 64 * 1024


def _one_line(text: object) -> str:
    """Collapse whitespace so an OS or network message cannot break the one-line rule."""
    return " ".join(str(text).split())


def cache_location() -> pathlib.Path:
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
    folder = cache_location()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(
            f"cannot create cache folder {folder} ({_one_line(err)}); "
            f"set {CACHE_ENV}=FOLDER to a writable folder"
        ) from None
    return folder


def new_file(folder: pathlib.Path, prefix: str) -> tuple[int, str]:
    """A temporary file beside its final name (renamed over it when written), readable as any file
    this user creates (umask permitting): mkstemp's own 0600 would hide shared
    results from others."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    mask = os.umask(0)
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)
    return fd, tmp


def sha256_file(path: pathlib.Path) -> str:
    """Hex sha256 of a file, read in chunks so a wrong multi-GB path cannot exhaust memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# How a caller hands the corpus over; a command line puts its own flag in these words' place.
GIVE_PATH = "pass its path to resolve_corpus"


def _ways() -> str:
    """The three ways to supply the corpus, naming the exact cache path to drop it at."""
    return (
        f"{GIVE_PATH}, set {DATA_ENV}=PATH ({CORPUS_NAME} or a folder holding it), "
        f"or place it at {cache_location() / CORPUS_NAME}"
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


class _DownloadFailed(Exception):
    """A download that ended without a payload, carrying the one-line reason."""


# What a bad network or server can raise (ValueError: a malformed URL or header).
_NETWORK_ERRORS = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


def _fetch(url: str, deadline_s: float, max_bytes: int) -> bytes:
    """GET `url` into memory, all of it within `deadline_s` seconds and `max_bytes` bytes.

    The transfer runs in a daemon thread that the caller waits on for at most
    `deadline_s`: only that bounds the total time, since urllib's timeout restarts with
    every byte received and name resolution does not honour it. A transfer still running
    at the deadline is told to stop and abandoned; it holds only memory, never a file, and
    its socket closes at the next chunk or after `deadline_s` of silence at worst.
    """
    outcome: dict = {}
    stop = threading.Event()

    def transfer():
        try:
            with urllib.request.urlopen(url, timeout=deadline_s) as response:
                # read1 returns whatever has arrived, so `stop` is seen after each trickle.
                read = getattr(response, "read1", response.read)
                chunks, size = [], 0
                while not stop.is_set():
                    chunk = read(_DOWNLOAD_CHUNK)
                    if not chunk:
                        outcome["payload"] = b"".join(chunks)
                        return
                    size += len(chunk)
                    if size > max_bytes:
                        raise _DownloadFailed(f"the server sent more than {max_bytes} bytes; "
                                              "the corpus is about 1.1 MB")
                    chunks.append(chunk)
        except Exception as err:  # noqa: BLE001  (handed to the caller, which re-raises it)
            outcome["error"] = err

    worker = threading.Thread(target=transfer, name="corpus-download", daemon=True)
    worker.start()
    try:
        worker.join(deadline_s)
    finally:  # the deadline, or Ctrl-C while waiting: either way the transfer is over
        stop.set()
    if worker.is_alive():
        raise _DownloadFailed(f"it did not finish within {deadline_s:g} s")
    if "payload" in outcome:
        return outcome["payload"]
    err = outcome.get("error")
    if err is None:
        raise _DownloadFailed("the transfer stopped without an answer")
    if isinstance(err, _DownloadFailed):
        raise err
    if isinstance(err, _NETWORK_ERRORS):  # an HTTPError's reason alone drops the status code
        reason = err if isinstance(err, urllib.error.HTTPError) else getattr(err, "reason", err)
        raise _DownloadFailed(_one_line(reason)) from None
    raise err  # a bug, not the network: keep its traceback


def _download(target: pathlib.Path) -> pathlib.Path:
    """Fetch CORPUS_URL into `target`, verifying before the file becomes visible.

    The bytes go to a temp file in the same folder and are renamed only after the hash
    matches, so an interrupted or tampered download never masquerades as the cache. The
    whole fetch has one deadline (DOWNLOAD_TIMEOUT_S) and one size cap
    (DOWNLOAD_MAX_BYTES), so a stalled, trickling or endless server ends in the same
    one-line DataError as no network at all.
    """
    print(f"downloading {CORPUS_URL} -> {target}", flush=True)
    try:
        payload = _fetch(CORPUS_URL, DOWNLOAD_TIMEOUT_S, DOWNLOAD_MAX_BYTES)
    except _DownloadFailed as err:
        raise DataError(
            f"{CORPUS_NAME} not found and the download failed ({_one_line(err)}); "
            f"{_ways()} (or connect to the internet)"
        ) from None
    actual = hashlib.sha256(payload).hexdigest()
    if actual != CORPUS_SHA256:
        raise DataError(
            f"downloaded {CORPUS_URL} has sha256 {actual}, expected {CORPUS_SHA256}; "
            f"provide a good copy: {_ways()}"
        )
    fd, tmp = new_file(target.parent, ".corpus-")
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


def _named(path: str | os.PathLike) -> pathlib.Path:
    """A path the user named for the corpus, the file itself or a folder holding it: the file."""
    given = pathlib.Path(path).expanduser()
    return given / CORPUS_NAME if given.is_dir() else given


def resolve_corpus(path: str | os.PathLike | None = None, *, download: bool = True) -> pathlib.Path:
    """Locate a verified corpus: explicit path, then $ATTENTION_JAX_DATA, then cache, then web.

    The path and the variable mean the same: the corpus file itself, or a folder holding it.
    A location the user named (argument or environment) that holds no corpus is an error
    rather than a fall-through, so a typo never quietly trains on some other copy.
    """
    if path is not None:
        candidate = _named(path)
        if not candidate.is_file():
            raise DataError(f"corpus not found at {candidate} (the path given): no such file; give "
                            f"the path of {CORPUS_NAME}, or of a folder holding it")
        return _verified(candidate)
    named = os.environ.get(DATA_ENV)
    if named:
        candidate = _named(named)
        if not candidate.is_file():
            raise DataError(f"{DATA_ENV}={named} holds no {CORPUS_NAME} (neither the file nor a "
                            f"folder holding it); fix it, or {_ways()}")
        return _verified(candidate)
    cached = cache_dir() / CORPUS_NAME
    if cached.is_file():
        return _verified(cached)
    if not download:
        raise DataError(f"{CORPUS_NAME} not found and downloading is off; {_ways()} (or connect "
                        "to the internet)")
    return _download(cached)
