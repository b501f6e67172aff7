"""The docs hold: every Python block in README and docs/ runs as written, every results page is what
its results file makes, and the site builds with mkdocs --strict."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(path: pathlib.Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


WITH_CODE = [p for p in PAGES if blocks(p)]


def test_the_pages_with_python_blocks_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in WITH_CODE}
    assert {"README.md", "docs/library.md"} <= names


@pytest.mark.slow
def test_every_python_block_runs_as_written(tmp_path, corpus_folder, bpe_cache):
    """Each block alone, in a fresh namespace (self-contained: it builds or loads what it uses), each
    page from an empty folder of its own (what it writes, results/, lands there); one process for
    all pages, so the imports and the programs two pages share are paid once."""
    from helpers import mlir_prelude   # the suite's processes share MLIR contexts: speed only, nothing a block sees
    runner = (mlir_prelude() + "import json, os, sys, traceback\n"
              "for page, codes in json.loads(sys.argv[1]):\n"
              "    folder = os.path.join(sys.argv[2], page.replace('/', '_'))\n"
              "    os.makedirs(folder)\n"
              "    os.chdir(folder)\n"
              "    for i, code in enumerate(codes):\n"
              "        try:\n"
              "            exec(compile(code, f'{page} block {i + 1}', 'exec'), {'__name__': '__main__'})\n"
              "        except BaseException:\n"
              "            traceback.print_exc()\n"
              "            sys.exit(f'{page}: block {i + 1} failed')\n")
    pages = [[p.relative_to(ROOT).as_posix(), blocks(p)] for p in WITH_CODE]
    env = {**os.environ, "ATTENTION_JAX_DATA": str(corpus_folder), "ATTENTION_JAX_CACHE": str(bpe_cache),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", runner, json.dumps(pages), str(tmp_path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]


def test_every_results_page_is_what_its_results_file_makes():
    from experiments import pages
    assert pages.names(), "no committed results under docs/results"
    stale = [path.relative_to(ROOT).as_posix() for path, text in pages.expected().items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    assert stale == [], "run python -m experiments.pages"


def test_a_page_changed_by_hand_is_caught(tmp_path, monkeypatch):
    from experiments import pages
    name = pages.names()[0]
    monkeypatch.setattr(pages, "DOCS", tmp_path)
    shutil.copytree(ROOT / "docs" / "results" / name, tmp_path / name)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{pages.BEGIN}\n{pages.END}\n{pages.LEGS[0]}\n{pages.LEGS[1]}\n")
    monkeypatch.setattr(pages, "README", readme)
    install = tmp_path / "install.md"
    install.write_text(f"z\n{pages.LEGS[0]}\n{pages.LEGS[1]}\n")
    monkeypatch.setattr(pages, "INSTALL", install)
    performance = tmp_path / "performance.md"
    performance.write_text(f"y\n{pages.FIGURES[0]}\n{pages.FIGURES[1]}\n")
    monkeypatch.setattr(pages, "PERFORMANCE", performance)
    assert pages.main([]) == 0 and pages.main(["--check"]) == 0
    page = tmp_path / f"{name}.md"
    page.write_text(page.read_text().replace("PASS", "FAIL", 1))
    assert pages.main(["--check"]) == 1


def test_a_table_rerun_over_its_row_cache_counts_the_cached_rows_training():
    from experiments import pages
    r = {"name": "ladder", "preset": "cpu", "claims": [],
         "backend": {"backend": "cpu", "device_count": 1, "device_kinds": ["cpu"], "jax": "0", "jaxlib": "0",
                     "flax": "0", "plugins": {}, "host": {"model": "x", "cores": 2, "bf16_units": []}},
         "time": {"wall_s": 30.0, "load": [0.5, 3.5, 2.0]},
         "rows": [{"seconds": 400.0, "cached": True}, {"seconds": 60.0, "cached": False},
                  {"runs": {"a": {"seconds": 200.0, "cached": True}, "b": {"seconds": 9.0, "cached": False}}}]}
    assert pages.cost(r) == (30.0, 600.0)       # nested records (a row holding a pair of runs) count too
    assert " 10 min |" in pages.experiments_table({"ladder": r}, link="{name}.md")
    text = pages.page("ladder", r)
    assert "30 s wall and 10 min of training in rows taken from its row cache" in text
    assert "load average was 3.5 on 2 cores" in text


def test_robustness_says_where_each_claim_was_checked_and_how_often_it_held():
    from experiments import pages
    once = {"claim": "a", "passed": True, "margin": 0.5}
    seeded = {"claim": "b", "passed": True, "margin": 0.2,
              "seeds": {"held": 2, "of": 3, "smallest_margin": -0.1}}
    undecided = {"claim": "c", "passed": True, "margin": 1.0, "decided": False}
    assert pages.robustness({"claims": [once, seeded, undecided]}) == [
        {"claim": "a", "where": "one run", "held": "1 of 1", "least": 0.5},
        {"claim": "b", "where": "3 seeds", "held": "2 of 3", "least": -0.1}]
    pools = [{"claims": [dict(once, margin=m, passed=m > 0)]} for m in (0.5, -0.3, 0.1)]
    assert pages.command("winograd", {"preset": "cpu", "pools": pools, "config": {"seeds": [0, 1]}}) == \
        "python -m experiments.winograd --preset cpu --seeds 2 --pools 3"
    assert pages.robustness({"claims": [once], "pools": pools}) == [
        {"claim": "a", "where": "3 word pools x 1 seed(s)", "held": "2 of 3", "least": -0.3}]


@pytest.mark.skipif(shutil.which("mkdocs") is None and not (pathlib.Path(sys.executable).parent / "mkdocs").exists(),
                    reason="mkdocs is not installed (pip install -e '.[test]')")
def test_the_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs") or str(pathlib.Path(sys.executable).parent / "mkdocs")
    out = subprocess.run([mkdocs, "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "results" / "index.html").is_file()


def test_the_guide_and_the_performance_page_are_short_and_undated():
    """CONTRIBUTING.md is a guide (at most 120 lines), docs/performance.md what is measured, how, and
    the current figures (at most 150): neither keeps a history of runs (git log does), so no dates."""
    import re
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    for name, most in (("CONTRIBUTING.md", 120), ("docs/performance.md", 150)):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert len(text.splitlines()) <= most, name
        assert not date.findall(text), (name, date.findall(text))


def test_taking_a_damaged_or_missing_run_is_one_line(tmp_path, capsys):
    """A damaged results.json gave a 22-line JSONDecodeError; a folder that is not there, "took nothing", exit 0."""
    from experiments import pages
    assert pages.main(["--take", str(tmp_path / "no-such"), "--check"]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "run" / "ladder").mkdir(parents=True)
    (tmp_path / "run" / "ladder" / "results.json").write_text('{"name": "ladder", ')
    assert pages.main(["--take", str(tmp_path / "run"), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is no JSON" in err


def test_the_experiments_page_lists_every_experiment_all_runs():
    from experiments.all import EXPERIMENTS
    page = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    assert [n for n in EXPERIMENTS if f"| `experiments.{n}` |" not in page] == []


def test_every_table_in_the_docs_ends_before_the_text_after_it():
    """A table with no blank line after it takes the next paragraph in as a row (library.md's hook table
    swallowed the `ablate` paragraph)."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    unclosed = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        unclosed += [f"{page.relative_to(ROOT)}:{i + 2}" for i, line in enumerate(lines[:-1])
                     if line.startswith("|") and lines[i + 1].strip() and not lines[i + 1].startswith(("|", "<!--"))]
    assert unclosed == []
