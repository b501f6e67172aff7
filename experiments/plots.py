"""Plots more than one table draws: figures over training steps, made without pyplot.

Every figure carries a title saying which preset and budget made it, labelled axes and
integer step ticks; legends sit outside the curves they name.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from experiments.harness import report


def integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def curves(records: list[dict], figures: Sequence[str], titles: Sequence[str], title: str, *,
           log: bool = True, source: str = "history"):
    """One panel per figure (e.g. val and train perplexity) against steps, one line per row (seed mean)."""
    fig, axes = report.figure(ncols=len(figures), size=(6 * len(figures) + 1.5, 4.5), sharey=len(figures) > 1)
    axes = np.atleast_1d(axes)
    for i, r in enumerate(records):
        points = r.get(source) or []
        if len(points) < 2:
            continue
        steps = [p["step"] for p in points]
        for ax, name in zip(axes, figures):
            ax.plot(steps, [float(np.mean(p[name])) for p in points], "o-", markersize=3, color=f"C{i % 10}",
                    label=r["name"])
    return finish_panels(fig, axes, [(panel, log) for panel in titles], title)


def finish_panels(fig, axes, panels: Sequence[tuple[str, bool]], title: str, *, ylabel: bool = False,
                  mark_step: int | None = None, mark_label: str = ""):
    """Title, step axis, log scale where asked, grid and integer ticks on each panel ((title, log)
    pairs); an optional dotted line at `mark_step`; one legend outside the last panel."""
    for ax, (panel, log) in zip(axes, panels):
        # a log axis needs a positive value to draw (a run too short to log any step has none)
        log = log and any(np.any(np.asarray(line.get_ydata(), float) > 0) for line in ax.get_lines())
        ax.set(title=panel, xlabel="step")
        if ylabel:
            ax.set_ylabel(panel)
        if mark_step:
            ax.axvline(mark_step, color="gray", linestyle=":", label=mark_label)
        if log:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        integer_steps(ax)
    axes[-1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    return fig
