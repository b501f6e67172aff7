"""attention_jax.analysis.checks: counts, numbers, finite metrics and gaps, each refused in one line."""
import numpy as np
import pytest

from attention_jax import ConfigError
from attention_jax.analysis.checks import MIN_GAP, finite, gap, number, whole
from attention_jax.errors import NotMeasurable


def test_a_count_is_a_whole_number_not_a_bool_or_a_fraction():
    assert whole("k", 3) == 3 and whole("k", np.int64(0), least=0) == 0
    for bad in (True, 2.5, np.float32(2), -1, "2", None):
        with pytest.raises(ConfigError, match="must be a whole number >= 1"):
            whole("k", bad)


def test_a_number_is_finite_and_real():
    assert number("x", 0) == 0.0 and number("x", np.float32(0.5)) == 0.5
    for bad in (float("nan"), float("inf"), -1e-9, False, "1", 1j):
        with pytest.raises(ConfigError, match="must be a finite number >= 0"):
            number("x", bad)


def test_non_finite_metrics_and_gaps_below_the_floor_are_not_measurable():
    np.testing.assert_array_equal(finite("x", [1, 2]), [1.0, 2.0])
    with pytest.raises(NotMeasurable, match=r"not finite \(x: nan\)"):
        finite("x", [1.0, np.nan])
    assert gap(1.0, 0.0) == 1.0 and gap(-2.0, 0.0) == -2.0          # a negative gap is a gap
    for clean, corrupted in ((1.0, 1.0), (1.0, 1.0 + MIN_GAP / 2), (np.nan, 0.0), (np.inf, 0.0)):
        with pytest.raises(NotMeasurable, match="not measurable"):
            gap(clean, corrupted)
    assert gap(1.0, 1.0 + 1e-5, min_gap=1e-6) == pytest.approx(-1e-5)
