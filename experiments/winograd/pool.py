"""One word pool trained: every chosen row, and with the two-block row its attention and patching per seed,
gathered as the claims read them."""
from __future__ import annotations

import dataclasses

import numpy as np

from experiments.winograd import causal
from experiments.winograd.attention import attention_demo
from experiments.winograd.constants import BOOK, HEADS, MODELS, TASKS
from experiments.winograd.figures import pct
from experiments.winograd.task import Splits, by_adjective, make_task


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
