"""A finished row's checkpoint read back, changing nothing: reopening a trained model is a read.

The library's `Checkpoints` is made for resuming a run: a step it cannot vouch for (saved by
another run, a checksum that does not match) is moved aside so training can save it again, and a
folder whose run.json is damaged starts afresh. Reopening a finished row must never move or delete
anything, so here each of those is refused in one line naming the mismatch and the fix (train the
row again), before orbax reads a byte, and the state is read straight from its step's folder.
"""
from __future__ import annotations

import hashlib
import json
import pathlib

from attention_jax.errors import CheckpointError

FIX = "rerun its table with --fresh to train it again"
ITEM = "default"      # the one item of each step's folder, as `Checkpoints` saves it (orbax's name for it)


def _read(path: pathlib.Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def run_id(fingerprint: dict) -> str:
    """The run a saved step names in checksums.json (as `attention_jax.train.Checkpoints` writes it)."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def vouched(record: dict, workdir: pathlib.Path) -> str:
    """The finished step's checksum, once run.json, checksums.json and the saved steps all match `record`;
    else a `CheckpointError` naming what does not. Reads only."""
    name, step, ckdir = record["name"], record["steps"], workdir / "checkpoints"
    row = f"row {name!r}"
    if not ckdir.is_dir():
        raise CheckpointError(f"{row} has no checkpoint in {workdir}; {FIX}")
    stored = _read(workdir / "run.json")
    if stored is None:
        raise CheckpointError(f"{row}: {workdir / 'run.json'} is missing or damaged, so nothing vouches for the "
                              f"checkpoint beside it; {FIX}")
    if stored != record["fingerprint"]:
        differs = sorted(k for k in set(stored) | set(record["fingerprint"]) if stored.get(k) != record["fingerprint"].get(k))
        raise CheckpointError(f"{row}: its record does not match the checkpoint in {workdir} (run.json differs in "
                              f"{', '.join(differs)}); {FIX}")
    sums = _read(workdir / "checksums.json")
    if not isinstance(sums, dict):
        raise CheckpointError(f"{row}: {workdir / 'checksums.json'} is missing or damaged, so no step of its "
                              f"checkpoint can be vouched for; {FIX}")
    saved = sorted(int(p.name) for p in ckdir.iterdir() if p.name.isdigit())
    if step not in saved:
        raise CheckpointError(f"{row}: the checkpoint in {ckdir} holds step(s) {saved}, not the finished step {step}; "
                              f"{FIX}")
    entry = sums.get(str(step))
    entry = {"state": entry} if isinstance(entry, str) else entry if isinstance(entry, dict) else {}
    if "state" not in entry or entry.get("run", run_id(stored)) != run_id(stored):
        raise CheckpointError(f"{row}: step {step} in {ckdir} was not saved by this row's run (checksums.json "
                              f"{'names another run' if 'state' in entry else 'has no checksum for it'}); {FIX}")
    return entry["state"]


def restore(record: dict, workdir: pathlib.Path, abstract_state):
    """The finished step's state, read without moving, deleting or writing anything; every mismatch with
    `record` (or a state whose checksum differs from the one saved) a one-line `CheckpointError`."""
    import orbax.checkpoint as ocp
    from attention_jax.errors import hush_unraisable
    from attention_jax.train.checkpoints import _orbax_echo, state_digest
    digest = vouched(record, workdir)
    where = (workdir / "checkpoints" / str(record["steps"])).absolute()
    hush_unraisable(_orbax_echo)     # damaged bytes: orbax's abandoned reads echo later; said once, below
    try:
        with ocp.StandardCheckpointer() as reader:
            state = reader.restore(where / ITEM, abstract_state)
    except Exception as e:  # orbax raises many kinds, on a structure mismatch as on damaged bytes
        raise CheckpointError(f"row {record['name']!r}: step {record['steps']} in {where.parent} cannot be read "
                              f"({type(e).__name__}); {FIX}") from None
    if state_digest(state) != digest:
        raise CheckpointError(f"row {record['name']!r}: step {record['steps']} in {where.parent} does not match the "
                              f"checksum saved with it (damaged since); {FIX}")
    return state
