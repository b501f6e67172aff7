"""A function as a key by what it computes with: its code and every value it reads.

`jax.jit` keeps a compiled program per static argument, found by the argument's hash and
equality. A Python function hashes by identity, so a metric that reads a global, a closure
cell or a default is served the program traced with the values it read the first time,
after they changed: a wrong number, silently. `Keyed(fn)` is equal to another only when
both run the same code on equal values: the defaults, the closure cells, the globals the code
names (and those of the plain functions it calls, recursively), a `functools.partial`'s
arguments, a dataclass's fields, arrays by their bytes. A module or a class of one's own
counts by the attributes the code reads of it (a class also by the special methods Python
calls unasked, and by what those read), wherever the code finds it: a global, a closure cell,
a default; the libraries' (`LIBRARIES`) by identity. A value it cannot compare (an object of
no known kind) makes the key equal to nothing else: that call compiles its own program.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import types

import jax
import numpy as np

# Functions and classes of these packages are read by identity: their globals are the packages' own.
LIBRARIES = ("jax", "jaxlib", "numpy", "flax", "optax", "builtins", "functools", "math", "operator",
             "dataclasses")


def _names(code: types.CodeType) -> set[str]:
    """Every global and attribute name `code` and the functions defined inside it may read."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def _name(value) -> str:
    return f"{getattr(value, '__module__', None) or type(value).__module__}." \
           f"{getattr(value, '__qualname__', None) or type(value).__qualname__}"


def fingerprint(value, _seen: dict | None = None, _names_read: frozenset | None = None):
    """A hashable stand-in for `value` that is equal for equal values (see the module's docstring).
    `_names_read`: the names the code holding `value` reads, by which a module or a class of one's
    own is keyed (None: no code is known, and only what Python calls unasked counts)."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, jax.core.Tracer):        # a value being traced has no bytes to compare
        return ("unique", object())
    jax_array = type(value).__module__.startswith(("jax", "jaxlib")) and hasattr(value, "dtype")
    if isinstance(value, (np.ndarray, np.generic)) or jax_array and hasattr(value, "shape"):
        array = np.asarray(value)
        sha = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        return ("array", array.dtype.str, array.shape, sha)
    held = isinstance(value, (types.ModuleType, type))       # read through its attributes
    if isinstance(value, types.ModuleType) and _library(value.__name__):
        return ("module", value.__name__)
    if isinstance(value, type) and _library(value.__module__):
        return ("library", _name(value), id(value))
    seen = {} if _seen is None else _seen
    # A module or class is read differently by each code that names it; anything else is one value.
    place = (id(value), _names_read) if held else id(value)
    if place in seen:                   # a cycle (a function that calls itself): its place
        return ("seen", seen[place])
    seen[place] = len(seen)
    at = lambda v, names=_names_read: fingerprint(v, seen, names)
    if isinstance(value, types.ModuleType):
        names = _names_read or frozenset()
        return ("module", value.__name__, _attributes(vars(value), names, names, at))
    if isinstance(value, type):
        return _own_class(value, _names_read, at)
    return _compound(value, at)


def _compound(value, at):
    """`fingerprint` of a container, a function, a partial, a method or a dataclass."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(at(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted((at(v) for v in value), key=repr)))
    if isinstance(value, dict):
        items = ((repr(k), at(v)) for k, v in value.items())
        return ("dict", tuple(sorted(items, key=lambda kv: kv[0])))
    if isinstance(value, functools.partial):
        names = _reads(value.func)
        return ("partial", at(value.func), at(value.args, names), at(value.keywords, names))
    if isinstance(value, types.MethodType):
        return ("method", at(value.__func__), at(value.__self__, _reads(value.__func__)))
    if isinstance(value, types.FunctionType):
        if _library(value.__module__):
            return ("library", _name(value), id(value))
        names = _reads(value)
        cells = tuple(at(c.cell_contents, names) for c in value.__closure__ or ())
        return ("function", value.__code__, at(value.__defaults__, names),
                at(value.__kwdefaults__, names), cells, _read(value, names, at))
    if callable(value) and _library(type(value).__module__):
        return ("library", _name(value), id(value))     # builtins, the libraries' callables
    if dataclasses.is_dataclass(value):
        fields = tuple((f.name, at(getattr(value, f.name))) for f in dataclasses.fields(value))
        return ("dataclass", at(type(value), None), fields)
    return ("unique", object())                   # nothing to compare by: equal to no other key


def _library(module: str | None) -> bool:
    return (module or "").split(".")[0] in LIBRARIES


def _reads(fn) -> frozenset | None:
    """The names a plain function's code reads; None for another callable."""
    return frozenset(_names(fn.__code__)) if isinstance(fn, types.FunctionType) else None


def _read(fn: types.FunctionType, names: frozenset, at) -> tuple:
    """The globals `fn`'s code names, each keyed by what the code reads of it (`settings.X`)."""
    glob = fn.__globals__
    return tuple((n, at(glob[n], names)) for n in sorted(names & set(glob)))


def _attributes(found: dict, wanted, names: frozenset, at) -> tuple:
    """(name, key) of the attributes in `found` (a module's or a class's own) that are `wanted`,
    each keyed by the `names` the code reading it reads."""
    return tuple((a, at(_unbound(found[a]), names)) for a in sorted(set(wanted) & set(found)))


def _unbound(raw):
    """What a class attribute runs or holds: a static or class method's function, a property's
    three; a slot's value is the instance's (keyed with it), so the slot is its name."""
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    if isinstance(raw, property):
        return (raw.fget, raw.fset, raw.fdel)
    if isinstance(raw, (types.MemberDescriptorType, types.GetSetDescriptorType)):
        return ("slot", raw.__name__)
    return raw


# Special methods that describe, compare, hash, copy or guard an object: they compute no value a
# program reads (a dataclass writes them, and `__hash__` may be a fingerprint's own).
BOOKKEEPING = {"__repr__", "__str__", "__format__", "__hash__", "__eq__", "__ne__", "__setattr__",
               "__delattr__", "__getstate__", "__setstate__", "__reduce__", "__reduce_ex__",
               "__copy__", "__deepcopy__", "__sizeof__", "__dir__", "__del__", "__init_subclass__",
               "__subclasshook__", "__class_getitem__"}


def _own_class(cls: type, names, at) -> tuple:
    """A class of one's own by what code reads of it: the attributes `names` names, the special
    methods Python calls unasked (__init__, __call__, the operators; not `BOOKKEEPING`), and what
    those read of it in turn; the library classes it derives from by name. Not by identity: a
    setting read from a class used as a namespace changes the key when it changes."""
    own, library = {}, []
    for c in reversed(cls.__mro__):
        if _library(c.__module__):
            library.append(_name(c))
        else:
            own.update(vars(c))
    read = set(names or ())
    wanted = {a for a, v in own.items() if a[:2] == a[-2:] == "__" and _runs(v)} - BOOKKEEPING
    keyed = set()
    while (wanted | (read & set(own))) - keyed:    # what the methods keyed read of it, in turn
        wanted |= read & set(own)
        for a in sorted(wanted - keyed):
            keyed.add(a)
            read |= {n for fn in _functions(_unbound(own[a])) for n in _names(fn.__code__)}
    return ("class", _name(cls), tuple(library), _attributes(own, keyed, frozenset(read), at))


def _runs(raw) -> bool:
    return isinstance(raw, (types.FunctionType, staticmethod, classmethod, property))


def _functions(value) -> list:
    return [f for f in (value if isinstance(value, tuple) else (value,))
            if isinstance(f, types.FunctionType)]


def digest(value) -> str:
    """A sha256 of `fingerprint(value)` that another process computes alike (code by its bytecode,
    constants and names, library callables by their names), to record what made a run. What the
    fingerprint cannot compare (an object of no known kind) enters by its type's name alone."""
    def stable(f):
        if isinstance(f, types.CodeType):
            return ("code", f.co_name, f.co_code.hex(), tuple(stable(c) for c in f.co_consts),
                    f.co_names)
        if isinstance(f, tuple) and f[:1] == ("library",):
            return f[:2]                    # its name, not where it sits in this process's memory
        if isinstance(f, tuple) and f[:1] == ("unique",):
            return "unique"
        if isinstance(f, tuple):
            return tuple(stable(x) for x in f)
        if isinstance(f, type):
            return f"{f.__module__}.{f.__qualname__}"
        return f
    return hashlib.sha256(repr(stable(fingerprint(value))).encode()).hexdigest()


class Keyed:
    """`fn` as a static argument: called as itself, equal to another `Keyed` only by
    `fingerprint`."""

    def __init__(self, fn):
        self.fn, self.key = fn, fingerprint(fn)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, Keyed) and self.key == other.key
