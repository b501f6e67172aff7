"""attention_jax.data.corpus: where the corpus comes from (argument, environment, cache, download),
its hash checked, downloads verified before they land and bounded in time and size, and the
cache folder's precedence.

A small synthetic corpus (helpers.SMALL, its hash patched in as the expected one) keeps this
fast. The cache always lives in tmp_path, never in $HOME; the network is refused unless a test
serves the file itself on 127.0.0.1.
"""

import contextlib
import hashlib
import http.server
import io
import pathlib
import threading
import time

import pytest

import attention_jax.data as data
from attention_jax.data import corpus as corpus_mod
from attention_jax.errors import DataError

from helpers import REAL_URLOPEN as _REAL_URLOPEN, SMALL, SMALL_SHA, isolate_data, put


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Fresh cache, no data env var, the synthetic corpus's hash expected, no network."""
    isolate_data(tmp_path, monkeypatch)
    return tmp_path


def assert_three_ways(err: DataError, cache_path: pathlib.Path) -> None:
    message = str(err)
    assert "\n" not in message  # one line: the CLI prints it alone
    assert "pass its path to resolve_corpus" in message and "ATTENTION_JAX_DATA=PATH" in message
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


def test_the_variable_takes_the_file_itself_as_the_path_does(tmp_path, monkeypatch):
    """ATTENTION_JAX_DATA set to tinyshakespeare.txt itself was refused ("holds no
    tinyshakespeare.txt") while resolve_corpus(FILE) and --data FILE took it: one meaning for a
    data path, file or folder."""
    env = put(tmp_path / "env")
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(env))
    assert data.resolve_corpus() == env
    renamed = env.rename(tmp_path / "env" / "shakespeare.txt")    # the file may have any name
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(renamed))
    assert data.resolve_corpus() == renamed
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(tmp_path / "env" / "gone.txt"))
    with pytest.raises(DataError, match="holds no tinyshakespeare.txt .neither the file nor a "
                                        "folder holding it.; fix it"):
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
