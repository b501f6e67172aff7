"""Speed as a swap: the model as built is the equation; `fast` puts in faster forms of its numbers.

    with fast(model):                       # attention by this backend's fastest form, the dense
        logits = model(tokens)              # layers with their hand-written backward
    handle = fast(model, form="chunked")    # or in place, until handle.undo()

Two parts are swapped, by the project's own select/replace (`attention_jax.swap`), each
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
from attention_jax.swap import Swapped, twins


class FastAttention(nnx.Module):
    """A `DotProductAttention` computed by one of `speed.forms`, with the attention as built held as
    its `reference`: its scale, mask and dropout are the twin's, and it computes what no form takes
    (a mask passed in, as decoding passes one, or a mask module of one's own). The scores and
    weights are never held, so the reference's hook points on them are not the model's while the
    twin is in."""

    def __init__(self, attention: DotProductAttention, form: str, chunk: int, backend=None):
        self.reference = attention
        self.form, self.chunk, self.backend = form, chunk, backend_of(backend)

    @property
    def mask(self):
        return self.reference.mask

    def __call__(self, q, k, v, *, bias=None, mask=None):
        ref = self.reference
        if mask is not None or type(ref.mask) not in (CausalMask, Bidirectional):
            return ref(q, k, v, bias=bias, mask=mask)
        attend = forms.FORMS[self.form]
        options = {"chunk": self.chunk} if self.form == "chunked" else {"backend": self.backend} \
            if self.form == "fused" else {}
        with jax.named_scope(f"attention_{self.form}"):    # the cross-lowering tests read it
            return attend(q, k, v, bias=bias, causal=ref.mask.causal, scale=ref.scale,
                          dropout=ref.dropout, **options)


class FastDense(Dense):
    """A `Dense` whose product has the hand-written backward, its inputs optionally rounded to
    `matmul_dtype`: the same parameters."""

    def __init__(self, layer: Dense, matmul_dtype: str | None = None, backend=None):
        self.kernel, self.bias, self.dtype = layer.kernel, layer.bias, layer.dtype
        self.matmul_dtype, self.backend = matmul_dtype, backend_of(backend)

    def __call__(self, x):
        x, kernel, bias = self.operands(x)
        bias = None if bias is None else F.floating(bias)
        return dense_kernel.dense(F.floating(x), F.floating(kernel), bias,
                                  operands=self.matmul_dtype, backend=self.backend)


def fast(model, speed: Speed | None = None, *, backend=None, **options) -> Swapped:
    """Swap faster forms into `model`, in place (a `with` block, or `.undo()`, puts the model as
    built back). `speed` (default `Speed()`) or its fields as keywords say which:
    `fast(model, form="chunked")`. `backend`: the devices the program is built for
    (`speed.backend_of`: a name, devices, a mesh; None: this process's default devices), read now,
    not when the model is traced."""
    speed = dataclasses.replace(speed or Speed(), **options) if options else (speed or Speed())
    return Swapped(model, parts(model, speed, backend))


def _attention(attention: DotProductAttention, path: str, *, form: str, speed: Speed, backend):
    hooked = type(attention.hook_scores) is not Hook or type(attention.hook_weights) is not Hook
    if form == "reference" or hooked:
        return None           # scores or weights patched or recorded: the equation computes them
    return FastAttention(attention, form, speed.chunk, backend)


def _dense(layer: Dense, path: str, *, speed: Speed, backend, **_):
    return FastDense(layer, speed.matmul_dtype, backend) if speed.dense else None


# Which twin replaces which part (`attention_jax.swap.twins`); a part swapped already is kept.
TWINS = {DotProductAttention: _attention, Dense: _dense, FastDense: None}


def parts(model, speed: Speed, backend=None) -> dict:
    """path -> twin for every part `speed` swaps in `model` on `backend` (parts already swapped stay
    as they are)."""
    backend = backend_of(backend)
    config = getattr(model, "config", None)
    form = speed.form_for(config, backend) if config is not None else \
        forms.choose(speed.form, backend=backend)
    return twins(model, TWINS, form=form, speed=speed, backend=backend)


def forms_of(model) -> dict[str, str]:
    """How each attention of `model` computes now, by path: {"blocks.0.mixer.attention":
    "reference"}."""
    return {".".join(map(str, p)): getattr(m, "form", "reference")
            for p, m in nnx.iter_modules(model)
            if isinstance(m, (DotProductAttention, FastAttention)) and "reference" not in p}
