"""The norms table's figures: gradient norm per block at init, and the first steps."""
from __future__ import annotations

from experiments.harness import report
from experiments.norms.constants import BOOK_INIT, N_LAYERS, NORMS, ROWS


def init_figure(init: dict, title: str, book: bool):
    import numpy as np
    fig, ax = report.figure(size=(10, 4.5))
    for i, norm in enumerate(NORMS):
        rec = init[norm]
        blocks = np.arange(1, len(rec["per_block"]) + 1)
        seeds = np.asarray(rec["per_block_seeds"])
        ax.plot(blocks, rec["per_block"], "o-", color=f"C{i}", label=f"{norm}-norm (mean of {len(seeds)} seeds)")
        if len(seeds) > 1:
            ax.fill_between(blocks, seeds.min(axis=0), seeds.max(axis=0), color=f"C{i}", alpha=0.2,
                            label=f"{norm}-norm, seed range")
        if book and len(blocks) == N_LAYERS:     # the book prints blocks 1 and 12 only
            b = BOOK_INIT[norm]
            ax.plot([1, N_LAYERS], [b["first"], b["last"]], "x", color=f"C{i}", markersize=10,
                    markeredgewidth=2, label=f"{norm}-norm, book (blocks 1 and {N_LAYERS})")
    ax.set(xlabel="block", ylabel="gradient norm at initialisation")
    fig.suptitle(title)
    ax.set_xticks(range(1, len(init[NORMS[0]]["per_block"]) + 1))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


def early_figure(records: list[dict], first: int, title: str, warmup: int | None = None):
    """Learning rate, global gradient norm and training loss over the first steps (seed means)."""
    import numpy as np
    from experiments.plots import finish_panels
    fig, axes = report.figure(ncols=3, size=(16, 4.5))
    # pre- and post-norm share a learning-rate schedule: post's line is drawn dashed and thicker
    # underneath, pre's thin on top, so both stay visible where they coincide
    style = {"pre": dict(linestyle="-", linewidth=1.2, zorder=3), "post": dict(linestyle="--", linewidth=2.6, zorder=2)}
    for i, r in enumerate(records):
        points = [p for p in r["train_log"] if p["step"] <= first]
        steps = [p["step"] for p in points]
        for ax, key in zip(axes, ("lr", "grad_norm", "loss")):
            ax.plot(steps, [float(np.mean(p[key])) for p in points], color=f"C{i}", label=r["name"],
                    **style[ROWS[r["name"]][0]])
    panels = (("learning rate", False), ("global gradient norm", True), ("training loss (nats)", False))
    return finish_panels(fig, axes, panels, title, ylabel=True, mark_step=warmup, mark_label="end of warmup")
