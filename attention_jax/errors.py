"""The errors a user can cause, each carrying one line that names the problem and the fix.

Each message speaks of values and of this library's own API (a field, an argument, a
file), so it reads the same from a notebook as from any program built on it; a program
with a command line adds its own flag names where it catches them.
"""
import sys


def hush_unraisable(expected) -> None:
    """Drop the "Exception ignored" reports that `expected(unraisable)` recognises as an echo of
    something already said; every other one is printed as before. Installing the same test
    twice adds nothing."""
    hook = sys.unraisablehook
    while hook is not None:
        if getattr(hook, "hushes", None) is expected:
            return
        hook = getattr(hook, "previous", None)
    previous = sys.unraisablehook

    def hushed(unraisable):
        if not expected(unraisable):
            previous(unraisable)
    hushed.hushes, hushed.previous = expected, previous
    sys.unraisablehook = hushed


def note(message: str) -> None:
    """One line on stderr saying what was done about something found (a damaged file, say):
    not an error."""
    print(f"note: {message}", file=sys.stderr, flush=True)


class UserError(Exception):
    """Base class: bad input from the user, not a bug in the library."""


class ConfigError(UserError, ValueError):
    """An impossible or unknown configuration, or an argument outside what it can be."""


class DataError(UserError, RuntimeError):
    """The corpus is missing, corrupt, or cannot be fetched."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint does not match the model or run it is restored into."""


class TrainingDiverged(UserError, RuntimeError):
    """A loss or an evaluation stopped being finite: the run is not finished, and not
    saved past it."""

    def __init__(self, step: int, what: str, lr: float, *, kept: int | None = None):
        self.step, self.what, self.lr, self.kept = step, what, lr, kept
        keep = f"its last good checkpoint (step {kept}) is kept" if kept \
            else "no checkpoint of it is kept"
        super().__init__(f"training diverged at step {step}: {what}; the learning rate "
                         f"(TrainConfig.lr={lr:g}) is the likely cause: lower it; {keep}")


class Preempted(KeyboardInterrupt):
    """The machines are being taken back (a preemption notice, through JAX's distributed runtime):
    every process saved the same step and stopped; `fit` on the same workdir resumes from it."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"preempted: every process saved step {step} and stopped; train again "
                         "into the same workdir to continue from it")


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C while `generate` decoded: `texts` holds each row's prompt and the `done` of `n` new
    tokens it had drawn (a list of int32 arrays), so nothing finished is lost."""

    def __init__(self, texts: list, done: int, n: int):
        self.texts, self.done, self.n = texts, done, n
        super().__init__(f"generation interrupted after {done} of {n} new tokens; the texts so far "
                         "are in this exception's .texts")


class NotMeasurable(UserError, ValueError):
    """A quantity with no meaningful value on these inputs: a ratio over a gap below its floor (or
    within its noise), a metric that is not finite, a correlation of constant scores.
    Never a number."""


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a greedy search (`analysis.pruning.acdc`): `state` holds every decision made
    so far, and the same call given `resume=state` goes on from there, so nothing
    decided is lost."""

    def __init__(self, state, done: int, total: int):
        self.state, self.done, self.total = state, done, total
        super().__init__(f"ACDC interrupted after deciding {done} of {total} edges; pass this "
                         "exception's .state as acdc(..., resume=state) to go on from there")
