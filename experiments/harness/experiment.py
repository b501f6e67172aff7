"""One experiment shape: declare a name, presets and flags, write `run(ctx) -> Result`.

    EXPERIMENT = Experiment("ladder", __doc__, PRESETS, run, rows=[...])   # a training table
    main = EXPERIMENT.main                       # python -m experiments.ladder [flags]
    result = EXPERIMENT(preset="smoke")          # a notebook: the same run, flags as keywords
    trained = EXPERIMENT.reopen("layer_norm")    # a row it trained: .model, .tokenizer (--reopen)

Both ways parse the same flags, check `--out` is writable before any work, run the same
`run`, then print the tables and claims and write `results/<name>/` (table.md,
results.json, the figures as PNG). The command line turns a user error into one line and
exit status 2 and Ctrl-C into exit status 130; a notebook gets the exception. Figures are
matplotlib `Figure` objects made without pyplot, so nothing switches a backend: they show
inline in a notebook and are saved as files everywhere.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from attention_jax.errors import ConfigError, UserError
from attention_jax.speed import Speed
from experiments.harness import cli, report
from experiments.harness.platform import apply_mallopt

STEPS_PER_CALL_ENV = "ATTENTION_JAX_STEPS_PER_CALL"
SMOKE_HELD_OUT_TOKENS = 4096   # the smoke preset checks plumbing: reading all held-out text was most of its time


@dataclasses.dataclass
class Context:
    """What a run is asked to do, as values: the flags are read once, into these, and stop here.

    `args` keeps the experiment's own flags (--width, --warmup, ...) for its `run` alone.
    """
    args: argparse.Namespace
    name: str
    preset: str
    settings: Any                 # the preset's value (a TrainConfig for training tables, with overrides)
    folder: pathlib.Path          # <out>/<name>/, known to be writable
    rows: list[str] = dataclasses.field(default_factory=list)   # training tables: the chosen rows
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0])
    fresh: bool = False           # retrain finished rows
    progress: bool = True         # progress bars
    corpus: str | None = None     # a text of the user's own (--corpus)
    data: str | None = None       # where tiny-shakespeare is (--data)
    held_out_tokens: int | None = None    # read only the first N held-out tokens (the smoke preset's plumbing)
    steps_per_call: int | None = None     # training steps per compiled call (None: the backend's default)
    train_overrides: dict = dataclasses.field(default_factory=dict)   # --steps, --lr, ... for any TrainConfig
    model_overrides: dict = dataclasses.field(default_factory=dict)   # --dtype for every row
    speed: Speed = dataclasses.field(default_factory=Speed)   # --attention: the faster forms every row trains with

    def model(self, config):
        """A row's ModelConfig with the command line's --dtype applied."""
        return dataclasses.replace(config, **self.model_overrides) if self.model_overrides else config

    def budget(self, train_config):
        """A TrainConfig with the command line's --steps, --batch-size, --lr, --schedule, --eval-every applied."""
        return dataclasses.replace(train_config, **self.train_overrides) if self.train_overrides else train_config


def speed_from_flags(attention: str | None) -> Speed:
    """--attention as the speed swap every row trains with (the model as built is the reference form)."""
    return Speed(form=attention or "auto")


def steps_per_call_from_env() -> int | None:
    """$ATTENTION_JAX_STEPS_PER_CALL as a number, None when unset; anything else is one clear error."""
    text = os.environ.get(STEPS_PER_CALL_ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{STEPS_PER_CALL_ENV}={text!r} must be a positive whole number "
                          "(1 = one step per call), or unset for the backend's default")
    return value


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
        """Every claim its budget decides holds (a smoke run of a training table decides none)."""
        return all(c["passed"] for c in self.claims if c.get("decided", True))


@contextlib.contextmanager
def _in_python_terms():
    """A user error raised inside, in a notebook's terms: a keyword where the command line has a
    flag."""
    try:
        yield
    except UserError as e:
        keyword = lambda m: m.group(1).replace("-", "_") + "="
        e.args = (re.sub(r"--([a-z][\w-]*) ", keyword, str(e)),)
        raise


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
    # Its claims are exact (counts, identities), so even the smoke preset's few steps decide them;
    # otherwise a smoke run reports every claim as not checked at that budget.
    smoke_decides: bool = False
    # A training table's tokenizer, from the run's values: what `reopen` hands over beside a model
    # (None: its rows read token ids of no text, as induction's).
    tokenizer: Callable[[Context], Any] | None = None

    def parser(self) -> argparse.ArgumentParser:
        p = cli.parser(self.name, self.description.strip().splitlines()[0], self.presets)
        if self.rows is not None:
            cli.add_training_args(p, self.rows)
        if self.flags is not None:
            self.flags(p)
        return p

    def context(self, args: argparse.Namespace, *, reading: bool = False) -> Context:
        """The flags turned into values, once: nothing past here reads them (but the experiment's
        own). `reading`: for a reopened row, which says its preset in its own line and writes
        nothing (the results folder is not proven writable, as a run's is)."""
        cli.join_processes(args)
        preset, settings = cli.choose_preset(args.preset, self.presets, say=not reading)
        folder = cli.results_folder(args.out, self.name, write=not reading)
        ctx = Context(args, self.name, preset, settings, folder, steps_per_call=steps_per_call_from_env(),
                      progress=not getattr(args, "no_progress", False))
        if self.rows is not None:
            flags = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "schedule": args.schedule,
                     "eval_every": args.eval_every}
            ctx.train_overrides = {k: v for k, v in flags.items() if v is not None}
            ctx.model_overrides = {"dtype": args.dtype} if args.dtype is not None else {}
            ctx.speed = speed_from_flags(args.attention)
            ctx.settings = ctx.budget(settings)
            ctx.rows = cli.choose_names(args.rows, list(self.rows))
            ctx.seeds, ctx.fresh = cli.seeds(args), args.fresh
            ctx.corpus, ctx.data = args.corpus, args.data
            ctx.held_out_tokens = SMOKE_HELD_OUT_TOKENS if preset == "smoke" else None
        return ctx

    def execute(self, args: argparse.Namespace, *, show: bool = True) -> Result:
        from experiments.harness.platform import backend_errors
        with backend_errors():     # a backend JAX cannot start: one line, wherever JAX first meets it
            return self._execute(args, show)

    def _execute(self, args: argparse.Namespace, show: bool = True) -> Result:
        ctx = self.context(args)
        started = time.perf_counter()
        from experiments.harness import committed
        training = self.rows is not None
        long = committed.announce(self.name, ctx.preset, ctx.rows if training else None,
                                  training=training, folder=ctx.folder)
        if long:      # a run of more than a few minutes says first how long, how to stop and resume
            print(long, flush=True)
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
        elif compile_cache.settings():    # asked for, but its folder cannot be made or written
            print(f"compiled programs: not kept between runs ({compile_cache.settings()['jax_compilation_cache_dir']} "
                  f"cannot be written; every run compiles anew)", file=sys.stderr, flush=True)
        from attention_jax.train.loop import default_steps_per_call
        per_call = ctx.steps_per_call or default_steps_per_call()
        if per_call > 1:
            print(f"training: up to {per_call} steps per compiled call ({STEPS_PER_CALL_ENV}=1: one)", flush=True)
        if self.rows is not None:   # a training table: say what computes attention here, "auto" resolved
            from attention_jax.config import ModelConfig
            chosen = ctx.model(ModelConfig())
            how = "; auto's choice, the fastest on this backend (--attention to choose)" if ctx.speed.form == "auto" else ""
            if ctx.speed.form_for(chosen) == "fused":   # cuDNN's kernel takes some head sizes only
                how += "; the kernel may differ by a row's head size (each row's record names its own)"
            print(f"attention: {ctx.speed.describe(chosen)}, {chosen.dtype}{how}", flush=True)
        warning = check_backend()
        if warning:   # a GPU/TPU plugin JAX cannot use: say so loudly, then run on what there is
            print(warning, file=sys.stderr, flush=True)
        from attention_jax.train.distributed import is_writer
        with cli.exclusive(ctx.folder) if is_writer() else contextlib.nullcontext():
            result = self.run(ctx)
            result.name, result.preset = self.name, ctx.preset
            if ctx.preset == "smoke" and not self.smoke_decides:
                for claim in result.claims:
                    claim["decided"] = False
            made = {**compile_clock.since(mark), "in_children": self.shares_accelerator,
                    "load": [round(x, 2) for x in os.getloadavg()]}   # 1, 5, 15 min: was the machine shared?
            result.extra = {"backend": backend, "time": {"wall_s": round(time.perf_counter() - started, 3), **made},
                            **result.extra}
            result.folder = report.publish(ctx.folder, result, show=show) if is_writer() else ctx.folder
        return result

    def _arguments(self, options: dict) -> argparse.Namespace:
        """The flags' values, as the command line's defaults with `options` (dest names) put in."""
        args = self.parser().parse_args([])
        unknown = sorted(set(options) - set(vars(args)))
        if unknown:
            raise ConfigError(f"{self.name} has no option {', '.join(unknown)}; "
                              f"choose from: {', '.join(sorted(vars(args)))}")
        for key, value in options.items():
            setattr(args, key, value)
        return args

    def reopen(self, row: str, *, seed: int | None = None, **options):
        """A row this table trained, reopened from its checkpoint, training nothing: a
        `trained.Reopened` with `.model` (the NNX `LanguageModel`, in eval mode) and `.tokenizer`
        (None where the table has none), `.record` and `.checkpoint`. `seed`: which seed's model
        (by default the row's first). `options` are a run's keywords and choose the row as in a
        run: `preset` (chosen as a run chooses it), `out` (default "results", where the command
        line writes), `seeds`, `steps`, `corpus`, ... A row that is not there is one
        `ConfigError` line naming the call that trains it."""
        with _in_python_terms():
            args = self._arguments({"out": "results", **options})
            args.reopen, args.seed = row, seed
            return self._reopened(args, python=True)

    def _reopened(self, args: argparse.Namespace, *, python: bool = False):
        from experiments.harness import trained
        from experiments.harness.platform import backend_errors
        if self.rows is None:
            raise ConfigError(f"{self.name} trains no model to reopen; the training tables do "
                              "(ladder, positions, ...)")
        seed, args = args.seed, argparse.Namespace(**{**vars(args), "seed": None})
        ctx = self.context(args, reading=True)
        asked = trained.Asked(self.name, list(self.rows), args.reopen, ctx.preset, ctx.folder,
                              seed=seed, flags=self._asked_flags(ctx, args), python=python)
        record = trained.choose(asked, trained.records(ctx.folder), self.presets)
        with backend_errors():
            return trained.reopened(asked, record, self.tokenizer and (lambda: self.tokenizer(ctx)))

    def _asked_flags(self, ctx: Context, args: argparse.Namespace) -> dict:
        """The flags given beside --reopen that choose among a row's trainings: each must match
        its record."""
        flags = {k: (v, lambda r, k=k, v=v: r["train_config"].get(k) == v)
                 for k, v in ctx.train_overrides.items()}
        if args.seeds is not None:
            flags["seeds"] = (args.seeds, lambda r: r["seeds"] == list(range(args.seeds)))
        if args.dtype is not None:
            flags["dtype"] = (args.dtype, lambda r: r["config"].get("dtype") == args.dtype)
        if args.attention is not None:
            flags["attention"] = (args.attention,
                                  lambda r: r["config"].get("attention") == args.attention)
        if ctx.corpus:
            from attention_jax.data.text import check_text_file
            with cli.flag_named("--corpus"):
                sha = check_text_file(ctx.corpus).sha256
            flags["corpus"] = (ctx.corpus, lambda r: (r.get("task") or {}).get("sha256") == sha)
        return flags

    def __call__(self, **options) -> Result:
        """Run as a notebook does: `EXPERIMENT(preset="smoke", seeds=3)`; flags by their dest names.

        Results go where `out` says; without it, to a fresh temporary folder (`result.folder`), not
        the current one: pass `out="results"` to keep them, and its finished rows, between calls.
        The tables and claims are not printed: a notebook shows the Result (`result.markdown()`).
        A row it trained reopens with `EXPERIMENT.reopen(row, ...)`."""
        if options.get("reopen"):
            return self.reopen(options.pop("reopen"), **options)
        args = self._arguments(options)
        if "out" not in options:
            args.out = tempfile.mkdtemp(prefix="attention_jax-")
            atexit.register(shutil.rmtree, args.out, ignore_errors=True)
            print(f"results: {args.out}/{self.name} (a temporary folder, removed when Python exits; out=FOLDER "
                  "keeps them)", flush=True)
        with _in_python_terms():
            return self.execute(args, show=False)      # the Result shows its tables and claims itself

    def main(self, argv: list[str] | None = None) -> int:
        """The command line: run, print, save; one line and exit 2 for a user error, 130 for Ctrl-C."""
        try:
            if argv is None:   # a command-line run (tests pass argv): keep XLA's scratch memory
                apply_mallopt(self.big_programs)
                cli.catch_interrupts()
            args = self.parser().parse_args(argv)
            if getattr(args, "reopen", None):      # a trained row reopened: what and from where
                print(self._reopened(args).describe(), flush=True)
            else:
                self.execute(args)
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
