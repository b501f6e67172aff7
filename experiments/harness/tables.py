"""The shape every training table shares: rows trained alike, a line each, claims per seed, one Result.

    table = Table.on_corpus(ctx, longest=256)              # tiny-shakespeare, or --corpus PATH
    r = table.train("layer_norm", config, say=lambda r: f"val {r['val']}")   # cached, resumable
    model = table.load_model(r)                            # the trained model, reopened
    return table.result(records, claims=claims, tables={...}, figures={...}, book=[...])

Every row gets the command's seeds, training config (or the one given), flags and data;
its record carries each final figure as mean, std and per seed (`val_ppl`, `val_ppl_std`,
`val_ppl_seeds`; `train` and `val` as text). A table keeps only its rows, claims, columns
and figures.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import DataError
from experiments.harness import cli, report, rows
from experiments.harness.experiment import Context, Result


@dataclasses.dataclass
class Table:
    ctx: Context
    corpus: object = None        # attention_jax.data.text.CorpusInfo, for the corpus tables
    splits: tuple = ()           # (train, val) token ids

    @classmethod
    def on_corpus(cls, ctx: Context, *, longest: int = 128, vocab_size: int = 1024) -> "Table":
        """The corpus (--data / --corpus) tokenized (cached) and split 90/10. `longest`: the longest
        window any row trains or is read on; a held-out split that cannot fill one is refused here."""
        from attention_jax.data import load_tokens, resolve_corpus, train_val_split
        from attention_jax.data.text import check_text_file
        from attention_jax.data.corpus import GIVE_PATH
        if ctx.corpus:
            with cli.flag_named("--corpus"):
                info = check_text_file(ctx.corpus)
        else:
            with cli.flag_named(words={GIVE_PATH: "pass --data PATH", "(the path given)": "(the path given as --data PATH)"}):
                info = check_text_file(resolve_corpus(ctx.data))
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
              measures: Mapping[str, rows.Measure] | None = None, reopen: bool = False,
              say: Callable[[dict], str] | None = None) -> dict:
        """Train (or reload) one row: its record, each final figure as mean/std/per seed, and one line
        `  name  say(record)  (seconds or "cached")`. `reopen`: the table will `load_model` it, so its
        checkpoint must restore (else the row retrains)."""
        tc, model_config = train_config or self.ctx.settings, self.ctx.model(model_config)
        task = task or self.text_task(model_config, tc)
        ctx = self.ctx
        record = rows.train_row(name, model_config, tc, task, preset=ctx.preset, seeds=self.seeds, folder=ctx.folder,
                                fresh=ctx.fresh, progress=ctx.progress, measures=measures, reopen=reopen,
                                steps_per_call=ctx.steps_per_call, speed=ctx.speed)
        for figure in record["final"]:
            record[figure], record[f"{figure}_std"], record[f"{figure}_seeds"] = rows.summary(record, figure)
        if "val_ppl" in record:
            record["train"] = rows.fmt(record["train_ppl"], record["train_ppl_std"])
            record["val"] = rows.fmt(record["val_ppl"], record["val_ppl_std"])
        if say is not None:
            took = "cached" if record["cached"] else f"{record['seconds']:.0f} s"
            width = max(map(len, ctx.rows or [name]))
            print(f"  {name:<{width}}  {say(record)}  ({took})", flush=True)
        return record

    def restore(self, record: dict):
        """(engine, state) of a finished row, from its checkpoint."""
        return rows.restore_state(record, self.ctx.folder)

    def load_model(self, record: dict, *, seed: int = 0):
        return rows.load_model(record, self.ctx.folder, seed=seed)

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
