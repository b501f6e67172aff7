"""`run`: train the six rows (or reopen them), read the two-block model's attention, one Result."""
from __future__ import annotations

import dataclasses

from attention_jax.errors import ConfigError
from experiments.harness import cli, report
from experiments.harness.experiment import Result
from experiments.winograd import causal
from experiments.winograd.attention import claims, save_viewer
from experiments.winograd.constants import BOOK, CHANCE, HEADS, MODELS, WIDTH
from experiments.winograd.figures import accuracy_figure, pair_figure, pair_table, rule_figure, rule_table
from experiments.winograd.pool import train_pool
from experiments.winograd.pools import other_pools, pools_tables


def flags(p) -> None:
    p.add_argument("--width", type=cli.positive_int, default=WIDTH,
                   help=f"model width d_model (default {WIDTH}; {HEADS} heads per block)")
    p.add_argument("--nouns", default=None, metavar="FILE",
                   help="noun pool: one noun per line, optionally 'animal' or 'place' after it")
    p.add_argument("--adjectives", default=None, metavar="FILE",
                   help="adjectives: one 'word x' (it = first noun) or 'word y' (it = second) per line")
    p.add_argument("--pools", type=cli.positive_int, default=1, metavar="K",
                   help="also train every row on K - 1 word pools drawn from built-in lists (pool 0: the book's), "
                        "and check every claim on each")


class Words:
    """The toy's tokenizer: an id a word of its vocabulary, a sentence its words split by spaces."""

    def __init__(self, vocab):
        self.vocab = tuple(vocab)

    def encode(self, sentence: str):
        from attention_jax.data import winograd as wg
        return wg.encode([sentence], self.vocab)[0]

    def decode(self, ids) -> str:
        import numpy as np
        return " ".join(self.vocab[int(i)] for i in np.asarray(ids).reshape(-1))


def tokenizer(ctx) -> Words:
    """The words the rows were trained on (--nouns, --adjectives), as a tokenizer."""
    from attention_jax.data import winograd as wg
    return Words(wg.vocabulary(wg.load_spec(ctx.args.nouns, ctx.args.adjectives)))


def run(ctx) -> Result:
    from attention_jax.data import winograd as wg
    from experiments.harness.rows import Table
    args, tc, seeds = ctx.args, ctx.settings, ctx.seeds
    if ctx.data or ctx.corpus:
        raise ConfigError("winograd generates its own sentences: --data/--corpus do not apply; "
                          "change the words with --nouns FILE / --adjectives FILE")
    if args.pools > 1 and (args.nouns or args.adjectives):
        raise ConfigError("--pools draws its own word pools (pool 0 is the book's); drop --nouns/--adjectives")
    spec = wg.load_spec(args.nouns, args.adjectives)
    table = Table(ctx)
    pool = train_pool(ctx, table, spec)
    records, book = pool["records"], pool["book"]
    title = (f"Winograd toy, {ctx.preset} preset: {tc.steps} steps x batch {tc.batch_size}, lr {tc.lr:g}, "
             f"width {args.width}, {len(seeds)} seed(s)")
    tables, figures = accuracy_table(ctx.preset, records, book), {"accuracy.png": accuracy_figure(records, book, title)}
    extra = {}
    if pool["demos"]:
        two_blocks(ctx, table, spec, pool, tables, figures, extra)
    if args.pools > 1:
        extra["pools"] = found = other_pools(ctx, table, spec, pool["check"])
        tables.update(pools_tables(found, args.pools, len(seeds)))
    if tc.eval_every and any(len(r["history"]) > 1 for r in records):
        from experiments.plots import curves
        figures["curves.png"] = curves(records, ("accuracy", "train_accuracy"),
                                       ("held-out accuracy", "train accuracy"), title, log=False)
    summary = [report.book(f"{r['name']}: held-out accuracy %", BOOK[r['name']][0], r["held_out"], ".1f")
               for r in records if book and r["name"] in BOOK]
    return table.result(records, claims=claims, check=pool["check"], tables=tables, figures=figures, extra=extra,
                        book=summary, config={"width": args.width, "heads": HEADS, "spec": dataclasses.asdict(spec),
                                              "book_figures": book,
                                              "models": {m: base.to_dict() for m, (_, base) in MODELS.items()}})


def accuracy_table(preset: str, records: list[dict], book: bool) -> dict[str, str]:
    """Held-out accuracy per row, beside chance and the book's."""
    columns = [("task_kind", "task", ""), ("model", "model", ""), ("params", "params", ",d"),
               ("held_out", "held-out accuracy %", ""), ("book", "book %", ""),
               ("other", "other noun %", ""), ("book_other", "book other noun %", ""),
               ("train_acc", "train accuracy %", "")]
    chance = {"task_kind": "-", "model": "chance (a guess between the two nouns)", "held_out": f"{CHANCE:.1f}",
              "book": f"{CHANCE:.1f}" if book else None, "other": f"{CHANCE:.1f}",
              "book_other": f"{CHANCE:.1f}" if book else None}
    heading = "Held-out referent accuracy (only the word after \"so the\" is scored)" + \
        ("; smoke preset: a few steps, so these accuracies say nothing of the task, chance included" if
         preset == "smoke" else "")
    return {heading: report.format_table(columns, [chance, *records])}


def two_blocks(ctx, table, spec, pool: dict, tables: dict, figures: dict, extra: dict) -> None:
    """The two-block model read: its viewer, where its heads look at the referent (its first
    seed), what patching entering block 2 brings back and the circuit edge patching finds; into
    `tables`, `figures`, `extra`."""
    r, s0 = next(r for r in pool["records"] if r["name"] == "clean_two_blocks"), ctx.seeds[0]
    title = f"Winograd toy, two blocks, seed {s0} ({ctx.preset} preset)"
    save_viewer(table.load_model(r, seed=s0), pool["splits"]["clean"](s0), ctx.folder / "attention.html",
                title)
    demo, attention, book = pool["demos"][0], pool["check"]["attention"], pool["book"]
    sides = dict(spec.adjectives)
    a, b = demo["demo"]
    x, y = demo["pair"]
    where = "a held-out pair" if demo["pair_heldout"] else "a training pair"
    head = (f"Two blocks (seed {s0}), heads averaged, at position {demo['position']} "
            f"(the \"the\" after \"so\"): 'the {x} ... the {y} ... too {a}/{b}' ({where})")
    tables[head] = pair_table(demo, book and (x, y, a, b) == ("animal", "street", "tired", "wet"))
    tables[f"Block 2 at the referent across all {len(demo['adjectives'])} adjectives "
           f"('{x}'/'{y}'; right: mean over seed {s0}'s held-out pairs)"] = rule_table(demo, sides)
    figures["attention_pair.png"] = pair_figure(demo, f"attention at the referent, {a} vs {b} ({ctx.preset}, "
                                                      f"two blocks, seed {s0})")
    figures["block2_adjectives.png"] = rule_figure(demo, sides, f"block 2 at the referent, every adjective "
                                                                f"({ctx.preset} preset, seed {s0})")
    extra["attention"] = {"seed0": demo, **attention}
    extra["causal"] = pool["check"]["causal"]
    tables[f"Patching entering block 2 (seed {s0}, {causal.PAIRS} held-out pairs): the share of "
           "the clean answer each slot brings back, per test (1: all of it, 0: none)"] = \
        causal.table(pool["check"]["causal"]["seed0"])
    extra["found"] = pool["check"]["found"]
    tables[f"The circuit edge patching finds, per test (the fewest top edges, at most {causal.MOST_EDGES}, "
           f"recovering {causal.FAITHFUL:.0%} of the answer alone)"] = causal.found_table(pool["check"]["found"])
    print(f"  block 1 at the referent, {a} vs {b}: max difference "
          + ", ".join(f"{v:.3g}" for v in attention["block1_pair_diff_seeds"])
          + f" (per seed); block 2 moves {demo['block2_shift']:.2f} of its weight", flush=True)


