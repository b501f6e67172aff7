"""The command-line convention shared by every `python -m experiments.<name>`.

Each experiment declares its presets (`smoke` for tests, `cpu` for a 2-core laptop,
`paper` for the book's budget on a GPU/TPU) and gets the same flags, the same
announcement of the chosen preset, and the same handling of user errors: one line on
stderr naming the problem and the fix, exit status 2, nothing finished lost. Nothing here
imports JAX, so `--help` and a bad flag answer at once.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import pathlib
import signal
import sys
import threading
from typing import Mapping, Sequence

from attention_jax.errors import ConfigError, DataError, Preempted, UserError, hush_unraisable, note
from experiments.harness import committed
from experiments.harness.report import SMOKE_NOTE

EXIT_USER_ERROR, EXIT_INTERRUPTED = 2, 130
LOCK_FILE = ".lock"      # in a results folder: held by the run writing there
PRESET_ORDER = ("smoke", "cpu", "paper")   # the order every --help lists them in: smallest budget first
# Set by the command line's SIGINT handler (catch_interrupts) and handed to every `fit`: a
# KeyboardInterrupt raised while XLA runs a callback of its own is printed as "ignored" and
# lost, so the training loop also looks here at every step.
STOP = threading.Event()


class _Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse's own errors become the one-line convention too
        raise ConfigError(f"{message} (see {self.prog} --help)")


def parser(name: str, description: str, presets: Mapping[str, object] | None = None) -> argparse.ArgumentParser:
    # No abbreviations: `--seed 3` was taken for `--seeds 3`, three seeds trained where seed 3 was meant.
    p = _Parser(prog=f"python -m experiments.{name}", description=description, allow_abbrev=False)
    if presets:
        order = sorted(presets, key=lambda n: PRESET_ORDER.index(n) if n in PRESET_ORDER else len(PRESET_ORDER))
        p.add_argument("--preset", default=None,
                       help=f"one of {', '.join(order)} (default: paper on a GPU/TPU, cpu otherwise)" + durations(name))
    p.add_argument("--out", default="results", help="folder for results (default: results/)")
    return p


def durations(name: str) -> str:
    """How long the committed runs of `name` took, for --help ("; committed runs: smoke 21 s (a
    first run, compiling: 2 min), cpu 86 min on 2 cores"), or "" where a checkout's docs/results
    are not there (an installed package). A damaged record there is one line on stderr (the
    file, the fix), and the command goes on without it."""
    try:
        first, smoke, cpu = committed.took(name)
    except DataError as e:
        note(f"{e}; --help leaves out how long the committed runs took")
        return ""
    except OSError:
        return ""
    smoke = f"{smoke}{f' (a first run, compiling: {first})' if first else ''}" if smoke else first
    said = ([f"smoke {smoke}"] if smoke else []) + ([f"cpu {cpu} on 2 cores"] if cpu else [])
    return f"; committed runs: {', '.join(said)}" if said else ""


def _positive(kind, what: str):
    """An argparse type: a finite positive number of `kind`, else argparse's one-line error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text} must be a {'finite ' if kind is float else ''}positive {what}")
        return value
    return parse


positive_int = _positive(int, "whole number")
positive_float = _positive(float, "number")


def seed_number(text: str) -> int:
    """An argparse type: a seed, a whole number from 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be a whole number from 0")
    return value


def seeds(args) -> list[int]:
    """The seeds a run trains: --seed S (that one), or --seeds N (0 .. N-1; 1 by default), never
    both."""
    seed, count = getattr(args, "seed", None), getattr(args, "seeds", None)
    if seed is not None and count is not None:
        raise ConfigError(f"--seed {seed} and --seeds {count} both given: --seed S trains the one "
                          "seed S, --seeds N the seeds 0 .. N-1; drop one")
    return [int(seed)] if seed is not None else list(range(count or 1))


def add_training_args(p: argparse.ArgumentParser, rows: Sequence[str]) -> argparse.ArgumentParser:
    """The flags every training table shares."""
    p.add_argument("--rows", default=None, help=f"comma-separated subset of: {', '.join(rows)}")
    p.add_argument("--steps", type=positive_int, default=None, help="override the preset's training steps")
    p.add_argument("--batch-size", type=positive_int, default=None, help="override the preset's batch size")
    p.add_argument("--lr", type=positive_float, default=None, help="override the preset's peak learning rate")
    p.add_argument("--schedule", choices=("constant", "cosine"), default=None,
                   help="override the preset's schedule after warmup (cosine decays to 0.1 x lr)")
    p.add_argument("--eval-every", type=positive_int, default=None, metavar="N",
                   help="also measure the table's figures every N steps (curves.png, results.json)")
    p.add_argument("--seeds", type=positive_int, default=None,
                   help="train N seeds at once, 0 .. N-1 (vmap): mean ± std, and every claim checked "
                        "per seed (default 1)")
    p.add_argument("--seed", type=seed_number, default=None, metavar="S",
                   help="train the one seed S instead (with --reopen: which seed's model)")
    p.add_argument("--attention", choices=("auto", "reference", "causal_halves", "chunked", "fused"), default=None,
                   help="how attention is computed (default: the config's, auto: fastest on this backend)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="compute dtype (bfloat16, float16: mixed precision; parameters and optimizer stay "
                        "float32; float16, for a T4, scales its loss); the first line says this device's")
    p.add_argument("--data", default=None, help="tinyshakespeare.txt or a folder holding it")
    p.add_argument("--corpus", default=None, metavar="PATH",
                   help="train on your own UTF-8 text file instead (its own BPE; no book figures)")
    p.add_argument("--fresh", action="store_true", help="ignore finished rows and checkpoints; retrain")
    p.add_argument("--reopen", default=None, metavar="ROW",
                   help="train nothing: reopen the finished ROW (of --preset, in --out) and say "
                        "what and where it is")
    multi = p.add_argument_group("more than one process (one per host or GPU; see docs/distributed.md)")
    multi.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="process 0's address (or $JAX_COORDINATOR_ADDRESS)")
    multi.add_argument("--num-processes", type=positive_int, default=None, help="(or $JAX_NUM_PROCESSES)")
    multi.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1 (or $JAX_PROCESS_ID)")
    multi.add_argument("--connect-timeout", type=positive_float, default=60.0, metavar="SECONDS",
                       help="how long to wait for the other processes (default 60)")
    multi.add_argument("--distributed", action="store_true",
                       help="let JAX find the processes itself (Cloud TPU pod slice, SLURM, Open MPI)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def choose_preset(requested: str | None, presets: Mapping[str, object], *,
                  say: bool = True) -> tuple[str, object]:
    """Resolve --preset, announcing the choice on the first line of output (unless not `say`)."""
    if requested is None:
        from experiments.harness.platform import accelerator   # imports JAX: only when it must look
        acc = accelerator()
        requested = "paper" if acc and "paper" in presets else ("cpu" if "cpu" in presets else next(iter(presets)))
        why = f"{acc} found" if acc else "no GPU/TPU found; --preset paper runs the book's budget"
        if say:
            print(f"preset: {requested} ({why})", flush=True)
    elif requested not in presets:
        raise ConfigError(f"unknown preset {requested!r}; choose one of: {', '.join(presets)}")
    elif say:
        print(f"preset: {requested}", flush=True)
    if requested == "smoke" and say:
        print(SMOKE_NOTE, flush=True)
    return requested, presets[requested]


def choose_names(requested: str | None, known: list[str], what: str = "row", *, as_given: bool = False) -> list[str]:
    """Parse a comma-separated subset such as --rows a,b; unknown or no names are one clear error.

    The names come back in `known`'s order (a table's), or with `as_given` in the order asked
    for, once each (where the first one means something, e.g. the contestant called "ours")."""
    if requested is None:
        return list(known)
    names = [n.strip() for n in requested.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--{what}s {requested!r} names no {what}; choose from: {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown {what} {', '.join(map(repr, unknown))}; choose from: {', '.join(known)}")
    return list(dict.fromkeys(names)) if as_given else [n for n in known if n in names]


def results_folder(out: str, name: str, *, write: bool = True) -> pathlib.Path:
    """`<out>/<name>/`, proven writable before any work starts (by writing there), left as it was
    found (`write=False`: a folder only read, proven nothing).

    Folders the proof had to create are removed again, so a command refused later (a bad
    corpus, say) leaves nothing behind; the results' own writes create them for real.
    """
    if not str(out).strip():
        raise ConfigError("--out is empty; name a folder for the results, e.g. --out results")
    folder = pathlib.Path(out).expanduser() / name
    if not write:
        return folder
    try:
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        for p in created:          # deepest first
            p.rmdir()
    except OSError as e:
        reason = " ".join(str(e.strerror or e).split())
        raise ConfigError(f"--out {out}: cannot write results into {folder} ({reason}); "
                          "choose a writable folder") from None
    return folder


@contextlib.contextmanager
def exclusive(folder: pathlib.Path):
    """Hold the results folder for one run: a second run on the same folder is refused with one line.

    Two runs writing the same rows and checkpoints at once could interleave their files. The
    lock is a file in the folder itself (`.lock`), so every path that reaches the folder (a
    symlink, `..`) meets the same lock, and a folder the run may write holds it. On a platform
    without fcntl, no lock.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK_FILE, "a+")
    except OSError as e:
        raise ConfigError(f"cannot hold {folder} for this run ({' '.join(str(e.strerror or e).split())}); "
                          "choose a folder you can write with --out") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(f"another run is writing into {folder} right now; wait for it to finish, "
                              "or choose another --out") from None
        try:
            yield
        finally:
            if created and [p.name for p in folder.iterdir()] == [LOCK_FILE]:   # refused before writing: leave
                with contextlib.suppress(OSError):                              # no trace of the folder
                    (folder / LOCK_FILE).unlink()
                    for p in created:
                        p.rmdir()
            fcntl.flock(handle, fcntl.LOCK_UN)


def catch_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt as usual and also leaves a note the training loop checks.

    An interrupt that lands inside one of XLA's own callbacks (during a compile, say) is
    reported as "ignored" by Python and lost; the note makes the loop stop at its next step.
    """
    def handler(signum, frame):
        STOP.set()
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, handler)
    # An interrupt that lands in a callback Python cannot raise from (a weakref's, during
    # garbage collection) is printed as "Exception ignored" with a traceback; the note above
    # already holds it, so the loop stops anyway: nothing to print.
    hush_unraisable(_interrupt_echo)


def _interrupt_echo(unraisable) -> bool:
    return isinstance(unraisable.exc_value, KeyboardInterrupt) and STOP.is_set()


@contextlib.contextmanager
def flag_named(flag: str | None = None, *, words: Mapping[str, str] | None = None):
    """A user error raised inside, in the command line's terms: prefixed with the flag whose value it
    is about, and the library's words for how to give a value replaced by the flag that gives it
    (the library names no flag)."""
    try:
        yield
    except UserError as e:
        message = str(e)
        for said, flagged in (words or {}).items():
            message = message.replace(said, flagged)
        e.args = (f"{flag} {message}" if flag else message,)
        raise


def join_processes(args) -> None:
    """Start JAX's distributed runtime when the flags or the environment (JAX_COORDINATOR_ADDRESS,
    JAX_NUM_PROCESSES, JAX_PROCESS_ID) name other processes."""
    env = os.environ.get
    coordinator = getattr(args, "coordinator", None) or env("JAX_COORDINATOR_ADDRESS")
    auto = getattr(args, "distributed", False)
    if not coordinator and not auto:
        return
    from attention_jax.train.distributed import initialize   # imports JAX: before anything touches it
    try:
        count = getattr(args, "num_processes", None) or (int(env("JAX_NUM_PROCESSES")) if env("JAX_NUM_PROCESSES")
                                                         else None)
        pid = getattr(args, "process_id", None)
        pid = int(env("JAX_PROCESS_ID")) if pid is None and env("JAX_PROCESS_ID") else pid
        initialize(coordinator, count, pid, auto=auto, timeout=getattr(args, "connect_timeout", None) or 60.0)
    except ConfigError as e:
        if "process_id=" in str(e):      # the processes' numbers, in the command line's words
            e.args = (str(e).replace("process_id=", "--process-id ").replace("num_processes=", "--num-processes "),)
        else:                            # the coordinator did not answer, or its address is not HOST:PORT
            e.args = (f"{e} (--coordinator)",)
        raise
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot join the other processes ({' '.join(str(e).split())[:300]}); check "
                          "--coordinator, --num-processes and --process-id") from None


def report_error(e: BaseException) -> int:
    """Print a user error or an interrupt as its one line; return the exit status."""
    if isinstance(e, KeyboardInterrupt):
        message = (f"preempted: every process saved step {e.step} and stopped; rerun the same command to continue "
                   "from it" if isinstance(e, Preempted) else
                   "interrupted: finished results are kept, and a row cut short resumes from its last checkpoint; "
                   "rerun the same command to continue")
        print(message, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    message = " ".join(str(e).split())
    print(f"error: {message}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


__all__ = ["parser", "add_training_args", "choose_preset", "choose_names", "results_folder", "report_error",
           "positive_int", "positive_float", "UserError", "ConfigError", "SMOKE_NOTE"]
