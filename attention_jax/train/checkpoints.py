"""orbax checkpoints of a run's state, fingerprinted so a run never resumes someone else's.

The whole training state (parameters, optimizer moments, step count, RNG streams) is one
pytree, so one orbax `CheckpointManager` save is a complete resume point. `run.json`
beside it records the model and training configuration and the seeds; a resume whose
request differs is refused with one line instead of silently training another model on.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import orbax.checkpoint as ocp

from attention_jax.errors import CheckpointError


class Checkpoints:
    """orbax CheckpointManager plus a fingerprint, so a run never resumes someone else's state."""

    def __init__(self, workdir: pathlib.Path, every: int, fingerprint: dict, *, resume: bool):
        self.dir = workdir.absolute() / "checkpoints"
        meta = workdir / "run.json"
        if not resume and self.dir.exists():
            shutil.rmtree(self.dir)
        if resume and meta.exists() and self.dir.exists():
            stored = json.loads(meta.read_text())
            if stored != fingerprint:
                raise CheckpointError(f"the checkpoint in {self.dir} was made by another configuration; "
                                      "delete that folder or choose another --out")
        workdir.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(fingerprint, indent=1, sort_keys=True))
        options = ocp.CheckpointManagerOptions(save_interval_steps=every, max_to_keep=1,
                                               enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(self.dir, options=options)

    def restore(self, abstract_state) -> tuple[int, Any]:
        step = self.manager.latest_step()
        if step is None:
            return 0, None
        try:
            state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
        except Exception as e:  # orbax raises many kinds on a structure mismatch
            raise CheckpointError(f"cannot restore {self.dir} (step {step}): it does not match this model "
                                  f"({type(e).__name__}); delete that folder to start again") from None
        return step, state

    def save(self, step: int, state, *, force: bool = False) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(state), force=force)

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()
