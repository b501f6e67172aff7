"""The committed runs under docs/results, read back: each experiment's results.json, the smoke preset's
times, and what a run cost.

The results pages (`experiments.pages`) are written from these, and every command's --help says how
long its committed runs took. A file cut short or of another shape is a `DataError` naming it and the
fix, never a traceback: the pages leave it out saying so, and a command's --help goes without its
times. Nothing here imports JAX or another module of the lab, so the command line reads it at once.
"""
from __future__ import annotations

import json
import pathlib

from attention_jax.errors import DataError

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
SMOKE = RESULTS / "smoke_times.json"     # each experiment's smoke-preset seconds (README's table, --help)


def shown(path: pathlib.Path) -> str:
    """A path as a message names it: relative to the checkout when inside it."""
    path = pathlib.Path(path)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def damaged(path: pathlib.Path, why: str, fix: str) -> DataError:
    return DataError(f"{shown(path)} is damaged ({' '.join(why.split())[:200]}); {fix}")


def read_json(path: pathlib.Path, fix: str):
    """A committed JSON file's content; cut short or no JSON is a `DataError` naming the file and `fix`."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise damaged(path, f"not UTF-8: {e.reason}", fix) from None
    except ValueError as e:
        raise damaged(path, f"no JSON: {e}", fix) from None


def restore(path: pathlib.Path) -> str:
    return f"restore it with git checkout -- {shown(path)}"


def retake(path: pathlib.Path) -> str:
    """The fix for a damaged results.json under docs/results."""
    return f"take it again from a run (python -m experiments.pages --take FOLDER), or {restore(path)}"


def load(name: str, folder: pathlib.Path | None = None) -> dict:
    path = (RESULTS if folder is None else folder) / name / "results.json"
    r = read_json(path, retake(path))
    if not isinstance(r, dict) or not isinstance(r.get("claims"), list):
        raise damaged(path, "not a results file: no list of claims", retake(path))
    return r


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def cost(r: dict) -> tuple[float | None, float]:
    """(the run's wall seconds, the training seconds of the rows it took from the row cache).

    A table rerun over its cached rows takes seconds; what it costs from an empty cache is both.
    Figures of another type raise ValueError (the caller names the file)."""
    def trained(x) -> float:      # a row's record, or a table row holding records (scale_ablation's pairs)
        if isinstance(x, dict):
            if "cached" in x and "seconds" in x:
                if x["seconds"] is not None and not _number(x["seconds"]):
                    raise ValueError(f"a row's seconds are {x['seconds']!r}, not a number")
                return (x["seconds"] or 0.0) if x["cached"] else 0.0
            return sum(trained(v) for v in x.values())
        return sum(trained(v) for v in x) if isinstance(x, list) else 0.0
    time = r.get("time", {})
    wall = time.get("wall_s") if isinstance(time, dict) else None
    if not isinstance(time, dict) or not (wall is None or _number(wall)):
        raise ValueError(f"its time is {time!r}, not {{'wall_s': seconds, ...}}")
    return wall, trained(r.get("rows", []))


def smoke_times(path: pathlib.Path | None = None) -> dict[str, float]:
    """Each experiment's smoke-preset wall seconds, from the committed run (`--take-smoke`), {} without one;
    a file cut short or of another shape is a `DataError` naming it and the fix."""
    path = SMOKE if path is None else path
    if not path.is_file():
        return {}
    fix = f"write it again (python -m experiments.pages --take-smoke FOLDER), or {restore(path)}"
    found = read_json(path, fix)
    seconds = found.get("seconds") if isinstance(found, dict) else None
    if not (isinstance(seconds, dict) and all(isinstance(k, str) and _number(v) for k, v in seconds.items())):
        raise damaged(path, 'not {"seconds": {experiment: seconds}}', fix)
    return seconds


def took(name: str, result: dict | None = None, smoke: dict | None = None,
         folder: pathlib.Path | None = None) -> tuple[str | None, str | None]:
    """How long the committed runs of `name` took, as text: (its smoke preset, its cpu preset), None where
    there is no such run. `result` (its results.json) and `smoke` (`smoke_times()`) when read already;
    `folder`: where the results are (docs/results, whose smoke_times.json is read)."""
    smoke = smoke_times(None if folder is None else folder / SMOKE.name) if smoke is None else smoke
    folder = RESULTS if folder is None else folder
    if result is None and (folder / name / "results.json").is_file():
        result = load(name, folder)
    try:
        wall, cached = cost(result) if result else (0, 0)
    except ValueError as e:
        path = folder / name / "results.json"
        raise damaged(path, str(e), retake(path)) from None
    return minutes(smoke[name]) if name in smoke else None, minutes(wall + cached) if wall else None
