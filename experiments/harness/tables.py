"""The start every corpus-trained table shares: the corpus, its splits, and its rows trained alike.

    table = TextTable.open(ctx, longest=256)     # tiny-shakespeare, or --corpus PATH
    record = table.train("layer_norm", config)   # cached, resumable; train/val perplexity per seed
    model = table.load_model(record)             # the trained model, reopened

Every row of a table gets the command's training config, preset, seeds and flags, and
the same corpus; its record carries the final figures as mean, std and per seed.

The smoke preset reads only the first `SMOKE_VAL_TOKENS` of the held-out split: its
figures mean nothing at that budget, and reading the whole split (about 46k tokens, several
times per row) was most of a smoke run's time after compiling. results.json says how many
held-out tokens were read.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import DataError
from experiments.harness import rows
from experiments.harness.experiment import Context

SMOKE_VAL_TOKENS = 4096


def held_out(val, preset: str, *, longest: int = 128):
    """The held-out tokens a preset reads: all of them, or for smoke the first SMOKE_VAL_TOKENS
    (at least two windows of `longest`)."""
    return val if preset != "smoke" else val[:max(SMOKE_VAL_TOKENS, 2 * (longest + 1))]


@dataclasses.dataclass
class TextTable:
    ctx: Context
    corpus: object               # attention_jax.data.text.CorpusInfo
    splits: tuple                # (train, val) token ids
    seeds: list[int]

    @classmethod
    def open(cls, ctx: Context, *, longest: int = 128, vocab_size: int = 1024) -> "TextTable":
        """Load the corpus (--data / --corpus), tokenize it (cached) and split it 90/10.

        `longest`: the longest window any row trains or is read on; a corpus whose held-out
        split cannot fill one is refused here, before anything trains.
        """
        from attention_jax.data import load_tokens, resolve_corpus, train_val_split
        from attention_jax.data.text import check_text_file
        args = ctx.args
        info = check_text_file(args.corpus) if args.corpus else check_text_file(resolve_corpus(args.data))
        tokens = load_tokens(info.path, vocab_size=vocab_size)
        if len(tokens) < 10 * (longest + 1):
            raise DataError(f"corpus {info.path} is too small: {len(tokens):,} tokens, and its 10% held-out split "
                            f"must fill a window of {longest + 1}; use a text of at least "
                            f"{10 * (longest + 1):,} tokens (~{25 * (longest + 1):,} characters)")
        if not info.default:
            print(f"corpus: {info.name} (sha256 {info.sha256[:16]}): not the book's, so no book figures", flush=True)
        train, val = train_val_split(tokens)
        return cls(ctx, info, (train, held_out(val, ctx.preset, longest=longest)), list(range(args.seeds)))

    @property
    def book(self) -> bool:
        """Whether the book's figures apply: only on the chapter's own corpus."""
        return self.corpus.default

    def train(self, name: str, model_config: ModelConfig, *, train_config: TrainConfig | None = None,
              measures: Mapping[str, rows.Measure] | None = None, reopen: bool = False) -> dict:
        """Train (or reload) one row; its record with mean/std/per-seed train and val perplexity.

        `reopen`: the table will `load_model` it, so its checkpoint must restore (else the row retrains)."""
        from attention_jax.train import text_task
        tc, model_config = train_config or self.ctx.settings, self.ctx.model(model_config)
        task = text_task(*self.splits, batch_size=tc.batch_size, context=model_config.context,
                         train_eval_windows=tc.train_eval_windows, identity=self.corpus.identity())
        record = rows.train_row(name, model_config, tc, task, preset=self.ctx.preset, seeds=self.seeds,
                                folder=self.ctx.folder, fresh=self.ctx.args.fresh, progress=self.ctx.progress,
                                measures=measures, reopen=reopen)
        for figure in record["final"]:
            record[figure], record[f"{figure}_std"], record[f"{figure}_seeds"] = rows.summary(record, figure)
        record["train"], record["val"] = (rows.fmt(record["train_ppl"], record["train_ppl_std"]),
                                          rows.fmt(record["val_ppl"], record["val_ppl_std"]))
        return record

    def load_model(self, record: dict, *, seed: int = 0):
        return rows.load_model(record, self.ctx.folder, seed=seed)

    def describe(self) -> dict:
        """What results.json says about the data."""
        from experiments.harness.platform import backend_summary
        train, val = self.splits
        return {"backend": backend_summary(), "corpus": self.corpus.name, "sha256": self.corpus.sha256, "path": str(self.corpus.path),
                "train_tokens": int(len(train)), "val_tokens": int(len(val)), "book_figures": self.book}
