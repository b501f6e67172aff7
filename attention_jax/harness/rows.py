"""Training a table's rows: a cache of finished rows and a checkpoint folder per row.

Every training experiment (the ladder and those after it) runs its rows through
`train_row`. A row's key is a hash of its model config, training config, preset and
seeds, so a rerun of the same command skips finished rows, an interrupted row resumes
from its last checkpoint, and changing anything about a row trains it anew.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Callable, Sequence

import numpy as np

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.data import load_tokens, resolve_corpus, train_val_split
from attention_jax.harness import cli, report
from attention_jax.inspect import count_params
from attention_jax.train import Engine, fit


def add_training_args(p, *, rows: Sequence[str] | None = None):
    """The flags every training experiment shares."""
    if rows:
        p.add_argument("--rows", default=None, help=f"comma-separated subset of: {', '.join(rows)}")
    p.add_argument("--steps", type=int, default=None, help="override the preset's training steps")
    p.add_argument("--batch-size", type=int, default=None, help="override the preset's batch size")
    p.add_argument("--lr", type=float, default=None, help="override the preset's peak learning rate")
    p.add_argument("--schedule", choices=("constant", "cosine"), default=None,
                   help="override the preset's schedule after warmup (cosine decays to 0.1 x lr)")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="also measure train and val perplexity every N steps (curves.png, results.json)")
    p.add_argument("--seeds", type=int, default=1, help="train N seeds at once (vmap) and report mean ± std")
    p.add_argument("--data", default=None, help="tinyshakespeare.txt or a folder holding it")
    p.add_argument("--fresh", action="store_true", help="ignore finished rows and checkpoints; retrain")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


@dataclasses.dataclass
class Table:
    """What a training experiment's command line resolves to, before any row trains."""
    args: Any
    preset: str
    train_config: TrainConfig
    rows: list[str]          # the chosen rows, in the table's order
    seeds: list[int]
    splits: tuple            # (train, val) token ids
    folder: pathlib.Path     # results/<name>/

    def train(self, name: str, model_config: ModelConfig, **kw) -> dict:
        """`train_row` with this command's training config, preset, seeds and flags."""
        return train_row(name, model_config, self.train_config, self.splits, preset=self.preset, seeds=self.seeds,
                         folder=self.folder, fresh=self.args.fresh, progress=not self.args.no_progress, **kw)


def start(name: str, description: str, presets, rows: Sequence[str], argv=None) -> Table:
    """Parse the shared flags, pick the preset and rows, load the corpus: every training table's start."""
    args = add_training_args(cli.parser(name, description, presets), rows=rows).parse_args(argv)
    preset, train_config = cli.choose_preset(args.preset, presets)
    chosen = cli.choose_names(args.rows, list(rows))
    train_config = with_overrides(train_config, args)
    seeds = seeds_from(args.seeds)
    splits = load_splits(args.data)
    return Table(args, preset, train_config, chosen, seeds, splits, report.results_dir(args.out, name))


def load_splits(data: str | None, *, vocab_size: int = 1024):
    """Corpus -> BPE ids -> (train, val), the 90/10 split every table uses."""
    tokens = load_tokens(resolve_corpus(data), vocab_size=vocab_size)
    return train_val_split(tokens)


def row_key(name: str, model_config: ModelConfig, train_config: TrainConfig, preset: str, seeds) -> str:
    blob = json.dumps({"model": model_config.to_dict(), "train": dataclasses.asdict(train_config),
                       "preset": preset, "seeds": list(seeds)}, sort_keys=True)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def train_row(name: str, model_config: ModelConfig, train_config: TrainConfig, splits, *,
              preset: str, seeds: Sequence[int], folder: pathlib.Path, fresh: bool = False,
              progress: bool = True, measure: Callable[[Engine, Any], dict] | None = None) -> dict:
    """Train one row (or load it when already finished) and return its record.

    `measure(engine, state)` may add a table's own figures (e.g. perplexity at other
    lengths) to the record; they are cached with it, so a finished row is never reloaded.
    """
    key = row_key(name, model_config, train_config, preset, seeds)
    done_file = folder / "rows" / f"{key}.json"
    if done_file.exists() and not fresh:
        record = json.loads(done_file.read_text())
        record["cached"] = True
        return record
    engine = Engine(model_config, train_config, n_seeds=len(seeds))
    result = fit(model_config, train_config, *splits, seeds=seeds, workdir=folder / "runs" / key,
                 resume=not fresh, progress=progress, desc=name, engine=engine)
    train_mean, train_std = result.mean_std("train_ppl")
    val_mean, val_std = result.mean_std("val_ppl")
    record = {"name": name, "key": key, "params": count_params(model_config),
              "train_ppl": train_mean, "train_ppl_std": train_std,
              "val_ppl": val_mean, "val_ppl_std": val_std,
              "train_ppl_seeds": result.train_ppl, "val_ppl_seeds": result.val_ppl,
              "seeds": list(seeds), "steps": result.steps, "seconds": result.seconds,
              "resumed_from": result.resumed_from, "config": model_config.to_dict(),
              "history": [{"step": h["step"], "train_ppl": float(np.mean(h["train_ppl"])),
                           "val_ppl": float(np.mean(h["val_ppl"]))} for h in result.history]}
    if measure is not None:
        record.update(measure(engine, result.state))
    report.atomic_write(done_file, json.dumps(record, indent=1))
    record["cached"] = False
    return record


def with_overrides(train_config: TrainConfig, args) -> TrainConfig:
    """The preset's training config with the command line's overrides applied."""
    flags = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "schedule": args.schedule,
             "eval_every": args.eval_every}
    change = {k: v for k, v in flags.items() if v is not None}
    return dataclasses.replace(train_config, **change)


def fmt_ppl(mean: float, std: float = 0.0) -> str:
    return f"{mean:.2f}" if not std else f"{mean:.2f} ± {std:.2f}"


def seeds_from(n: int) -> list[int]:
    if n < 1:
        raise cli.ConfigError(f"--seeds {n}: train at least one seed")
    return list(range(n))
