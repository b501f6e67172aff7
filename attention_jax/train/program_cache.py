"""Compiled programs shared between Engines: a second Engine of a configuration already built traces
and compiles nothing. Held, and dropped, by its caller (`Engine(..., programs=cache)`); nothing here
is global.
"""
from __future__ import annotations

import collections
from typing import Callable


class ProgramCache:
    """Compiled programs shared by the Engines built with this cache
    (`Engine(..., programs=cache)`): a second Engine of a configuration already built traces and
    compiles nothing. The key (`Engine.program_key`) is everything the programs compute with (model
    config, the optimizer's fields, seed count, loss, metrics, devices, speed, backend); the
    `maxsize` most recently used are kept. Like any `jax.jit` function they keep what they traced:
    after editing the library's code in a running session, `clear()` (or a new cache)."""

    def __init__(self, maxsize: int = 32):
        self.maxsize, self._kept = maxsize, collections.OrderedDict()

    def get(self, key, compile: Callable[[], tuple]) -> tuple:
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        compiled = self._kept[key] = compile()
        while len(self._kept) > self.maxsize:
            self._kept.popitem(last=False)
        return compiled

    def clear(self) -> None:
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)
