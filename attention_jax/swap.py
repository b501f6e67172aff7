"""Select a part of a model by its path and swap it for another, putting it back after: penzai's
select/replace, the one mechanism beneath inspection (`inspect`: hooks that record or patch,
ablations), speed (`speed`: faster forms of the same numbers) and decoding (`kv_cache`: the
key/value cache). It knows nothing of any of them.

    undo = swap(model, {"blocks.0.mixer": None})       # a sub-layer removed (the block skips it)
    undo()                                             # and put back
    with replaced(model, {"blocks.0.mixer.attention.mask": Bidirectional()}): ...

Speed and decoding each say in one table which twin replaces which part (`speed.swap.TWINS`,
`decoding.layout.TWINS`, `kv_cache.TWINS`); `twins` reads a table against a model.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Mapping

from flax import nnx

from attention_jax.errors import ConfigError


def _path(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def select(model, path: str):
    """The part of `model` at a dotted path such as "blocks.1.mixer"."""
    node = model
    for part in _path(path):
        try:
            node = node[part] if isinstance(part, int) else getattr(node, part)
        except (AttributeError, IndexError, TypeError):
            raise ConfigError(f"the model has no part {path!r}") from None
    return node


def swap(model, parts: Mapping[str, object]) -> Callable[[], None]:
    """Put the parts at the given paths in place of those there (None removes a sub-layer), in
    order; the function returned puts the old ones back, in reverse (so a path through a part
    swapped earlier is undone first). A path that does not exist undoes what was done and raises."""
    swapped = []   # (parent, attribute, the part before)

    def undo():
        while swapped:
            owner, last, old = swapped.pop()
            setattr(owner, last, old)
    try:
        for path, new in parts.items():
            *parent, last = path.split(".")
            owner = select(model, ".".join(parent)) if parent else model
            old = select(model, path)
            swapped.append((owner, last, old))
            setattr(owner, last, new)
    except BaseException:
        undo()
        raise
    return undo


def twins(model, table: Mapping[type, Callable | None], **how) -> dict:
    """path -> twin for every part of `model` that `table` names: the entry of the part's own
    class, or else of the nearest class it derives from, is called as `entry(part, path, **how)`
    and gives the twin, or None to keep the part (an entry of None keeps every part of that class).
    The part a twin holds as built (its `reference`) is the twin's to call, and is
    not looked into."""
    parts = {}
    for path, part in nnx.iter_modules(model):
        if "reference" in path:
            continue
        entry = next((table[c] for c in type(part).__mro__ if c in table), None)
        name = ".".join(map(str, path))
        twin = None if entry is None else entry(part, name, **how)
        if twin is not None:
            parts[name] = twin
    return parts


@contextlib.contextmanager
def replaced(model, parts: Mapping[str, object]):
    """Swap the parts at the given paths for others (None removes a sub-layer); put them back on
    exit, even when the body raises."""
    undo = swap(model, parts)
    try:
        yield model
    finally:
        undo()


class Swapped:
    """What a swap of twins did to a model (`speed.fast`, `kv_cache.cached`): `undo()`, or leaving a
    `with` block, puts the parts as built back."""

    def __init__(self, model, parts: Mapping[str, object]):
        self.model, self.parts, self._undo = model, dict(parts), swap(model, parts)

    def undo(self) -> None:
        self._undo()

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.undo()
