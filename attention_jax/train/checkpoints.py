"""orbax checkpoints of a run's state, recorded and checksummed before they are trusted.

The whole training state (parameters, optimizer moments, step count, RNG streams) is one
pytree, so one orbax `CheckpointManager` save is a complete resume point. Beside it:

* `run.json`, the model and training configuration, task and seeds that made it: a resume
  whose request differs is refused with one line instead of training another model on;
* `checksums.json`, the sha256 of every saved state's bytes: a restored state must hash to
  what was saved, so a flipped bit or an overwritten block is found, not trained on. A
  damaged step falls back to the earlier one kept (two are kept), else to a fresh start,
  and says which on stderr.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from attention_jax.data.corpus import new_file
from attention_jax.errors import CheckpointError, hush_unraisable, note
from attention_jax.train.distributed import barrier, is_writer, to_host

KEEP = 2   # the latest step and one to fall back to


def run_record(model_config, train_config, seeds, task_identity=None, loss=None) -> dict:
    """What made a run: its checkpoints resume only under the same one. As JSON reads it back (a
    tuple as a list), so a record compares equal to the one stored; `loss`: a loss of one's own, by
    its digest (`attention_jax.fingerprint.digest`: its code and the values it reads)."""
    made = {"model": model_config.to_dict(), "train": dataclasses.asdict(train_config),
            "seeds": [int(s) for s in seeds],
            **({"task": dict(task_identity)} if task_identity else {}),
            **({"loss": loss} if loss else {})}
    return json.loads(json.dumps(made, sort_keys=True, default=str))


def state_digest(state) -> str:
    """sha256 over every leaf's bytes (PRNG keys as their key data), in tree order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(state):
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        digest.update(np.ascontiguousarray(to_host(leaf)).tobytes())
    return digest.hexdigest()


def _read_json(path: pathlib.Path):
    """A JSON file's content, or None when it is missing or damaged (never an exception)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _disk_full(error: BaseException) -> str | None:
    """The OS's words when an error (or one it wraps) is a full disk or quota, else None."""
    import errno
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error.strerror or str(error)
        if "No space left on device" in str(error):
            return "No space left on device"
        error = error.__cause__ or error.__context__
    return None


def _orbax_echo(unraisable) -> bool:
    """When orbax gives up on damaged bytes, its reads still running in TensorStore's threads end
    later, each printed by Python as "Exception ignored": "Event loop is closed", and the read
    error again from its abandoned coroutine. The damage is reported once, in our own note."""
    code = getattr(unraisable.object, "cr_code", None)
    closed = str(unraisable.exc_value) == "Event loop is closed"
    return (isinstance(unraisable.exc_value, RuntimeError) and closed
            or code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename)


class Checkpoints:
    """orbax CheckpointManager plus the run's record and checksums: a run resumes only its own,
    intact state."""

    def __init__(self, workdir: pathlib.Path, every: int, record: dict, *, resume: bool):
        self.dir = workdir.absolute() / "checkpoints"
        self.every = every
        meta, self.sums_file = workdir / "run.json", workdir / "checksums.json"
        self.known = resume and meta.exists()     # a run record vouches for what the folder holds
        if resume and meta.exists() and self.dir.exists():
            stored = _read_json(meta)
            if stored is None:
                note(f"{meta} is damaged: the checkpoint beside it cannot be vouched for; "
                     "starting afresh")
                resume = False
            elif stored != record:
                raise CheckpointError(f"the checkpoint in {self.dir} was made by another "
                                      "configuration; delete that folder, or train this one into "
                                      "another workdir")
        if is_writer():       # process 0 changes the files; the others wait for it below
            if not resume and self.dir.exists():
                shutil.rmtree(self.dir)
                self.sums_file.unlink(missing_ok=True)
            workdir.mkdir(parents=True, exist_ok=True)
            meta.write_text(json.dumps(record, indent=1, sort_keys=True))
        barrier(f"checkpoints {workdir}")
        # Each saved step names the run that made it and how far that run meant to go: a step
        # copied from another run, or past this run's end, is not resumed.
        self.run = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
        self.planned = record.get("train", {}).get("steps")
        sums = _read_json(self.sums_file)
        self.sums_damaged = self.sums_file.exists() and not isinstance(sums, dict)
        self.sums = {str(k): v for k, v in sums.items()} if isinstance(sums, dict) else {}
        # Which steps are saved is `due`'s decision alone (every `every` steps, and a preemption
        # notice), and `save` always forces: orbax's default policy would also save the first
        # step of every run, so the steps kept would differ with the steps per call.
        # A save cut short (Ctrl-C, or a failure) leaves a temporary folder; it goes now, quietly.
        # Not orbax's cleanup_tmp_directories: in the same process (a notebook calling fit again)
        # the cut save's writer threads may still be filling it, and orbax's rmtree raises on that
        # race.
        if is_writer():
            for tmp in self.dir.glob("*.orbax-checkpoint-tmp*"):
                shutil.rmtree(tmp, ignore_errors=True)
        options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(self.dir, options=options)
        # Preemption notices come only through JAX's distributed runtime (on by default when it
        # starts, even for one process); without it nothing but the interval decides.
        self.preemptible = jax.distributed.is_initialized()
        self.preempted = False     # set by `due` when a preemption notice (not the interval) asks
        self.cut = None            # the step whose save an exception (Ctrl-C) cut short

    def restore(self, abstract_state) -> tuple[int, Any]:
        """(step, state) of the latest intact checkpoint of this run, or (0, None) to start
        afresh."""
        hush_unraisable(_orbax_echo)
        steps = sorted(self.manager.all_steps(), reverse=True)
        self.restored = None
        for i, step in enumerate(steps):
            entry = self.sums.get(str(step))
            entry = {"state": entry} if isinstance(entry, str) else \
                entry if isinstance(entry, dict) else {}
            problem, state = self._vouched(step, entry), None
            if problem is None:
                problem, state = self._read(step, entry, abstract_state)
            if problem is None:
                self.restored = entry
                return step, state
            earlier = f"falling back to step {steps[i + 1]}" if i + 1 < len(steps) else \
                "starting afresh"
            aside = self.set_aside(step)
            note(f"checkpoint step {step} in {self.dir} is damaged: {problem}; {earlier} "
                 f"(moved to {aside})")
        return 0, None

    def _vouched(self, step: int, entry: dict) -> str | None:
        """Why a saved step is not this run's to resume from its record, or None."""
        if self.sums_damaged:
            return "checksums.json is damaged, so no checkpoint can be vouched for"
        if self.planned and step > self.planned:
            return f"it is past this run's {self.planned} steps (another run's)"
        return "it was saved by another run" if entry.get("run", self.run) != self.run else None

    def _read(self, step: int, entry: dict, abstract_state) -> tuple[str | None, Any]:
        """(None, state) for a step that reads back with its checksum, or (why not, None)."""
        try:
            state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
        except Exception as e:  # orbax raises many kinds, on a wrong structure as on damaged bytes
            if not self.known:
                raise CheckpointError(f"cannot restore {self.dir} (step {step}): it does not "
                                      f"match this model ({type(e).__name__}); delete that folder "
                                      "to start again") from None
            return f"it cannot be read ({type(e).__name__})", None
        same = state_digest(state) == entry.get("state")
        return (None, state) if same else ("its checksum does not match", None)

    def discard(self) -> None:
        """Set every saved step aside: the run starts again from nothing."""
        for step in list(self.manager.all_steps()):
            self.set_aside(step)

    def set_aside(self, step: int) -> pathlib.Path:
        """Move a damaged step out of orbax's folder, so training can save that step again (orbax
        refuses to overwrite one) and nothing later mistakes it for the latest; kept, not
        deleted."""
        aside = self.dir.parent / "damaged" / str(step)
        if is_writer():
            if aside.exists():
                shutil.rmtree(aside)
            aside.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.dir / str(step)), str(aside))
            self.sums.pop(str(step), None)
        barrier(f"checkpoint {self.dir} set aside {step}")
        self.manager.reload()
        return aside

    def due(self, step: int, *, since: int | None = None) -> bool:
        """Whether the state after `step` is to be saved: on the interval, or on a preemption.

        `since`: the first step of a multi-step call that ended at `step`. On a preemption
        notice JAX's processes agree to save at the next step any of them reports, so every
        step of the call is reported, in order; a notice met inside saves the call's end (and
        sets `preempted`, also when that step is on the interval). Ask once per step reached.
        """
        interval = step % self.every == 0 and step != self.manager.latest_step()
        if not self.preemptible:   # nothing to report: orbax's check costs more than a GPU step
            return interval
        notices = [self.manager.reached_preemption(s) for s in range(since or step, step + 1)]
        self.preempted = any(notices)
        return interval or self.preempted

    def metrics_intact(self, metrics_file: pathlib.Path | None) -> bool:
        """Whether the metrics file still begins with what was logged when the restored step was
        saved (a run's curves are rebuilt from it); True when that save recorded none."""
        seen = (self.restored or {}).get("metrics")
        if not seen or metrics_file is None:
            return True
        try:
            with open(metrics_file, "rb") as f:
                head = f.read(seen["bytes"])
        except OSError:
            return False
        return len(head) == seen["bytes"] and hashlib.sha256(head).hexdigest() == seen["sha256"]

    def save(self, step: int, state, metrics_file: pathlib.Path | None = None) -> None:
        """Save `state` as `step` (whether to is `due`'s to say): orbax, then its checksum, the run
        that made it and the digest of the metrics logged so far (process 0)."""
        self.cut = step
        try:
            saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
            self.cut = None
        except Exception as e:
            full = _disk_full(e)
            if full is None:
                raise
            raise CheckpointError(f"the disk is full: checkpoint step {step} could not be written "
                                  f"to {self.dir} ({full}); free some space and train again: the "
                                  "run resumes from its last checkpoint") from None
        if saved and is_writer():
            self.sums = {k: v for k, v in self.sums.items() if int(k) in self.manager.all_steps()}
            entry = {"state": state_digest(state), "run": self.run}
            if metrics_file is not None and metrics_file.exists():
                logged = metrics_file.read_bytes()
                entry["metrics"] = {"bytes": len(logged),
                                    "sha256": hashlib.sha256(logged).hexdigest()}
            self.sums[str(step)] = entry
            self._write_sums()

    def keep(self, step: int, state, metrics_file: pathlib.Path | None = None) -> None:
        """On an interruption: save `step` unless it is saved, its save was what got cut (orbax's
        writer threads still fill that step's temporary folder; saving it again would pull the
        folder from under them), or the step cut short had already taken the state's buffers
        (donated to it). A full disk is said in one line: the last finished step stands."""
        if self.cut is not None or self.manager.latest_step() == step:
            return
        if any(isinstance(a, jax.Array) and a.is_deleted() for a in jax.tree.leaves(state)):
            return
        try:
            self.save(step, state, metrics_file)
        except CheckpointError as e:
            note(str(e))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def finished(self, keep: int = KEEP) -> None:
        """A finished run keeps its `keep` latest steps (1: the model alone, for a run whose figures
        mean nothing, where the step before it to fall back to only takes room)."""
        steps = sorted(self.manager.all_steps())
        if not steps or len(steps) <= keep or not is_writer():
            return
        for step in steps[:-keep]:
            self.manager.delete(step)
        self.sums = {k: v for k, v in self.sums.items() if int(k) in steps[-keep:]}
        self._write_sums()

    def _write_sums(self) -> None:
        """The saved steps' digests to their file, whole or not at all (a new file moved over the
        old)."""
        fd, tmp = new_file(self.sums_file.parent, f".{self.sums_file.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.sums, indent=1))
        os.replace(tmp, self.sums_file)

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()
