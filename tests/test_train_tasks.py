"""attention_jax.train.tasks: a Task is what a run trains on and how it is scored. text_task's
batches are a pure function of (seed, step) (what makes a resumed run draw the same batches), and
its evaluation is train perplexity on a fixed sample of the training split and held-out
perplexity on the whole validation split."""

import dataclasses

import numpy as np
import pytest

from attention_jax.data import get_batch
from attention_jax.train import Task, text_task

TRAIN = np.random.default_rng(0).integers(0, 64, 2000).astype(np.int32)
VAL = np.random.default_rng(1).integers(0, 64, 300).astype(np.int32)


def make(**kw):
    return text_task(TRAIN, VAL, batch_size=4, context=16, train_eval_windows=5, **kw)


def test_a_sample_is_a_pure_function_of_seed_and_step():
    task = make()
    first = task.sample(3, 7)
    assert set(first) == {"x", "y"}
    assert first["x"].shape == first["y"].shape == (4, 16) and first["x"].dtype == np.int32
    np.testing.assert_array_equal(first["y"][:, :-1], first["x"][:, 1:])     # y: the next tokens
    # whatever was drawn before, and by another task object: the pair alone decides
    make().sample(0, 0), task.sample(3, 8), task.sample(4, 7)
    again = make().sample(3, 7)
    for k in ("x", "y"):
        np.testing.assert_array_equal(again[k], first[k])
    assert not np.array_equal(task.sample(3, 8)["x"], first["x"])          # another step, another batch
    assert not np.array_equal(task.sample(4, 7)["x"], first["x"])          # another seed too
    x, y = get_batch(TRAIN, seed=3, step=7, batch_size=4, context=16)       # the batches' own rule
    np.testing.assert_array_equal(first["x"], x)
    np.testing.assert_array_equal(first["y"], y)


def test_samples_come_from_the_training_split_only():
    fives = text_task(np.full(100, 5, np.int32), VAL, batch_size=4, context=16, train_eval_windows=5)
    for step in range(20):
        b = fives.sample(0, step)
        assert set(b["x"].ravel().tolist()) == set(b["y"].ravel().tolist()) == {5}   # nothing of VAL leaks in


class FakeEngine:
    """An engine as far as evaluate asks it: perplexity of a split, one value per seed, calls recorded."""
    def __init__(self):
        self.calls = []

    def perplexity(self, state, tokens, *, max_windows=None):
        self.calls.append((tokens, max_windows))
        return np.array([float(len(tokens)), float(max_windows or 0)])


def test_evaluate_gives_train_ppl_on_a_fixed_sample_and_val_ppl_on_the_whole_split():
    engine = FakeEngine()
    got = make().evaluate(engine, "state")
    assert set(got) == {"train_ppl", "val_ppl"}
    np.testing.assert_array_equal(got["train_ppl"], [len(TRAIN), 5])   # the training split, train_eval_windows
    np.testing.assert_array_equal(got["val_ppl"], [len(VAL), 0])       # the validation split, every window
    (train_tokens, _), (val_tokens, _) = engine.calls
    assert train_tokens is TRAIN and val_tokens is VAL


def test_the_identity_is_a_copy_and_the_task_is_frozen():
    identity = {"corpus": "mine", "sha256": "ab" * 32}
    task = make(identity=identity)
    assert isinstance(task, Task)
    assert task.identity == identity and task.identity is not identity
    identity["corpus"] = "changed"                       # the caller's dict changing later changes nothing
    assert task.identity["corpus"] == "mine"
    assert list(make().identity) == ["tokens"]              # without one of the caller's: the tokens' digest
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.sample = None


@pytest.mark.slow
def test_a_run_on_other_tokens_or_another_loss_is_not_resumed(tmp_path):
    """Resumed on other tokens (or with another loss), fit returned the first run's model at its last step."""
    from attention_jax.errors import CheckpointError
    from attention_jax.train import fit, text_task
    from helpers import TC, TRAIN, VAL, new_engine
    task = lambda train: text_task(train, VAL, batch_size=TC.batch_size, context=16,
                                   train_eval_windows=TC.train_eval_windows)
    fit(new_engine(), task(TRAIN), seeds=[0], workdir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="another"):
        fit(new_engine(), task(TRAIN[::-1].copy()), seeds=[0], workdir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="another"):
        fit(new_engine(loss=lambda logits, y, w=None: logits.mean()), task(TRAIN), seeds=[0], workdir=tmp_path,
            progress=False)
    assert fit(new_engine(), task(TRAIN), seeds=[0], workdir=tmp_path, progress=False).resumed_from == TC.steps


@pytest.mark.slow
def test_an_identity_holding_a_tuple_resumes(tmp_path):
    """JSON reads a tuple back as a list: every resume was refused as another configuration's."""
    from attention_jax.train import fit, text_task
    from helpers import TC, TRAIN, VAL, new_engine
    task = text_task(TRAIN, VAL, batch_size=TC.batch_size, context=16, train_eval_windows=TC.train_eval_windows,
                     identity={"split": (0.9, 0.1)})
    fit(new_engine(), task, seeds=[0], workdir=tmp_path, progress=False)
    assert fit(new_engine(), task, seeds=[0], workdir=tmp_path, progress=False).resumed_from == TC.steps
