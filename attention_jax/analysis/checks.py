"""The analyses' arguments and results checked, each in one line that names the problem and the fix.

A size that is no count (negative, a bool, a fraction) would be read with Python's slicing or
`int()` and give another circuit than the one asked for; a NaN threshold keeps nothing; a share of
a gap too small to measure is noise scaled up. So every public argument of the analyses passes
through one of these, and every ratio through `gap`.
"""
from __future__ import annotations

import numpy as np

from attention_jax.errors import ConfigError, NotMeasurable

MIN_GAP = 1e-3     # the least clean-corrupted gap a share is taken of, in the metric's own units


def whole(name: str, value, *, least: int = 1) -> int:
    """`value` as an int, if it is a whole number >= `least` (not a bool, not a fraction)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < least:
        raise ConfigError(f"{name}={value!r} must be a whole number >= {least}")
    return int(value)


def number(name: str, value, *, least: float = 0.0) -> float:
    """`value` as a float, if it is a finite real number >= `least` (not a bool)."""
    if isinstance(value, (bool, np.bool_)) \
            or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value < least:
        raise ConfigError(f"{name}={value!r} must be a finite number >= {least:g}")
    return float(value)


def finite(what: str, values) -> np.ndarray:
    """`values` as float64, if every one is finite: a NaN ranked or pruned as if it were a
    score is a lie."""
    values = np.asarray(values, np.float64)
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)].reshape(-1)[0]
        raise NotMeasurable(f"the metric is not finite ({what}: {bad}), and every score from it "
                            "would not be either; check the metric and the model on these texts")
    return values


def gap(clean: float, corrupted: float, min_gap: float = MIN_GAP) -> float:
    """clean - corrupted (a metric's, or a logit difference's), if finite and at least
    `min_gap` in size."""
    min_gap = number("min_gap", min_gap)
    difference = float(clean) - float(corrupted)
    if not np.isfinite(difference) or abs(difference) < min_gap:
        raise NotMeasurable(f"the clean and corrupted runs differ by {difference:.3g} in the "
                            f"metric, below min_gap={min_gap:g}: a share of that gap is not "
                            "measurable; choose texts (or answers) the model tells apart")
    return difference
