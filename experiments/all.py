"""Every table of the chapter, one after another, then one report: results/REPORT.md.

    python -m experiments.all [--preset smoke|cpu|paper] [--only a,b | --skip a,b] [--seeds N] [--out DIR]
                              [--data PATH | --corpus PATH]

Each experiment runs as its own command would (same presets, row cache, results folder),
so a rerun skips every finished row and an interrupted one resumes. One that stops with a
user error is reported and the others still run; the report gathers every table, every
claim and every figure, with one summary of each book figure beside ours.
"""
from __future__ import annotations

import json
import pathlib

from attention_jax.errors import UserError
from experiments.harness import cli, report

# The chapter's order: averaging, scaling, the ladder, positions, √d, norms, cost, the toy, the lecture;
# then the benchmarks and what the chapter leaves to others (patching). Each runs on the base install: a
# comparison whose oracle (torch, transformers, TransformerLens) is missing is left out, saying so.
EXPERIMENTS = ["averaging", "scaling", "params", "parity", "ladder", "positions", "scale_ablation", "norms",
               "complexity", "winograd", "inside_tiny_gpt", "throughput", "generation", "patching", "induction"]
TRAINING = {"ladder", "positions", "scale_ablation", "norms", "winograd", "inside_tiny_gpt", "induction"}
CORPUS_TABLES = {"ladder", "positions", "scale_ablation", "norms"}     # trained on tiny-shakespeare (or --corpus)


def _module(name: str):
    import importlib
    return importlib.import_module(f"experiments.{name}")


def available() -> list[str]:
    import importlib.util
    return [n for n in EXPERIMENTS if importlib.util.find_spec(f"experiments.{n}") is not None]


def run_one(name: str, args) -> str | None:
    """Run one experiment; None on success, else the one-line reason it stopped."""
    experiment = _module(name).EXPERIMENT
    argv = ["--out", args.out] + (["--preset", args.preset] if args.preset else [])
    if name in TRAINING:
        argv += ["--seeds", str(args.seeds)] + (["--no-progress"] if args.no_progress else [])
        if name in CORPUS_TABLES:
            argv += (["--corpus", args.corpus] if args.corpus else []) + (["--data", args.data] if args.data else [])
    print(f"\n===== {name} =====", flush=True)
    try:
        experiment.execute(experiment.parser().parse_args(argv))
    except UserError as e:
        cli.report_error(e)
        return " ".join(str(e).split())
    return None


def gather(out: pathlib.Path, names: list[str], failures: dict[str, str]) -> str:
    """REPORT.md: a summary of book figures beside ours, every claim, then each experiment's tables and figures."""
    results = {}
    for name in names:
        path = out / name / "results.json"
        if path.exists() and name not in failures:     # an earlier run's results are not this run's
            results[name] = json.loads(path.read_text(encoding="utf-8"))
    presets = sorted({r.get("preset") for r in results.values() if r.get("preset")})
    md = ["# attention_jax: every table of the chapter", "",
          f"Preset(s): {', '.join(presets) or '-'}. Regenerate with `python -m experiments.all"
          + (f" --preset {presets[0]}" if len(presets) == 1 else "") + "`.", ""]
    if "smoke" in presets:
        md += [f"*{cli.SMOKE_NOTE}*", ""]
    book = [dict(experiment=n, **b) for n, r in results.items() for b in r.get("book", [])]
    if book:
        md += ["## The book's figures beside ours", "",
               report.format_table([("experiment", "experiment", ""), ("what", "figure", ""), ("book", "book", ""),
                                    ("ours", "ours", "")], book), ""]
    md += [f"## Claims: {report.tally([c for r in results.values() for c in r['claims']])}", ""]
    for name, r in results.items():
        md += [f"- **{name}**"] + [f"  - **{report.verdict(c)}** {report.claim_text(c, markdown=True)}"
                                   for c in r["claims"]]
    for name, reason in failures.items():
        md += [f"- **{name}** did not finish: {report.safe(reason)}"]
    timed = [dict(experiment=n, wall=r["time"]["wall_s"], programs=r["time"]["programs"],
                  compile=r["time"]["compile_s"] + r["time"]["trace_and_lower_s"]) for n, r in results.items() if "time" in r]
    if timed:     # what ran them, and how much of each run went into making XLA programs
        from experiments.harness.platform import describe_backend
        backend = next(r["backend"] for r in results.values() if "backend" in r)
        md += ["", "## Where and how long", "", f"`{describe_backend(backend)}`", "",
               report.format_table([("experiment", "experiment", ""), ("wall", "seconds", ".1f"),
                                    ("programs", "XLA programs made here", "d"),
                                    ("compile", "seconds making them", ".1f")], timed)]
    for name, r in results.items():
        table = (out / name / "table.md").read_text(encoding="utf-8").split("\n", 1)[1]
        table = table.replace(f"*{cli.SMOKE_NOTE}*", "")        # said once, at the top
        md += ["", f"# {name}" + (f" (preset: {r.get('preset')})" if r.get("preset") else ""), table.strip(), ""]
        md += [f"![{name}: {fig}]({name}/{fig})" for fig in r.get("figures", [])]
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("all", __doc__.strip().splitlines()[0], {"smoke": 0, "cpu": 0, "paper": 0})
    p.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(EXPERIMENTS)}")
    p.add_argument("--skip", default=None, help="comma-separated experiments to leave out")
    p.add_argument("--seeds", type=cli.positive_int, default=1, help="seeds for the training tables")
    p.add_argument("--corpus", default=None, help="your own text for the corpus tables (ladder, positions, ...)")
    p.add_argument("--data", default=None, help="tinyshakespeare.txt or a folder holding it, for the corpus tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    try:
        args = p.parse_args(argv)
        if args.preset is not None and args.preset not in ("smoke", "cpu", "paper"):
            raise cli.ConfigError(f"unknown preset {args.preset!r}; choose one of: smoke, cpu, paper")
        names = cli.choose_names(args.only, available(), "experiment")
        skip = set(cli.choose_names(args.skip, available(), "experiment")) if args.skip else set()
        names = [n for n in names if n not in skip]
        if not names:     # and an empty REPORT.md must not replace the last one
            raise cli.ConfigError("--only and --skip leave no experiment to run; drop one of them")
        out = cli.results_folder(args.out, "all").parent
    except UserError as e:
        return cli.report_error(e)
    if any(_module(n).EXPERIMENT.shares_accelerator for n in names):
        # One process runs them all, and JAX reserves memory when it first looks for devices (the
        # first experiment): those whose children take turns on the accelerator need it unreserved.
        import os
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    failures, ran = {}, []
    try:
        for name in names:
            reason = run_one(name, args)
            ran.append(name)
            if reason:
                failures[name] = reason
    except KeyboardInterrupt as e:     # the report holds what this run finished, not earlier runs' results
        report.atomic_write(out / "REPORT.md", gather(out, ran, failures))
        code = cli.report_error(e)
        if argv is None:     # a command line: leave before XLA's threads meet the interpreter's teardown
            import os
            import sys
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
        return code
    report.atomic_write(out / "REPORT.md", gather(out, names, failures))
    print(f"\nwrote {out / 'REPORT.md'}", flush=True)
    return cli.EXIT_USER_ERROR if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
