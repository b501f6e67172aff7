"""The errors a user can cause, each carrying one line that names the problem and the fix.

Command-line entry points catch `UserError` and print its message alone (no traceback),
then exit with status 2; everything already written to disk stays there.
"""
import sys
import threading

# Set by a command line's SIGINT handler (experiments.harness.cli.catch_interrupts): a
# KeyboardInterrupt raised while XLA runs a callback of its own is printed as "ignored" and
# lost, so the training loop also looks here at every step.
STOP = threading.Event()


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
    """One line on stderr saying what was done about something found (a damaged file, say): not an error."""
    print(f"note: {message}", file=sys.stderr, flush=True)


class UserError(Exception):
    """Base class: bad input from the user, not a bug in the library."""


class ConfigError(UserError, ValueError):
    """An impossible or unknown model/experiment configuration."""


class DataError(UserError, RuntimeError):
    """The corpus is missing, corrupt, or cannot be fetched."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint does not match the model or run it is restored into."""


class TrainingDiverged(UserError, RuntimeError):
    """A loss or an evaluation stopped being finite: the row is not finished, and not saved past it."""

    def __init__(self, row: str, step: int, what: str, lr: float, *, kept: int | None = None):
        self.row, self.step = row, step
        keep = f"its last good checkpoint (step {kept}) is kept" if kept else "no checkpoint of it is kept"
        super().__init__(f"row {row!r} diverged at step {step}: {what}; the learning rate (lr={lr:g}) is the "
                         f"likely cause: lower it with --lr; {keep} and nothing was recorded as finished")


class Preempted(KeyboardInterrupt):
    """The machines are being taken back (a preemption notice, through JAX's distributed runtime):
    every process saved the same step and stopped; the same command resumes from it."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"preempted: every process saved step {step} and stopped; rerun the same command "
                         "to continue from it")
