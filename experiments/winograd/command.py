"""`run`: train the six rows (or reopen them), read the two-block model's attention, one Result."""
from __future__ import annotations

import dataclasses

import numpy as np

from attention_jax.errors import ConfigError
from experiments.harness import cli, report
from experiments.harness.experiment import Result
from experiments.winograd import causal
from experiments.winograd.attention import attention_demo, claims, save_viewer
from experiments.winograd.constants import BOOK, CHANCE, HEADS, MODELS, ROWS, TASKS, WIDTH
from experiments.winograd.figures import accuracy_figure, pair_figure, pair_table, pct, rule_figure, rule_table
from experiments.winograd.task import Splits, by_adjective, make_task


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


def pools_attention_table(found: list[dict]) -> str:
    """Per pool: how much block 1 reads the adjective, and whether the last block looks at the picked noun."""
    rows = [{"pool": p["pool"], "nouns": ", ".join(p["nouns"][:4]) + ", ...", **p["attention"],
             **{n: p["accuracy"].get(n) for n in ("clean_one_block", "clean_two_blocks")}} for p in found]
    return report.format_table([("pool", "pool", ""), ("nouns", "nouns", ""),
                                ("clean_one_block", "one block %", ""), ("clean_two_blocks", "two blocks %", ""),
                                ("block1_adjective_weight", "block 1: most weight on the adjective", ".3f"),
                                ("block1_pair_diff", "block 1: the demo pair's rows differ by", ".3f"),
                                ("block2_shift", "block 2: weight moved by the adjective", ".3f"),
                                ("block2_pick_margin", "block 2: picked noun minus other, least", ".3f")], rows)


def pools_causal_table(found: list[dict]) -> str:
    """Per pool: what patching one slot entering block 2 brings back, for each test of the story."""
    rows = [{"pool": p["pool"], **p["causal"]} for p in found]
    return report.format_table([("pool", "pool", ""), ("keep_referent", "keep: referent", ".2f"),
                                ("keep_first", "keep: first noun", ".2f"),
                                ("fetch_second", "fetch: second noun", ".2f"),
                                ("fetch_referent", "fetch: referent", ".2f"),
                                ("read_adjective", "read: adjective", ".2f"), ("read_referent", "read: referent", ".2f"),
                                ("read_best_head", "read: best head of block 2", ".2f")], rows)


def pools_table(found: list[dict]) -> str:
    """A row per claim: its verdict and margin on each pool, in how many pools x seeds it held, the least margin."""
    rows = []
    for j, c in enumerate(found[0]["claims"]):
        row = {"claim": c["claim"]}
        for p in found:
            v = p["claims"][j]
            margin = report.held_across([v])[2]
            row[f"pool {p['pool']}"] = f"{report.verdict(v)} ({margin:.3g})" if margin is not None else report.verdict(v)
        held, of, row["least"] = report.held_across([p["claims"][j] for p in found])
        row["held"] = f"{held} of {of}"
        rows.append(row)
    return report.format_table([("claim", "claim", "")] + [(f"pool {p['pool']}", f"pool {p['pool']}", "")
                                                            for p in found]
                               + [("held", "held (pools x seeds)", ""), ("least", "least margin", ".3g")], rows)

def train_pool(ctx, table, spec) -> dict:
    """Every chosen row trained on one word pool: its records, the splits, and (with the two-block row)
    its attention demo per seed, gathered as the claims read them (`check`)."""
    from attention_jax.data import winograd as wg
    tc, seeds, book = ctx.settings, ctx.seeds, spec == wg.WinogradSpec()
    splits = {task: Splits(spec, task == "leaky") for task in TASKS}
    for task in TASKS:   # a word list the chosen rows cannot use is refused before anything trains
        if any(r.startswith(task + "_") for r in ctx.rows):
            for s in seeds:
                splits[task](s)
    vocab, context = wg.vocabulary(spec), len(spec.template.split(" ")) - 1
    configs = {}            # every chosen row's model first: a --width the heads cannot split is refused now
    for name in ctx.rows:
        configs[name] = dataclasses.replace(MODELS[name.split("_", 1)[1]][1], vocab_size=len(vocab), context=context,
                                            d_model=ctx.args.width, n_heads=HEADS)
    records = []
    for name in ctx.rows:
        task_name, model_name = name.split("_", 1)
        sp = splits[task_name]
        r = table.train(name, configs[name], task=make_task(sp, seeds, tc.batch_size),
                        reopen=name == "clean_two_blocks", measures={"by_adjective": by_adjective(sp, seeds)},
                        say=lambda r: (f"params {r['params']:>8,}  held-out {pct(r, 'accuracy'):>11}%  other noun "
                                       f"{pct(r, 'other_noun'):>11}%  train {pct(r, 'train_accuracy'):>11}%"))
        t0 = sp(0)
        r.update(task_kind=task_name, model=MODELS[model_name][0], held_out=pct(r, "accuracy"),
                 other=pct(r, "other_noun"), train_acc=pct(r, "train_accuracy"), n_heldout=len(t0.heldout.sentences),
                 n_train=len(t0.train.sentences),
                 book=f"{BOOK[name][0]:.1f}" if book and name in BOOK else None,
                 book_other=f"{BOOK[name][1]:.1f}" if book and name in BOOK and BOOK[name][1] else None)
        records.append(r)
    check, demos = {r["name"]: r for r in records}, []
    if "clean_two_blocks" in check:
        r = check["clean_two_blocks"]
        models = [table.load_model(r, seed=s) for s in seeds]
        demos = [attention_demo(m, splits["clean"](s)) for m, s in zip(models, seeds)]
        patched = [causal.causal_demo(m, splits["clean"](s)) for m, s in zip(models, seeds)]
        check["causal"] = {**causal.worst(patched), "seed0": patched[0]}
        check["found"] = causal.found_per_test(models, [splits["clean"](s) for s in seeds])
        per_seed = {k: [d[k] for d in demos] for k in ("block1_pair_diff", "block1_all_adjectives_diff",
                                                       "block1_heldout_diff", "block1_adjective_weight", "block2_shift",
                                                       "block2_pick_margin")}
        # Across seeds: each claim's figure at its worst seed (a claim is about every model), block 2's shift's mean.
        worst = {"block2_pick_margin": np.min}
        check["attention"] = {**{k: float(worst[k](v) if k in worst else np.max(v) if k.startswith("block1")
                                          else np.mean(v))
                                 for k, v in per_seed.items()},
                              **{f"{k}_seeds": v for k, v in per_seed.items()}, "demo": demos[0]["demo"]}
    return {"records": records, "check": check, "splits": splits, "demos": demos, "book": book}


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
    records, splits, book = pool["records"], pool["splits"], pool["book"]

    by_name_ = {r["name"]: r for r in records}
    check = pool["check"]
    budget = (f"{tc.steps} steps x batch {tc.batch_size}, lr {tc.lr:g}, width {args.width}, "
              f"{len(seeds)} seed(s)")
    title = f"Winograd toy, {ctx.preset} preset: {budget}"
    columns = [("task_kind", "task", ""), ("model", "model", ""), ("params", "params", ",d"),
               ("held_out", "held-out accuracy %", ""), ("book", "book %", ""),
               ("other", "other noun %", ""), ("book_other", "book other noun %", ""),
               ("train_acc", "train accuracy %", "")]
    chance = {"task_kind": "-", "model": "chance (a guess between the two nouns)", "held_out": f"{CHANCE:.1f}",
              "book": f"{CHANCE:.1f}" if book else None, "other": f"{CHANCE:.1f}",
              "book_other": f"{CHANCE:.1f}" if book else None}
    heading = "Held-out referent accuracy (only the word after \"so the\" is scored)" + \
        ("; smoke preset: a few steps, so these accuracies say nothing of the task, chance included" if
         ctx.preset == "smoke" else "")
    tables = {heading: report.format_table(columns, [chance, *records])}
    figures = {"accuracy.png": accuracy_figure(records, book, title)}
    extra = {}
    if pool["demos"]:
        r = by_name_["clean_two_blocks"]
        save_viewer(table.load_model(r), splits["clean"](0), ctx.folder / "attention.html",
                    f"Winograd toy, two blocks, seed 0 ({ctx.preset} preset)")
        demo, attention = pool["demos"][0], pool["check"]["attention"]
        sides = dict(spec.adjectives)
        a, b = demo["demo"]
        x, y = demo["pair"]
        where = "a held-out pair" if demo["pair_heldout"] else "a training pair"
        head = (f"Two blocks (seed 0), heads averaged, at position {demo['position']} (the \"the\" after \"so\"): "
                f"'the {x} ... the {y} ... too {a}/{b}' ({where})")
        tables[head] = pair_table(demo, book and (x, y, a, b) == ("animal", "street", "tired", "wet"))
        tables[f"Block 2 at the referent across all {len(demo['adjectives'])} adjectives "
               f"('{x}'/'{y}'; right: mean over seed 0's held-out pairs)"] = rule_table(demo, sides)
        figures["attention_pair.png"] = pair_figure(demo, f"attention at the referent, {a} vs {b} ({ctx.preset}, "
                                                          f"two blocks, seed 0)")
        figures["block2_adjectives.png"] = rule_figure(demo, sides, f"block 2 at the referent, every adjective "
                                                                    f"({ctx.preset} preset, seed 0)")
        extra["attention"] = {"seed0": demo, **attention}
        extra["causal"] = pool["check"]["causal"]
        tables[f"Patching entering block 2 (seed 0, {causal.PAIRS} held-out pairs): the share of the clean answer "
               "each slot brings back, per test (1: all of it, 0: none)"] = causal.table(pool["check"]["causal"]["seed0"])
        extra["found"] = pool["check"]["found"]
        tables[f"The circuit edge patching finds, per test (the fewest top edges, at most {causal.MOST_EDGES}, "
               f"recovering {causal.FAITHFUL:.0%} of the answer alone)"] = causal.found_table(pool["check"]["found"])
        print(f"  block 1 at the referent, {a} vs {b}: max difference "
              + ", ".join(f"{v:.3g}" for v in attention["block1_pair_diff_seeds"])
              + f" (per seed); block 2 moves {demo['block2_shift']:.2f} of its weight", flush=True)
    if args.pools > 1:
        pools = [(0, spec, pool["check"])] + [(k, wg.draw_pool(k), None) for k in range(1, args.pools)]
        found = []
        for k, words, check_k in pools:
            if check_k is None:
                print(f"pool {k}: {', '.join(words.nouns)}; {', '.join(a for a, _ in words.adjectives)}", flush=True)
                check_k = train_pool(ctx, table, words)["check"]
            found.append({"pool": k, "nouns": list(words.nouns), "adjectives": [list(a) for a in words.adjectives],
                          "claims": report.claims_across_seeds(claims, check_k, len(seeds)),
                          "accuracy": {n: pct(check_k[n], "accuracy") for n in ROWS if n in check_k},
                          "attention": {k_: v for k_, v in check_k.get("attention", {}).items()
                                        if k_.startswith("block") and not k_.endswith("_seeds")},
                          "causal": {k_: v for k_, v in check_k.get("causal", {}).items()
                                     if isinstance(v, float)},
                          "found": check_k.get("found", {})})
        extra["pools"] = found
        tables[f"Each claim on {args.pools} word pools (0: the book's), {len(seeds)} seed(s) each"] = \
            pools_table(found)
        if all(p["attention"] for p in found):
            tables["Two blocks at the referent, per word pool (worst seed)"] = pools_attention_table(found)
        if all(p["causal"] for p in found):
            tables["Patching entering block 2, per word pool (worst seed): the share of the clean answer one slot "
                   "brings back"] = pools_causal_table(found)
        if all(p["found"] for p in found):
            tables["The circuit edge patching finds, per word pool and test"] = \
                causal.found_table({}, [(p["pool"], p["found"]) for p in found])
    if tc.eval_every and any(len(r["history"]) > 1 for r in records):
        from experiments.plots import curves
        figures["curves.png"] = curves(records, ("accuracy", "train_accuracy"),
                                       ("held-out accuracy", "train accuracy"), title, log=False)
    summary = [report.book(f"{r['name']}: held-out accuracy %", BOOK[r['name']][0], r["held_out"], ".1f")
               for r in records if book and r["name"] in BOOK]
    return table.result(records, claims=claims, check=check, tables=tables, figures=figures, extra=extra,
                        book=summary, config={"width": args.width, "heads": HEADS, "spec": dataclasses.asdict(spec),
                                              "book_figures": book,
                                              "models": {m: base.to_dict() for m, (_, base) in MODELS.items()}})
