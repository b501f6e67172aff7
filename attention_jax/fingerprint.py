"""A function as a key by what it computes with: its code and every value it reads.

`jax.jit` keeps a compiled program per static argument, found by the argument's hash and
equality. A Python function hashes by identity, so a metric that reads a global, a closure
cell or a default is served the program traced with the values it read the first time,
after they changed: a wrong number, silently. `Keyed(fn)` is equal to another only when
both run the same code on equal values: the defaults, the closure cells, the globals the code
names (and those of the plain functions it calls, recursively), a `functools.partial`'s
arguments, a dataclass's fields, arrays by their bytes. A value it cannot compare (an object
of no known kind) makes the key equal to nothing else: that call compiles its own program.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import types

import numpy as np

# Functions of these packages are read by identity: their globals are the packages' own state.
LIBRARIES = ("jax", "jaxlib", "numpy", "flax", "optax", "builtins", "functools", "math", "operator")


def _names(code: types.CodeType) -> set[str]:
    """Every global name `code` and the functions defined inside it may read."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def fingerprint(value, _seen: dict | None = None):
    """A hashable stand-in for `value` that is equal for equal values (see the module's docstring)."""
    seen = {} if _seen is None else _seen
    if id(value) in seen:                         # a cycle (a function that calls itself): its place
        return ("seen", seen[id(value)])
    seen[id(value)] = len(seen)
    at = lambda v: fingerprint(v, seen)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(at(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), at(v)) for k, v in value.items()), key=lambda kv: kv[0])))
    if isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.startswith(("jax", "jaxlib")) and \
            hasattr(value, "dtype") and hasattr(value, "shape"):
        array = np.asarray(value)
        return ("array", array.dtype.str, array.shape, hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest())
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, functools.partial):
        return ("partial", at(value.func), at(value.args), at(value.keywords))
    if isinstance(value, types.MethodType):
        return ("method", at(value.__func__), at(value.__self__))
    if isinstance(value, types.FunctionType):
        if (value.__module__ or "").split(".")[0] in LIBRARIES:
            return ("function", id(value))
        code, glob = value.__code__, value.__globals__
        cells = tuple(at(c.cell_contents) if c.cell_contents is not value else ("self",)
                      for c in value.__closure__ or ())
        names = tuple((n, at(glob[n])) for n in sorted(_names(code)) if n in glob)
        return ("function", code, at(value.__defaults__), at(value.__kwdefaults__), cells, names)
    if isinstance(value, type) or callable(value) and type(value).__module__.split(".")[0] in LIBRARIES:
        return ("identity", id(value))            # classes, builtins, the libraries' callables
    if dataclasses.is_dataclass(value):
        return ("dataclass", type(value), tuple((f.name, at(getattr(value, f.name)))
                                                for f in dataclasses.fields(value)))
    return ("unique", object())                   # nothing to compare by: equal to no other key


class Keyed:
    """`fn` as a static argument: called as itself, equal to another `Keyed` only by `fingerprint`."""

    def __init__(self, fn):
        self.fn, self.key = fn, fingerprint(fn)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, Keyed) and self.key == other.key
