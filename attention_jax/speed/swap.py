"""Speed as a swap: the model as built is the equation, and `fast` puts faster forms of the same numbers in.

    with fast(model):                       # attention by this backend's fastest form, the dense
        logits = model(tokens)              # layers with their hand-written backward
    handle = fast(model, form="chunked")    # or in place, until handle.undo()

Two parts are swapped, by the project's own select/replace (`attention_jax.inspect`), each
for a twin holding the very same parameters and sub-modules, so the model's state, its
paths and its optimizer are untouched: every `DotProductAttention` for a `FastAttention`
computing one of `speed.forms`, and every `Dense` for a `FastDense` whose product has a
hand-written backward (`speed.dense`), optionally on bfloat16 inputs. The numbers agree with
the model as built to float rounding (tests compare every form, forward and gradients); the
hook points on scores and weights exist only in the model as built, which is what inspection
reads. The training engine and `generate` apply `Speed()` unless told `speed=None`.
"""
from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from attention_jax import functional as F
from attention_jax.layers import Bidirectional, CausalMask, Dense, Hook
from attention_jax.model import DotProductAttention
from attention_jax.speed import dense as dense_kernel
from attention_jax.speed import forms
from attention_jax.speed.backend import backend_of
from attention_jax.speed.options import FORMS, Speed  # noqa: F401  (FORMS: the names `Speed` takes)


class FastAttention(DotProductAttention):
    """A `DotProductAttention` computed by one of `speed.forms`: the same mask and dropout modules,
    no hook points (the scores and weights are never held). A mask passed in (decoding) or a mask
    module of one's own is applied by the equation itself."""

    def __init__(self, attention: DotProductAttention, form: str, chunk: int, backend=None):
        self.scale, self.dropout, self.mask = attention.scale, attention.dropout, attention.mask
        self.form, self.chunk, self.backend = form, chunk, backend_of(backend)

    def __call__(self, q, k, v, *, bias=None, mask=None):
        if mask is not None or type(self.mask) not in (CausalMask, Bidirectional):
            mask = self.mask(q.shape[-2]) if mask is None else mask
            w = F.attention_weights(q, k, mask=mask, bias=bias, scale=self.scale)
            return F.mix(w if self.dropout is None else self.dropout(w), v)
        attend = forms.FORMS[self.form]
        options = {"chunk": self.chunk} if self.form == "chunked" else {"backend": self.backend} \
            if self.form == "fused" else {}
        with jax.named_scope(f"attention_{self.form}"):    # the cross-lowering tests read which form ran
            return attend(q, k, v, bias=bias, causal=self.mask.causal, scale=self.scale, dropout=self.dropout,
                          **options)


class FastDense(Dense):
    """A `Dense` whose product has the hand-written backward, its inputs optionally rounded to
    `matmul_dtype`: the same parameters."""

    def __init__(self, layer: Dense, matmul_dtype: str | None = None, backend=None):
        self.kernel, self.bias, self.dtype = layer.kernel, layer.bias, layer.dtype
        self.matmul_dtype, self.backend = matmul_dtype, backend_of(backend)

    def __call__(self, x):
        x, kernel, bias = self.operands(x)
        return dense_kernel.dense(F.floating(x), F.floating(kernel), None if bias is None else F.floating(bias),
                                  operands=self.matmul_dtype, backend=self.backend)


class Swapped:
    """What `fast` did to a model: undone by `undo()`, or on leaving a `with` block."""

    def __init__(self, model, parts: dict):
        from attention_jax.inspect import swap
        self.model, self.parts, self._undo = model, parts, swap(model, parts)

    def undo(self) -> None:
        self._undo()

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        self.undo()


def fast(model, speed: Speed | None = None, *, backend=None, **options) -> Swapped:
    """Swap faster forms into `model`, in place (a `with` block, or `.undo()`, puts the model as built
    back). `speed` (default `Speed()`) or its fields as keywords say which: `fast(model, form="chunked")`.
    `backend`: the devices the program is built for (`speed.backend_of`: a name, devices, a mesh;
    None: this process's default devices), read now, not when the model is traced."""
    speed = dataclasses.replace(speed or Speed(), **options) if options else (speed or Speed())
    return Swapped(model, parts(model, speed, backend))


def parts(model, speed: Speed, backend=None) -> dict:
    """path -> twin for every part `speed` swaps in `model` on `backend` (parts already swapped stay as
    they are)."""
    backend = backend_of(backend)
    config = getattr(model, "config", None)
    form = speed.form_for(config, backend) if config is not None else forms.choose(speed.form, backend=backend)
    swaps = {}
    for path, m in nnx.iter_modules(model):
        name = ".".join(map(str, path))
        if type(m) is DotProductAttention and form != "reference" and type(m.hook_scores) is Hook and \
                type(m.hook_weights) is Hook:    # scores or weights patched or recorded: the equation computes them
            swaps[name] = FastAttention(m, form, speed.chunk, backend)
        elif type(m) is Dense and speed.dense:
            swaps[name] = FastDense(m, speed.matmul_dtype, backend)
    return swaps


def forms_of(model) -> dict[str, str]:
    """How each attention of `model` computes now, by path: {"blocks.0.mixer.attention": "reference"}."""
    return {".".join(map(str, p)): getattr(m, "form", "reference") for p, m in nnx.iter_modules(model)
            if isinstance(m, DotProductAttention)}
