"""The ablation ladder: from a plain average to a transformer block, one part per row.

    python -m experiments.ladder [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--seeds N]
                                 [--eval-every N] [--lr X] [--batch-size N] [--schedule S]

Every row is `dataclasses.replace` of the row above; each adds exactly one part.
"""
from __future__ import annotations

import dataclasses

from attention_jax.harness import cli, report, rows as runs
from experiments.configs import LADDER, LADDER_BASE as BASE, LADDER_BUDGETS

ROWS = LADDER
BOOK_TRAIN = {r.name: r.book_train_ppl for r in LADDER if r.book_train_ppl}
PRESETS = LADDER_BUDGETS


def claims(r: dict) -> list[dict]:
    v = {k: x["val_ppl"] for k, x in r.items()}
    t = {k: x["train_ppl"] for k, x in r.items()}
    out, need = [], lambda *names: all(n in r for n in names)
    if need("no_context", "average"):
        out.append(report.claim("the average is >= 2x worse than no context", v["average"] >= 2 * v["no_context"],
                                f"{v['average']:.2f} vs {v['no_context']:.2f} ({v['average'] / v['no_context']:.2f}x)"))
    if need("no_context", "average", "average_positions"):
        gap, back = v["average"] - v["no_context"], v["average"] - v["average_positions"]
        out.append(report.claim("learned positions recover < 5% of that gap", back < 0.05 * gap,
                                f"{back:.2f} of {gap:.2f} points ({100 * back / gap:.1f}%)"))
    if need("no_context", "average_residual"):
        rel = abs(v["average_residual"] - v["no_context"]) / v["no_context"]
        out.append(report.claim("the residual brings the average within 5% of no context", rel < 0.05,
                                f"{v['average_residual']:.2f} vs {v['no_context']:.2f} ({100 * rel:.1f}%)"))
    for better, worse, text in [
            ("head_residual", "average_residual", "a learned head beats the uniform average + residual"),
            ("head_residual", "head_replace", "the residual head beats the replacing head"),
            ("heads", "head_residual", "four heads beat one"),
            ("feed_forward", "heads", "+ FFN improves"),
            ("layer_norm", "feed_forward", "+ LayerNorm improves")]:
        if need(better, worse):
            out.append(report.claim(text, v[better] < v[worse], f"{v[better]:.2f} vs {v[worse]:.2f}"))
    if need("layer_norm", "two_blocks"):
        ok = t["two_blocks"] < t["layer_norm"] and v["two_blocks"] > v["layer_norm"]
        out.append(report.claim("two blocks: lower train and higher val perplexity than one", ok,
                                f"train {t['two_blocks']:.2f} vs {t['layer_norm']:.2f}, "
                                f"val {v['two_blocks']:.2f} vs {v['layer_norm']:.2f}"))
    return out


def plot(records: list[dict], path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(records))
    ax.plot(xs, [r["val_ppl"] for r in records], "o-", label="val (ours)")
    ax.plot(xs, [r["train_ppl"] for r in records], "s--", label="train (ours)")
    book = [(i, r["book_val_ppl"]) for i, r in enumerate(records) if r["book_val_ppl"]]
    ax.plot([i for i, _ in book], [b for _, b in book], "kx", markersize=9, label="val (book)")
    ax.set_xticks(list(xs), [r["name"] for r in records], rotation=35, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("perplexity")
    ax.legend()
    report.save_figure(fig, path)


def plot_curves(records: list[dict], path) -> bool:
    """Val (left) and train (right) perplexity against steps, for rows run with --eval-every."""
    curves = [r for r in records if len(r.get("history") or []) > 1]
    if not curves:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, r in enumerate(curves):
        steps = [h["step"] for h in r["history"]]
        for ax, split in zip(axes, ("val_ppl", "train_ppl")):
            ax.plot(steps, [h[split] for h in r["history"]], "o-", markersize=3, color=f"C{i % 10}",
                    label=r["name"])
    for ax, title in zip(axes, ("held-out (val) perplexity", "train perplexity")):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    report.save_figure(fig, path)
    return True


def _main(argv=None):
    t = runs.start("ladder", __doc__.splitlines()[0], PRESETS, [r.name for r in ROWS], argv)
    records, previous = [], None
    for row in ROWS:
        name = row.name
        if name not in t.rows:
            continue
        r = t.train(name, row.config)
        r.update(label=row.label, book_val_ppl=row.book_val_ppl, book_train_ppl=row.book_train_ppl,
                 change=None if previous is None else r["val_ppl"] - previous)
        r["val"] = runs.fmt_ppl(r["val_ppl"], r["val_ppl_std"])
        r["train"] = runs.fmt_ppl(r["train_ppl"], r["train_ppl_std"])
        previous = r["val_ppl"]
        records.append(r)
        took = "cached" if r["cached"] else f"{r['seconds']:.0f} s"
        print(f"  {name:<18} params {r['params']:>9,}  train {r['train']:>16}  val {r['val']:>16}  ({took})",
              flush=True)
    columns = [("name", "row", ""), ("params", "params", ",d"), ("train", "train ppl", ""),
               ("val", "val ppl", ""), ("book_val_ppl", "book val ppl", ".2f"), ("change", "change", "+.2f")]
    table = report.format_table(columns, records)
    checked = claims({r["name"]: r for r in records})
    print(table)
    plot(records, t.folder / "ladder.png")
    plot_curves(records, t.folder / "curves.png")
    report.publish(t.args.out, "ladder", rows=records, claims=checked, tables={"ladder": table},
                   preset=t.preset, config={"train": dataclasses.asdict(t.train_config), "seeds": t.seeds,
                                          "base": BASE.to_dict()})


main = cli.main(_main)

if __name__ == "__main__":
    raise SystemExit(main())
