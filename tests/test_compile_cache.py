"""harness.compile_cache: where the compiled programs are kept, that a second process loads them, and
that a damaged entry is removed and written anew instead of being warned about on every run."""
import os
import pathlib
import subprocess
import sys

import pytest

from experiments.harness import compile_cache

REPO = pathlib.Path(__file__).resolve().parents[1]
JAX_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
           "JAX_COMPILATION_CACHE_MAX_SIZE", compile_cache.ENV)


@pytest.mark.parametrize("env, expected", [
    ({}, {"jax_compilation_cache_dir": "CACHE/jax-compilation", "jax_persistent_cache_min_compile_time_secs": 0.1}),
    ({compile_cache.ENV: "0"}, {}),                                 # turned off
    ({"JAX_COMPILATION_CACHE_DIR": "/elsewhere"}, {}),              # the user's own cache: JAX reads it
    ({"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"},
     {"jax_compilation_cache_dir": "CACHE/jax-compilation"}),      # JAX's own variable wins
])
def test_the_cache_lives_in_the_cache_folder_unless_told_otherwise(monkeypatch, tmp_path, env, expected):
    for name in JAX_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTENTION_JAX_CACHE", "cache")       # relative: the child processes' cwd may differ
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cache = str(tmp_path / "cache")
    expected = {k: v.replace("CACHE", cache) if isinstance(v, str) else v for k, v in expected.items()}
    assert compile_cache.settings() == expected


@pytest.mark.slow
def test_a_folder_it_cannot_make_or_write_leaves_the_cache_off(tmp_path):
    code = f"""
import os, jax
from experiments.harness import compile_cache
os.environ["ATTENTION_JAX_CACHE"] = {str(tmp_path / "a file")!r}     # a file where the folder should be
open(os.environ["ATTENTION_JAX_CACHE"], "w").close()
made = compile_cache.enable()
os.environ["ATTENTION_JAX_CACHE"] = {str(tmp_path / "read-only")!r}
os.access = lambda path, mode: False                                 # as root, every folder is writable
written = compile_cache.enable()
print(made, written, jax.config.jax_compilation_cache_dir)
"""
    env = {k: v for k, v in os.environ.items() if k not in JAX_ENV}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["None", "None", "None"]


def test_only_a_programs_entries_that_no_longer_decompress_are_removed(tmp_path):
    from jax._src.compilation_cache import compress_executable
    whole = compress_executable(b"an executable" * 100)
    files = {"jit_step-aa-cache": whole[:10], "jit_step-aa-atime": b"t", "jit_step-bb-cache": whole,
             "jit_stepper-cc-cache": whole[:10], ".lockfile": b""}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert compile_cache.remove_damaged(str(tmp_path), "jit_step") == 1           # not bb: it still reads
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lockfile", "jit_step-bb-cache", "jit_stepper-cc-cache"]
    assert compile_cache.remove_damaged(str(tmp_path), "jit_stepper") == 1


# What an experiment's command does first (harness.experiment), then one compiled program.
PROBE = """
import jax, jax.numpy as jnp
from experiments.harness import compile_cache
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event))
folder = compile_cache.enable()
value = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.arange(4096.0).reshape(64, 64) / 4096)
import os
shared = os.environ.get("JAX_COMPILATION_CACHE_DIR") == folder     # what the processes it starts will use
print(folder, hits.count('/jax/compilation_cache/cache_hits'), float(value), shared)
"""


@pytest.mark.slow
def test_a_second_process_loads_the_programs_and_a_damaged_entry_is_replaced(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in JAX_ENV}
    env.update(ATTENTION_JAX_CACHE=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # keep fast compiles too
    folder = tmp_path / "jax-compilation"

    def run():
        done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        where, hits, value, shared = done.stdout.split()
        assert where == str(folder) and shared == "True"
        return int(hits), value, done.stderr

    hits, value, _ = run()
    assert hits == 0 and list(folder.glob("jit_*-cache"))
    hits, again, _ = run()
    assert hits >= 1 and again == value                   # the jit's program (and the eager ops') loaded
    for entry in folder.glob("*-cache"):                   # as a run killed mid-write leaves them
        entry.write_bytes(entry.read_bytes()[:100])
    hits, damaged, err = run()
    assert damaged == value and hits == 0
    assert "damaged entr" in err and "Error reading persistent compilation cache" not in err
    hits, healed, err = run()
    assert healed == value and hits >= 1 and "damaged" not in err    # written anew by the run before
