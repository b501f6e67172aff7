"""One experiment shape: declare a name, presets and flags, write `run(ctx) -> Result`.

    EXPERIMENT = Experiment("ladder", __doc__, PRESETS, run, rows=[...])   # a training table
    main = EXPERIMENT.main                       # python -m experiments.ladder [flags]
    result = EXPERIMENT(preset="smoke")          # a notebook: the same run, flags as keywords

Both ways parse the same flags, check `--out` is writable before any work, run the same
`run`, then print the tables and claims and write `results/<name>/` (table.md,
results.json, the figures as PNG). The command line turns a user error into one line and
exit status 2 and Ctrl-C into exit status 130; a notebook gets the exception. Figures are
matplotlib `Figure` objects made without pyplot, so nothing switches a backend: they show
inline in a notebook and are saved as files everywhere.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from attention_jax.errors import ConfigError, UserError
from experiments.harness import cli, report
from experiments.harness.platform import apply_mallopt


@dataclasses.dataclass
class Context:
    """What a run is asked to do: the parsed flags, the preset and its settings, the results folder."""
    args: argparse.Namespace
    name: str
    preset: str
    settings: Any                 # the preset's value (a TrainConfig for training tables, with overrides)
    folder: pathlib.Path          # <out>/<name>/, known to be writable
    rows: list[str] = dataclasses.field(default_factory=list)   # training tables: the chosen rows

    @property
    def progress(self) -> bool:
        return not getattr(self.args, "no_progress", False)

    def model(self, config):
        """A row's ModelConfig with the command line's --attention / --dtype applied."""
        change = {k: getattr(self.args, k, None) for k in ("attention", "dtype")}
        change = {k: v for k, v in change.items() if v is not None}
        return dataclasses.replace(config, **change) if change else config


@dataclasses.dataclass
class Result:
    """What a run found: rows of figures, the chapter's claims as checked, tables and figures."""
    rows: list[dict]
    claims: list[dict]
    tables: dict[str, str]
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)   # file name -> matplotlib Figure
    config: dict = dataclasses.field(default_factory=dict)
    extra: dict = dataclasses.field(default_factory=dict)
    book: list[dict] = dataclasses.field(default_factory=list)   # report.book(...): the book's figures beside ours
    name: str = ""
    preset: str = ""
    folder: pathlib.Path | None = None

    def markdown(self) -> str:
        return report.markdown(self.name, self.preset, self.tables, self.claims)

    def _repr_markdown_(self) -> str:   # a notebook shows the tables and claims
        return self.markdown()

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.claims)


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    presets: Mapping[str, Any]
    run: Callable[[Context], Result]
    flags: Callable[[argparse.ArgumentParser], None] | None = None
    rows: Sequence[str] | None = None        # a training table: --rows and the shared training flags
    big_programs: bool = False               # programs that fragment one glibc arena (harness/platform.py)
    # Its work runs in child processes that take turns on one accelerator: no process may reserve
    # most of its memory up front (JAX's default, 75%, at the first touch), this one included.
    shares_accelerator: bool = False

    def parser(self) -> argparse.ArgumentParser:
        p = cli.parser(self.name, self.description.strip().splitlines()[0], self.presets)
        if self.rows is not None:
            cli.add_training_args(p, self.rows)
        if self.flags is not None:
            self.flags(p)
        return p

    def context(self, args: argparse.Namespace) -> Context:
        cli.join_processes(args)
        preset, settings = cli.choose_preset(args.preset, self.presets)
        folder = cli.results_folder(args.out, self.name)
        chosen = []
        if self.rows is not None:
            from experiments.harness.rows import with_overrides
            chosen = cli.choose_names(args.rows, list(self.rows))
            settings = with_overrides(settings, args)
        return Context(args, self.name, preset, settings, folder, chosen)

    def execute(self, args: argparse.Namespace) -> Result:
        from experiments.harness.platform import backend_errors
        with backend_errors():     # a backend JAX cannot start: one line, wherever JAX first meets it
            return self._execute(args)

    def _execute(self, args: argparse.Namespace) -> Result:
        ctx = self.context(args)
        started = time.perf_counter()
        if self.shares_accelerator:   # before JAX first looks for devices, below
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        from experiments.harness import compile_cache, compile_clock   # imports JAX: after --help
        mark = compile_clock.start()
        from experiments.harness.platform import backend_summary, check_backend, describe_backend
        kept = compile_cache.enable()     # before the first compile
        backend = backend_summary()       # printed now, and kept in results.json (what ran it, on which host)
        print(describe_backend(backend), flush=True)
        if kept:
            print(compile_cache.describe(kept), flush=True)
        from attention_jax.train.loop import STEPS_PER_CALL_ENV, default_steps_per_call
        per_call = default_steps_per_call()     # a bad $ATTENTION_JAX_STEPS_PER_CALL: one line now, not mid-table
        if per_call > 1:
            print(f"training: up to {per_call} steps per compiled call ({STEPS_PER_CALL_ENV}=1: one)", flush=True)
        if self.rows is not None:   # a training table: say what computes attention here, "auto" resolved
            from attention_jax.config import ModelConfig
            from attention_jax import backends
            chosen = ctx.model(ModelConfig())
            how = "; auto's choice, the fastest on this backend (--attention to choose)" if chosen.attention == "auto" else ""
            if backends.resolve(chosen) == "fused":   # cuDNN's kernel takes some head sizes only
                how += "; the kernel may differ by a row's head size (each row's record names its own)"
            print(f"attention: {backends.describe(chosen)}, {chosen.dtype}{how}", flush=True)
        warning = check_backend()
        if warning:   # a GPU/TPU plugin JAX cannot use: say so loudly, then run on what there is
            print(warning, file=sys.stderr, flush=True)
        from attention_jax.train.distributed import is_writer
        with cli.exclusive(ctx.folder) if is_writer() else contextlib.nullcontext():
            result = self.run(ctx)
            result.name, result.preset = self.name, ctx.preset
            made = {**compile_clock.since(mark), "in_children": self.shares_accelerator}
            result.extra = {"backend": backend, "time": {"wall_s": round(time.perf_counter() - started, 3), **made},
                            **result.extra}
            result.folder = report.publish(ctx.folder, result) if is_writer() else ctx.folder
        return result

    def __call__(self, **options) -> Result:
        """Run as a notebook does: `EXPERIMENT(preset="smoke", seeds=3)`; flags by their dest names."""
        p = self.parser()
        args = p.parse_args([])
        unknown = sorted(set(options) - set(vars(args)))
        if unknown:
            raise ConfigError(f"{self.name} has no option {', '.join(unknown)}; "
                              f"choose from: {', '.join(sorted(vars(args)))}")
        for key, value in options.items():
            setattr(args, key, value)
        return self.execute(args)

    def main(self, argv: list[str] | None = None) -> int:
        """The command line: run, print, save; one line and exit 2 for a user error, 130 for Ctrl-C."""
        try:
            if argv is None:   # a command-line run (tests pass argv): keep XLA's scratch memory
                apply_mallopt(self.big_programs)
                cli.catch_interrupts()
            self.execute(self.parser().parse_args(argv))
        except UserError as e:
            return cli.report_error(e)
        except KeyboardInterrupt as e:
            code = cli.report_error(e)
            if argv is None:
                # A command line interrupted mid-compile would otherwise tear the interpreter down
                # while XLA's threads still run (a segfault, exit 139): what is finished is saved,
                # so leave now, with the status an interrupt should have.
                sys.stdout.flush(), sys.stderr.flush()
                os._exit(code)
            return code
        return 0
