"""Every table of the chapter, one after another, then one report: results/REPORT.md.

    python -m experiments.all [--preset smoke|cpu|paper] [--only a,b | --skip a,b] [--seeds N] [--out DIR]
                              [--data PATH | --corpus PATH]

Each experiment runs as its own command would (same presets, row cache, results folder),
so a rerun skips every finished row and an interrupted one resumes. One that stops (a user
error, or a crash) is reported and the others still run; the report says first which did not
run and why, counts the claims of those that ran, and gathers every table, claim and figure,
with one summary of each book figure beside ours. A run of every table writes REPORT.md; a
run of some (--only, --skip) writes REPORT-<tables>.md, so REPORT.md keeps every table.
"""
from __future__ import annotations

import os
import sys
import traceback

from attention_jax.errors import UserError
from experiments.harness import cli, gather

# The chapter's order: averaging, scaling, the ladder, positions, √d, norms, cost, the toy, the lecture;
# then the benchmarks and what the chapter leaves to others (patching, circuits). Each runs on the base install: a
# comparison whose oracle (torch, transformers, TransformerLens, tracr) is missing is left out, saying so.
EXPERIMENTS = ["averaging", "scaling", "params", "parity", "ladder", "positions", "scale_ablation", "norms",
               "complexity", "winograd", "inside_tiny_gpt", "throughput", "generation", "patching", "induction",
               "circuits_known", "ioi"]
TRAINING = {"ladder", "positions", "scale_ablation", "norms", "winograd", "inside_tiny_gpt", "induction"}
CORPUS_TABLES = {"ladder", "positions", "scale_ablation", "norms"}     # trained on tiny-shakespeare (or --corpus)


def _module(name: str):
    import importlib
    return importlib.import_module(f"experiments.{name}")


def available() -> list[str]:
    import importlib.util
    return [n for n in EXPERIMENTS if importlib.util.find_spec(f"experiments.{n}") is not None]


def run_one(name: str, args) -> str | None:
    """Run one experiment; None on success, else the one-line reason it stopped. A crash (a bug, not a
    user error) prints its traceback and is reported the same way: the other tables still run."""
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
    except Exception as e:        # a bug in one table must not lose the others' results
        traceback.print_exc()
        return f"it crashed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return None


def parse(argv: list[str] | None):
    """The flags, and the tables they choose in the chapter's order; a user error raised as one."""
    p = cli.parser("all", __doc__.strip().splitlines()[0], {"smoke": 0, "cpu": 0, "paper": 0})
    p.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(EXPERIMENTS)} (the report: "
                   "REPORT-<tables>.md; REPORT.md is the report of every table)")
    p.add_argument("--skip", default=None, help="comma-separated experiments to leave out")
    p.add_argument("--seeds", type=cli.positive_int, default=1, help="seeds for the training tables")
    p.add_argument("--corpus", default=None, help="your own text for the corpus tables (ladder, positions, ...)")
    p.add_argument("--data", default=None, help="tinyshakespeare.txt or a folder holding it, for the corpus tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.preset is not None and args.preset not in ("smoke", "cpu", "paper"):
        raise cli.ConfigError(f"unknown preset {args.preset!r}; choose one of: smoke, cpu, paper")
    names = cli.choose_names(args.only, available(), "experiment")
    skip = set(cli.choose_names(args.skip, available(), "experiment")) if args.skip else set()
    names = [n for n in names if n not in skip]
    if not names:     # and an empty report must not replace the last one
        raise cli.ConfigError("--only and --skip leave no experiment to run; drop one of them")
    return args, names


def main(argv: list[str] | None = None) -> int:
    try:
        args, names = parse(argv)
        run = gather.Run(cli.results_folder(args.out, "all").parent, names, available())
    except UserError as e:
        return cli.report_error(e)
    if any(_module(n).EXPERIMENT.shares_accelerator for n in names):
        # One process runs them all, and JAX reserves memory when it first looks for devices (the
        # first experiment): those whose children take turns on the accelerator need it unreserved.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    done = 0
    try:
        for name in names:
            reason = run_one(name, args)
            done += 1
            if reason:
                run.failures[name] = reason
    except KeyboardInterrupt as e:     # the report holds what this run finished, not earlier runs' results
        run.failures.update({names[done]: "interrupted (Ctrl-C) while it ran; rerun to resume its rows"} |
                            {n: "not started: the run was interrupted before it" for n in names[done + 1:]})
        finish(run)
        code = cli.report_error(e)
        if argv is None:     # a command line: leave before XLA's threads meet the interpreter's teardown
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
        return code
    return finish(run)


def finish(run: gather.Run) -> int:
    """Write the report and end on what did not run (a line each, then the count): exit 2 if any did not."""
    last = gather.write(run)
    sys.stdout.flush()
    if not run.failures:
        print(f"\n{last}", flush=True)
        return 0
    print("", file=sys.stderr)
    for name, reason in run.failures.items():
        print(f"did not run: {name}: {reason}", file=sys.stderr)
    print(f"error: {last}", file=sys.stderr, flush=True)
    return cli.EXIT_USER_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
