"""Which faster forms `speed.fast` swaps into a model: one frozen `Speed`, checked when made.

Nothing here imports JAX until a form is chosen for a backend, so a program can turn its
settings into a `Speed` first.
"""
from __future__ import annotations

import dataclasses

from attention_jax.errors import ConfigError

FORMS = ("auto", "reference", "causal_halves", "chunked", "fused")
MATMUL_DTYPES = (None, "bfloat16")


@dataclasses.dataclass(frozen=True)
class Speed:
    """Which faster forms `fast` swaps in. `form`: how attention is computed ("auto": causal_halves
    on a CPU, fused on a GPU/TPU; "reference": as built); `chunk`: the chunked form's block of keys
    and queries; `dense`: the projections' hand-written backward; `matmul_dtype`: "bfloat16" rounds
    the projections' product inputs alone (a float32 model on a CPU's or GPU's bfloat16 units)."""
    form: str = "auto"
    chunk: int = 512
    dense: bool = True
    matmul_dtype: str | None = None

    def __post_init__(self):
        if self.form not in FORMS:
            raise ConfigError(f"Speed(form={self.form!r}); choose one of {', '.join(FORMS)}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ConfigError(f"Speed(chunk={self.chunk!r}) must be a positive whole number of "
                              "positions")
        if not isinstance(self.dense, bool):
            raise ConfigError(f"Speed(dense={self.dense!r}) must be True or False")
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ConfigError(f"Speed(matmul_dtype={self.matmul_dtype!r}); choose None or "
                              "'bfloat16'")
        if self.matmul_dtype and not self.dense:
            raise ConfigError("Speed(matmul_dtype='bfloat16') rounds the products of the "
                              "hand-written dense layer; it needs dense=True")

    def form_for(self, config, backend=None) -> str:
        """The form a model of `config` computes attention by on `backend` (`speed.backend_of`: a
        name, devices, a `Backend`; None: the default devices), refusing one it cannot take."""
        from attention_jax.speed import forms
        chosen = forms.choose(self.form, dropout=config.dropout, backend=backend)
        if chosen == "chunked" and config.positions == "alibi":
            raise ConfigError("form='chunked' adds no bias to its scores, so it cannot compute "
                              "positions='alibi'; use 'reference', 'causal_halves' or 'fused'")
        if chosen in ("chunked", "fused") and config.dropout > 0:
            raise ConfigError(f"form={chosen!r} has no dropout on its weights; use 'reference' or "
                              "'causal_halves' for dropout > 0")
        return chosen

    def describe(self, config, backend=None, *, decoding: bool = False) -> str:
        """What computes a config's attention on `backend`, in words: "causal_halves", "fused
        (cuDNN)", "fused (XLA)" off a CUDA GPU, and on one "fused (XLA's kernel; ...)" with the
        reason it is not cuDNN's (the model's dtype or head size, the GPU's capability, or cuDNN
        refusing the call, asked of JAX at the config's training shape); "none (...)" for a model
        without heads. `decoding`: what decoding with the key/value cache runs instead, whatever
        the form: the reference (training and `generate(..., cache=False)` run the form)."""
        from attention_jax.speed import forms
        from attention_jax.speed.backend import backend_of
        b = backend_of(backend)
        chosen = self.form_for(config, b)
        if config.heads_used == 0:
            return f"none (mixer={config.mixer!r} has no attention)"
        if decoding:      # `FastAttention` hands a call with a mask in to the attention as built
            return "reference (a query reads the slots its row has written: a mask no form takes)"
        if chosen == "chunked":
            return f"chunked ({self.chunk} positions a chunk)"
        if chosen != "fused":
            return chosen
        kernel, why = forms.kernel_choice(config.dtype, config.d_head_used, b)
        if kernel == "cudnn":
            why = forms.cudnn_refusal(config.dtype, config.heads_used, config.context,
                                      config.d_head_used, config.positions == "alibi")
            why = why and f"cuDNN refused: {why}"
        if why:
            return f"fused (XLA's kernel; {why})"
        return f"fused ({'cuDNN' if kernel == 'cudnn' else 'XLA'})"


def dtype_for(backend=None) -> tuple[str, str]:
    """The compute dtype (`ModelConfig.dtype`) a model trains fastest in on `backend`
    (`backend_of`'s; None: the default devices), and why, in words: bfloat16 on a TPU and on an
    NVIDIA GPU of compute capability 8.0 or more (or not known); float16 below 8.0, whose tensor
    cores take no bfloat16 (a T4: 7.5), with a loss scale; float32 on a CPU or an AMD GPU."""
    from attention_jax.speed.backend import backend_of
    b = backend_of(backend)
    if b.platform == "tpu":
        return "bfloat16", "a TPU's matrix units multiply bfloat16: float32's range, no loss scale"
    if b.platform == "cuda" and b.capability is not None and b.capability < 8.0:
        return "float16", ("tensor cores for float16 and none for bfloat16 below compute "
                           "capability 8.0; trained with a dynamic loss scale")
    if b.platform == "cuda":
        return "bfloat16", ("bfloat16 tensor cores from compute capability 8.0: float32's range, "
                            "no loss scale")
    if b.platform == "rocm":
        return "float32", "an AMD GPU: no half-precision step measured on one"
    return "float32", ("a CPU: a half-precision model is no faster; bfloat16 products alone are, "
                       "with bfloat16 units (Speed(matmul_dtype='bfloat16'))")
