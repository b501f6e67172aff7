"""Demos 4-5: where the heads look (ASCII and PNG heatmaps), and why scores are divided by √d."""
from __future__ import annotations

import math

from attention_jax.errors import ConfigError
from experiments.configs import FROZEN
from experiments.inside_tiny_gpt.constants import LECTURE_SQRT_D, SHADES, SQRT_D_KEYS, SQRT_D_SEED
from experiments.inside_tiny_gpt.evaluate import cached_run


def ascii_heatmap(weights, labels, shades: str = SHADES) -> str:
    """Rows = query positions, columns = key positions; each weight as one of ten shades (0.1 apart).

    Only the value decides the shade, so the blank upper triangle of a causal head is its
    exact zeros, not something drawn in.
    """
    import numpy as np
    w = np.asarray(weights, np.float64)
    labels = [str(c) for c in labels]
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] != len(labels):
        raise ConfigError(f"ascii_heatmap needs a square [T, T] matrix and T labels, got {w.shape} "
                          f"and {len(labels)} labels")
    top = len(shades) - 1
    level = np.clip(np.floor(w * len(shades)), 0, top).astype(int)    # the lecture's min(9, int(10 w))
    lines = ["     " + "".join(c[:1] for c in labels)]
    for i, row in enumerate(level):
        lines.append(f"  {labels[i][:1]:>1}  " + "".join(shades[k] for k in row))
    return "\n".join(lines)


def heatmap_figure(matrices: dict, labels, title: str, *, ncols: int = 4, highlight=()):
    """One panel per named [T, T] weight matrix, characters on both axes; `highlight` marks key columns."""
    import numpy as np
    n = len(matrices)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    T = len(labels)
    from matplotlib.figure import Figure
    fig = Figure(figsize=(3.6 * ncols + 1.2, 3.5 * nrows + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    ticks = [("\\n" if c in ("\n", "⏎") else ("␣" if c == " " else c)) for c in labels]
    image = None
    for k, (ax, (name, w)) in enumerate(zip(axes, matrices.items())):
        image = ax.imshow(np.asarray(w), cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        bottom, left = k + ncols >= n, k % ncols == 0       # characters on the outer panels only
        ax.set_xticks(range(T), ticks if bottom else [], fontsize=5, rotation=90)
        ax.set_yticks(range(T), ticks if left else [], fontsize=5)
        if bottom:
            ax.set_xlabel("key position (attended to)", fontsize=7)
        if left:
            ax.set_ylabel("query position", fontsize=7)
        for j in highlight:
            ax.axvline(j, color="cyan", linewidth=0.4, alpha=0.5)
    for ax in axes[n:]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=list(axes[:n]), shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=10)
    return fig


def attention_demo(model, tok, name: str) -> dict:
    """Every head's weights on the question about `name`: future mass, top-3 of the last row, weight on the name."""
    import numpy as np
    from attention_jax.data import tiny_world as tw
    prompt, name_pos = tw.question_prompt(name)
    ids = tok.encode(prompt)
    cache = cached_run(model, ids)
    layers = [np.asarray(cache[f"blocks.{i}.mixer.attention.weights"], np.float64)[0] for i in range(len(model.blocks))]
    T = len(ids)
    upper = np.triu(np.ones((T, T), bool), 1)
    future = np.concatenate([a[:, upper].ravel() for a in layers])
    chars = list(tw.show(prompt))
    heads = []
    for i, a in enumerate(layers):
        for h in range(a.shape[0]):
            row = a[h, -1]
            top = np.argsort(-row, kind="stable")[:3]
            heads.append(dict(head=f"{i}.{h}", layer=i, index=h,
                              top3="  ".join(f"{chars[j]!r}@{j}:{row[j]:.2f}" for j in top),
                              on_name=float(row[name_pos].sum()), on_self=float(row[-1]), max=float(row.max())))
    best = max(heads, key=lambda r: r["on_name"])
    return dict(prompt=prompt, chars=chars, name_positions=name_pos, layers=layers, heads=heads, best=best,
                future_sum=float(future.sum()), future_max=float(future.max()) if future.size else 0.0,
                future_entries=int(future.size))


# --- demo 5: why divide by √d -----------------------------------------------------------------

def sqrt_d_random(rows: int, keys: int = SQRT_D_KEYS, seed: int = SQRT_D_SEED, pairs: int | None = None) -> list[dict]:
    """experiments.scaling's sweep at the lecture's sizes: per d_k, the std of random q·k (over
    `pairs` pairs, scaling's cpu preset's by default), the mean max weight and the share of frozen
    rows, with and without ÷√d_k."""
    from experiments import scaling
    found, _, _ = scaling.measure(pairs=pairs or scaling.PRESETS["cpu"]["pairs"], rows=rows, keys=keys, seed=seed)
    return [dict(d_k=r["d"], std=r["std"], sqrt_d=r["sqrt_d"], raw_max=r["unscaled_max"], scaled_max=r["scaled_max"],
                 saturated=r["unscaled_frozen"], scaled_saturated=r["scaled_frozen"],
                 lecture=LECTURE_SQRT_D.get(r["d"], "-")) for r in found]


def entropy_rows(weights, mask):
    """Mean entropy (nats) of the softmax rows."""
    import numpy as np
    w = np.where(mask, weights, 0.0)
    return float(-(w * np.log(np.where(w > 0, w, 1.0))).sum(-1).mean())


def sqrt_d_trained(model, ids) -> list[dict]:
    """Per layer: std of the real scores with and without the √d division, and the rows' entropy both ways."""
    import numpy as np
    from attention_jax import functional as F
    cache = cached_run(model, ids)
    T, dh = len(ids), model.config.d_head_used
    causal = np.tril(np.ones((T, T), bool))
    uniform = float(np.mean(np.log(np.arange(1, T + 1))))
    out = []
    for i in range(len(model.blocks)):
        s = np.asarray(cache[f"blocks.{i}.mixer.attention.scores"], np.float64)[0]          # [H, T, T], divided by √d_h
        seen = s[:, causal]
        rows = []
        for scale in (1.0, math.sqrt(dh)):                                         # as trained / without ÷√d
            w = np.asarray(F.masked_softmax(s * scale, causal), np.float64)
            rows.append((entropy_rows(w, causal), float(w.max(-1).mean()), float((w.max(-1) > FROZEN).mean())))
        out.append(dict(layer=i, std_scaled=float(seen.std()), std_unscaled=float((seen * math.sqrt(dh)).std()),
                        entropy=rows[0][0], entropy_unscaled=rows[1][0], uniform_entropy=uniform,
                        max_weight=rows[0][1], max_weight_unscaled=rows[1][1], saturated_unscaled=rows[1][2]))
    return out
