"""ROC curves of circuits against a known circuit, and their area as the ACDC paper computes it.

A circuit (a set of edge names) is a point: TPR, the share of the true edges it holds, and FPR, the
share of the other edges it holds. A method gives a sequence of circuits (a score's top k for every
k, or ACDC at each threshold). Its area, as the ACDC paper's code has it (Conmy et al. 2023,
`notebooks/make_plotly_plots.py`): (0, 0) and (1, 1) added, only the Pareto-optimal points kept, and
the pessimistic step sum over them, each rise in TPR credited at the FPR it was reached at.
"""
from __future__ import annotations


def point(circuit, true: set, every: list) -> tuple[float, float]:
    """(FPR, TPR) of one circuit among `every` edge."""
    held = set(circuit)
    false = len(every) - len(true)
    return len(held - true) / max(1, false), len(held & true) / max(1, len(true))


def curve(circuits, true: set, every: list) -> list[tuple[float, float]]:
    """The Pareto-optimal points of `circuits`, with (0, 0) and (1, 1), by FPR then TPR."""
    points = {point(c, true, every) for c in circuits} | {(0.0, 0.0), (1.0, 1.0)}
    best = [p for p in points if not any(q != p and q[0] <= p[0] and q[1] >= p[1] for q in points)]
    return sorted(best)


def area(points: list[tuple[float, float]]) -> float:
    """The pessimistic step sum: sum over points by rising TPR of (TPR - the last TPR) * (1 - its FPR)."""
    total, last = 0.0, 0.0
    for fpr, tpr in sorted(points, key=lambda p: (p[1], p[0])):
        total += max(0.0, tpr - last) * (1.0 - fpr)
        last = max(last, tpr)
    return total
