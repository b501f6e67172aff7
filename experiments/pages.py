"""The results pages: docs/results/<name>.md written from committed results files, never typed.

    python -m experiments.pages --take results    # copy a cpu-preset run's results.json and PNGs into docs/results/
    python -m experiments.pages --take-smoke DIR  # the smoke preset's times, from experiments.all --preset smoke's DIR
    python -m experiments.pages                   # write every page, the index, README's experiments table,
                                                  # the current figures in docs/performance.md and the CI legs
                                                  # (README, docs/install.md)
    python -m experiments.pages --check           # exit 1 naming each page that differs from what it would write

A page holds what ran the experiment and how long it took, the book's figures beside ours,
every claim with its measured figure and margin (and per seed), every table and figure; a
prose note from docs/results/notes/<name>.md is appended when there is one. The suite runs
`--check`, so a page edited by hand, or a results file committed without its page, is caught.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import shutil
import sys

from attention_jax.errors import ConfigError
from experiments.harness import cli, report

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "results"
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- experiments table: python -m experiments.pages -->", "<!-- end of the experiments table -->"
FIGURES = "<!-- current figures: python -m experiments.pages -->", "<!-- end of the current figures -->"
SMOKE = DOCS / "smoke_times.json"      # each experiment's smoke-preset seconds (README's table, --help)
# What each CI leg ran on (docs/ci/<leg>.json, written by the leg: tools/ci_legs.py), in README and install.md.
CI = ROOT / "docs" / "ci"
INSTALL = ROOT / "docs" / "install.md"
LEGS = "<!-- ci legs: python -m experiments.pages -->", "<!-- end of the ci legs -->"
# The benchmarks whose committed cpu-preset figures docs/performance.md shows, and the tables it carries whole.
BENCHMARKS = {"throughput": ("Training step",), "generation": ("ms per token", "ours against transformers"),
              "complexity": ()}


def names() -> list[str]:
    from experiments.all import EXPERIMENTS
    return [n for n in EXPERIMENTS if (DOCS / n / "results.json").is_file()]


def load(name: str) -> dict:
    return json.loads((DOCS / name / "results.json").read_text(encoding="utf-8"))


def summary(name: str) -> str:
    """What the experiment regenerates: the first line of its module's docstring."""
    return (importlib.import_module(f"experiments.{name}").__doc__ or name).strip().splitlines()[0].rstrip(".")


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def cost(r: dict) -> tuple[float | None, float]:
    """(the run's wall seconds, the training seconds of the rows it took from the row cache).

    A table rerun over its cached rows takes seconds; what it costs from an empty cache is both."""
    def trained(x) -> float:      # a row's record, or a table row holding records (scale_ablation's pairs)
        if isinstance(x, dict):
            if "cached" in x and "seconds" in x:
                return (x["seconds"] or 0.0) if x["cached"] else 0.0
            return sum(trained(v) for v in x.values())
        return sum(trained(v) for v in x) if isinstance(x, list) else 0.0
    return r.get("time", {}).get("wall_s"), trained(r.get("rows", []))


def _took(r: dict) -> str:
    wall, cached = cost(r)
    if wall is None:
        return ""
    said = f", {_minutes(wall)} wall"
    if cached:
        said += f" and {_minutes(cached)} of training in rows taken from its row cache (trained earlier on this machine)"
    load, cores = r.get("time", {}).get("load"), (r.get("backend", {}).get("host") or {}).get("cores")
    if load and cores and load[1] > cores:   # the 5-minute load average at the end of the run
        said += f"; the machine's load average was {load[1]:.1f} on {cores} cores, so these are a shared machine's times"
    return said


def _claim(c: dict) -> str:
    margin = f" (margin {c['margin']:.3g})" if c.get("margin") is not None else ""
    return f"- **{report.verdict(c)}** {report.claim_text(c, markdown=True)}{margin}"


def command(name: str, r: dict) -> str:
    """The command that made a results file, as far as the file tells: preset, seeds, word pools."""
    seeds = len((r.get("config") or {}).get("seeds") or [0])
    return (f"python -m experiments.{name} --preset {r['preset']}" + (f" --seeds {seeds}" if seeds > 1 else "")
            + (f" --pools {len(r['pools'])}" if r.get("pools") else ""))


def robustness(r: dict) -> list[dict]:
    """A row per claim: where it was checked (one run, seeds, word pools x seeds), how often it held, the least margin."""
    pools, rows = r.get("pools") or [], []
    for j, c in enumerate(r["claims"]):
        if not c.get("decided", True):
            continue
        held, of, least = report.held_across([p["claims"][j] for p in pools] if pools else [c])
        where = (f"{len(pools)} word pools x {of // len(pools)} seed(s)" if pools else
                 f"{of} seeds" if c.get("seeds") else "one run")
        rows.append({"claim": c["claim"], "where": where, "held": f"{held} of {of}", "least": least})
    return rows


def page(name: str, r: dict) -> str:
    """One experiment's page, from its results.json alone (and its note, when there is one)."""
    md = [f"# {name}: {summary(name)}", "",
          f"`{command(name, r)}`: {report.tally(r['claims'])}. "
          "Generated by `python -m experiments.pages` from "
          f"[`{name}/results.json`]({name}/results.json); do not edit by hand.", ""]
    if r.get("backend"):
        from experiments.harness.platform import describe_backend
        md += [f"Ran on `{describe_backend(r['backend'])}`{_took(r)}.", ""]
    if r.get("book"):
        md += ["## The book's figures beside ours", "",
               report.format_table([("what", "figure", ""), ("book", "book", ""), ("ours", "ours", "")], r["book"]),
               ""]
    md += ["## Claims", ""] + [_claim(c) for c in r["claims"]] + [""]
    from experiments.all import TRAINING
    if r["claims"] and (name in TRAINING or any(c.get("seeds") for c in r["claims"])):   # seeds apply
        md += ["## Robustness", "", "Where each claim was checked, in how many of those checks it held, and its "
               "smallest margin (in the claim's own unit). A claim checked once has only its margin to go on: "
               "`--seeds N` checks it per seed" + (", `--pools K` on other words" if name == "winograd" else "") + ".",
               "", report.format_table([("claim", "claim", ""), ("where", "checked on", ""), ("held", "held in", ""),
                                        ("least", "smallest margin", ".3g")], robustness(r)), ""]
    for title, table in r.get("tables", {}).items():      # written safe by format_table; a file edited since too
        md += [f"## {report.safe(title)}", "", report.escape(table), ""]
    for fig in r.get("figures", []):
        md += [f"![{name}: {fig}]({name}/{fig})", ""]
    for view in sorted(p.name for p in (DOCS / name).glob("*.html")):
        md += [f"The attention viewer, interactive (hover a token, click a pattern): [{view}]({name}/{view})", ""]
    note = DOCS / "notes" / f"{name}.md"
    if note.is_file():
        md += ["## Notes", "", note.read_text(encoding="utf-8").strip(), ""]
    return "\n".join(md).rstrip() + "\n"


def index(results: dict[str, dict]) -> str:
    md = ["# Results", "",
          "Each experiment's cpu-preset run on a 2-core CPU, committed as `results.json` and figures and "
          "turned into its page by `python -m experiments.pages`. Rerun any of them with the command on its page. "
          "The times are what each run took from an empty row cache, wall clock, on a machine that was not always "
          "quiet: a page says so where its notes or its load average show other work beside it.",
          "", experiments_table(results, link="{name}.md"), ""]
    return "\n".join(md)


def took(name: str, result: dict | None = None, smoke: dict | None = None) -> tuple[str | None, str | None]:
    """How long the committed runs of `name` took, as text: (its smoke preset, its cpu preset), None where
    there is no such run. `result` (its results.json) and `smoke` (`smoke_times()`) when read already."""
    smoke = smoke_times() if smoke is None else smoke
    if result is None and (DOCS / name / "results.json").is_file():
        result = load(name)
    wall, cached = cost(result) if result else (0, 0)
    return _minutes(smoke[name]) if name in smoke else None, _minutes(wall + cached) if wall else None


def experiments_table(results: dict[str, dict], *, link: str) -> str:
    smoke = smoke_times()
    rows = []
    for name, r in results.items():
        smoke_took, cpu_took = took(name, r, smoke)
        rows.append({"command": report.Markdown(f"[`experiments.{name}`]({link.format(name=name)})"), "what": summary(name),
                     "smoke": smoke_took or "-", "time": cpu_took or "-",
                     "claims": report.tally(r["claims"]).split(" claims")[0]})
    return report.format_table([("command", "experiment", ""), ("what", "what it regenerates", ""),
                                ("smoke", "smoke preset", ""), ("time", "cpu preset, 2 cores", ""),
                                ("claims", "claims held", "")], rows)


def smoke_times() -> dict[str, float]:
    """Each experiment's smoke-preset wall seconds, from the committed run (`--take-smoke`), {} without one."""
    try:
        return json.loads(SMOKE.read_text(encoding="utf-8"))["seconds"]
    except (OSError, ValueError, KeyError):
        return {}


def take_smoke(run: pathlib.Path) -> dict[str, float]:
    """The wall seconds of a smoke-preset run of every experiment (`experiments.all --preset smoke`, its
    --out folder, from an empty row cache) into SMOKE, for README's table and the commands' --help."""
    from experiments.all import EXPERIMENTS
    seconds = {}
    for name in EXPERIMENTS:
        try:
            found = json.loads((run / name / "results.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if found.get("preset") != "smoke":
            raise ConfigError(f"{run / name / 'results.json'} is not a smoke-preset run")
        seconds[name] = round(sum(cost(found)), 1)
    if not seconds:
        raise ConfigError(f"--take-smoke {run}: no smoke-preset results there; give experiments.all's --out folder")
    report.atomic_write(SMOKE, json.dumps({"command": "python -m experiments.all --preset smoke", "seconds": seconds},
                                          indent=1) + "\n")
    return seconds


def readme_with_table(text: str, results: dict[str, dict]) -> str:
    """README.md with its experiments table (between the two markers) made from the results."""
    return between(text, (BEGIN, END), experiments_table(results, link="docs/results/{name}.md"), "README.md")


def between(text: str, markers: tuple[str, str], body: str, where: str) -> str:
    """`text` with what lies between its two marker lines replaced by `body`."""
    begin, end = markers
    if begin not in text or end not in text:
        raise ValueError(f"{where} has no {begin} ... {end} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def ci_legs() -> str:
    """The CI legs' records as a table: what each ran, on which Python and versions, and pytest's closing line."""
    records = sorted((json.loads(p.read_text(encoding="utf-8")) for p in CI.glob("*.json")), key=lambda r: r["python"])
    rows = [{"leg": r["what"], "python": r["python"],
             "jax": f"jax {r['versions']['jax']}, jaxlib {r['versions']['jaxlib']}, flax {r['versions']['flax']}, "
                    f"numpy {r['versions']['numpy']}, torch {r['versions']['torch']}",
             "command": f"`{r['command']}`", "pytest": r["pytest"]} for r in records]
    return report.format_table([("leg", "CI leg", ""), ("python", "Python", ""), ("jax", "versions", ""),
                                ("command", "command", ""), ("pytest", "its last run", "")], rows)


def performance_figures(results: dict[str, dict]) -> str:
    """The benchmarks' current figures, from their committed results: command, machine, claims, main tables."""
    from experiments.harness.platform import describe_backend
    md = []
    for name, tables in BENCHMARKS.items():
        r = results.get(name)
        if r is None:
            continue
        md += [f"**[{name}](results/{name}.md)**: `{command(name, r)}`, {report.tally(r['claims'])}; ran on "
               f"`{describe_backend(r['backend'])}`{_took(r)}.", ""]
        md += [_claim(c) for c in r["claims"]] + [""]
        md += [t for title, t in r.get("tables", {}).items() if title.startswith(tables) and tables] + [""] * bool(tables)
    return "\n".join(md).rstrip()


def expected() -> dict[pathlib.Path, str]:
    """Every generated file and what it should hold."""
    results = {n: load(n) for n in names()}
    files = {DOCS / f"{n}.md": page(n, r) for n, r in results.items()}
    files[DOCS / "index.md"] = index(results)
    legs = ci_legs()
    files[README] = between(readme_with_table(README.read_text(encoding="utf-8"), results), LEGS, legs, "README.md")
    files[INSTALL] = between(INSTALL.read_text(encoding="utf-8"), LEGS, legs, "docs/install.md")
    files[PERFORMANCE] = between(PERFORMANCE.read_text(encoding="utf-8"), FIGURES, performance_figures(results),
                                 "docs/performance.md")
    return files


def take(run: pathlib.Path) -> list[str]:
    """Copy each experiment's results.json and PNG figures from a run's folder into docs/results/."""
    from experiments.all import EXPERIMENTS
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
    p.add_argument("--take-smoke", metavar="FOLDER", help="first record the smoke preset's times from "
                   "experiments.all --preset smoke's FOLDER")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs")
    args = p.parse_args(argv)
    if args.take_smoke:
        try:
            print(f"smoke times of {len(take_smoke(pathlib.Path(args.take_smoke)))} experiments from {args.take_smoke}")
        except (ConfigError, OSError) as e:
            return cli.report_error(e)
    if args.take:
        try:
            print(f"took {', '.join(take(pathlib.Path(args.take))) or 'nothing'} from {args.take}")
        except (ConfigError, OSError) as e:   # one line, exit 2, as every command here
            return cli.report_error(e)
    stale = []
    for path, text in expected().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path))
        if not args.check:
            report.atomic_write(path, text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python -m experiments.pages", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(expected())} files" + (f" ({len(stale)} changed)" if stale else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
