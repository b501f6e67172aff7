"""A table's rows: trained alike, cached when finished, reopened; a line each, claims per seed, one Result.

    table = Table.on_corpus(ctx, longest=256)              # tiny-shakespeare, or --corpus PATH
    r = table.train("layer_norm", config, say=lambda r: f"val {r['val']}")   # cached, resumable
    model = table.load_model(r)                            # the trained model, reopened
    return table.result(records, claims=claims, tables={...}, figures={...}, book=[...])

Every row gets the command's seeds, training config (or the one given), flags and data; its
record carries each final figure as mean, std and per seed (`val_ppl`, `val_ppl_std`,
`val_ppl_seeds`; `train` and `val` as text). A row's key is a hash of its model config, how
it was computed (the speed swap: --attention), training config, preset, seeds and task (the
corpus, when it is not the default), so a rerun of the same command skips finished rows, an
interrupted row resumes from its last checkpoint, and changing anything about a row trains
it anew. The key spells the model as rows were first spelled (`spelled`), so rows finished
by earlier versions stay finished.

A finished row keeps its checkpoint: `load_model(record)` reopens its trained model (a read that
moves nothing: `reopen`), and a measurement the cached record lacks (one added to the table
later) is computed from that checkpoint and added to the record. A cached record is trusted
only when it parses and its key, config and training config are the ones asked for; otherwise
the row is trained again, saying why.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any, Callable, Mapping

import numpy as np

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import DataError
from attention_jax.speed import Speed
from experiments.harness import cli, reopen, report
from experiments.harness.experiment import Context, Result
from experiments.harness.reopen import (SPEED_FIELDS, digest as _digest, hashed as _hash,
                                        load_model, programs, restore_state, unspelled)

Measure = Callable[[Any, Any], dict]   # (engine, state) -> figures to keep with the row
SMOKE_KEEPS = 1       # checkpoints a finished smoke row keeps (`keeps`)
# ModelConfig fields added after rows were first cached, at the value every earlier row had:
# left out of a row's key while they hold it, so those rows keep their keys.
ADDED_LATER = {"gelu": "exact", "output_bias": True, "causal": True, "activation": "gelu", "ff_width": None,
               "output_size": None}
__all__ = ["SPEED_FIELDS", "Table", "load_model", "measured", "restore_state", "row_key", "spelled",
           "unspelled"]


def spelled(model_config: ModelConfig, speed: Speed) -> dict:
    """The model and its speed as a row's key and record spell them (see ADDED_LATER, SPEED_FIELDS)."""
    out = {k: v for k, v in model_config.to_dict().items() if ADDED_LATER.get(k, ...) != v}
    out.update(attention=speed.form, attention_chunk=speed.chunk)
    if speed.matmul_dtype is not None:
        out["matmul_dtype"] = speed.matmul_dtype
    if not speed.dense:
        out["dense"] = False
    return out


def row_key(name: str, model_config: ModelConfig, train_config: TrainConfig, preset: str, seeds,
            task_identity: Mapping | None = None, speed: Speed = Speed()) -> str:
    """<name>-<12 hex>: the hash of what made the row and the preset (`reopen.key`)."""
    return reopen.key(name, spelled(model_config, speed), dataclasses.asdict(train_config), seeds,
                      task_identity, preset)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)


def _cached(path: pathlib.Path, key: str, model_config: ModelConfig, train_config: TrainConfig,
            speed: Speed) -> dict | None:
    """The finished row's record, or None (saying why) when it is missing, damaged or someone else's."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        ok = (isinstance(record, dict) and record.get("key") == key and record.get("config") == spelled(model_config, speed)
              and record.get("train_config") == dataclasses.asdict(train_config) and "final" in record
              and record.get("digest") == _digest(record))     # a record without one is not trusted
    except (OSError, ValueError):
        ok = False
    if not ok:
        _note(f"{path} is damaged or belongs to another row; training it again")
        return None
    record.pop("digest", None)
    return record


def _stale(workdir: pathlib.Path, fingerprint: dict) -> bool:
    """Whether an unfinished row's checkpoint folder names its run otherwise than this version does
    (its run.json): such a folder is another version's, and the row trains from the start."""
    try:
        return json.loads((workdir / "run.json").read_text(encoding="utf-8")) != fingerprint
    except (OSError, ValueError):
        return False


def measured(name: str, identity: dict, compute: Callable[[], dict], *, folder: pathlib.Path,
             fresh: bool = False) -> dict:
    """A measurement that trains nothing, kept like a finished row (rows/<name>-<hash>.json, its
    content's sha256 checked on reading): `compute()` runs when it is missing, damaged or `fresh`."""
    key = f"{name}-{_hash(identity)[:12]}"
    path = folder / "rows" / f"{key}.json"
    if path.exists() and not fresh:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(record, dict) and record.get("key") == key and record.get("digest") == _digest(record):
                return record["value"]
        except (OSError, ValueError):
            pass
        _note(f"{path} is damaged or belongs to another measurement; measuring again")
    value = compute()
    _write(path, {"key": key, "identity": identity, "value": value})
    return value


def _labelled(record: dict, model_config: ModelConfig, speed: Speed) -> dict:
    """The record with what computed its attention here (what "auto" chose, and the kernel)."""
    record["attention"], record["attention_kernel"] = speed.form_for(model_config), speed.describe(model_config)
    return record


def _every(log: list[dict], n: int) -> list[dict]:
    """Step metrics averaged over each stretch of n steps (per seed), for the record."""
    out = []
    for i in range(0, len(log), n):
        chunk = log[i:i + n]
        point = {"step": chunk[-1]["step"]}
        for k in chunk[0]:
            if k != "step":
                point[k] = np.mean([c[k] for c in chunk], axis=0).tolist()
        point["lr"] = chunk[-1]["lr"]
        out.append(point)
    return out


def _write(path: pathlib.Path, record: dict) -> None:
    from attention_jax.train.distributed import is_writer
    if not is_writer():   # with several processes, process 0 keeps the records
        return
    data = report._jsonable({k: v for k, v in record.items() if k not in ("cached", "digest")})
    report.atomic_write(path, json.dumps({**data, "digest": _digest(data)}, indent=1))


def keeps(preset: str) -> int:
    """How many checkpoints a finished row keeps: the library's (its step and one to fall back
    to), or at the smoke preset its last alone, which reopens it (its figures mean nothing:
    nothing to fall back to)."""
    from attention_jax.train.checkpoints import KEEP
    return SMOKE_KEEPS if preset == "smoke" else KEEP


def corpus_of(ctx: Context):
    """The corpus a run's corpus tables train on: --corpus, or tiny-shakespeare where --data, the
    environment or the cache has it (an `attention_jax.data.text.CorpusInfo`); a bad one is one
    line naming its flag."""
    from attention_jax.data import resolve_corpus
    from attention_jax.data.text import check_text_file
    from attention_jax.data.corpus import GIVE_PATH
    if ctx.corpus:
        with cli.flag_named("--corpus"):
            return check_text_file(ctx.corpus)
    as_flag = {GIVE_PATH: "pass --data PATH", "(the path given)": "(the path given as --data PATH)"}
    with cli.flag_named(words=as_flag):
        return check_text_file(resolve_corpus(ctx.data))


def corpus_tokenizer(ctx: Context, vocab_size: int = 1024):
    """The BPE tokenizer of the corpus a run's corpus tables train on (a `tokenizers.Tokenizer`)."""
    from attention_jax.data import load_tokenizer
    return load_tokenizer(corpus_of(ctx).path, vocab_size=vocab_size)


@dataclasses.dataclass
class Table:
    ctx: Context
    corpus: object = None        # attention_jax.data.text.CorpusInfo, for the corpus tables
    splits: tuple = ()           # (train, val) token ids

    @classmethod
    def on_corpus(cls, ctx: Context, *, longest: int = 128, vocab_size: int = 1024) -> "Table":
        """The corpus (--data / --corpus) tokenized (cached) and split 90/10. `longest`: the longest
        window any row trains or is read on; a held-out split that cannot fill one is refused here."""
        from attention_jax.data import load_tokens, train_val_split
        info = corpus_of(ctx)
        tokens = load_tokens(info.path, vocab_size=vocab_size)
        if len(tokens) < 10 * (longest + 1):
            raise DataError(f"corpus {info.path} is too small: {len(tokens):,} tokens, and its 10% held-out split "
                            f"must fill a window of {longest + 1}; use a text of at least "
                            f"{10 * (longest + 1):,} tokens (~{25 * (longest + 1):,} characters)")
        if not info.default:
            print(f"corpus: {info.name} (sha256 {info.sha256[:16]}): not the book's, so no book figures", flush=True)
        train, val = train_val_split(tokens)
        if ctx.held_out_tokens:
            val = val[:max(ctx.held_out_tokens, 2 * (longest + 1))]
        return cls(ctx, info, (train, val))

    @property
    def seeds(self) -> list[int]:
        return self.ctx.seeds

    @property
    def book(self) -> bool:
        """Whether the book's figures apply: only on the chapter's own corpus."""
        return self.corpus is None or self.corpus.default

    def text_task(self, model_config: ModelConfig, train_config: TrainConfig):
        """Next-token prediction on the corpus: train and held-out perplexity."""
        from attention_jax.train import text_task
        return text_task(*self.splits, batch_size=train_config.batch_size, context=model_config.context,
                         train_eval_windows=train_config.train_eval_windows, identity=self.corpus.identity())

    def train(self, name: str, model_config: ModelConfig, *, train_config: TrainConfig | None = None, task=None,
              measures: Mapping[str, Measure] | None = None, reopen: bool = False,
              say: Callable[[dict], str] | None = None) -> dict:
        """Train one row (or load it when already finished): its record, each final figure as
        mean/std/per seed, and one line `  name  say(record)  (seconds or "cached")`.

        `measures` maps a name to `measure(engine, state) -> dict`: a table's own figures (e.g.
        perplexity at other lengths), kept in `record["measures"][name]`. `reopen`: the table will
        reopen the trained model (`restore`, `load_model`), so a finished row is served from the
        cache only when its checkpoint restores. A finished row whose checkpoint is needed but
        damaged or gone is trained again, that row alone (not the whole table).
        """
        from attention_jax.errors import CheckpointError, TrainingDiverged
        from attention_jax.train import Engine, fit, run_record
        from attention_jax.parameters import count_params
        tc, model_config, ctx = train_config or self.ctx.settings, self.ctx.model(model_config), self.ctx
        task, measures, fresh, folder = task or self.text_task(model_config, tc), dict(measures or {}), ctx.fresh, ctx.folder
        key = row_key(name, model_config, tc, ctx.preset, ctx.seeds, task.identity, ctx.speed)
        done_file = folder / "rows" / f"{key}.json"
        record = None if fresh else _cached(done_file, key, model_config, tc, ctx.speed)
        if record is not None:
            missing = [m for m in measures if m not in record.get("measures", {})]
            try:
                if missing or reopen:
                    engine, state = self.restore(record)
                if missing:   # added to the table since the row was trained: measure its checkpoint
                    record["measures"].update({m: measures[m](engine, state) for m in missing})
                    _write(done_file, record)
                record["cached"] = True
                return self._said(name, _labelled(record, model_config, ctx.speed), say)
            except CheckpointError:
                _note(f"row {name!r} is finished but its checkpoint cannot be reopened (damaged or deleted); "
                      "training that row again")
                fresh = True
        engine = Engine(model_config, tc, n_seeds=len(ctx.seeds), speed=ctx.speed, programs=programs())
        made = run_record(model_config, tc, ctx.seeds, task.identity)
        if not fresh and _stale(folder / "runs" / key, made):
            _note(f"row {name!r}: its unfinished checkpoint was written by another version of this code; "
                  "training that row from the start")
            fresh = True
        try:
            result = fit(engine, task, seeds=ctx.seeds, workdir=folder / "runs" / key, resume=not fresh,
                         progress=ctx.progress, desc=name, steps_per_call=ctx.steps_per_call,
                         stop=cli.STOP, keep_finished=keeps(ctx.preset))
        except TrainingDiverged as e:    # in the command line's terms: the row, its flag, what is recorded
            keep = f"its last good checkpoint (step {e.kept}) is kept" if e.kept else "no checkpoint of it is kept"
            e.args = (f"row {name!r} diverged at step {e.step}: {e.what}; the learning rate (lr={e.lr:g}) is the likely "
                      f"cause: lower it with --lr; {keep} and nothing was recorded as finished",)
            raise
        record = {"name": name, "key": key, "params": count_params(model_config), "seeds": list(ctx.seeds),
                  "steps": result.steps, "seconds": result.seconds, "resumed_from": result.resumed_from,
                  "steps_per_call": result.steps_per_call,
                  "config": spelled(model_config, ctx.speed), "train_config": dataclasses.asdict(tc),
                  "fingerprint": made,
                  "task": task.identity, "final": result.final, "history": result.history,
                  "train_log": _every(result.train_log, tc.log_every),
                  "measures": {m: fn(engine, result.state) for m, fn in measures.items()}}
        _write(done_file, record)
        record["cached"] = False
        return self._said(name, _labelled(record, model_config, ctx.speed), say)

    def _said(self, name: str, record: dict, say) -> dict:
        """The record with each final figure's mean, std and per-seed values, its line printed."""
        for figure in record["final"]:
            record[figure], record[f"{figure}_std"], record[f"{figure}_seeds"] = summary(record, figure)
        if "val_ppl" in record:
            record["train"] = fmt(record["train_ppl"], record["train_ppl_std"])
            record["val"] = fmt(record["val_ppl"], record["val_ppl_std"])
        if say is not None:
            took = "cached" if record["cached"] else f"{record['seconds']:.0f} s"
            width = max(map(len, self.ctx.rows or [name]))
            print(f"  {name:<{width}}  {say(record)}  ({took})", flush=True)
        return record

    def restore(self, record: dict):
        """(engine, state) of a finished row, from its checkpoint."""
        return restore_state(record, self.ctx.folder)

    def load_model(self, record: dict, *, seed: int | None = None):
        """A finished row's model for `seed` (by default the row's first)."""
        return load_model(record, self.ctx.folder, seed=seed)

    def describe(self) -> dict:
        """What results.json says about the data."""
        from experiments.harness.platform import backend_summary
        train, val = self.splits
        return {"backend": backend_summary(), "corpus": self.corpus.name, "sha256": self.corpus.sha256,
                "path": str(self.corpus.path), "train_tokens": int(len(train)), "val_tokens": int(len(val)),
                "book_figures": self.book}

    def budget(self, train_config: TrainConfig | None = None) -> str:
        """The preset and budget in words, for titles: "cpu preset: 2250 steps x batch 32, lr 0.003, 1 seed(s)"."""
        tc = train_config or self.ctx.settings
        corpus = f", {self.corpus.name}" if self.corpus is not None else ""
        return (f"{self.ctx.preset} preset: {tc.steps} steps x batch {tc.batch_size}, lr {tc.lr:g}, "
                f"{len(self.seeds)} seed(s){corpus}")

    def result(self, records: list[dict], *, claims: Callable[[dict], list[dict]], tables: dict, figures: dict,
               book=(), config: dict | None = None, extra: dict | None = None, check: dict | None = None) -> Result:
        """The table's Result: `claims` checked on the seed means and on every seed (`check`: the records
        by name, or what the claims read instead), the training config, seeds and data in its config."""
        check = {r["name"]: r for r in records} if check is None else check
        found = report.claims_across_seeds(claims, check, len(self.seeds))
        block = {"train": dataclasses.asdict(self.ctx.settings), "seeds": self.seeds, **(config or {})}
        if self.corpus is not None:
            block["data"] = self.describe()
        return Result(rows=records, claims=found, tables=tables, figures=figures, book=list(book), config=block,
                      extra=extra or {})


def summary(record: dict, figure: str) -> tuple[float, float, list[float]]:
    """(mean, std, per-seed values) of a final figure of a row."""
    from attention_jax.train.loop import mean_std
    values = np.asarray(record["final"][figure], np.float64)
    return (*mean_std(values), values.tolist())


def fmt(mean: float, std: float = 0.0, spec: str = ".2f") -> str:
    """`mean`, or `mean ± std` when there is a spread (more than one seed), both in format `spec`."""
    return format(mean, spec) if not std else f"{format(mean, spec)} ± {format(std, spec)}"
