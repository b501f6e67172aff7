"""The command-line convention shared by every `python -m experiments.<name>`.

Each experiment declares its presets (`smoke` for tests, `cpu` for a 2-core laptop,
`paper` for the book's budget on a GPU/TPU) and gets the same flags, the same
announcement of the chosen preset, and the same handling of user errors: one line on
stderr naming the problem and the fix, exit status 2, nothing finished lost.
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, Mapping

from attention_jax.errors import ConfigError, UserError
from attention_jax.harness.platform import accelerator, apply_mallopt


def parser(name: str, description: str, presets: Mapping[str, object] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m experiments.{name}", description=description)
    if presets:
        p.add_argument("--preset", default=None,
                       help=f"one of {', '.join(presets)} (default: paper on a GPU/TPU, cpu otherwise)")
    p.add_argument("--out", default="results", help="folder for results (default: results/)")
    return p


def choose_preset(requested: str | None, presets: Mapping[str, object]) -> tuple[str, object]:
    """Resolve --preset, announcing the choice on the first line of output."""
    if requested is None:
        acc = accelerator()
        requested = "paper" if acc and "paper" in presets else ("cpu" if "cpu" in presets else next(iter(presets)))
        why = f"{acc} found" if acc else "no GPU/TPU found; --preset paper runs the book's budget"
        print(f"preset: {requested} ({why})", flush=True)
    elif requested not in presets:
        raise ConfigError(f"unknown preset {requested!r}; choose one of: {', '.join(presets)}")
    else:
        print(f"preset: {requested}", flush=True)
    return requested, presets[requested]


def choose_names(requested: str | None, known: list[str], what: str = "row") -> list[str]:
    """Parse a comma-separated subset such as --rows a,b; unknown names are one clear error."""
    if not requested:
        return list(known)
    names = [n.strip() for n in requested.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown {what} {', '.join(map(repr, unknown))}; choose from: {', '.join(known)}")
    return [n for n in known if n in names]


def main(fn: Callable[[list[str] | None], object]) -> Callable[[list[str] | None], int]:
    """Wrap an experiment's entry point: user errors and Ctrl-C become one line and an exit code."""
    @functools.wraps(fn)
    def wrapped(argv: list[str] | None = None) -> int:
        if argv is None:   # a command-line run (tests pass argv): keep XLA's scratch memory
            apply_mallopt()
        try:
            fn(argv)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: finished results are kept; rerun the same command to continue",
                  file=sys.stderr)
            return 130
        return 0
    return wrapped
