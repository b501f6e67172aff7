"""attention_jax.train.checkpoints: when a save is due (the interval, a preemption notice inside
a call), a checkpoint of another configuration refused, the run record and the state's digest,
and a damaged step set aside for the one before it.
"""

import dataclasses
import hashlib
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_jax.errors import CheckpointError
from attention_jax.train import Checkpoints, run_record
from attention_jax.train.checkpoints import state_digest

from helpers import MC, TC, one_line, run


pytestmark = pytest.mark.usefixtures("private_cache")   # no test here may touch the user's cache


class FakePreemption:
    """orbax's manager as far as `Checkpoints.due` asks it, with a notice agreed for one step."""
    def __init__(self, at):
        self.at, self.asked = at, []

    def reached_preemption(self, step):
        self.asked.append(step)
        return step == self.at

    def latest_step(self):
        return None


def test_checkpoints_are_due_on_the_interval_and_on_a_preemption_inside_a_call(tmp_path):
    from attention_jax.train import Checkpoints
    ckpt = Checkpoints(tmp_path, 4, {"run": 1}, resume=False)
    assert not ckpt.preemptible                                  # no distributed runtime, no notices
    assert [s for s in range(1, 10) if ckpt.due(s)] == [4, 8]    # and not orbax's first-step save
    ckpt.close()
    ckpt.preemptible, ckpt.manager = True, FakePreemption(at=6)
    assert not ckpt.due(3, since=1) and ckpt.manager.asked == [1, 2, 3]
    assert ckpt.due(7, since=4) and ckpt.manager.asked[3:] == [4, 5, 6, 7]   # every step, in order
    assert not ckpt.due(10, since=8)
    ckpt.manager = FakePreemption(at=8)       # a notice met on an interval step still stops the run
    assert ckpt.due(8, since=5) and ckpt.preempted


@pytest.mark.slow
def test_checkpoint_of_another_configuration_is_refused(tmp_path, engine):
    work = tmp_path / "run"
    first = run(engine=engine(), workdir=work)
    folder = str((work / "checkpoints").absolute())
    for mc, tc, seeds in [(MC, dataclasses.replace(TC, lr=2e-2), [0]),
                          (dataclasses.replace(MC, d_model=16), TC, [0]),
                          (MC, TC, [1])]:
        with pytest.raises(CheckpointError) as info:
            run(mc, tc, seeds=seeds, workdir=work)
        message = one_line(info.value)
        assert folder in message and "another configuration" in message
        assert "delete that folder, or train this one into another workdir" in message
    # The refused runs left the checkpoint and its run record as they were.
    assert run(engine=engine(), workdir=work).final == first.final
    # Without a run record, each step still names the run that saved it: another model's run sets
    # it aside and trains afresh.
    (work / "run.json").unlink()
    other = run(dataclasses.replace(MC, n_layers=2), workdir=work)
    assert other.resumed_from == 0 and (work / "damaged" / str(TC.steps)).is_dir()
    # resume=False is the way out: the old checkpoint is dropped and training starts at 0.
    fresh = run(engine=engine(), seeds=[1], workdir=work, resume=False)
    assert fresh.resumed_from == 0
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_ppl" in r] == [TC.steps]   # the old run's lines are gone


def test_the_run_record_names_the_model_the_training_the_seeds_and_the_task():
    got = run_record(MC, TC, (np.int64(0), 3), {"corpus": "mine"})
    assert got == {"model": MC.to_dict(), "train": dataclasses.asdict(TC), "seeds": [0, 3], "task": {"corpus": "mine"}}
    assert json.loads(json.dumps(got)) == got                          # what run.json holds, as it is
    assert "task" not in run_record(MC, TC, [0])                      # no identity: the keys of old rows
    assert run_record(MC, TC, [0]) != run_record(MC, dataclasses.replace(TC, lr=2e-2), [0])


def test_the_state_digest_is_the_sha256_of_every_leafs_bytes_in_tree_order():
    state = {"a": jnp.arange(3, dtype=jnp.float32), "b": {"key": jax.random.key(7), "n": jnp.int32(5)}}
    by_hand = hashlib.sha256(np.arange(3, dtype=np.float32).tobytes()
                             + np.asarray(jax.random.key_data(jax.random.key(7))).tobytes()
                             + np.int32(5).tobytes()).hexdigest()
    assert state_digest(state) == by_hand
    flipped = {**state, "a": state["a"].at[1].set(np.nextafter(np.float32(1), np.float32(2)))}   # one ulp
    assert state_digest(flipped) != by_hand


def tiny_state(value: float) -> dict:
    return {"w": jnp.full((2, 3), value, jnp.float32), "step": jnp.int32(value)}


def test_a_saved_state_restores_and_a_damaged_step_is_set_aside_for_the_one_before(tmp_path, capsys):
    made_by = run_record(MC, TC, [0])
    ckpt = Checkpoints(tmp_path, 2, made_by, resume=True)
    for step in (2, 4):
        ckpt.save(step, tiny_state(step))
    ckpt.close()
    abstract = jax.eval_shape(lambda: tiny_state(0.0))
    reopened = Checkpoints(tmp_path, 2, made_by, resume=True)
    step, state = reopened.restore(abstract)
    assert step == 4 and float(state["w"][0, 0]) == 4.0 and int(state["step"]) == 4
    reopened.close()
    # A checksum that does not match (as a flipped bit would leave it): step 4 is set aside, step 2 used.
    sums = json.loads((tmp_path / "checksums.json").read_text())
    assert sorted(sums) == ["2", "4"] and sums["4"]["state"] == state_digest(tiny_state(4))
    assert sums["4"]["run"] == reopened.run                              # and the run that saved it
    sums["4"]["state"] = "0" * 64
    (tmp_path / "checksums.json").write_text(json.dumps(sums))
    damaged = Checkpoints(tmp_path, 2, made_by, resume=True)
    step, state = damaged.restore(abstract)
    assert step == 2 and float(state["w"][0, 0]) == 2.0
    err = capsys.readouterr().err
    assert "checkpoint step 4" in err and "its checksum does not match; falling back to step 2" in err
    assert (tmp_path / "damaged" / "4").is_dir() and damaged.latest_step() == 2
    damaged.close()
    # resume=False drops what the folder held; nothing is restored.
    fresh = Checkpoints(tmp_path, 2, made_by, resume=False)
    assert fresh.restore(abstract) == (0, None) and fresh.latest_step() is None
    fresh.close()


def test_a_folder_made_by_another_configuration_is_refused_and_left_as_it_was(tmp_path):
    ckpt = Checkpoints(tmp_path, 2, run_record(MC, TC, [0]), resume=True)
    ckpt.save(2, tiny_state(2))
    ckpt.close()
    before = (tmp_path / "run.json").read_text()
    for other in (run_record(MC, TC, [1]), run_record(dataclasses.replace(MC, d_model=16), TC, [0])):
        with pytest.raises(CheckpointError) as info:
            Checkpoints(tmp_path, 2, other, resume=True)
        message = one_line(info.value)
        assert str((tmp_path / "checkpoints").absolute()) in message and "another configuration" in message
    assert (tmp_path / "run.json").read_text() == before and (tmp_path / "checkpoints" / "2").is_dir()
    fresh = Checkpoints(tmp_path, 2, run_record(MC, TC, [1]), resume=False)   # the way out: start again
    assert fresh.latest_step() is None and json.loads((tmp_path / "run.json").read_text())["seeds"] == [1]
    fresh.close()


def test_a_step_from_another_run_or_past_this_runs_end_is_not_resumed(tmp_path, capsys):
    """A longer run's checkpoints and checksums copied in: its steps are past this run's 6 steps."""
    longer = run_record(MC, dataclasses.replace(TC, steps=12), [0])
    short = run_record(MC, dataclasses.replace(TC, steps=6), [0])
    theirs = Checkpoints(tmp_path / "theirs", 4, longer, resume=True)
    for step in (8, 12):
        theirs.save(step, tiny_state(step))
    theirs.close()
    ours = tmp_path / "ours"
    Checkpoints(ours, 2, short, resume=True).close()                   # this row's run.json
    for part in ("checkpoints", "checksums.json"):
        src = tmp_path / "theirs" / part
        if src.is_dir():
            shutil.copytree(src, ours / part, dirs_exist_ok=True)
        else:
            shutil.copy(src, ours / part)
    ckpt = Checkpoints(ours, 2, short, resume=True)
    assert ckpt.restore(jax.eval_shape(lambda: tiny_state(0.0))) == (0, None)
    assert "past this run's 6 steps" in capsys.readouterr().err
    ckpt.close()
    (ours / "checksums.json").write_text("{not json")                     # and a garbage checksums file
    mine = Checkpoints(ours, 2, short, resume=True)
    mine.save(2, tiny_state(2))
    (ours / "checksums.json").write_text("{not json")
    again = Checkpoints(ours, 2, short, resume=True)
    assert again.restore(jax.eval_shape(lambda: tiny_state(0.0))) == (0, None)
    assert "checksums.json is damaged, so no checkpoint can be vouched for" in capsys.readouterr().err


def test_a_full_disk_during_a_save_is_one_line(tmp_path, monkeypatch):
    import errno
    ckpt = Checkpoints(tmp_path, 2, run_record(MC, TC, [0]), resume=True)

    def full(*a, **kw):
        raise RuntimeError("orbax failed") from OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(ckpt.manager, "save", full)
    with pytest.raises(CheckpointError, match="the disk is full: checkpoint step 2 could not be written") as err:
        ckpt.save(2, tiny_state(2))
    one_line(err.value)
