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
    from experiments.harness import results_page
    r = {"name": "ladder", "preset": "cpu", "claims": [],
         "backend": {"backend": "cpu", "device_count": 1, "device_kinds": ["cpu"], "jax": "0", "jaxlib": "0",
                     "flax": "0", "plugins": {}, "host": {"model": "x", "cores": 2, "bf16_units": []}},
         "time": {"wall_s": 30.0, "load": [0.5, 3.5, 2.0]},
         "rows": [{"seconds": 400.0, "cached": True}, {"seconds": 60.0, "cached": False},
                  {"runs": {"a": {"seconds": 200.0, "cached": True}, "b": {"seconds": 9.0, "cached": False}}}]}
    assert pages.cost(r) == (30.0, 600.0)       # nested records (a row holding a pair of runs) count too
    table = results_page.experiments_table({"ladder": r}, pages.committed.Smoke(), link="{name}.md")
    assert " 10 min |" in table
    text = pages.page("ladder", r)
    assert "30 s wall and 10 min of training in rows taken from its row cache" in text
    assert "load average was 3.5 on 2 cores" in text


def test_robustness_says_where_each_claim_was_checked_and_how_often_it_held():
    from experiments.harness import results_page as pages
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
    the current figures (at most 155, its generated tables each a blank line apart): neither keeps a
    history of runs (git log does), so no dates."""
    import re
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b")
    for name, most in (("CONTRIBUTING.md", 120), ("docs/performance.md", 155)):
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


def test_no_two_tables_in_the_docs_run_together():
    """A table right after another, with no blank line between, is read as one: the second one's header
    becomes a row (docs/performance.md's two generation tables were one)."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    rule = re.compile(r"^\|[-:| ]+\|$")
    joined = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").splitlines()
        joined += [f"{page.relative_to(ROOT)}:{i + 1}" for i, line in enumerate(lines)
                   if rule.match(line) and i >= 2 and lines[i - 2].startswith("|")]
    assert joined == []


def _docs_with_damage(tmp_path, monkeypatch):
    """A copy of two experiments' committed results, one cut short; a CI record cut short and one without
    its versions; smoke times of another shape; README, install.md and performance.md with their markers."""
    from experiments import pages
    docs, ci = tmp_path / "results", tmp_path / "ci"
    for name in ("averaging", "scaling"):
        shutil.copytree(ROOT / "docs" / "results" / name, docs / name)
    text = (docs / "scaling" / "results.json").read_text()
    (docs / "scaling" / "results.json").write_text(text[: len(text) // 2])
    ci.mkdir()
    good = json.loads((ROOT / "docs" / "ci" / "whole_suite.json").read_text())
    (ci / "whole_suite.json").write_text(json.dumps(good))
    (ci / "newest_jax.json").write_text(json.dumps({k: v for k, v in good.items() if k != "versions"}))
    (ci / "cut.json").write_text('{"leg": "x", ')
    (docs / "smoke_times.json").write_text('{"seconds": [3.0, 2.8]}')
    for attr, markers in (("README", [(pages.BEGIN, pages.END), pages.LEGS]), ("INSTALL", [pages.LEGS]),
                          ("PERFORMANCE", [pages.FIGURES])):
        path = tmp_path / f"{attr.lower()}.md"
        path.write_text("x\n" + "".join(f"{a}\n{b}\n" for a, b in markers))
        monkeypatch.setattr(pages, attr, path)
    monkeypatch.setattr(pages, "DOCS", docs)
    monkeypatch.setattr(pages, "CI", ci)
    monkeypatch.setattr(pages, "SMOKE", docs / "smoke_times.json")
    return docs, ci


def test_a_damaged_record_is_left_out_of_the_pages_in_one_line_each_and_the_rest_written(tmp_path, monkeypatch,
                                                                                          capsys):
    """A results file or a CI record cut short gave a JSONDecodeError traceback; a record missing a field, a
    KeyError. Now: each named with its fix in one line, the rest written, exit 2."""
    from experiments import pages
    docs, ci = _docs_with_damage(tmp_path, monkeypatch)
    assert pages.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    named = {str(docs / "scaling" / "results.json"): "--take FOLDER", str(ci / "newest_jax.json"): "bash .ci/run",
             str(ci / "cut.json"): "bash .ci/run", str(docs / "smoke_times.json"): "--take-smoke FOLDER"}
    for path, fix in named.items():
        assert [line for line in err if line.startswith(f"error: {path} is damaged (") and fix in line], (path, err)
    assert err[-1] == "error: 4 damaged file(s) left out, each named above; the rest is written"
    assert (docs / "averaging.md").is_file() and not (docs / "scaling.md").exists()
    index = (docs / "index.md").read_text()
    assert "experiments.averaging" in index and "experiments.scaling" not in index
    assert "Python 3.11, the whole suite" in pages.README.read_text()          # the intact CI record, shown


def test_take_smoke_says_which_results_it_left_out(tmp_path, monkeypatch, capsys):
    """It skipped a results file it could not read without a word; now one line each, and exit 2."""
    from experiments import pages
    run = tmp_path / "run"
    for name, text in (("averaging", json.dumps({"preset": "smoke", "claims": [], "time": {"wall_s": 3.0}})),
                       ("scaling", '{"preset": "smoke", "time": ')):
        (run / name).mkdir(parents=True)
        (run / name / "results.json").write_text(text)
    monkeypatch.setattr(pages, "SMOKE", tmp_path / "smoke_times.json")
    assert pages.main(["--take-smoke", str(run), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"error: {run / 'scaling' / 'results.json'} is damaged (" in err and "Traceback" not in err
    assert json.loads((tmp_path / "smoke_times.json").read_text())["seconds"] == {"averaging": 3.0}


def test_the_smoke_columns_hold_a_first_run_and_a_cached_one(tmp_path, monkeypatch):
    """README's smoke column assumed the compiled programs cached, though a first run takes several
    times as long: --take-smoke-first keeps a first run's times beside --take-smoke's (each leaves
    the other), and the table shows both, with a last row of every table added up that says when
    the runs shared the machine with other work."""
    from experiments import pages
    from experiments.harness import committed, results_page
    for folder, wall, load in (("first", 30.0, 6.5), ("cached", 9.0, 1.0)):
        (tmp_path / folder / "averaging").mkdir(parents=True)
        run = {"preset": "smoke", "claims": [], "time": {"wall_s": wall, "load": [7.0, load, 2.0]},
               "backend": {"host": {"cores": 2}}}
        (tmp_path / folder / "averaging" / "results.json").write_text(json.dumps(run))
    monkeypatch.setattr(pages, "SMOKE", tmp_path / "smoke_times.json")
    assert pages.take_smoke(tmp_path / "cached", []) == {"averaging": 9.0}
    assert pages.take_smoke(tmp_path / "first", [], first=True) == {"averaging": 30.0}
    smoke = committed.smoke_times(tmp_path / "smoke_times.json")
    assert (smoke.seconds, smoke.first_run, smoke.cores) == ({"averaging": 9.0},
                                                              {"averaging": 30.0}, 2)
    assert smoke.load == {"first_run": 6.5, "seconds": 1.0}       # the 5-minute load of each run
    r = {"preset": "cpu", "claims": [{"claim": "x", "passed": True}], "time": {"wall_s": 4.0}}
    table = results_page.experiments_table({"averaging": r}, smoke, link="{name}.md")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    assert cells[0][2:5] == ["smoke, first run", "smoke, cached", "cpu preset, 2 cores"]
    assert cells[2][2:] == ["30 s", "9 s", "4 s", "1 of 1"]
    assert cells[3][:2] == ["`experiments.all`", "every table above, one after another, its runs "
                            "beside other work (load average 6.5 and 1.0 on 2 cores)"]
