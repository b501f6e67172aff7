"""Faster forms of the model's numbers, applied as a swap: `fast(model)` or `with fast(model): ...`.

`swap`: `fast` (put the forms in, and back out) and the twins it puts in; `options`: `Speed`,
which forms, and `dtype_for`, the compute dtype a backend trains fastest in; `forms`:
attention's faster forms; `chunked`: the online-softmax attention in O(T) memory; `dense`: the
dense layer with a hand-written backward; `backend`: which devices a program is built for, the
one input of every choice that differs by backend. The model as built (`attention_jax.model`)
is the reference all of them are tested against. The names below load on first use, so a
`Speed` can be made before JAX is imported.
"""
import importlib

_EXPORTS = {"Speed": "options", "FORMS": "options", "dtype_for": "options", "fast": "swap",
            "FastAttention": "swap", "FastDense": "swap", "Swapped": "swap", "forms_of": "swap",
            "Backend": "backend", "backend_of": "backend"}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attention_jax.speed' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"attention_jax.speed.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
