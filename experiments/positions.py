"""Position encodings: trained on 64-token windows, read on 64, 128 and 256.

    python -m experiments.positions [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--seeds N] [--corpus PATH]

Each row is the ladder's one pre-norm block with one kind of position information. Only
the learned table has rows for positions past 64, and training never touches them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.harness.rows import corpus_tokenizer
from experiments.configs import LADDER_BUDGETS, ONE_BLOCK

TRAIN_LENGTH, LENGTHS = 64, (64, 128, 256)
# The ladder's "layer_norm" row (one full pre-norm block), on 64-token windows. The learned
# table gets a row for every position read below; those past 64 stay as initialised.
BASE = dataclasses.replace(ONE_BLOCK, context=TRAIN_LENGTH, max_positions=max(LENGTHS))
KINDS = ("none", "learned", "sinusoidal", "rope", "alibi")
ROWS = [(kind, dataclasses.replace(BASE, positions=kind)) for kind in KINDS]
BOOK = {"alibi": {64: 44.95, 256: 42.49}}   # the chapter's figures: ALiBi's first and last window
PRESETS = {"paper": LADDER_BUDGETS["paper"],
           "cpu": dataclasses.replace(LADDER_BUDGETS["cpu"], steps=1500, eval_every=0),
           "smoke": LADDER_BUDGETS["smoke"]}


def at_lengths(val_tokens):
    """The row's own figures: held-out perplexity in non-overlapping windows of each length."""
    def measure(engine, state) -> dict:
        by_length = {L: np.asarray(engine.perplexity(state, val_tokens, context=L)) for L in LENGTHS}
        return {"ppl": {str(L): float(p.mean()) for L, p in by_length.items()},
                "ppl_seeds": {str(L): p.tolist() for L, p in by_length.items()}}
    return measure


def claims(r: dict) -> list[dict]:
    ppl = {k: {int(L): v for L, v in x["ppl"].items()} for k, x in r.items()}
    first, last = LENGTHS[0], LENGTHS[-1]
    ratio = {k: p[last] / p[first] for k, p in ppl.items()}
    out = []
    if set(ppl) == set(KINDS):
        best, second = sorted(ppl, key=lambda k: ppl[k][first])[:2]
        rest = min(p[first] for k, p in ppl.items() if k != "learned")
        out.append(report.claim(f"learned positions win at the training length ({first})", best == "learned",
                                f"{best} {ppl[best][first]:.2f}, then {second} {ppl[second][first]:.2f}",
                                rest - ppl["learned"][first]))
    if "learned" in ppl:
        p = ppl["learned"]
        rise = min(p[b] - p[a] for a, b in zip(LENGTHS, LENGTHS[1:]))
        out.append(report.claim("learned positions get worse with every length past training", rise > 0,
                                " -> ".join(f"{p[L]:.2f}" for L in LENGTHS), rise))
    if "sinusoidal" in ppl:
        p = ppl["sinusoidal"]
        out.append(report.claim(f"sinusoids do not extrapolate (worse at {last} than at {first})",
                                p[last] > p[first], f"{p[first]:.2f} -> {p[last]:.2f}", p[last] - p[first]))
    if {"rope", "learned", "sinusoidal"} <= set(ppl):
        out.append(report.claim(f"RoPE degrades more gently than learned and sinusoidal ({last}/{first})",
                                ratio["rope"] < min(ratio["learned"], ratio["sinusoidal"]),
                                ", ".join(f"{k} {ratio[k]:.2f}x" for k in ("rope", "learned", "sinusoidal")),
                                min(ratio["learned"], ratio["sinusoidal"]) - ratio["rope"]))
    if "alibi" in ppl:
        p, book = ppl["alibi"], BOOK["alibi"]
        out.append(report.claim(f"ALiBi improves with length ({last} better than {first})", p[last] < p[first],
                                f"{p[first]:.2f} -> {p[last]:.2f} (book {book[first]} -> {book[last]})",
                                p[first] - p[last]))
    return out


def figure(records: list[dict], title: str):
    fig, ax = report.figure(size=(7.5, 4.5))
    for r in records:
        ax.plot(LENGTHS, [r["ppl"][str(L)] for L in LENGTHS], "o-", label=r["name"])
    ax.axvline(TRAIN_LENGTH, color="gray", linestyle=":", label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xticks(LENGTHS, [str(L) for L in LENGTHS])
    ax.set(yscale="log", xlabel="evaluation window (tokens)", ylabel="held-out perplexity", title=title)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


def run(ctx) -> Result:
    from experiments.harness.rows import Table
    table = Table.on_corpus(ctx, longest=max(LENGTHS))
    records = []
    for name, cfg in ROWS:
        if name not in ctx.rows:
            continue
        r = table.train(name, cfg, measures={"lengths": at_lengths(table.splits[1])},
                        say=lambda r: "  ".join(f"{L}: {r['measures']['lengths']['ppl'][str(L)]:7.2f}" for L in LENGTHS))
        r.update(r["measures"]["lengths"])
        for L in LENGTHS:
            r[f"ppl_{L}"] = r["ppl"][str(L)]
            r[f"book_{L}"] = BOOK.get(name, {}).get(L) if table.book else None
        r["ratio"] = r["ppl"][str(LENGTHS[-1])] / r["ppl"][str(LENGTHS[0])]
        records.append(r)
    columns = [("name", "positions", ""), ("params", "params", ",d"),
               *[(f"ppl_{L}", f"ppl @{L}", ".2f") for L in LENGTHS],
               ("ratio", f"@{LENGTHS[-1]} / @{LENGTHS[0]}", ".2f"),
               *[(f"book_{L}", f"book @{L}", ".2f") for L in (LENGTHS[0], LENGTHS[-1])]]
    title = f"positions, trained on {TRAIN_LENGTH} tokens, {table.budget()}"
    book = [report.book(f"alibi: held-out perplexity @{L}", BOOK["alibi"][L], r[f"ppl_{L}"])
            for r in records if r["name"] == "alibi" and table.book for L in (LENGTHS[0], LENGTHS[-1])]
    return table.result(records, claims=claims, book=book,
                        tables={"Trained on 64 tokens, read on longer windows": report.format_table(columns, records)},
                        figures={"positions.png": figure(records, title)},
                        config={"base": BASE.to_dict(), "train_length": TRAIN_LENGTH, "lengths": list(LENGTHS)})


EXPERIMENT = Experiment("positions", __doc__, PRESETS, run, rows=list(KINDS),
                        tokenizer=corpus_tokenizer)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
