"""The committed runs under docs/results, read back: each experiment's results.json, the smoke preset's
times, and what a run cost.

The results pages (`experiments.pages`) are written from these, and every command's --help says how
long its committed runs took. A file cut short or of another shape is a `DataError` naming it and the
fix, never a traceback: the pages leave it out saying so, and a command's --help goes without its
times. Nothing here imports JAX or another module of the lab, so the command line reads it at once.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import NamedTuple, Sequence

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
    """Seconds as a reader counts them: "27 s", "86 min", "4.1 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


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


@dataclasses.dataclass(frozen=True)
class Smoke:
    """The smoke preset's committed times (`python -m experiments.all --preset smoke`), each
    experiment's wall seconds: `first_run` from empty caches (every program compiled, the tokenizer
    trained, every row trained), `seconds` again with the compiled programs cached (rows trained
    anew); on `cores` cores, the highest 5-minute load average of each run in `load` (a run
    beside other work is slower than its cores alone make it)."""
    seconds: dict = dataclasses.field(default_factory=dict)
    first_run: dict = dataclasses.field(default_factory=dict)
    cores: int | None = None
    load: dict = dataclasses.field(default_factory=dict)      # "seconds" / "first_run" -> load

    def shared(self) -> str:
        """", its runs beside other work (load average 7.2 and 7.1 on 2 cores)", or "" where
        neither run's load passed its cores."""
        loads = [self.load[k] for k in ("first_run", "seconds") if k in self.load]
        if not self.cores or not loads or max(loads) <= self.cores:
            return ""
        said = " and ".join(f"{x:.1f}" for x in loads)
        return f", its runs beside other work (load average {said} on {self.cores} cores)"


def _times(x) -> bool:
    return isinstance(x, dict) and all(isinstance(k, str) and _number(v) for k, v in x.items())


def smoke_times(path: pathlib.Path | None = None) -> Smoke:
    """The smoke preset's committed times (`--take-smoke`, `--take-smoke-first`), none without a
    file; a file cut short or of another shape is a `DataError` naming it and the fix."""
    path = SMOKE if path is None else path
    if not path.is_file():
        return Smoke()
    fix = f"write it again (python -m experiments.pages --take-smoke FOLDER), or {restore(path)}"
    found = read_json(path, fix)
    found = found if isinstance(found, dict) else {}
    seconds, first, cores = found.get("seconds"), found.get("first_run", {}), found.get("cores")
    load = found.get("load", {})
    if not (_times(seconds) and _times(first) and _times(load)
            and (cores is None or isinstance(cores, int))):
        shape = '{"seconds": {experiment: seconds}, "first_run": {...}, "cores": N, "load": {...}}'
        raise damaged(path, f"not {shape}", fix)
    return Smoke(seconds, first, cores, load)


class Took(NamedTuple):
    """How long the committed runs of one experiment took, as text (None where there is none)."""
    first: str | None      # the smoke preset's first run, from empty caches
    smoke: str | None      # the smoke preset with its compiled programs cached
    cpu: str | None        # the cpu preset, from an empty row cache


def took(name: str, result: dict | None = None, smoke: Smoke | None = None,
         folder: pathlib.Path | None = None) -> Took:
    """How long the committed runs of `name` took. `result` (its results.json) and `smoke`
    (`smoke_times()`) when read already; `folder`: where the results are (docs/results, whose
    smoke_times.json is read)."""
    smoke = smoke_times(None if folder is None else folder / SMOKE.name) if smoke is None else smoke
    wall, cached = cpu_cost(name, result, folder)
    said = lambda times: minutes(times[name]) if name in times else None
    return Took(said(smoke.first_run), said(smoke.seconds), minutes(wall + cached) if wall else None)


def cpu_cost(name: str, result: dict | None = None,
             folder: pathlib.Path | None = None) -> tuple[float, float]:
    """`cost` of the committed run of `name` (0, 0 where there is none); a damaged one is a
    `DataError`."""
    folder = RESULTS if folder is None else folder
    if result is None and (folder / name / "results.json").is_file():
        result = load(name, folder)
    try:
        wall, cached = cost(result) if result else (0, 0)
    except ValueError as e:
        path = folder / name / "results.json"
        raise damaged(path, str(e), retake(path)) from None
    return wall or 0, cached


def _seconds(x) -> float:
    """Every training second the records in `x` took, whether this run trained them or took them
    from the row cache."""
    if isinstance(x, dict):
        if "cached" in x and _number(x.get("seconds")):
            return x["seconds"]
        return sum(_seconds(v) for v in x.values())
    return sum(_seconds(v) for v in x) if isinstance(x, list) else 0.0


# A run expected to take longer than this says first how long, and how to stop and resume it.
LONG_S = 120.0
STOP = {True: "Ctrl-C stops it keeping every finished row (the row in progress resumes from its "
              "last checkpoint), and the same command resumes",
        False: "Ctrl-C stops it, and the same command starts it over"}
Expected = tuple[float, str, "int | None", str]    # seconds, what they are, cores, an aside


def expected(name: str, preset: str, rows: Sequence[str] | None = None) -> Expected | None:
    """(seconds, what they are, cores, an aside) of the committed run of `name` at `preset` (for
    `rows` alone, where its records say what each row took), or None where there is none or it
    cannot be read."""
    try:
        if preset == "smoke":
            smoke = smoke_times()
            first, again = smoke.first_run.get(name), smoke.seconds.get(name)
            aside = f", compiling every program ({minutes(again)} with them cached)" if again else ""
            return (first, "its committed first run", smoke.cores, aside) if first else None
        if preset != "cpu" or not (RESULTS / name / "results.json").is_file():
            return None
        result = load(name)
        if result.get("preset") != "cpu":
            return None
        cores = ((result.get("backend") or {}).get("host") or {}).get("cores")
        every = [r for r in result.get("rows", []) if isinstance(r, dict)]
        chosen = [r for r in every if rows and r.get("name") in rows]
        if chosen and len(chosen) < len(every):
            names = ", ".join(r["name"] for r in chosen)
            return _seconds(chosen), f"its committed cpu-preset run of {names}", cores, ""
        return sum(cpu_cost(name, result)), "its committed cpu-preset run", cores, ""
    except (DataError, OSError, AttributeError, TypeError):   # --help says what is damaged
        return None


def announce(name: str, preset: str, rows: Sequence[str] | None = None, *, training: bool = False,
             folder: pathlib.Path | None = None) -> str | None:
    """The one line a run of more than a few minutes (`LONG_S`) starts with: how long the committed
    run took, on how many cores, and how to stop and resume it; None for a shorter run or one never
    committed."""
    found = expected(name, preset, rows)
    if not found or found[0] < LONG_S:
        return None
    seconds, what, cores, aside = found
    on = f" on {cores} cores" if cores else ""
    reused = f"; rows already finished in {folder} are reused" if training and folder else ""
    return (f"{name}, {preset} preset: {what} took {minutes(seconds)}{on}{aside}{reused}; "
            f"{STOP[training]}")
