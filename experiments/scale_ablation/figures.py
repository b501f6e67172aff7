"""Tables and PNG figures: perplexity both ways, the scores over training."""
from __future__ import annotations

from experiments.harness import report
from experiments.scale_ablation.constants import BOOK_SCORES, FROZEN, VARIANTS
from experiments.scale_ablation.measure import uniform_entropy


def _pct(x):
    return None if x is None else f"{100 * x:.1f}%"


def score_rows(records: list[dict], book: bool) -> list[dict]:
    out = []
    for r in records:
        for scale, way in VARIANTS:
            key = "scaled" if scale else "unscaled"
            b = BOOK_SCORES.get((r["name"], scale), {}) if book else {}
            out.append({"name": r["name"], "way": way,
                        "std_before": r[f"score_std_before_{key}"], "std_after": r[f"score_std_after_{key}"],
                        "book_std": b.get("std"),
                        "ent_before": r[f"entropy_before_{key}"], "ent_after": r[f"entropy_after_{key}"],
                        "book_entropy": b.get("entropy"),
                        "frozen_before": _pct(r[f"frozen_before_{key}"]), "frozen_after": _pct(r[f"frozen_after_{key}"]),
                        "book_frozen": b.get("frozen")})
    return out


def _curve(run: dict, stat: str):
    import numpy as np
    points = [(0, np.mean(run["measures"]["init"][stat]))]
    points += [(p["step"], np.mean(p[stat])) for p in run["history"] if stat in p]
    return [p[0] for p in points], [p[1] for p in points]


def scores_figure(records: list[dict], title: str):
    from experiments.plots import integer_steps
    fig, axes = report.figure(ncols=3, size=(17, 4.8))
    panels = [("score_std", "std of the scores fed to the softmax", "score std (log)"),
              ("entropy", "mean attention entropy (nats)", "entropy (nats)"),
              ("frozen", f"share of rows with > {FROZEN} on one token", "share of rows")]
    for i, r in enumerate(records):
        for scale, way in VARIANTS:
            run = r["runs"]["scaled" if scale else "unscaled"]
            for ax, (stat, _, _) in zip(axes, panels):
                xs, ys = _curve(run, stat)
                ax.plot(xs, ys, "o-" if scale else "s--", markersize=3, color=f"C{i}",
                        label=f"d_head {r['d_head']}, {way}")
    T = records[0]["runs"]["scaled"]["config"]["context"] if records else 128
    axes[1].axhline(uniform_entropy(T), color="gray", linestyle=":", label="uniform causal rows")
    for ax, (_, panel, ylabel) in zip(axes, panels):
        ax.set(title=panel, xlabel="step (0 = initialisation)", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        integer_steps(ax)
    axes[0].set_yscale("log")
    axes[2].set_ylim(-0.03, 1.03)
    handles, labels = axes[1].get_legend_handles_labels()
    axes[2].legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    return fig


def perplexity_figure(records: list[dict], title: str):
    fig, axes = report.figure(ncols=2, size=(13, 4.8))
    xs = list(range(len(records)))
    ax = axes[0]
    for key, way, marker, shift in (("val_scaled", "÷√d", "o", -0.06), ("val_unscaled", "no ÷", "s", 0.06)):
        ax.errorbar([x + shift for x in xs], [r[key] for r in records], fmt=marker, markersize=8, label=way,
                    yerr=[r[f"{key}_sd"] for r in records] if any(r[f"{key}_sd"] for r in records) else None)
    ax.set(ylabel="held-out perplexity", title="val perplexity, both ways")
    ax = axes[1]
    ax.bar(xs, [r["gain"] for r in records], color="C2", alpha=0.7, label="gain (ours): no ÷ − ÷√d",
           yerr=[r["gain_std"] for r in records] if any(r["gain_std"] for r in records) else None)
    # the book's d_head 32 figure is words ("worth nothing"): drawn at 0
    book = [(i, 0.0 if r["book_gain_text"] == "≈0" else r["book_gain"]) for i, r in enumerate(records)
            if r["book_gain_text"] is not None]
    if book:
        ax.plot([i for i, _ in book], [b for _, b in book], "kx", markersize=10, label="gain (book)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(ylabel="perplexity points", title="what ÷√d is worth")
    for ax in axes:
        ax.set_xticks(xs, [f"{r['d_head']}\n{'ladder block' if r['budget'] == 'long' else 'no LN'}"
                           for r in records])
        ax.set_xlabel("head width d_head")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title)
    return fig


def curves_figure(records: list[dict], title: str):
    """Held-out perplexity over training, one colour per width, solid ÷√d, dashed without (as scores.png)."""
    import numpy as np
    from experiments.plots import integer_steps
    fig, ax = report.figure(size=(9, 5))
    for i, r in enumerate(records):
        for scale, way in VARIANTS:
            points = r["runs"]["scaled" if scale else "unscaled"]["history"]
            ax.plot([p["step"] for p in points], [float(np.mean(p["val_ppl"])) for p in points],
                    "o-" if scale else "s--", markersize=3, color=f"C{i}", label=f"d_head {r['d_head']}, {way}")
    ax.set(yscale="log", xlabel="step", ylabel="held-out perplexity", title="val perplexity over training")
    ax.grid(True, which="both", alpha=0.3)
    integer_steps(ax)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    return fig
