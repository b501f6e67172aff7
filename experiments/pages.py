"""The results pages: docs/results/<name>.md written from committed results files, never typed.

    python -m experiments.pages --take results    # copy a cpu-preset run's results.json and PNGs into docs/results/
    python -m experiments.pages --take-smoke DIR  # the smoke preset's times, from experiments.all --preset smoke's DIR
                                                  # (programs cached; --take-smoke-first DIR: a
                                                  # first run's, from empty caches)
    python -m experiments.pages                   # write every page, the index, README's experiments table,
                                                  # the current figures in docs/performance.md and the CI legs
                                                  # (README, docs/install.md)
    python -m experiments.pages --check           # exit 1 naming each page that differs from what it would write

A page holds what ran the experiment and how long it took, the book's figures beside ours,
every claim with its measured figure and margin (and per seed), every table and figure; a
prose note from docs/results/notes/<name>.md is appended when there is one. The suite runs
`--check`, so a page edited by hand, or a results file committed without its page, is caught. A
damaged record (a results file or a CI record cut short, smoke times of another shape) is left out,
a line each naming the file and the fix, and the command exits 2 once it has written the rest.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys

from attention_jax.errors import ConfigError, DataError
from experiments.all import EXPERIMENTS, TRAINING
from experiments.harness import cli, committed, report, results_page
from experiments.harness.committed import cost

ROOT = committed.ROOT
DOCS = committed.RESULTS
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- experiments table: python -m experiments.pages -->", "<!-- end of the experiments table -->"
FIGURES = "<!-- current figures: python -m experiments.pages -->", "<!-- end of the current figures -->"
SMOKE = committed.SMOKE                 # each experiment's smoke-preset seconds (README's table, --help)
# What each CI leg ran on (docs/ci/<leg>.json, written by the leg: tools/ci_legs.py), in README and install.md.
CI = ROOT / "docs" / "ci"
INSTALL = ROOT / "docs" / "install.md"
LEGS = "<!-- ci legs: python -m experiments.pages -->", "<!-- end of the ci legs -->"
# The benchmarks whose committed cpu-preset figures docs/performance.md shows, and the tables it carries whole.
BENCHMARKS = {"throughput": ("Training step",), "generation": ("ms per token", "ours against transformers"),
              "complexity": ()}
# What a CI record must hold for its row of the legs' table.
CI_FIELDS = {"what": str, "python": str, "command": str, "pytest": str, "versions": dict}
VERSIONS = ("jax", "jaxlib", "flax", "numpy", "torch")


def names() -> list[str]:
    return [n for n in EXPERIMENTS if (DOCS / n / "results.json").is_file()]


def load(name: str) -> dict:
    return committed.load(name, DOCS)


def page(name: str, r: dict) -> str:
    """One experiment's page (see `results_page.page`), with its views and note from docs/results."""
    return results_page.page(name, r, DOCS, training=name in TRAINING)


def readable(name: str, damaged: list[str]) -> tuple[dict, str] | None:
    """(results.json, its page) of one experiment, or None with a line in `damaged` naming the file and the fix."""
    path = DOCS / name / "results.json"
    try:
        r = load(name)
        return r, page(name, r)
    except DataError as e:
        damaged.append(str(e))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:   # a field of another shape
        damaged.append(str(committed.damaged(path, f"{type(e).__name__}: {e}", committed.retake(path))))
    return None


def ci_records(damaged: list[str]) -> list[dict]:
    """The CI legs' records that hold what the table shows; each other one a line in `damaged`."""
    records = []
    for path in sorted(CI.glob("*.json")):
        fix = f"record the leg again (bash .ci/run, then cp .ci/logs/*.json docs/ci/), or {committed.restore(path)}"
        try:
            r = committed.read_json(path, fix)
            wrong = ([k for k, kind in CI_FIELDS.items() if not isinstance(r.get(k), kind)] if isinstance(r, dict)
                     else ["the record"])
            wrong += [f"versions.{v}" for v in VERSIONS if not wrong and not isinstance(r["versions"].get(v), str)]
            if wrong:
                raise committed.damaged(path, f"{', '.join(wrong)} missing or of another type", fix)
            records.append(r)
        except DataError as e:
            damaged.append(str(e))
    return records


def smoke_times(damaged: list[str]) -> committed.Smoke:
    try:
        return committed.smoke_times(SMOKE)
    except DataError as e:
        damaged.append(str(e))
        return committed.Smoke()


def take_smoke(run: pathlib.Path, damaged: list[str], *, first: bool = False) -> dict[str, float]:
    """The wall seconds of a smoke-preset run of every experiment (`experiments.all --preset smoke`,
    its --out folder, from an empty row cache) into SMOKE, for README's table and the commands'
    --help: as `first_run` (`first`: from empty caches, JAX's compiled programs and the tokenizer's
    too) or as `seconds` (the compiled programs cached), the other kept as it was; a results file
    there that cannot be read is left out, a line in `damaged` saying so."""
    seconds, cores, loads, flag = {}, set(), [], "--take-smoke-first" if first else "--take-smoke"
    for name in EXPERIMENTS:
        path, again = run / name / "results.json", f"run {name}'s smoke preset into {run} again"
        if not path.is_file():
            continue
        try:
            found = committed.read_json(path, again)
        except DataError as e:
            damaged.append(str(e))
            continue
        if not isinstance(found, dict) or found.get("preset") != "smoke":
            raise ConfigError(f"{path} is not a smoke-preset run")
        try:
            seconds[name] = round(sum(cost(found)), 1)
        except ValueError as e:
            damaged.append(str(committed.damaged(path, str(e), again)))
        cores.add(((found.get("backend") or {}).get("host") or {}).get("cores"))
        load = (found.get("time") or {}).get("load")
        loads += [load[1]] if isinstance(load, list) and len(load) == 3 else []    # its 5 minutes
    if not seconds:
        raise ConfigError(f"{flag} {run}: no smoke-preset results there; give experiments.all's "
                          "--out folder")
    kept = smoke_times([]) if SMOKE.is_file() else committed.Smoke()
    whole = {"command": "python -m experiments.all --preset smoke",
             "cores": next(iter(cores)) if len(cores) == 1 else kept.cores,
             "seconds": kept.seconds, "first_run": kept.first_run, "load": dict(kept.load)}
    whole["first_run" if first else "seconds"] = seconds
    whole["load"].pop("first_run" if first else "seconds", None)
    if loads:
        whole["load"]["first_run" if first else "seconds"] = max(loads)
    report.atomic_write(SMOKE, json.dumps(whole, indent=1) + "\n")
    return seconds


def between(text: str, markers: tuple[str, str], body: str, path: pathlib.Path) -> str:
    """`text` (the file at `path`) with what lies between its two marker lines replaced by `body`."""
    begin, end = markers
    if begin not in text or end not in text:
        raise DataError(f"{committed.shown(path)} has no {begin} ... {end} section; put the two markers back "
                        f"({committed.restore(path)})")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def build() -> tuple[dict[pathlib.Path, str], list[str]]:
    """Every generated file and what it should hold, and a line for each damaged record left out of them."""
    damaged, results, files = [], {}, {}
    for name in names():
        if (made := readable(name, damaged)) is not None:
            results[name], files[DOCS / f"{name}.md"] = made
    smoke = smoke_times(damaged)
    files[DOCS / "index.md"] = results_page.index(results, smoke)
    legs = results_page.ci_table(ci_records(damaged))
    table = results_page.experiments_table(results, smoke, link="docs/results/{name}.md")
    for path, parts in ((README, [((BEGIN, END), table), (LEGS, legs)]), (INSTALL, [(LEGS, legs)]),
                        (PERFORMANCE, [(FIGURES, results_page.performance_figures(results, BENCHMARKS))])):
        try:
            text = path.read_text(encoding="utf-8")
            for markers, body in parts:
                text = between(text, markers, body, path)
            files[path] = text
        except DataError as e:
            damaged.append(str(e))
        except OSError as e:
            damaged.append(f"{committed.shown(path)} cannot be read ({e.strerror or e}); {committed.restore(path)}")
    return files, damaged


def expected() -> dict[pathlib.Path, str]:
    """Every generated file and what it should hold; a damaged record raises its one-line DataError."""
    files, damaged = build()
    if damaged:
        raise DataError(damaged[0])
    return files


def take(run: pathlib.Path) -> list[str]:
    """Copy each experiment's results.json and PNG figures from a run's folder into docs/results/."""
    if not run.is_dir():
        raise ConfigError(f"--take {run}: no such folder; give the --out folder of a cpu-preset run")
    taken = []
    for name in EXPERIMENTS:
        source = run / name / "results.json"
        if not source.is_file():
            continue
        try:
            found = json.loads(source.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ConfigError(f"{source} is no JSON ({e.msg} at line {e.lineno}); run that experiment again") from None
        if not isinstance(found, dict) or found.get("preset") != "cpu":
            raise ConfigError(f"{source} is not a cpu-preset run; the pages show the cpu preset")
        target = DOCS / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for f in [source, *sorted(source.parent.glob("*.png")), *sorted(source.parent.glob("*.html"))]:
            shutil.copy2(f, target / f.name)
        taken.append(name)
    return taken


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.pages", description=__doc__.strip().splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("--take", metavar="FOLDER", help="first copy a cpu-preset run's results and figures from FOLDER")
    p.add_argument("--take-smoke", metavar="FOLDER", help="first record the smoke preset's times "
                   "from experiments.all --preset smoke's FOLDER, a run with the programs cached")
    p.add_argument("--take-smoke-first", metavar="FOLDER", help="the same, from a first run's "
                   "FOLDER: empty caches (ATTENTION_JAX_CACHE an empty folder, a fresh --out)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs")
    args = p.parse_args(argv)
    damaged = []
    try:
        for folder, first in ((args.take_smoke_first, True), (args.take_smoke, False)):
            if folder:
                found = take_smoke(pathlib.Path(folder), damaged, first=first)
                said = " (a first run)" if first else ""
                print(f"smoke times of {len(found)} experiments from {folder}{said}")
        if args.take:
            print(f"took {', '.join(take(pathlib.Path(args.take))) or 'nothing'} from {args.take}")
    except (ConfigError, OSError) as e:   # one line, exit 2, as every command here
        return cli.report_error(e)
    files, left_out = build()
    stale = write(files, check=args.check)
    print(f"{'checked' if args.check else 'wrote'} {len(files)} files" + (f" ({len(stale)} changed)" if stale else ""))
    for line in damaged + left_out:
        print(f"error: {line}", file=sys.stderr)
    if damaged or left_out:
        print(f"error: {len(damaged) + len(left_out)} damaged file(s) left out, each named above; the rest is written",
              file=sys.stderr)
        return cli.EXIT_USER_ERROR
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python -m experiments.pages", file=sys.stderr)
        return 1
    return 0


def write(files: dict[pathlib.Path, str], *, check: bool) -> list[str]:
    """Write each file that differs from what it should hold (none with `check`); return them, by name."""
    stale = []
    for path, text in files.items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(committed.shown(path))
        if not check:
            report.atomic_write(path, text)
    return stale


if __name__ == "__main__":
    raise SystemExit(main())
