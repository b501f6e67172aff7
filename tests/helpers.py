"""What several test files share: the smoke-sized training setup (test_train_engine, _loop,
_checkpoints), the synthetic corpus of the data tests (test_data_corpus, _tokenizer), and
`copy_rows`, which starts a table's folder from another run's trained rows, and
`hlo_computations`, a compiled program's computations (test_decoding_loops, test_decoding_layout),
and `discovery_case`, the circuit tests' model and texts.

Not a test file: plain functions and constants, imported as `helpers` (pytest puts tests/ on
sys.path). Fixtures stay in the files that use them, or in conftest.py.
"""
from __future__ import annotations

import hashlib
import pathlib
import re
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.data import CORPUS_NAME
from attention_jax.train import Engine, ProgramCache, fit, text_task

# -- training: a 1-block model of width 32 on random tokens --------------------------------

V, T = 64, 16
MC = ModelConfig(vocab_size=V, context=T, d_model=32, n_heads=2)

TC = TrainConfig(steps=8, batch_size=8, lr=1e-2, checkpoint_every=3, log_every=2,
                 train_eval_windows=16, eval_batch=16)
_rng = np.random.default_rng(0)
TRAIN = _rng.integers(0, V, 4096).astype(np.int32)
VAL = _rng.integers(0, V, 40 * T + 1).astype(np.int32)   # 40 windows: 16 + 16 + a ragged 8


# The suite's compiled programs: every engine a test builds with `new_engine` shares them with the
# others of its configuration in this worker (attention_jax.train.ProgramCache), as the lab's rows do.
PROGRAMS = ProgramCache(maxsize=64)


def new_engine(model_config=MC, train_config=TC, *, n_seeds=1, **kw) -> Engine:
    return Engine(model_config, train_config, n_seeds=n_seeds, programs=PROGRAMS, **kw)


def engines():
    """engine(model_config, n_seeds) -> an Engine on the suite's smoke TrainConfig (programs shared)."""
    return lambda model_config=MC, n_seeds=1: new_engine(model_config, TC, n_seeds=n_seeds)


def task(tc=TC):
    return text_task(TRAIN, VAL, batch_size=tc.batch_size, context=T, train_eval_windows=tc.train_eval_windows)


def run(model_config=MC, train_config=TC, *, engine=None, seeds=(0,), **kw):
    engine = engine or new_engine(model_config, train_config, n_seeds=len(seeds))
    return fit(engine, task(train_config), seeds=seeds, progress=False, **kw)


def batch(eng, seeds=(0,), step=0):
    return eng.shard([task().sample(s, step) for s in seeds])


@nnx.jit
def decode_step(model, x):
    """A model decoding (`kv_cache.cached` swapped in): the next tokens' logits, its clock moved on, compiled."""
    from attention_jax.decoding.kv_cache import Cached
    return Cached.resume(model)(x)


@nnx.jit
def forward(model, x):
    """The model's logits, compiled: one program per model structure and shape, where an eager call
    compiles each of its operations. One function for the suite, so tests share its programs."""
    return model(x)


def leaves(state) -> list[tuple[str, np.ndarray]]:
    """(path, array) for every leaf; typed PRNG keys as their raw key data."""
    out = []
    for path, a in jax.tree_util.tree_leaves_with_path(state):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a = jax.random.key_data(a)
        out.append((jax.tree_util.keystr(path), np.asarray(a)))
    return out


def assert_same_state(got, want):
    got, want = leaves(got), leaves(want)
    assert [p for p, _ in got] == [p for p, _ in want]
    for (path, a), (_, b) in zip(got, want):
        np.testing.assert_array_equal(a, b, err_msg=path)


def killed_after(real, n: int):
    """`real`, booby-trapped: its n-th call finishes, then a Ctrl-C lands (the step's output lost)."""
    calls = []

    def killed(*args):
        calls.append(1)
        out = real(*args)
        if len(calls) == n:
            raise KeyboardInterrupt
        return out
    return killed


def one_line(err: Exception) -> str:
    message = str(err)
    assert "\n" not in message, message  # the CLI prints it alone
    return message


def saved_steps(workdir: pathlib.Path) -> list[int]:
    """The steps orbax holds in workdir/checkpoints, ascending."""
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


# -- data: a small synthetic corpus, its hash patched in as the expected one -----------------

WORDS = "to be or not that is the question whether tis nobler in mind suffer slings".split()
SMALL = "\n".join(" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(9)) for i in range(400)) + "\n"
SMALL_SHA = hashlib.sha256(SMALL.encode()).hexdigest()

# The real urlopen, saved before any fixture replaces it with one that refuses.
REAL_URLOPEN = urllib.request.urlopen


def refuse(exc: Exception):
    """A stand-in that fails if called: for the network, and for the BPE trainer."""
    def raiser(*args, **kwargs):
        raise exc
    return raiser


def put(folder: pathlib.Path, text: str = SMALL) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CORPUS_NAME
    path.write_text(text, encoding="utf-8")
    return path


def isolate_data(tmp_path: pathlib.Path, monkeypatch) -> None:
    """Fresh cache, no data env var, the synthetic corpus's hash expected, no network."""
    import urllib.error
    from attention_jax.data import corpus as corpus_mod
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTENTION_JAX_DATA", raising=False)
    monkeypatch.setattr(corpus_mod, "CORPUS_SHA256", SMALL_SHA)
    monkeypatch.setattr(corpus_mod.urllib.request, "urlopen", refuse(urllib.error.URLError("unreachable")))


def smoke_ladder(out: pathlib.Path, cache: pathlib.Path, data: pathlib.Path, *flags) -> list[dict]:
    """`python -m experiments.ladder --preset smoke FLAGS --out OUT` on the test corpus and BPE cache
    (the environment put back after): its results.json's rows; a run that fails fails the test."""
    import contextlib
    import io
    import json
    import pytest
    from experiments import ladder
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(err):
        mp.setenv("ATTENTION_JAX_CACHE", str(cache))
        mp.setenv("ATTENTION_JAX_DATA", str(data))
        code = ladder.main(["--preset", "smoke", "--no-progress", *flags, "--out", str(out)])
    assert code == 0, err.getvalue()
    return json.loads((out / "ladder" / "results.json").read_text())["rows"]


def copy_rows(src: pathlib.Path, dst: pathlib.Path) -> None:
    """A table's trained rows (records and checkpoints) from the results folder `src` into `dst`,
    as a user's second run finds them: its rows are served from the row cache."""
    import shutil
    for part in ("rows", "runs"):
        shutil.copytree(pathlib.Path(src) / part, pathlib.Path(dst) / part)


# -- speed: one MLIR context for many programs ------------------------------------------------

MLIR_CONTEXT_USES = 256    # programs lowered in one MLIR context before a fresh one (bounds what it keeps)


def share_mlir_contexts(uses: int = MLIR_CONTEXT_USES) -> None:
    """JAX lowers each program in a fresh MLIR context, and making one (loading its dialects) is a
    good part of what a single eager op costs on a CPU, where most of the suite's programs are eager
    ops (CONTRIBUTING.md has the figures, tools/eager_op_cost.py measures them). From here on, each
    thread of this process lowers `uses` programs in one context. The programs' text is the same, so
    the same compiled code and compilation-cache keys. For the tests' processes only, never the
    library; without `mlir.make_ir_context` (another JAX) nothing changes but the time."""
    import threading
    from jax._src.interpreters import mlir
    make = getattr(mlir, "make_ir_context", None)
    if make is None or getattr(make, "shared", False):
        return
    local = threading.local()

    def shared():
        if getattr(local, "uses", uses) >= uses:
            local.context, local.uses = make(), 0
        local.uses += 1
        return local.context
    shared.shared = True
    mlir.make_ir_context = shared


def mlir_prelude() -> str:
    """A line to put first in a script a test runs in a process of its own: the same sharing there
    (its sys.path left as it was)."""
    here = str(pathlib.Path(__file__).resolve().parent)
    return (f"import sys; sys.path.insert(0, {here!r}); from helpers import share_mlir_contexts; "
            "share_mlir_contexts(); sys.path.pop(0)\n")


# -- the oracles: torch, transformers, TransformerLens (the lab's, experiments/transformer_lens_ref.py) --

ORACLE_MISSING = ("{} is not installed: the test oracles (torch, transformers, TransformerLens, "
                  "tracr) come with the test extra: pip install -e '.[test]' --extra-index-url "
                  "https://download.pytorch.org/whl/cpu (docs/install.md; CI's Python 3.12 leg "
                  "runs without them on purpose)")


def oracle(name: str):
    """The oracle module `name`, imported; the test skips, naming it, where it is not installed."""
    import pytest
    return pytest.importorskip(name, reason=ORACLE_MISSING.format(name))


from experiments.transformer_lens_ref import random_gpt2 as tiny_gpt2, bridge as tl_bridge  # noqa: E402,F401


def gpt2_texts(folder):
    """The oracles' case: a tiny random GPT-2 (ours, and the transformers model), a clean batch [2, 10] and
    a corrupted one with one token changed; skips, naming it, where an oracle is not installed."""
    import numpy as np
    oracle("torch"), oracle("transformers"), oracle("transformer_lens")
    ours, hf = tiny_gpt2(folder)
    clean = np.random.default_rng(2).integers(0, 101, (2, 10))
    corrupted = clean.copy()
    corrupted[:, 4] = (corrupted[:, 4] + 31) % 101
    return ours, hf, clean, corrupted


def hlo_computations(hlo: str) -> tuple[dict[str, str], set[str]]:
    """A compiled program's text (`.compile().as_text()`) as ({computation name: its body, the entry's
    under "ENTRY"}, the names of the fused computations)."""
    bodies = dict(re.findall(r"\n(%[\w.\-]+) [^\n]*\{\n(.*?)\n\}", "\n" + hlo, re.S))
    bodies["ENTRY"] = hlo[hlo.index("ENTRY"):]
    return bodies, set(re.findall(r"kind=k\w+, calls=(%[\w.\-]+)", hlo))


# -- circuit discovery: a 2-block model of two heads, biases on, pre- or post-norm ------------------

def discovery_case(norm: str):
    """(model, clean, corrupted, metric): test_analysis_discovery, _pruning and _faithfulness's texts."""
    from attention_jax.analysis.patching import normalized_logit_diff
    from attention_jax.model import LanguageModel
    cfg = ModelConfig(vocab_size=23, context=8, d_model=16, n_heads=2, n_layers=2, mixer="heads", qkv_bias=True,
                      bias=True, norm=norm)
    model = LanguageModel(cfg, rngs=nnx.Rngs(3))
    clean = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]])
    corrupted = np.array([[1, 2, 9, 4, 5, 6, 7, 8], [3, 1, 4, 1, 7, 9, 2, 6]])
    return model, clean, corrupted, normalized_logit_diff(model, clean, corrupted, 5, 6)
