"""Shared fixtures: a seeded numpy generator, and `parity`, which checks a max |diff| against
torch and lists every measured value at the end of the run (the numbers the closing note cites)."""

import contextlib
import dataclasses
import gc
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import typing

import numpy as np
import pytest

from attention_jax.data import CORPUS_NAME

_PARITY = pytest.StashKey[list]()
_REPO = pathlib.Path(__file__).resolve().parents[1]
# Read at import, before any fixture edits the environment; CI sets a path relative to the repo.
# As the library reads it: tinyshakespeare.txt itself, or a folder holding it.
_NAMED = _REPO / os.environ.get("ATTENTION_JAX_DATA", ".")
_CORPUS = next((p for p in (_NAMED.parent if _NAMED.is_file() else _NAMED,
                            _REPO.parent / "shared" / "data") if (p / CORPUS_NAME).is_file()), None)


# What the suite's time goes to on a CPU is XLA compiling (about half of it from a cold cache),
# not running: the smoke programs are tiny. Two settings, both through the environment so that
# the processes tests start (the notebook's kernel, the multi-process and throughput workers)
# share them:
# - a persistent compilation cache, so each program compiles once per machine, whichever test
#   or process meets it first. It lives in $ATTENTION_JAX_CACHE (CI: .cache) or the temp
#   folder, never in the user's cache.
# - LLVM optimisation level 0 for XLA's CPU code: compiling costs about a quarter less and the
#   smoke programs run hardly slower. It changes code generation, not the computation: every
#   figure the tests pin is the same at level 3 (the default, which users get).
# - XLA's older loop emitters rather than its MLIR fusion emitters: most of the ~2,500
#   programs a cold run compiles are single eager ops (46 ms each with the MLIR emitters, 26
#   ms without, measured on 480 of them); the test files heaviest in eager ops went from 240
#   to 200 CPU seconds from a cold cache. This one can round an op differently: the test that
#   pins a bit-for-bit identity compiles its two programs with the default emitters
#   (test_train_engine.DEFAULT_CODEGEN); the figures pinned within a tolerance hold either way.
# Both are asked of the installed XLA first (`known_xla_flags`): XLA aborts the process at its first
# compile on a flag it does not know, and jax >= 0.11's XLA has only the fusion emitters.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def _xla_accepts(flags: str) -> bool:
    """Whether a process with XLA_FLAGS=`flags` compiles and runs a program (it aborts on an unknown flag)."""
    code = "import jax; jax.jit(lambda x: x + 1)(1).block_until_ready()"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION")} | \
        {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120).returncode == 0


def known_xla_flags(flags: str, root: str) -> str:
    """The flags of `flags` that the installed XLA knows, each tried in a child process once per jaxlib
    version (the answers kept in `root`/xla_flags.json): probed, not assumed from a version number."""
    import importlib.metadata
    path = pathlib.Path(root) / "xla_flags.json"
    key = f"jaxlib {importlib.metadata.version('jaxlib')}: {flags}"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known.get(key), str):
        known[key] = flags if _xla_accepts(flags) else " ".join(f for f in flags.split() if _xla_accepts(f))
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(known, indent=1))
    return known[key]


def pytest_configure(config):
    if not _controller(config):
        gc.disable()        # until the test files are collected: the garbage collector's note below
    root = os.environ.get("ATTENTION_JAX_CACHE") or os.path.join(tempfile.gettempdir(), "attention_jax-tests")
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.abspath(root), "jax-compilation"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):   # set once, by xdist's controller
        flags = known_xla_flags(TEST_XLA_FLAGS, root)
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    # This process's config too if jax was imported before this hook (a plugin); else jax reads the
    # variables above when it is imported. Not importing it here spares xdist's controller, which
    # runs no test, the 1.5 s import before it starts the workers. XLA reads XLA_FLAGS when the
    # backend starts, after this.
    if "jax" in sys.modules:
        import jax
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# Python's full garbage collections walk every object alive, and a worker's heap (jax, flax, torch,
# the test modules, then jax's caches) grows to millions of them: each full collection took up to a
# second, tens of seconds a worker (CONTRIBUTING: tools/gc_time.py). Frozen objects are skipped by
# the cyclic collector (reference counting still frees them), so: no collection while the test
# files are imported, that heap frozen, and after each test file what survives a collection frozen.
def _controller(config) -> bool:
    """xdist's controller: it runs no test and collects nothing, so it keeps Python's default."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_collection_finish(session):
    if not _controller(session.config):
        gc.freeze()
        gc.enable()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if nextitem is None or nextitem.path != item.path:     # the file's fixtures are torn down by now
        if memory_maps() > MAPS_KEPT:
            import jax
            jax.clear_caches()
        gc.collect()
        gc.freeze()


# XLA maps each program it compiles for the CPU into the process (about three memory maps a
# program) and JAX keeps every program it compiled. A worker of a cold whole-suite run compiles
# some 20,000, past the kernel's limit on maps (vm.max_map_count, 65,530 by default): the next map
# fails and XLA crashes the worker (a segfault while serializing a program, seen in CI). So between
# files a worker past a third of the limit drops JAX's compiled programs; the persistent
# compilation cache gives them back without compiling.
def _max_map_count() -> int:
    try:
        return int(pathlib.Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530


MAPS_KEPT = _max_map_count() // 3


def memory_maps() -> int:
    """This process's memory maps (0 where /proc is not there: macOS, Windows)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


@pytest.fixture(scope="session", autouse=True)
def shared_mlir_context():
    """Each worker lowers many programs in one MLIR context (helpers.share_mlir_contexts says why)."""
    from helpers import share_mlir_contexts
    share_mlir_contexts()


# Heaviest first, so that two workers finish together: xdist hands whole files (--dist loadfile)
# to whichever worker is free, in this order (the scheduler below keeps it; xdist's own sorts
# files by their number of tests, which left the notebook's, two tests, among the last). The order is
# by each file's seconds in a whole cold run on 2 loaded cores (junit.xml at bbae2a4; a file sent
# to another's worker, SAME_WORKER_AS, counts with it: the notebook, ladder and tiny GPT 182 s,
# then 68, 65, 62 (positions, all, analysis), 59, 56, 54, 52, 51, 49, 42, 41, 31, 28, 27, 22, 21, 14,
# 13, 12); the files left out take less. In the fast tier (-m "not slow") the library's files
# among them are what is left to balance.
HEAVY_FIRST = ("test_notebook.py", "test_ladder.py", "test_inside_tiny_gpt.py", "test_accelerators.py", "test_norms.py",
               "test_decoding_generate_cached.py", "test_positions.py", "test_all.py", "test_experiments_analysis.py",
               "test_train_engine.py", "test_speed_swap.py", "test_train_loop.py", "test_throughput.py", "test_docs.py",
               "test_winograd.py", "test_train_distributed.py", "test_scale_ablation.py", "test_rows.py",
               "test_functional.py", "test_pretrained.py", "test_model.py", "test_damage.py", "test_decoding_generate.py",
               "test_compile_cache.py", "test_complexity.py", "test_analysis_inspect.py", "test_speed_dense.py", "test_speed_forms.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # stable: file order kept otherwise


# Files that start from another file's session fixture go to that file's worker, so the fixture
# is computed once: the notebook's test reuses the smoke ladder's trained rows (smoke_ladder)
# and the smoke tiny GPT's (smoke_tiny_gpt, whose first run test_inside_tiny_gpt.py checks);
# experiments.all's smoke report starts from the positions table's rows (smoke_positions), and
# its report of averaging, scaling and params (smoke_analysis) is what test_experiments_analysis reads.
# (xdist's own `--dist loadgroup` cannot do this with pytest >= 9.2: it renames item ids that
# pytest no longer reads.)
SAME_WORKER_AS = {"tests/test_notebook.py": "tests/test_ladder.py", "tests/test_inside_tiny_gpt.py": "tests/test_ladder.py",
                  "tests/test_all.py": "tests/test_positions.py",
                  "tests/test_experiments_analysis.py": "tests/test_positions.py"}


@pytest.hookimpl(optionalhook=True)          # a hook of pytest-xdist: ignored without it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` in HEAVY_FIRST order, with the files of SAME_WORKER_AS sent to one worker as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    config.option.loadscopereorder = False       # keep the collection's order (HEAVY_FIRST)
    from xdist.scheduler import LoadFileScheduling

    class LoadFileTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SAME_WORKER_AS.get(scope, scope)
    return LoadFileTogether(config, log)


@pytest.fixture(scope="session")
def corpus_folder() -> pathlib.Path:
    """The folder holding tiny-shakespeare (CI: ../shared/data); tests that need it skip without it."""
    if _CORPUS is None:
        pytest.skip("tiny-shakespeare not found: set ATTENTION_JAX_DATA to tinyshakespeare.txt "
                    "or a folder holding it")
    return _CORPUS.absolute()


@pytest.fixture(scope="session")
def bpe_cache(tmp_path_factory) -> pathlib.Path:
    """One BPE cache for the whole session (training the BPE costs seconds), never $HOME's."""
    return tmp_path_factory.getbasetemp() / "attention_jax_cache"


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, corpus_folder, bpe_cache):
    """`smoke_run(module, *flags)`: an experiment's command at the smoke preset in a fresh folder, on
    the test corpus and BPE cache: (exit status, stdout, its results folder, results.json)."""
    def run(module, *flags):
        name = module.EXPERIMENT.name
        out = tmp_path_factory.mktemp(f"{name}_out")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))
            mp.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                code = module.main(["--preset", "smoke", "--no-progress", "--out", str(out), *flags])
        folder = out / name
        return code, buffer.getvalue(), folder, json.loads((folder / "results.json").read_text())
    return run


@pytest.fixture(scope="session")
def smoke_positions(smoke_run):
    """`python -m experiments.positions --preset smoke` once for the suite: (exit status, stdout,
    results folder, results.json). test_positions.py checks it; test_all.py starts from its rows."""
    from experiments import positions
    return smoke_run(positions)


@contextlib.contextmanager
def keeping_figures():
    """Inside: every Result that `report.publish` writes keeps its matplotlib Figures here,
    {experiment name: {file name: Figure}}, for tests that look at them after the run."""
    from experiments.harness import report
    kept, real_publish = {}, report.publish

    def publish(folder, result, **kw):
        kept.setdefault(result.name, {}).update(result.figures)
        return real_publish(folder, result, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report, "publish", publish)
        yield kept


class AnalysisRun(typing.NamedTuple):
    code: int                   # experiments.all's exit status
    folder: pathlib.Path        # its report (REPORT-<tables>.md) and one folder per table
    figures: dict               # {table: {file name: matplotlib Figure}}


@pytest.fixture(scope="session")
def smoke_analysis(tmp_path_factory) -> AnalysisRun:
    """`python -m experiments.all --preset smoke --only averaging,scaling,params` once for the suite.
    test_all.py checks the report, test_experiments_analysis.py each table's figures."""
    from experiments import all as everything
    out = tmp_path_factory.mktemp("analysis_out")
    with keeping_figures() as figures, contextlib.redirect_stdout(io.StringIO()):
        code = everything.main(["--preset", "smoke", "--only", "averaging,scaling,params", "--out", str(out)])
    return AnalysisRun(code, out, figures)


@dataclasses.dataclass
class LadderRun:
    code: int
    stdout: str
    seconds: float
    results: dict | None
    trained: list[str]      # row names with a checkpoint folder after this run

    def printed_rows(self) -> dict[str, str]:
        """name -> its line in the per-row progress output."""
        from experiments import ladder
        names = [row.name for row in ladder.ROWS]
        return {line.split()[0]: line for line in self.stdout.splitlines()
                if line.startswith("  ") and line.split()[0] in names}


@pytest.fixture(scope="session")
def smoke_ladder(tmp_path_factory, corpus_folder, bpe_cache) -> dict:
    """The smoke ladder trained once for the suite, as a user would run it, into one folder:
    `--rows heads,no_context` (trains those two), the full ladder (trains the other eight,
    reuses the two), the full ladder again (trains nothing). {"subset", "full", "again": a
    LadderRun; "folder": the results folder}. test_ladder.py checks these runs; the notebook's
    test starts from their trained rows. Both files run on one xdist worker (SAME_WORKER_AS),
    so the rows are trained once."""
    from experiments import ladder
    out = tmp_path_factory.mktemp("ladder_out")
    folder = out / "ladder"
    done = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))
        mp.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
        for name, extra in [("subset", ["--rows", "heads,no_context"]), ("full", []), ("again", [])]:
            buffer, t0 = io.StringIO(), time.perf_counter()
            with contextlib.redirect_stdout(buffer):
                code = ladder.main(["--preset", "smoke", "--no-progress", "--out", str(out), *extra])
            seconds = time.perf_counter() - t0
            results = json.loads((folder / "results.json").read_text()) if code == 0 else None
            trained = sorted(p.name.rsplit("-", 1)[0] for p in (folder / "runs").iterdir()) \
                if (folder / "runs").is_dir() else []
            done[name] = LadderRun(code, buffer.getvalue(), seconds, results, trained)
    done["folder"] = folder
    return done


@pytest.fixture(scope="session")
def smoke_tiny_gpt(tmp_path_factory) -> dict:
    """`python -m experiments.inside_tiny_gpt --preset smoke` once for the suite: {"code", "stdout",
    "results", "folder", "figures": name -> the matplotlib Figure it published}. Its checks are
    test_inside_tiny_gpt.py's; the notebook's test reruns it from these rows (it must train nothing)."""
    from experiments import inside_tiny_gpt
    out = tmp_path_factory.mktemp("tiny_gpt_out")
    buffer = io.StringIO()
    with keeping_figures() as kept, contextlib.redirect_stdout(buffer):
        code = inside_tiny_gpt.main(["--preset", "smoke", "--no-progress", "--out", str(out)])
    figures = kept.get(inside_tiny_gpt.NAME, {})
    folder = out / inside_tiny_gpt.NAME
    results = json.loads((folder / "results.json").read_text()) if code == 0 else None
    return {"code": code, "stdout": buffer.getvalue(), "results": results, "folder": folder, "figures": figures}


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def parity(request):
    rows = request.config.stash.setdefault(_PARITY, [])

    def check(name, ours, theirs, atol=1e-5):
        as_np = lambda x: np.asarray(x.detach() if hasattr(x, "detach") else x, np.float64)
        diff = float(np.max(np.abs(as_np(ours) - as_np(theirs))))
        rows.append((name, diff))
        assert diff <= atol, f"{name}: max |diff| {diff:.3g} > {atol:g}"
        return diff

    return check


def pytest_terminal_summary(terminalreporter, config):
    rows = config.stash.get(_PARITY, [])
    if rows:
        terminalreporter.section("parity with torch: measured max |diff|")
        for name, diff in rows:
            terminalreporter.write_line(f"{diff:9.2e}  {name}")


@pytest.fixture
def private_cache(tmp_path_factory, monkeypatch):
    """A cache folder of the test session's own: the user's is never touched."""
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "attention_jax_cache"))


@pytest.fixture(scope="module")
def engine():
    """engine(model_config, n_seeds) -> an Engine on helpers.TC (its compiled programs shared)."""
    from helpers import engines
    return engines()


@pytest.fixture
def cudnn():
    """As if cuDNN were installed: JAX's version check (`check_cudnn_version`) is the one thing that
    tracing cuDNN's attention asks the CUDA plugin, so with it answered a program that calls cuDNN
    lowers for cuda from this CPU (it cannot run here). Undone after the test, with what
    `forms.cudnn_refusal` learned meanwhile."""
    from jax._src.cudnn import fused_attention_stablehlo
    from attention_jax.speed import forms
    forms.cudnn_refusal.cache_clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)   # cuDNN 9.10
        yield
    forms.cudnn_refusal.cache_clear()


@pytest.fixture(scope="session")
def torch():
    """PyTorch, the oracle of the parity tests; the test skips, saying why, where it is not installed."""
    from helpers import oracle
    torch = oracle("torch")
    torch.set_num_threads(1)
    return torch


@pytest.fixture
def without_torch(monkeypatch):
    """torch hidden from import for one test (`import torch` raises ImportError, as on the base install).
    The lab's twin module, if first imported meanwhile, holds torch's absence: it is put back after, as it
    was before the test, so the parity tests after it still find their twins."""
    import experiments
    kept = sys.modules.get("experiments.torch_ref"), vars(experiments).get("torch_ref")
    monkeypatch.setitem(sys.modules, "torch", None)
    yield
    sys.modules.pop("experiments.torch_ref", None), vars(experiments).pop("torch_ref", None)
    if kept[0] is not None:
        sys.modules["experiments.torch_ref"], experiments.torch_ref = kept
