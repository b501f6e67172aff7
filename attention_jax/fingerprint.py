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

import jax
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


def _name(value) -> str:
    return f"{getattr(value, '__module__', None) or type(value).__module__}." \
           f"{getattr(value, '__qualname__', None) or type(value).__qualname__}"


def fingerprint(value, _seen: dict | None = None):
    """A hashable stand-in for `value` that is equal for equal values (see the module's docstring)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, jax.core.Tracer):        # a value being traced has no bytes to compare
        return ("unique", object())
    if isinstance(value, (np.ndarray, np.generic)) or type(value).__module__.startswith(("jax", "jaxlib")) and \
            hasattr(value, "dtype") and hasattr(value, "shape"):
        array = np.asarray(value)
        return ("array", array.dtype.str, array.shape, hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest())
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    seen = {} if _seen is None else _seen
    if id(value) in seen:                         # a cycle (a function that calls itself): its place
        return ("seen", seen[id(value)])
    seen[id(value)] = len(seen)
    at = lambda v: fingerprint(v, seen)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(at(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((repr(k), at(v)) for k, v in value.items()), key=lambda kv: kv[0])))
    if isinstance(value, functools.partial):
        return ("partial", at(value.func), at(value.args), at(value.keywords))
    if isinstance(value, types.MethodType):
        return ("method", at(value.__func__), at(value.__self__))
    if isinstance(value, types.FunctionType):
        if _library(value.__module__):
            return ("library", _name(value), id(value))
        return ("function", value.__code__, at(value.__defaults__), at(value.__kwdefaults__),
                tuple(at(c.cell_contents) for c in value.__closure__ or ()), _read(value, at))
    if isinstance(value, type) or callable(value) and _library(type(value).__module__):
        return ("library", _name(value), id(value))     # classes, builtins, the libraries' callables
    if dataclasses.is_dataclass(value):
        return ("dataclass", type(value), tuple((f.name, at(getattr(value, f.name)))
                                                for f in dataclasses.fields(value)))
    return ("unique", object())                   # nothing to compare by: equal to no other key


def _library(module: str | None) -> bool:
    return (module or "").split(".")[0] in LIBRARIES


def _read(fn: types.FunctionType, at) -> tuple:
    """The globals `fn`'s code names, and of a module of one's own among them (`settings.ANSWER`) the
    attributes the code names."""
    names, glob = _names(fn.__code__), fn.__globals__
    read = []
    for n in sorted(names & set(glob)):
        value = glob[n]
        read.append((n, at(value)))
        if isinstance(value, types.ModuleType) and not _library(value.__name__):
            read.append((n, tuple((a, at(getattr(value, a))) for a in sorted(names) if hasattr(value, a))))
    return tuple(read)


def digest(value) -> str:
    """A sha256 of `fingerprint(value)` that another process computes alike (code by its bytecode,
    constants and names, library callables by their names), to record what made a run. What the
    fingerprint cannot compare (an object of no known kind) enters by its type's name alone."""
    def stable(f):
        if isinstance(f, types.CodeType):
            return ("code", f.co_name, f.co_code.hex(), tuple(stable(c) for c in f.co_consts), f.co_names)
        if isinstance(f, tuple) and f[:1] == ("library",):
            return f[:2]                              # its name, not where it sits in this process's memory
        if isinstance(f, tuple) and f[:1] == ("unique",):
            return "unique"
        if isinstance(f, tuple):
            return tuple(stable(x) for x in f)
        if isinstance(f, type):
            return f"{f.__module__}.{f.__qualname__}"
        return f
    return hashlib.sha256(repr(stable(fingerprint(value))).encode()).hexdigest()


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
