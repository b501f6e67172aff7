"""Every table of the chapter, one after another, then one report: results/REPORT.md.

    python -m experiments.all [--preset smoke|cpu|paper] [--only a,b | --skip a,b] [--out DIR]
                              [--seeds N | --seed S] [--data PATH | --corpus PATH]

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
    print(f"\n===== {name} =====", flush=True)
    try:
        experiment.execute(experiment.parser().parse_args(flags_for(name, args)))
    except UserError as e:
        cli.report_error(e)
        return " ".join(str(e).split())
    except Exception as e:        # a bug in one table must not lose the others' results
        traceback.print_exc()
        return f"it crashed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return None


def flags_for(name: str, args) -> list[str]:
    """The command line one table runs with: --out and --preset, and what of the rest applies."""
    argv = ["--out", args.out] + (["--preset", args.preset] if args.preset else [])
    if name in TRAINING:
        one = args.seed is not None
        seeds = ["--seed", str(args.seed)] if one else ["--seeds", str(args.seeds or 1)]
        argv += seeds + (["--no-progress"] if args.no_progress else [])
        if name in CORPUS_TABLES:
            argv += ["--corpus", args.corpus] if args.corpus else []
            argv += ["--data", args.data] if args.data else []
    return argv


def parse(argv: list[str] | None):
    """The flags, and the tables they choose in the chapter's order; a user error raised as one."""
    p = cli.parser("all", __doc__.strip().splitlines()[0], {"smoke": 0, "cpu": 0, "paper": 0})
    p.add_argument("--only", default=None, help=f"comma-separated subset of: {', '.join(EXPERIMENTS)} (the report: "
                   "REPORT-<tables>.md; REPORT.md is the report of every table)")
    p.add_argument("--skip", default=None, help="comma-separated experiments to leave out")
    p.add_argument("--seeds", type=cli.positive_int, default=None,
                   help="seeds 0 .. N-1 for the training tables (default 1)")
    p.add_argument("--seed", type=cli.seed_number, default=None, metavar="S",
                   help="the one seed S instead")
    p.add_argument("--corpus", default=None, help="your own text for the corpus tables (ladder, positions, ...)")
    p.add_argument("--data", default=None, help="tinyshakespeare.txt or a folder holding it, for the corpus tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.preset is not None and args.preset not in ("smoke", "cpu", "paper"):
        raise cli.ConfigError(f"unknown preset {args.preset!r}; choose one of: smoke, cpu, paper")
    cli.seeds(args)           # --seed and --seeds both given: refused before anything runs
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
    said = announce(names, args.preset)
    if said:      # the tables' committed runs added up: a run of more than a few minutes says so
        print(said, flush=True)
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


def announce(names: list[str], preset: str | None) -> str | None:
    """How long the committed runs of these tables took in all, and how to stop and resume, when
    that was more than a few minutes (`committed.LONG_S`); None otherwise."""
    from experiments.harness import committed
    if preset is None:      # as every table chooses it: cpu where no GPU/TPU is found
        from experiments.harness.platform import accelerator
        preset = "paper" if accelerator() else "cpu"
    found = [f for f in (committed.expected(n, preset) for n in names) if f]
    if sum(f[0] for f in found) < committed.LONG_S:
        return None
    tables = f"{len(names)} tables"
    tables += f" ({len(found)} with a committed run)" if len(found) < len(names) else ""
    cores = {f[2] for f in found} - {None}
    on = f" on {cores.pop()} cores" if len(cores) == 1 else ""
    smoke = committed.smoke_times().seconds if preset == "smoke" else {}
    cached = sum(smoke.get(n, 0) for n in names)
    again = f" ({committed.minutes(cached)} with their programs cached)" if cached else ""
    runs = "first runs" if preset == "smoke" else "runs"
    took = committed.minutes(sum(f[0] for f in found))
    return (f"{tables}, {preset} preset: their committed {runs} took {took} in all{on}{again}; "
            "Ctrl-C stops the run keeping every finished table and row, and the same command "
            "resumes")


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
