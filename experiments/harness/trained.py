"""A row a table trained, found in its results folder and reopened: the way into what it trained.

    trained = ladder.EXPERIMENT.reopen("layer_norm", preset="cpu")   # from results/ladder
    trained.model, trained.tokenizer                                  # a LanguageModel, a tokenizer
    python -m experiments.ladder --reopen layer_norm --preset cpu    # what it reopened, from where

A training table keeps each finished row as `<out>/<name>/rows/<row>-<hash>.json` (its record)
and `runs/<row>-<hash>/` (its checkpoint), the hash covering its model, training config, seeds,
task and preset. The row asked for is found by reading the records: its name, the preset (its
key is remade from the record at each preset: one matches), the seed asked for among its seeds,
and every flag given beside them (`--seeds`, `--steps`, `--corpus`, ...), each of which must
match. Where several rows fit, one of the chapter's own corpus first, then the one the table's
results.json shows (the table as last written), then the one finished last. Nothing trains and
nothing moves: a row that is not there is one line naming the command that trains it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Callable

from attention_jax.errors import ConfigError
from experiments.harness import reopen

WHOLE = ("name", "key", "config", "train_config", "seeds", "final", "fingerprint")   # a row's


@dataclasses.dataclass(frozen=True)
class Reopened:
    """A trained row: its model (in eval mode) and the tokenizer its text was written in (None where
    its table has none), the record it was found by, and the checkpoint step it was read from."""
    model: Any
    tokenizer: Any
    record: dict
    checkpoint: pathlib.Path
    table: str
    preset: str
    seed: int

    @property
    def row(self) -> str:
        return self.record["name"]

    @property
    def out(self) -> pathlib.Path:
        """The results folder it was found in (the `out` of the run that trained it)."""
        return self.checkpoint.parents[4]

    def describe(self) -> str:
        """What was reopened and from where, in two lines (the command line prints them)."""
        i, tc = self.record["seeds"].index(self.seed), self.record["train_config"]
        final = ", ".join(f"{k} {_figure(v, i)}" for k, v in list(self.record["final"].items())[:3])
        call = python_call(self.table, self.row, self.preset, self.seed, self.out)
        return (f"reopened {self.table} row {self.row!r}, seed {self.seed} ({self.preset} preset: "
                f"{tc['steps']} steps x batch {tc['batch_size']}, lr {tc['lr']:g}; {final}): a "
                f"{type(self.model).__name__} of {self.record['params']:,} parameters, from "
                f"{self.checkpoint}\nin Python: {call}.model"
                + ("" if self.tokenizer is None else ", .tokenizer"))

    def __repr__(self) -> str:
        return self.describe()


def _figure(values, i: int) -> str:
    value = values[i] if isinstance(values, list) else values
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def python_call(table: str, row: str, preset: str, seed: int, out: pathlib.Path) -> str:
    where = "" if out == pathlib.Path("results") else f', out="{out}"'
    return f'{table}.EXPERIMENT.reopen("{row}", preset="{preset}", seed={seed}{where})'


def records(folder: pathlib.Path) -> list[tuple[dict, float]]:
    """Every finished row's record in `folder`/rows that is intact (its digest holds), with the
    time it was written; a measurement kept beside them (`rows.measured`) or a damaged file is
    passed over."""
    found = []
    for path in sorted((folder / "rows").glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            whole = isinstance(record, dict) and all(k in record for k in WHOLE)
            if whole and record.get("digest") == reopen.digest(record):
                found.append((record, path.stat().st_mtime))
        except (OSError, ValueError):
            continue
    return found


def preset_of(record: dict, presets) -> str | None:
    """The preset whose key this record's content makes, or None (a row of another version's)."""
    for preset in presets:
        made = reopen.key(record["name"], record["config"], record["train_config"], record["seeds"],
                          record.get("task"), preset)
        if made == record["key"]:
            return preset
    return None


def shown(folder: pathlib.Path) -> list[str]:
    """The row keys the table's results.json shows, its rows first (then any other it names)."""
    try:
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    keys: list[str] = []

    def walk(x):
        if isinstance(x, dict):
            if isinstance(x.get("key"), str) and x["key"] not in keys:
                keys.append(x["key"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    if isinstance(results, dict):
        walk(results.get("rows"))
        walk(results)
    return keys


@dataclasses.dataclass
class Asked:
    """What the call asked for: the table, its rows, the row, preset, seed, and the flags given
    beside them (name -> (value, whether a record was trained so)), each of which the row must
    match."""
    table: str
    rows: list[str]
    row: str
    preset: str
    folder: pathlib.Path
    seed: int | None = None
    flags: dict[str, tuple[Any, Callable[[dict], bool]]] = dataclasses.field(default_factory=dict)
    python: bool = False      # a notebook's call: the fix in Python's words

    def said(self, flags: dict) -> str:
        """Flags as the caller gives them: `--rows a --steps 9`, or `rows="a", steps=9`."""
        if self.python:
            return ", ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}"
                             for k, v in flags.items())
        return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags.items())

    def train_it(self) -> str:
        """The command (or call) that trains the row asked for."""
        flags = {"preset": self.preset, "rows": table_row(self.row, self.rows),
                 **{k: v for k, (v, _) in self.flags.items()}}
        if self.seed is not None and "seeds" not in self.flags:
            flags["seed"] = self.seed
        out = self.folder.parent
        if self.python:
            return f'{self.table}.EXPERIMENT({self.said({**flags, "out": str(out)})})'
        return (f"python -m experiments.{self.table} {self.said(flags)}"
                + ("" if out == pathlib.Path("results") else f" --out {out}"))


def table_row(row: str, rows: list[str]) -> str:
    """The table's row a trained row belongs to: itself, or the longest row its name extends
    (scale_ablation's d32 trains d32_scaled and d32_unscaled)."""
    if row in rows:
        return row
    return max((r for r in rows if row.startswith(r + "_")), key=len, default=row)


def choose(asked: Asked, found: list[tuple[dict, float]], presets) -> dict:
    """The record of the row asked for, or one `ConfigError` line saying why there is none and
    what trains it."""
    where, row, head = asked.folder, asked.row, f"{asked.table} row {asked.row!r}"
    fix = f"train it with {asked.train_it()}"
    named = [(r, t) for r, t in found if r["name"] == row]
    if not named and row not in asked.rows:
        raise ConfigError(f"{asked.table} has no row {row!r}; choose from: {', '.join(asked.rows)}")
    parts = sorted({r["name"] for r, _ in found if r["name"].startswith(row + "_")})
    if not named and parts:
        raise ConfigError(f"{head} is trained as {len(parts)} models ({', '.join(parts)}); "
                          "reopen one of them by that name")
    if not named:
        raise ConfigError(f"{head} has not been trained in {where}; {fix}")
    at = [(r, t) for r, t in named if preset_of(r, presets) == asked.preset]
    if not at:
        others = sorted({p for p in (preset_of(r, presets) for r, _ in named) if p})
        ask = asked.said({"preset": others[0]}) if others else ""
        also = f" (it is at the {' and '.join(others)} preset: {ask})" if others else ""
        raise ConfigError(f"{head} has not been trained at the {asked.preset} preset in {where}"
                          f"{also}; {fix}")
    fit = [(r, t) for r, t in at if all(ok(r) for _, ok in asked.flags.values())]
    if not fit:
        given = asked.said({k: v for k, (v, _) in asked.flags.items()})
        raise ConfigError(f"{head} at the {asked.preset} preset in {where} was not trained with "
                          f"{given}; {fix}")
    held = [(r, t) for r, t in fit if asked.seed is None or asked.seed in r["seeds"]]
    if not held:
        seeds = ", ".join(map(str, sorted({s for r, _ in fit for s in r["seeds"]})))
        raise ConfigError(f"{head} at the {asked.preset} preset in {where} holds seed(s) {seeds}, "
                          f"not seed {asked.seed}; choose one of those, or {fix}")
    # Where several fit: the chapter's own corpus, then the one results.json shows, then the newest.
    order = {k: i for i, k in enumerate(shown(where))}
    held.sort(key=lambda rt: ("corpus" in (rt[0].get("task") or {}),
                              order.get(rt[0]["key"], len(order)), -rt[1]))
    return held[0][0]


def reopened(asked: Asked, record: dict, tokenizer: Callable[[], Any] | None) -> Reopened:
    """The chosen row's model for the seed asked for (its first by default), read from its
    checkpoint."""
    seed = record["seeds"][0] if asked.seed is None else asked.seed
    model = reopen.load_model(record, asked.folder, seed=seed)
    model.eval()
    step = asked.folder / "runs" / record["key"] / "checkpoints" / str(record["steps"])
    return Reopened(model, tokenizer() if tokenizer else None, record, step, asked.table,
                    asked.preset, seed)
