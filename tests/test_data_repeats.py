"""attention_jax.data.repeats: every sequence holds its segment twice, back to back, wherever and however
long its draw says; batches are a pure function of (seed, step); the masks mark the predictable copy."""
import numpy as np
import pytest

from attention_jax.data.repeats import copy_targets, repeated_segments
from attention_jax.errors import ConfigError

KW = dict(batch=64, length=64, vocab=64, shortest=12, longest=32)


def test_each_sequence_repeats_its_segment_right_after_itself_inside_the_window():
    b = repeated_segments(3, 7, **KW)
    assert b["x"].shape == b["y"].shape == (64, 64) and b["x"].dtype == np.int32
    np.testing.assert_array_equal(b["x"][:, 1:], b["y"][:, :-1])                      # y is x one step on
    for x, f, s in zip(b["x"], b["first"], b["span"]):
        assert 12 <= s <= 32 and f + 2 * s <= 64
        np.testing.assert_array_equal(x[f + s:f + 2 * s], x[f:f + s])
    assert len(set(b["span"].tolist())) > 5 and len(set(b["first"].tolist())) > 5       # no fixed offset to learn
    assert b["x"].min() >= 0 and b["x"].max() < 64


def test_batches_are_a_pure_function_of_seed_and_step():
    a, again = repeated_segments(1, 2, **KW), repeated_segments(1, 2, **KW)
    assert all(np.array_equal(a[k], again[k]) for k in a)
    assert not np.array_equal(a["x"], repeated_segments(1, 3, **KW)["x"])
    assert not np.array_equal(a["x"], repeated_segments(2, 2, **KW)["x"])


def test_the_masks_mark_as_many_predictable_targets_as_unpredictable_ones():
    b = repeated_segments(0, 0, **KW)
    repeat, once = copy_targets(b["first"], b["span"], 64)
    np.testing.assert_array_equal(repeat.sum(1), b["span"] - 1)
    np.testing.assert_array_equal(once.sum(1), b["span"] - 1)
    rows, cols = np.nonzero(repeat)       # each target in the second copy is the token after its earlier twin
    np.testing.assert_array_equal(b["y"][rows, cols], b["y"][rows, cols - b["span"][rows]])
    assert not (repeat & once).any()


@pytest.mark.parametrize("bad", [dict(shortest=1), dict(longest=40), dict(shortest=20, longest=12), dict(vocab=1)])
def test_segments_that_cannot_fit_are_refused_in_one_line(bad):
    with pytest.raises(ConfigError) as info:
        repeated_segments(0, 0, **{**KW, **bad})
    assert "\n" not in str(info.value)
