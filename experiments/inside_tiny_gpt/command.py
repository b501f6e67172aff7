"""`run`: train (or reopen) the tiny GPT, then the lecture's demos in order, as one Result."""
from __future__ import annotations

import dataclasses
import functools
import math

from attention_jax.errors import ConfigError
from experiments.harness import report
from experiments.harness.experiment import Result
from experiments.inside_tiny_gpt import demos
from experiments.inside_tiny_gpt.constants import CONFIG, LECTURE, ROW, SQRT_D_KEYS, SQRT_D_PAIRS, SQRT_D_ROWS, \
    SQRT_D_SEED, VAL_WINDOWS
from experiments.inside_tiny_gpt.evaluate import greedy_accuracy
from experiments.inside_tiny_gpt.figures import training_figure
from experiments.inside_tiny_gpt.world import identity, make_task, world_data


def flags(p) -> None:
    p.add_argument("--world-seed", type=int, default=0, metavar="N",
                   help="seed of the generated world (people, cities, text); another seed trains a new model")


def run(ctx) -> Result:
    from experiments.harness import rows as row_cache
    pm = functools.partial(row_cache.fmt, spec=".3f")     # mean ± std over the seeds
    world, tok, val, task, ident = prepared(ctx)
    record, models = trained(ctx, task, pm)
    sheet, person, budget = demos.Sheet(), world.people[0], budget_of(ctx)
    demos.parameters(sheet, models[0])
    prompt, ids = demos.forward(sheet, models[0], tok, person)
    demos.residual(sheet, models[0], ids, prompt, ctx.preset)
    demos.attention(sheet, models[0], tok, person, ctx.folder, ctx.preset)
    demos.sqrt_d(sheet, models[0], tok, person, ctx.preset)
    abl = demos.ablations(sheet, models, tok, world, val, budget, pm)
    greedy0 = greedy_accuracy(models[0], tok, world)
    print(f"fact accuracy of the intact model: greedy {greedy0:.3f}, teacher-forced {abl[0]['acc_seeds'][0]:.3f}",
          flush=True)
    consistency = trained_table(sheet, ctx, world, record, greedy0, abl[0], pm)
    sheet.figures["training.png"] = training_figure(record, f"tiny GPT training, {budget}")
    settings = {"model": ctx.model(CONFIG).to_dict(), "train": dataclasses.asdict(ctx.settings), "seeds": ctx.seeds,
                "data": ident, "sqrt_d": {"rows": SQRT_D_ROWS[ctx.preset], "keys": SQRT_D_KEYS, "seed": SQRT_D_SEED,
                                          **({"pairs": SQRT_D_PAIRS[ctx.preset]} if ctx.preset in SQRT_D_PAIRS else {})}}
    extra = {"record": {k: record[k] for k in ("key", "steps", "seconds", "cached", "final", "history")},
             "train_log": record["train_log"], **sheet.extra, "ablation_engine_consistency": consistency}
    summary = [report.book("tiny GPT: parameters", "109,056", f"{record['params']:,}"),
               report.book("tiny GPT: validation bits/char", LECTURE["intact"][0], record["val_bpc"], ".3f"),
               report.book("tiny GPT: fact accuracy (greedy, seed 0)", LECTURE["intact"][1], greedy0, ".3f")]
    summary += [report.book(f"ablation {r['key']}: val bits/char", r["lecture_bpc"], r["bpc"], ".3f")
                for r in abl if r["key"] != "intact" and r["lecture_bpc"] is not None]
    return Result(rows=abl, claims=sheet.claims, tables=sheet.tables, figures=sheet.figures, config=settings,
                  extra=extra, book=summary)


def tokenizer(ctx):
    """The lecture's 44-symbol alphabet, the tiny GPT's tokenizer."""
    from attention_jax.data import tiny_world as tw
    return tw.CharTokenizer()


def budget_of(ctx) -> str:
    tc = ctx.settings
    return (f"{ctx.preset} preset: {tc.steps} steps x batch {tc.batch_size} x {CONFIG.context} chars, "
            f"lr {tc.lr:g} ({tc.schedule}), {len(ctx.seeds)} seed(s)")


def prepared(ctx):
    """(world, tokenizer, validation windows, task, the data's identity) of --world-seed; a corpus refused."""
    from attention_jax.data import eval_windows
    args, tc = ctx.args, ctx.settings
    if ctx.corpus or ctx.data:
        raise ConfigError("the tiny GPT trains on the generated world, not a corpus; drop --corpus/--data "
                          "(--world-seed N draws another world)")
    if args.world_seed < 0:
        raise ConfigError(f"--world-seed {args.world_seed} must be a non-negative integer")
    config = ctx.model(CONFIG)
    world, tok, train_ids, val_ids = world_data(args.world_seed)
    val_windows = VAL_WINDOWS.get(ctx.preset)
    vx, vy = eval_windows(val_ids, config.context, max_windows=val_windows)   # the task's and the ablations'
    ident = identity(world, args.world_seed, val_windows)
    task = make_task(world, tok, train_ids, (vx, vy), tc, config.context, ident)
    print(f"world (seed {args.world_seed}): {len(world.people)} people in {len(world.cities)} cities, "
          f"{len(world.train_text):,} training and {len(world.val_text):,} validation characters", flush=True)
    return world, tok, (vx, vy), task, ident


def trained(ctx, task, pm) -> tuple[dict, list]:
    """The row's record and its model per seed, always from the checkpoint (trained now or reopened)."""
    from experiments.harness.rows import Table
    table = Table(ctx)
    record = table.train(ROW, CONFIG, task=task, reopen=True)
    engine, state = table.restore(record)      # fresh or cached, always from the checkpoint
    models = [engine.model(state, i) for i in range(len(ctx.seeds))]
    took = "reopened from the row cache" if record["cached"] else f"trained in {record['seconds']:.1f} s"
    print(f"tiny GPT ({record['params']:,} parameters) {took}: validation "
          f"{pm(record['val_bpc'], record['val_bpc_std'])} bits/char, fact accuracy "
          f"{pm(record['fact_acc'], record['fact_acc_std'])}", flush=True)
    return record, models


def trained_table(sheet, ctx, world, record: dict, greedy0: float, intact: dict, pm) -> float:
    """Table 0, first of all: the trained model beside the lecture's; returns how far the ablations' intact
    row, recomputed from the reopened checkpoint, is from the engine's own validation bits/char."""
    import numpy as np
    consistency = abs(intact["bpc_seeds"][0] - float(np.asarray(record["final"]["val_bpc"])[0]))
    train_rows = [dict(figure="validation bits/char", ours=pm(record["val_bpc"], record["val_bpc_std"]), lecture="0.409"),
                  dict(figure="train-window bits/char", ours=pm(record["train_bpc"], record["train_bpc_std"]), lecture="-"),
                  dict(figure="fact accuracy (teacher-forced argmax)", ours=pm(record["fact_acc"], record["fact_acc_std"]),
                       lecture="0.93"),
                  dict(figure="fact accuracy (greedy decoding, the lecture's way; seed 0)", ours=f"{greedy0:.3f}",
                       lecture="0.93"),
                  dict(figure="uniform baseline bits/char", ours=f"{math.log2(CONFIG.vocab_size):.3f}",
                       lecture="5.459"),
                  dict(figure="training time", ours=("cached" if record["cached"] else
                                                     f"{record['seconds']:.1f} s"), lecture="~1 min"),
                  dict(figure="parameters", ours=f"{record['params']:,}", lecture="109,056")]
    table = report.format_table([("figure", "figure", ""), ("ours", "ours", ""), ("lecture", "lecture", "")],
                                train_rows) + (
        f"\n\n{budget_of(ctx)}; world seed {ctx.args.world_seed}: {len(world.people)} people in "
        f"{len(world.cities)} cities, {len(world.train_text):,} training characters. Validation bits/char from the "
        f"engine's nll; the ablation table's intact row recomputes it from the reopened checkpoint "
        f"(|diff| {consistency:.1e}).")
    sheet.tables = {"0. The trained model": table, **sheet.tables}
    return consistency
