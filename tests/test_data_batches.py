"""attention_jax.data.batches: the contiguous train/val split, random batches as a pure function
of (seed, step), evaluation windows tiling a split, and the sizes each refuses."""

import numpy as np
import pytest

import attention_jax.data as data
from attention_jax.errors import ConfigError, DataError


def test_split_and_batches_are_deterministic():
    tokens = np.arange(1000, dtype=np.int32)
    train, val = data.train_val_split(tokens)
    assert len(train) == 900 and train[-1] + 1 == val[0] and len(val) == 100
    x, y = data.get_batch(train, seed=3, step=7, batch_size=8, context=16)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    np.testing.assert_array_equal(y[:, -1], x[:, -1] + 1)  # y is the next token
    np.testing.assert_array_equal(x, data.get_batch(train, seed=3, step=7, batch_size=8, context=16)[0])
    assert not np.array_equal(x, data.get_batch(train, seed=3, step=8, batch_size=8, context=16)[0])
    assert not np.array_equal(x, data.get_batch(train, seed=4, step=7, batch_size=8, context=16)[0])
    with pytest.raises(DataError):
        data.get_batch(tokens[:10], seed=0, step=0, batch_size=2, context=10)


def test_eval_windows_tile_without_overlap():
    tokens = np.arange(1003, dtype=np.int32)
    x, y = data.eval_windows(tokens, 100)
    assert x.shape == y.shape == (10, 100)
    np.testing.assert_array_equal(x.ravel(), tokens[:1000])  # contiguous, no overlap, no gap
    np.testing.assert_array_equal(y.ravel(), tokens[1:1001])
    sx, sy = data.eval_windows(tokens, 100, max_windows=4)
    np.testing.assert_array_equal(sx[:, 0], [0, 200, 500, 700])  # evenly spaced, distinct
    np.testing.assert_array_equal(sy, sx + 1)
    np.testing.assert_array_equal(data.eval_windows(tokens, 100, max_windows=50)[0], x)


def test_the_split_is_contiguous_at_any_fraction_and_refuses_one_that_leaves_a_side_empty():
    tokens = np.arange(50, dtype=np.int32)
    train, val = data.train_val_split(tokens, frac=0.5)
    np.testing.assert_array_equal(np.concatenate([train, val]), tokens)   # nothing dropped, nothing shuffled
    assert len(train) == 25
    for frac in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match=f"train fraction {frac} must lie strictly between 0 and 1"):
            data.train_val_split(tokens, frac)
    with pytest.raises(DataError, match="3 tokens cannot be split 0.10/0.90"):
        data.train_val_split(tokens[:3], 0.1)      # int(0.3) == 0: no training token


def test_batch_windows_start_anywhere_a_whole_window_fits_and_nowhere_else():
    tokens = np.arange(40, dtype=np.int32)
    starts = set()
    for step in range(200):
        x, y = data.get_batch(tokens, seed=0, step=step, batch_size=4, context=8)
        np.testing.assert_array_equal(x, x[:, :1] + np.arange(8))          # contiguous windows of the ids
        starts |= set(x[:, 0].tolist())
    assert starts == set(range(40 - 8))         # every start with a target after it, the last one included


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(batch_size=0), ConfigError, "batch_size must be a positive integer, got 0"),
    (dict(context=-1), ConfigError, "context must be a positive integer, got -1"),
    (dict(seed=-1), ConfigError, "seed (-1) and step (0) must be non-negative"),
    (dict(step=-2), ConfigError, "seed (0) and step (-2) must be non-negative"),
    (dict(context=40), DataError, "40 tokens are too few for context 40"),
])
def test_get_batch_refuses_impossible_sizes_in_one_line(kwargs, error, needle):
    args = dict(seed=0, step=0, batch_size=2, context=4) | kwargs
    with pytest.raises(error) as info:
        data.get_batch(np.arange(40, dtype=np.int32), **args)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_eval_windows_refuse_a_split_shorter_than_one_window():
    x, y = data.eval_windows(np.arange(9, dtype=np.int32), 8)                # 8 inputs + 1 target: one window
    assert x.shape == (1, 8) and y[0, -1] == 8
    with pytest.raises(DataError, match="8 tokens are too few for one evaluation window of 8"):
        data.eval_windows(np.arange(8, dtype=np.int32), 8)
    with pytest.raises(ConfigError, match="max_windows must be a positive integer, got 0"):
        data.eval_windows(np.arange(100, dtype=np.int32), 8, max_windows=0)
