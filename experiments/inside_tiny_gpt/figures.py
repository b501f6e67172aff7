"""The PNG figures: ablations, √d, the residual stream, training curves."""
from __future__ import annotations

import math

from experiments.harness import report
from experiments.inside_tiny_gpt.constants import CONFIG, LECTURE, SQRT_D_KEYS


def ablation_figure(rows: list[dict], title: str):
    import numpy as np
    fig, (ax1, ax2) = report.figure(ncols=2, size=(12, 0.32 * len(rows) + 2.2), sharey=True)
    ys = np.arange(len(rows))
    ax1.barh(ys, [r["bpc"] for r in rows], color="C0", label="ours")
    lec = [(i, r["lecture_bpc"]) for i, r in enumerate(rows) if r.get("lecture_bpc") is not None]
    ax1.plot([v for _, v in lec], [i for i, _ in lec], "kx", markersize=8, label="lecture")
    ax1.set_yticks(ys, [r["key"] for r in rows])
    ax1.invert_yaxis()
    ax1.set(xlabel="validation bits per character (lower is better)", ylabel="ablation")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.barh(ys, [r["acc"] for r in rows], color="C1", label="ours")
    lec = [(i, r["lecture_acc"]) for i, r in enumerate(rows) if r.get("lecture_acc") is not None]
    ax2.plot([v for _, v in lec], [i for i, _ in lec], "kx", markersize=8, label="lecture")
    ax2.set(xlabel="fact-completion accuracy (greedy)", xlim=(0, 1.05))
    ax2.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def sqrt_d_figure(random_rows: list[dict], trained: list[dict], title: str):
    fig, (ax1, ax2, ax3) = report.figure(ncols=3, size=(15, 4.5))
    dks = [r["d_k"] for r in random_rows]
    ax1.plot(dks, [r["std"] for r in random_rows], "o-", label="std of q·k (measured)")
    ax1.plot(dks, [r["sqrt_d"] for r in random_rows], "k--", label="√d_k")
    ax1.set(xscale="log", yscale="log", xlabel="d_k (per-head width)", ylabel="std of the score",
            title="random q, k ~ N(0, 1)")
    ax1.set_xticks(dks, [str(d) for d in dks])
    ax1.set_yticks([r["sqrt_d"] for r in random_rows], [f"{r['sqrt_d']:g}" for r in random_rows])
    ax1.minorticks_off()
    ax1.legend(fontsize=8)
    ax2.plot(dks, [r["raw_max"] for r in random_rows], "o-", label="mean max weight, q·k")
    ax2.plot(dks, [r["scaled_max"] for r in random_rows], "s-", label="mean max weight, q·k/√d_k")
    ax2.plot(dks, [r["saturated"] for r in random_rows], "^--", label="share of rows > 0.99, q·k")
    ax2.set(xscale="log", xlabel="d_k", ylabel="weight / share", ylim=(0, 1.05),
            title=f"softmax over {SQRT_D_KEYS} keys")
    ax2.set_xticks(dks, [str(d) for d in dks])
    ax2.minorticks_off()
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    layers = [r["layer"] for r in trained]
    width = 0.25
    ax3.bar([x - width for x in layers], [r["entropy"] for r in trained], width, label="as trained (÷√d)")
    ax3.bar(layers, [r["entropy_unscaled"] for r in trained], width, label="same scores without ÷√d")
    ax3.bar([x + width for x in layers], [r["uniform_entropy"] for r in trained], width,
            label="uniform over the prefix")
    ax3.set_xticks(layers, [f"layer {x}" for x in layers])
    ax3.set(ylabel="mean row entropy (nats)", title="the trained model's scores")
    ax3.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title, fontsize=10)
    return fig


def residual_figure(rows: list[dict], title: str):
    fig, ax = report.figure(size=(8, 4.2))
    parts = [r for r in rows if r["writes"] is not None]
    xs = range(len(parts))
    ax.bar(xs, [r["writes"] for r in parts], color="C0", label="norm of what it writes (last position)")
    ax.plot(xs, [r["stream"] for r in parts], "ko-", label="norm of the stream after it")
    ax.set_xticks(list(xs), [r["component"] for r in parts], rotation=20, ha="right")
    ax.set(ylabel="L2 norm", xlabel="component, in order", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def training_figure(record: dict, title: str):
    import numpy as np
    from experiments.plots import integer_steps
    fig, ax = report.figure(size=(7.5, 4.5))
    log = record.get("train_log") or []
    if log:
        ax.plot([p["step"] for p in log], [float(np.mean(p["loss"])) / math.log(2) for p in log], "-",
                label="training loss (bits/char, mean over log_every steps)")
    hist = record.get("history") or []
    if hist:
        ax.plot([h["step"] for h in hist], [float(np.mean(h["val_bpc"])) for h in hist], "o-", label="validation")
        ax.plot([h["step"] for h in hist], [float(np.mean(h["train_bpc"])) for h in hist], "s--",
                label="train windows")
    ax.axhline(math.log2(CONFIG.vocab_size), color="gray", linestyle=":", label="uniform (log2 44)")
    ax.axhline(LECTURE["intact"][0], color="k", linestyle="--", linewidth=0.8, label="lecture's final 0.409")
    ax.set(yscale="log", xlabel="step", ylabel="bits per character", title=title)
    integer_steps(ax)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig
