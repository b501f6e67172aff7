"""Tables and PNG figures: accuracy beside the book's, block 1 and 2 at the referent."""
from __future__ import annotations

import numpy as np

from experiments.harness import report
from experiments.winograd.constants import BOOK, BOOK_PAIR, CHANCE


def pct(record: dict, figure: str) -> str:
    from experiments.harness.rows import fmt
    from attention_jax.train.loop import mean_std
    return fmt(*mean_std(100 * np.asarray(record[f"{figure}_seeds"], np.float64)), ".1f")


def accuracy_figure(records: list[dict], book: bool, title: str):
    fig, ax = report.figure(size=(9, 4.5))
    xs = np.arange(len(records))
    acc = [100 * r["accuracy"] for r in records]
    from attention_jax.train.loop import mean_std
    err = [100 * mean_std(r["accuracy_seeds"])[1] for r in records]
    ax.bar(xs - 0.2, acc, 0.4, yerr=err, label="held-out accuracy (ours)")
    ax.bar(xs + 0.2, [100 * r["other_noun"] for r in records], 0.4, label="names the other noun (ours)")
    if book:
        pts = [(i, BOOK[r["name"]][0]) for i, r in enumerate(records) if r["name"] in BOOK]
        ax.plot([i - 0.2 for i, _ in pts], [b for _, b in pts], "kx", markersize=10, label="accuracy (book)")
        other = [(i, BOOK[r["name"]][1]) for i, r in enumerate(records) if BOOK.get(r["name"], (0, None))[1]]
        if other:
            ax.plot([i + 0.2 for i, _ in other], [b for _, b in other], "k+", markersize=12,
                    label="other noun (book)")
    ax.axhline(CHANCE, color="gray", linestyle=":", label="chance (a guess between the two nouns)")
    ax.set_xticks(xs, [r["name"] for r in records], rotation=20, ha="right")
    ax.set(ylim=(0, 105), ylabel="% of held-out sentences", xlabel="task and model", title=title)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


def heatmap(ax, values, rows, cols, title):
    values = np.asarray(values)
    im = ax.imshow(values, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for (i, j), v in np.ndenumerate(values):
        if v >= 0.005:
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if v > 0.6 else "black")
    ax.set(title=title, xlabel="attended position (word)")
    return im


def pair_figure(demo: dict, title: str):
    a, b = demo["demo"]
    ia, ib = demo["adjectives"].index(a), demo["adjectives"].index(b)
    w, n = demo["weights"], len(demo["weights"])
    rows = [f"block {l + 1}, {adj}" for l in range(n) for adj in (a, b)]
    values = [w[l][i] for l in range(n) for i in (ia, ib)]
    cols = [f"{p}:{u}" if u == v else f"{p}:{u}/{v}" for p, (u, v) in
            enumerate(zip(demo["words"][ia], demo["words"][ib]))]
    fig, ax = report.figure(size=(10, 1.2 + 0.55 * len(rows)))
    im = heatmap(ax, values, rows, cols, title)
    ax.set_ylabel("block, sentence")
    fig.colorbar(im, ax=ax, label="attention weight (heads averaged)")
    return fig


def rule_figure(demo: dict, sides: dict, title: str):
    w = demo["weights"][-1]
    words, slot = demo["words"][0], demo["slots"]["adj"]
    cols = [f"{p}:{u}" if p != slot else f"{p}:{{adj}}" for p, u in enumerate(words)]
    rows = [f"{a} ({sides[a]})" for a in demo["adjectives"]]
    fig, ax = report.figure(size=(10, 1.2 + 0.45 * len(rows)))
    im = heatmap(ax, w, rows, cols, title)
    ax.set_ylabel("adjective (it = x or y)")
    fig.colorbar(im, ax=ax, label="block 2 weight (heads averaged)")
    return fig


def pair_table(demo: dict, book: bool) -> str:
    a, b = demo["demo"]
    ia, ib = demo["adjectives"].index(a), demo["adjectives"].index(b)
    w = demo["weights"]
    rows = []
    for p, (u, v) in enumerate(zip(demo["words"][ia], demo["words"][ib])):
        row = {"pos": p, "word": u if u == v else f"{u} / {v}",
               "b1a": w[0][ia][p], "b1b": w[0][ib][p], "b2a": w[-1][ia][p], "b2b": w[-1][ib][p]}
        if book:
            row.update(book1=BOOK_PAIR["block 1"].get(p, 0.0), book2a=BOOK_PAIR["block 2 tired"].get(p, 0.0),
                       book2b=BOOK_PAIR["block 2 wet"].get(p, 0.0))
        rows.append(row)
    columns = [("pos", "pos", "d"), ("word", "word", ""), ("b1a", f"block 1, {a}", ".3f"),
               ("b1b", f"block 1, {b}", ".3f"), ("book1", "book block 1", ".2f"),
               ("b2a", f"block 2, {a}", ".3f"), ("book2a", f"book block 2, {a}", ".2f"),
               ("b2b", f"block 2, {b}", ".3f"), ("book2b", f"book block 2, {b}", ".2f")]
    return report.format_table(columns, rows)


def rule_table(demo: dict, sides: dict) -> str:
    w = demo["weights"][-1]
    words, slot = demo["words"][0], demo["slots"]["adj"]
    columns = [("adj", "adjective", ""), ("side", "it =", "")]
    columns += [(f"p{p}", u if p != slot else "{adj}", ".2f") for p, u in enumerate(words)]
    columns += [("pred", "predicts", ""), ("x", "held-out mean: x", ".2f"), ("y", "y", ".2f"),
                ("a", "adjective", ".2f"), ("rest", "rest", ".2f")]
    rows = []
    for i, a in enumerate(demo["adjectives"]):
        row = {"adj": a, "side": sides[a], "pred": demo["predicted"][i], **{f"p{p}": v for p, v in enumerate(w[i])}}
        r = demo["block2_rule"][a]
        row.update(x=r["x"], y=r["y"], a=r["adj"], rest=r["rest"])
        rows.append(row)
    return report.format_table(columns, rows)
