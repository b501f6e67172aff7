"""The Colab notebook: its committed .ipynb is its jupytext .py source (no drift, no outputs), and it
runs end to end on this CPU at smoke size, every cell's assert included."""

import json
import pathlib
import shutil
import time

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
SOURCE, NOTEBOOK = NOTEBOOKS / "source" / "attention_jax.py", NOTEBOOKS / "attention_jax.ipynb"


def code_cells(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def test_the_ipynb_is_its_py_source_without_outputs():
    jupytext, nbformat = pytest.importorskip("jupytext"), pytest.importorskip("nbformat")
    committed = nbformat.read(NOTEBOOK, as_version=4)
    source = jupytext.read(SOURCE)
    assert code_cells(committed) == code_cells(source), \
        "notebooks/attention_jax.ipynb drifted from its .py: run `jupytext --sync notebooks/attention_jax.ipynb`"
    assert [c.source.strip() for c in committed.cells if c.cell_type == "markdown"] == \
        [c.source.strip() for c in source.cells if c.cell_type == "markdown"]
    assert all(not c.get("outputs") and not c.get("execution_count") for c in committed.cells if c.cell_type == "code")


@pytest.mark.slow
def test_the_notebook_runs_on_cpu_at_smoke_size(tmp_path, corpus_folder, bpe_cache, smoke_ladder, smoke_tiny_gpt,
                                                monkeypatch):
    """As a user's second run: the ladder's ten smoke rows and the tiny GPT's are already in its
    results folder (trained once for the suite by conftest.smoke_ladder and smoke_tiny_gpt, whose
    runs test_ladder.py and test_inside_tiny_gpt.py check), so the notebook's cells serve them
    from the row cache, train nothing, and everything after runs on them: the checkpoint
    reopened, the heads drawn, the tiny GPT reopened and probed with the first run's figures."""
    nbclient, nbformat = pytest.importorskip("nbclient"), pytest.importorskip("nbformat")
    assert smoke_ladder["full"].code == 0, smoke_ladder["full"].stdout     # else test_ladder.py says why
    assert smoke_tiny_gpt["code"] == 0, smoke_tiny_gpt["stdout"]          # else test_inside_tiny_gpt.py says why
    # The notebook's own folder, as Jupyter, VS Code and Colab start the kernel: a module there
    # named like the package (its jupytext twin once was) would shadow attention_jax.
    here = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, here, ignore=shutil.ignore_patterns("results", ".ipynb_checkpoints"))
    assert not [p.name for p in here.glob("*.py")], "a .py beside the notebook shadows the package"
    from helpers import copy_rows
    copy_rows(smoke_ladder["folder"], here / "results" / "ladder")
    copy_rows(smoke_tiny_gpt["folder"], here / "results" / "inside_tiny_gpt")
    # The kernel inherits this environment: the corpus, a private cache, no accelerator.
    monkeypatch.setenv("ATTENTION_JAX_DATA", str(corpus_folder))
    monkeypatch.setenv("ATTENTION_JAX_CACHE", str(bpe_cache))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    # The same persistent compilation cache as the tests (conftest.py): the ladder's smoke programs are reused.
    import jax
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", jax.config.jax_compilation_cache_dir)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # As the suite's own processes, the kernel lowers many programs in one MLIR context (helpers.py):
    # a first cell of the test's, with no output, that changes the time and nothing the notebook sees.
    from helpers import mlir_prelude
    nb.cells.insert(0, nbformat.v4.new_code_cell(mlir_prelude()))
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(here)}}
                            ).execute()
    seconds = time.perf_counter() - t0
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)          # the figures showed inline
    assert any("text/markdown" in o.get("data", {}) for o in outputs)      # the ladder's table and claims
    ladder_rows = json.loads((here / "results" / "ladder" / "results.json").read_text())["rows"]
    assert len(ladder_rows) == 10 and all(r["cached"] for r in ladder_rows)     # the same row keys as the CLI's
    # The tiny GPT reopened from its row cache: the same checkpoint, so the first run's figures to the last digit.
    first, again = smoke_tiny_gpt["results"], json.loads((here / "results" / "inside_tiny_gpt" / "results.json").read_text())
    assert again["record"]["cached"] is True and first["record"]["cached"] is False
    assert any("reopened from the row cache" in o.get("text", "") for o in outputs)
    assert [(r["bpc"], r["acc"]) for r in again["rows"]] == [(r["bpc"], r["acc"]) for r in first["rows"]]
    assert seconds < 240, f"the notebook took {seconds:.0f} s"
