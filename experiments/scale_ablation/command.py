"""`run`: every row with and without ÷√d, the claims, one Result."""
from __future__ import annotations

import dataclasses
import math

from experiments.harness import report
from experiments.harness.experiment import Result
from experiments.configs import ONE_BLOCK
from experiments.scale_ablation.constants import (
    BIG_GAIN, COLLAPSED, FROZEN, PROBE_WINDOWS, ROWS, SMALL_GAIN, VARIANTS)
from experiments.scale_ablation.figures import curves_figure, perplexity_figure, score_rows, scores_figure
from experiments.scale_ablation.measure import row_budget, describe_budget, train_variant, combine, uniform_entropy


def claims(r: dict) -> list[dict]:
    """The chapter's claims on the rows present (each record: gain, val_*, the statistics)."""
    out = []
    if "d32" in r:
        g = r["d32"]["gain"]
        out.append(report.claim(f"÷√d makes no meaningful difference at d_head 32 (|gain| < {SMALL_GAIN:g} points)",
                                abs(g) < SMALL_GAIN,
                                f"{r['d32']['val_scaled']:.2f} with vs {r['d32']['val_unscaled']:.2f} without, "
                                f"gain {g:+.2f}", SMALL_GAIN - abs(g)))
    for name, book in (("d256", 18), ("d1024", 17)):
        if name in r:
            x = r[name]
            out.append(report.claim(f"÷√d gains at least {BIG_GAIN:g} points at d_head {name[1:]} (book {book})",
                                    x["gain"] >= BIG_GAIN,
                                    f"{x['val_scaled']:.2f} with vs {x['val_unscaled']:.2f} without, "
                                    f"gain {x['gain']:+.2f}", x["gain"] - BIG_GAIN))
    if "d1024" in r:
        share = r["d1024"]["frozen_after_unscaled"]
        also = f"; d_head 256: {100 * r['d256']['frozen_after_unscaled']:.1f}%" if "d256" in r else ""
        out.append(report.claim(f"without ÷√d the d_head 1024 head collapses: > {100 * COLLAPSED:g}% of rows put "
                                f"> {FROZEN} on one token after training (book 99.9%)", share > COLLAPSED,
                                f"{100 * share:.1f}% (at init {100 * r['d1024']['frozen_before_unscaled']:.1f}%)"
                                + also, share - COLLAPSED))
    scaled = [(name, when, x[f"score_std_{when}_scaled"]) for name, x in r.items() for when in ("before", "after")]
    if scaled:
        worst = max(scaled, key=lambda t: abs(math.log10(t[2])))
        decades = abs(math.log10(worst[2]))
        after = ", ".join(f"{name[1:]}: {x['score_std_after_scaled']:.2f}" for name, x in r.items())
        out.append(report.claim("with ÷√d the score std stays within an order of magnitude of 1 "
                                "(init and trained, every width; book 3.44 trained)", decades < 1,
                                f"trained {after}; farthest from 1: {worst[2]:.3g} ({worst[0][1:]}, {worst[1]} "
                                "training)", 1 - decades))
    return out

def run(ctx) -> Result:
    from attention_jax.data import eval_windows
    from experiments.harness.rows import fmt
    from experiments.harness.rows import Table
    table = Table.on_corpus(ctx)
    probe_windows, _ = eval_windows(table.splits[1], ONE_BLOCK.context, max_windows=PROBE_WINDOWS)
    records = []
    for row in ROWS:
        if row.name not in ctx.rows:
            continue
        tc = row_budget(ctx, row)
        runs = {}
        for scale, way in VARIANTS:
            say = lambda r, way=way: (f"{way:<5} params {r['params']:>9,}  val {fmt(r['val_ppl'], r['val_ppl_std'])}  "
                                      f"score std {r['measures']['init']['score_std'][0]:.3g} -> {r['score_std']:.3g}"
                                      f"  frozen {100 * r['frozen']:.1f}%")
            runs[scale] = train_variant(table, f"{row.name}_{'scaled' if scale else 'unscaled'}",
                                        dataclasses.replace(row.config, scale=scale), tc, probe_windows, say)
        r = combine(row, runs, table.book)
        r.update(budget=row.budget, setup=describe_budget(tc))
        records.append(r)
    columns = [("name", "row", ""), ("label", "model", ""), ("setup", "budget", ""), ("params", "params", ",d"),
               ("scaled", "val ppl ÷√d", ""), ("unscaled", "val ppl no ÷", ""),
               ("gain_text", "gain (no ÷ − ÷√d)", ""), ("book_gain_text", "book gain", "")]
    score_columns = [("name", "row", ""), ("way", "scores", ""),
                     ("std_before", "score std init", ".3g"), ("std_after", "score std trained", ".3g"),
                     ("book_std", "book std", ""),
                     ("ent_before", "entropy init", ".3f"), ("ent_after", "entropy trained", ".3f"),
                     ("book_entropy", "book entropy", ""),
                     ("frozen_before", f"> {FROZEN} init", ""), ("frozen_after", f"> {FROZEN} trained", ""),
                     ("book_frozen", f"book > {FROZEN}", "")]
    budgets = {}
    for r in records:
        budgets.setdefault(r["setup"], []).append(r["name"])
    title = (f"scale_ablation, {ctx.preset} preset, {len(table.seeds)} seed(s), {table.corpus.name}\n"
             + "; ".join(f"{', '.join(names)}: {setup}" for setup, names in budgets.items()))
    figures = {}
    if records:
        figures = {"scores.png": scores_figure(records, title), "perplexity.png": perplexity_figure(records, title)}
        if any(len(run["history"]) > 1 for r in records for run in r["runs"].values()):
            figures["curves.png"] = curves_figure(records, title)
    T = ONE_BLOCK.context
    tables = {"Held-out perplexity with and without ÷√d": report.format_table(columns, records),
              f"Inside the scores: {PROBE_WINDOWS} held-out windows of {T}, at initialisation and trained "
              f"(entropy in nats; uniform causal rows {uniform_entropy(T):.3f})":
                  report.format_table(score_columns, score_rows(records, table.book))}
    summary = [report.book(f"{r['name']}: perplexity gain from ÷√d", r["book_gain_text"], r["gain_text"])
               for r in records if r["book_gain_text"] is not None]
    return table.result(records, claims=claims, tables=tables, figures=figures, book=summary,
                        config={"short": dataclasses.asdict(row_budget(ctx, ROWS[-1])),
                                "rows": {row.name: {"budget": row.budget, "config": row.config.to_dict()}
                                         for row in ROWS},
                                "probe_windows": PROBE_WINDOWS, "frozen_above": FROZEN})
