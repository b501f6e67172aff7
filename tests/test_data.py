"""Data layer: corpus resolution and checks, BPE cache, batches and eval windows.

A small synthetic corpus (its hash patched in as the expected one) keeps this fast; only
the token count needs the real file. The cache always lives in tmp_path, never in $HOME.
"""

import contextlib
import hashlib
import http.server
import io
import os
import pathlib
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import attention_jax.data as data
from attention_jax.data import corpus as corpus_mod
from attention_jax.data import tokenizer as tok_mod
from attention_jax.errors import DataError

# Read before any fixture edits the environment; CI sets a path relative to the repo.
_REPO = pathlib.Path(__file__).resolve().parents[1]
_CANDIDATES = [_REPO / os.environ.get("ATTENTION_JAX_DATA", "."), _REPO.parent / "shared" / "data"]
REAL = next((p / data.CORPUS_NAME for p in _CANDIDATES if (p / data.CORPUS_NAME).is_file()), None)

# The real urlopen, saved before the autouse fixture replaces it with one that refuses.
_REAL_URLOPEN = urllib.request.urlopen

WORDS = "to be or not that is the question whether tis nobler in mind suffer slings".split()
SMALL = "\n".join(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(9)) for i in range(400)) + "\n"
SMALL_SHA = hashlib.sha256(SMALL.encode()).hexdigest()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Fresh cache, no data env var, the synthetic corpus's hash expected, no network."""
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTENTION_JAX_DATA", raising=False)
    monkeypatch.setattr(corpus_mod, "CORPUS_SHA256", SMALL_SHA)
    monkeypatch.setattr(corpus_mod.urllib.request, "urlopen", refuse(urllib.error.URLError("unreachable")))
    return tmp_path


def refuse(exc: Exception):
    """A stand-in that fails if called: for the network, and for the BPE trainer."""
    def raiser(*args, **kwargs):
        raise exc
    return raiser


def put(folder: pathlib.Path, text: str = SMALL) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / data.CORPUS_NAME
    path.write_text(text, encoding="utf-8")
    return path


def assert_three_ways(err: DataError, cache_path: pathlib.Path) -> None:
    message = str(err)
    assert "\n" not in message  # one line: the CLI prints it alone
    assert "--data PATH" in message and "ATTENTION_JAX_DATA=FOLDER" in message
    assert str(cache_path) in message


def test_precedence_explicit_then_env_then_cache(tmp_path, monkeypatch):
    cached = put(data.cache_dir())
    assert data.resolve_corpus() == cached
    env = put(tmp_path / "env")
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(env.parent))
    assert data.resolve_corpus() == env
    explicit = put(tmp_path / "mine")
    assert data.resolve_corpus(explicit) == explicit
    assert data.resolve_corpus(str(explicit.parent)) == explicit  # a folder works too
    # A named place without a corpus is an error, though good copies exist elsewhere.
    with pytest.raises(DataError, match="not found at"):
        data.resolve_corpus(tmp_path / "typo.txt")
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="holds no"):
        data.resolve_corpus()


def test_wrong_hash_names_file_hashes_and_fixes(tmp_path):
    bad = put(tmp_path / "bad", SMALL + "tampered\n")
    with pytest.raises(DataError) as info:
        data.resolve_corpus(bad)
    message = str(info.value)
    assert str(bad) in message and SMALL_SHA in message
    assert hashlib.sha256(bad.read_bytes()).hexdigest() in message
    assert_three_ways(info.value, data.cache_dir() / data.CORPUS_NAME)


@pytest.mark.parametrize("download", [False, True])
def test_missing_everywhere_offline(download):
    with pytest.raises(DataError) as info:
        data.resolve_corpus(download=download)
    assert_three_ways(info.value, data.cache_dir() / data.CORPUS_NAME)
    assert "internet" in str(info.value)
    assert not list(data.cache_dir().iterdir())  # no partial download left behind


@pytest.mark.parametrize("good", [True, False])
def test_download_is_verified_before_it_lands(monkeypatch, good):
    payload = SMALL.encode() if good else b"an error page"
    monkeypatch.setattr(corpus_mod.urllib.request, "urlopen", lambda url, timeout: io.BytesIO(payload))
    target = data.cache_dir() / data.CORPUS_NAME
    if good:
        assert data.resolve_corpus() == target and target.read_bytes() == payload
        return
    with pytest.raises(DataError, match="expected"):
        data.resolve_corpus()
    assert not list(data.cache_dir().iterdir())  # a bad payload never becomes the cache


@contextlib.contextmanager
def local_server(payload: bytes, *, pause_s: float = 0.0, piece: int = 1 << 16):
    """An HTTP server on 127.0.0.1 that sends `payload` in `piece`-byte bits, `pause_s` apart.

    With a short pause and piece=1 it is the trickling server no per-read timeout ever
    catches. Yields its URL; the handler stops writing as soon as the block exits.
    """
    done = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's naming)
            if not self.path.endswith(data.CORPUS_NAME):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            try:
                for start in range(0, len(payload), piece):
                    if done.wait(pause_s):
                        return
                    self.wfile.write(payload[start:start + piece])
                    self.wfile.flush()
            except OSError:  # the client gave up: exactly what the deadline should do
                pass

        def log_message(self, *args):  # keep pytest's output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{data.CORPUS_NAME}"
    finally:
        done.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def real_network(monkeypatch):
    """Undo the autouse fixture's refusal, and keep any proxy away from 127.0.0.1."""
    monkeypatch.setattr(corpus_mod.urllib.request, "urlopen", _REAL_URLOPEN)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def test_download_from_a_real_http_server_lands_verified(monkeypatch, real_network):
    with local_server(SMALL.encode(), piece=1000) as url:
        monkeypatch.setattr(corpus_mod, "CORPUS_URL", url)
        target = data.cache_dir() / data.CORPUS_NAME
        assert data.resolve_corpus() == target and target.read_text() == SMALL


def test_a_trickling_server_ends_at_the_total_deadline_with_one_line(monkeypatch, real_network):
    # A byte every 0.1 s: every read succeeds long before urllib's per-read timeout would
    # fire, so only a deadline on the whole download can end it.
    monkeypatch.setattr(corpus_mod, "DOWNLOAD_TIMEOUT_S", 1.0)
    with local_server(SMALL.encode(), pause_s=0.1, piece=1) as url:
        monkeypatch.setattr(corpus_mod, "CORPUS_URL", url)
        start = time.monotonic()
        with pytest.raises(DataError) as info:
            data.resolve_corpus()
        elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 3.0, elapsed
    assert "did not finish within 1 s" in str(info.value)
    assert_three_ways(info.value, data.cache_dir() / data.CORPUS_NAME)
    assert not list(data.cache_dir().iterdir())  # nothing partial left in the cache


def test_an_oversized_answer_is_refused_before_it_fills_memory(monkeypatch, real_network):
    monkeypatch.setattr(corpus_mod, "DOWNLOAD_MAX_BYTES", 4096)
    with local_server(b"x" * 100_000, piece=1024) as url:
        monkeypatch.setattr(corpus_mod, "CORPUS_URL", url)
        with pytest.raises(DataError, match="more than 4096 bytes") as info:
            data.resolve_corpus()
    assert_three_ways(info.value, data.cache_dir() / data.CORPUS_NAME)
    assert not list(data.cache_dir().iterdir())


@pytest.mark.parametrize("url, reason", [("{server}/moved.txt", "HTTP Error 404: Not Found"),
                                         ("http://127.0.0.1:bad/", "nonnumeric port"),
                                         ("notascheme://x", "unknown url type")],
                         ids=["404", "malformed-port", "unknown-scheme"])
def test_a_failed_or_malformed_request_is_one_line(monkeypatch, real_network, url, reason):
    with local_server(b"") as server:
        monkeypatch.setattr(corpus_mod, "CORPUS_URL", url.format(server=server.rsplit("/", 1)[0]))
        with pytest.raises(DataError, match=f"download failed \\({reason}") as info:
            data.resolve_corpus()
    assert_three_ways(info.value, data.cache_dir() / data.CORPUS_NAME)
    assert not list(data.cache_dir().iterdir())


def test_cache_dir_precedence(tmp_path, monkeypatch):
    assert data.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
    monkeypatch.delenv("ATTENTION_JAX_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.cache_dir() == tmp_path / "xdg" / "attention_jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data.cache_dir() == tmp_path / "home" / ".cache" / "attention_jax"


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


@pytest.mark.skipif(REAL is None, reason="real corpus not available")
def test_real_corpus_token_count(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(corpus_mod, "CORPUS_SHA256", data.CORPUS_SHA256)
    ids = data.load_tokens(data.resolve_corpus(REAL), vocab_size=1024, cache=tmp_path / "tok")
    assert len(ids) == 459_792 and ids.max() < 1024
    assert "1,115,394 chars -> 459,792 tokens (2.43 chars/token), BPE vocab 1024" in capsys.readouterr().out


def test_split_and_batches_are_deterministic():
    tokens = np.arange(1000, dtype=np.int32)
    train, val = data.train_val_split(tokens)
    assert len(train) == 900 and train[-1] + 1 == val[0] and len(val) == 100
    x, y = data.get_batch(train, seed=3, step=7, batch_size=8, context=16)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    np.testing.assert_array_equal(y[:, -1], x[:, -1] + 1)  # y is the next token
    np.testing.assert_array_equal(x, data.get_batch(train, seed=3, step=7, batch_size=8, context=16)[0])
    assert not np.array_equal(x, data.get_batch(train, seed=3, step=8, batch_size=8, context=16)[0])
    assert not np.array_equal(x, data.get_batch(train, seed=4, step=7, batch_size=8, context=16)[0])
    with pytest.raises(DataError):
        data.get_batch(tokens[:10], seed=0, step=0, batch_size=2, context=10)


def test_eval_windows_tile_without_overlap():
    tokens = np.arange(1003, dtype=np.int32)
    x, y = data.eval_windows(tokens, 100)
    assert x.shape == y.shape == (10, 100)
    np.testing.assert_array_equal(x.ravel(), tokens[:1000])  # contiguous, no overlap, no gap
    np.testing.assert_array_equal(y.ravel(), tokens[1:1001])
    sx, sy = data.eval_windows(tokens, 100, max_windows=4)
    np.testing.assert_array_equal(sx[:, 0], [0, 200, 500, 700])  # evenly spaced, distinct
    np.testing.assert_array_equal(sy, sx + 1)
    np.testing.assert_array_equal(data.eval_windows(tokens, 100, max_windows=50)[0], x)
