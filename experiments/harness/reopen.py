"""A finished row's record and checkpoint read back, changing nothing: reopening a model is a read.

A row's key is the hash of what made it (`key`: model, training config, seeds, task, preset),
its record is trusted only when its content hashes to the digest it carries (`digest`), and a
record is enough to remake its Engine and read its trained state (`restore_state`,
`load_model`).

The library's `Checkpoints` is made for resuming a run: a step it cannot vouch for (saved by
another run, a checksum that does not match) is moved aside so training can save it again, and a
folder whose run.json is damaged starts afresh. Reopening a finished row must never move or delete
anything, so here each of those is refused in one line naming the mismatch and the fix (train the
row again), before orbax reads a byte, and the state is read straight from its step's folder.
"""
from __future__ import annotations

import functools
import hashlib
import json
import pathlib

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import CheckpointError
from attention_jax.speed import Speed

FIX = "rerun its table with --fresh to train it again"
ITEM = "default"      # the one item of each step's folder, as `Checkpoints` saves it (orbax's name for it)
# How attention was computed, once ModelConfig fields and now the speed swap's (Speed): written
# into the key where it was, under the names it had.
SPEED_FIELDS = {"attention": "form", "attention_chunk": "chunk", "matmul_dtype": "matmul_dtype",
                "dense": "dense"}


def hashed(blob) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def key(name: str, model: dict, train: dict, seeds, task: dict | None, preset: str) -> str:
    """<name>-<12 hex>: a row's key, the hash of its model and training config as its record spells
    them, its seeds, its task (when not the default corpus's) and the preset."""
    blob = {"model": model, "train": train, "seeds": [int(s) for s in seeds],
            **({"task": dict(task)} if task else {}), "preset": preset}
    return f"{name}-{hashed(blob)[:12]}"


def digest(record: dict) -> str:
    """sha256 of a record's content: a figure changed inside still-valid JSON is caught on
    reading."""
    return hashed({k: v for k, v in record.items() if k not in ("cached", "digest")})


def unspelled(config: dict) -> tuple[ModelConfig, Speed]:
    """A record's config as the ModelConfig and Speed that trained it (`rows.spelled`'s inverse)."""
    fields = {k: v for k, v in config.items() if k not in SPEED_FIELDS}
    speed = {f: config[k] for k, f in SPEED_FIELDS.items() if k in config}
    return ModelConfig(**fields), Speed(**speed)


@functools.cache
def programs():
    """The compiled programs every row of this process shares (an
    `attention_jax.train.ProgramCache`): a row reopened after training, or trained again by
    another table of one run, traces and compiles nothing anew."""
    from attention_jax.train import ProgramCache   # imports JAX: only when a row trains or reopens
    return ProgramCache()


def engine(record: dict):
    """The Engine that trained a finished row, remade from its record."""
    from attention_jax.train import Engine   # imports JAX: only when a row trains or reopens
    model_config, speed = unspelled(record["config"])
    return Engine(model_config, TrainConfig(**record["train_config"]), n_seeds=len(record["seeds"]),
                  speed=speed, programs=programs())


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


def restore_state(record: dict, folder) -> tuple:
    """(engine, state) of a finished row, from the checkpoint its training left in `folder`. A
    read: a checkpoint that does not match the record is refused in one line, and nothing is
    moved."""
    made = engine(record)
    workdir = pathlib.Path(folder) / "runs" / record["key"]
    state = restore(record, workdir, made.abstract_state(record["seeds"]))
    return made, made.replicate(state)


def load_model(record: dict, folder, *, seed: int | None = None):
    """A finished row's trained model (an NNX `LanguageModel`) for `seed` (by default its
    first), reopened from its checkpoint in `folder` (a Result's `folder`, or a table's)."""
    seeds = record["seeds"]
    if seed is not None and seed not in seeds:
        held = ", ".join(map(str, seeds))
        raise CheckpointError(f"row {record['name']!r} was trained with seed(s) {held}, not seed "
                              f"{seed}; choose one of those")
    made, state = restore_state(record, folder)
    return made.model(state, seeds.index(seeds[0] if seed is None else seed))
