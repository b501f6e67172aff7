"""Position encodings: trained on 64-token windows, read on 64, 128 and 256.

    python -m experiments.positions [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--seeds N]

Each row is the ladder's one pre-norm block with one kind of position information. Only
the learned table has rows for positions past 64, and training never touches them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from attention_jax.harness import cli, report, rows as runs
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
        out.append(report.claim(f"learned positions win at the training length ({first})", best == "learned",
                                f"{best} {ppl[best][first]:.2f}, then {second} {ppl[second][first]:.2f}"))
    if "learned" in ppl:
        p = ppl["learned"]
        out.append(report.claim("learned positions get worse with every length past training",
                                all(p[a] < p[b] for a, b in zip(LENGTHS, LENGTHS[1:])),
                                " -> ".join(f"{p[L]:.2f}" for L in LENGTHS)))
    if "sinusoidal" in ppl:
        p = ppl["sinusoidal"]
        out.append(report.claim(f"sinusoids do not extrapolate (worse at {last} than at {first})",
                                p[last] > p[first], f"{p[first]:.2f} -> {p[last]:.2f}"))
    if {"rope", "learned", "sinusoidal"} <= set(ppl):
        out.append(report.claim(f"RoPE degrades more gently than learned and sinusoidal ({last}/{first})",
                                ratio["rope"] < min(ratio["learned"], ratio["sinusoidal"]),
                                ", ".join(f"{k} {ratio[k]:.2f}x" for k in ("rope", "learned", "sinusoidal"))))
    if "alibi" in ppl:
        p, book = ppl["alibi"], BOOK["alibi"]
        out.append(report.claim(f"ALiBi improves with length ({last} better than {first})", p[last] < p[first],
                                f"{p[first]:.2f} -> {p[last]:.2f} (book {book[first]} -> {book[last]})"))
    return out


def plot(records: list[dict], path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in records:
        ax.plot(LENGTHS, [r["ppl"][str(L)] for L in LENGTHS], "o-", label=r["name"])
    ax.axvline(TRAIN_LENGTH, color="gray", linestyle=":", label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xticks(LENGTHS, [str(L) for L in LENGTHS])
    ax.set_yscale("log")
    ax.set_xlabel("evaluation window (tokens)")
    ax.set_ylabel("held-out perplexity")
    ax.legend()
    report.save_figure(fig, path)


def _main(argv=None):
    t = runs.start("positions", __doc__.splitlines()[0], PRESETS, KINDS, argv)
    records = []
    for name, cfg in ROWS:
        if name not in t.rows:
            continue
        r = t.train(name, cfg, measure=at_lengths(t.splits[1]))
        for L in LENGTHS:
            r[f"ppl_{L}"] = r["ppl"][str(L)]
            r[f"book_{L}"] = BOOK.get(name, {}).get(L)
        r["ratio"] = r["ppl"][str(LENGTHS[-1])] / r["ppl"][str(LENGTHS[0])]
        records.append(r)
        took = "cached" if r["cached"] else f"{r['seconds']:.0f} s"
        print(f"  {name:<11} " + "  ".join(f"{L}: {r[f'ppl_{L}']:7.2f}" for L in LENGTHS) + f"  ({took})",
              flush=True)
    columns = [("name", "positions", ""), ("params", "params", ",d"),
               *[(f"ppl_{L}", f"ppl @{L}", ".2f") for L in LENGTHS],
               ("ratio", f"@{LENGTHS[-1]} / @{LENGTHS[0]}", ".2f"),
               *[(f"book_{L}", f"book @{L}", ".2f") for L in (LENGTHS[0], LENGTHS[-1])]]
    table = report.format_table(columns, records)
    print(table)
    plot(records, t.folder / "positions.png")
    report.publish(t.args.out, "positions", rows=records, claims=claims({r["name"]: r for r in records}),
                   tables={"Trained on 64 tokens, read on longer windows": table}, preset=t.preset,
                   config={"train": dataclasses.asdict(t.train_config), "seeds": t.seeds, "base": BASE.to_dict(),
                           "train_length": TRAIN_LENGTH, "lengths": list(LENGTHS)})


main = cli.main(_main)

if __name__ == "__main__":
    raise SystemExit(main())
