"""Activation and attribution patching: which activations carry what a clean run has and a
corrupted one lacks.

    metric = normalized_logit_diff(model, clean, corrupted,
                                   answer, wrong)   # clean 1, corrupted 0 (`metrics`)
    sweep = activation_patch(model, clean, corrupted, metric, hook="resid_pre", by="position",
                             into="corrupted")
    sweep.values                               # [layer, position]: the metric with that one patched
    approx = attribution_patch(model, clean, corrupted, metric, hook="z", by="head",
                               into="corrupted")

Every call says which run is patched, `into`: "corrupted" runs the corrupted text with one
activation (a hook point of one block, at one position or head) taken from the clean run (what
restores the behaviour: TransformerLens' `get_act_patch_*`); "clean" runs the clean text with
one corrupted activation (what breaks it: the direction of edge patching, `analysis.discovery`).
There is no default, so no call reads as the other direction. Attribution patching estimates
every patch at once from one forward and one backward pass, as the metric's gradient times the
activation's change (Nanda 2023, attribution patching).

A sweep is one compiled program: the patches are an index, vmapped `batch_size` at a time,
so the model runs once per index inside it, not a Python loop of forwards; the program is
called once per batch, so a Ctrl-C is answered between them. Hook points are the model's own
(`inspect.hook_names`), read and patched by the model as built; `hook` names a kind, and `by`
the axes the sweep runs over.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.analysis.inspect import deterministic, patched, run_with_cache
from attention_jax.analysis.metrics import (  # noqa: F401  (the metrics: part of patching's API,
                                              # as before)
    check_answers, kl_divergence, logit_diff, logit_diffs, normalized_logit_diff, squared_error)
from attention_jax.errors import ConfigError
from attention_jax.fingerprint import Keyed
from attention_jax.layers import check_ids

# hook kind -> (its name in block i, the axes of its value after the batch's)
HOOKS = {**{k: (f"blocks.{{i}}.{k}", ("position", "d_model"))
            for k in ("resid_pre", "mixer_in", "mixer_out", "resid_mid", "ffn_in", "ffn_out",
                      "resid_post")},
         **{k: (f"blocks.{{i}}.mixer.{k}", ("head", "position", "d_head"))
            for k in ("q", "k", "v", "z")},
         "weights": ("blocks.{i}.mixer.attention.weights", ("head", "position", "key"))}
BY = {"position": ("position",), "head": ("head",), "head_position": ("head", "position")}


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A patching result: `values` over `axes` (layer first), for `hook`; `np.asarray(sweep)`
    is the array."""
    values: np.ndarray
    axes: tuple[str, ...]
    hook: str
    method: str = "activation"
    labels: tuple[str, ...] | None = None     # names along the first axis, where it is
                                              # not a number (components)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)

    def max(self) -> tuple[float, dict]:
        """The largest value and where it is, by axis name: (0.93, {"layer": 1, "head": 4})."""
        at = np.unravel_index(int(np.argmax(self.values)), self.values.shape)
        return float(self.values[at]), dict(zip(self.axes, map(int, at)))


def token_pair(model, clean, corrupted) -> tuple[np.ndarray, np.ndarray]:
    """Clean and corrupted token ids as arrays, [B, T] of one shape and in the model's vocabulary
    (inside a compiled sweep an id past it would be clamped), or one line why not."""
    try:
        clean, corrupted = (np.asarray(t) for t in (clean, corrupted))
    except ValueError:
        raise ConfigError("clean and corrupted tokens must be [B, T] of one shape: texts of "
                          "unequal lengths make no array; pad them to one length or "
                          "patch them apart") from None
    if clean.shape != corrupted.shape or clean.ndim != 2 or 0 in clean.shape:
        raise ConfigError(f"clean and corrupted tokens must be [B, T] of one shape, neither empty, "
                          f"got {clean.shape} and {corrupted.shape}")
    for tokens in (clean, corrupted):
        check_ids(tokens, model.config.vocab_size)
    return clean, corrupted


def _plan(model, clean, corrupted, hook: str, by: str, into: str):
    """(target tokens, source tokens, hook names per block, grid sizes) for a sweep, or one
    line why not."""
    if hook not in HOOKS:
        raise ConfigError(f"hook={hook!r}; choose one of {', '.join(HOOKS)}")
    axes = HOOKS[hook][1]
    if by not in BY or not set(BY[by]) <= set(axes):
        fits = [b for b, need in BY.items() if set(need) <= set(axes)]
        raise ConfigError(f"by={by!r} does not fit hook={hook!r} (its axes: {', '.join(axes)}); "
                          f"choose {' or '.join(map(repr, fits))}")
    if into not in ("corrupted", "clean"):
        raise ConfigError(f"into={into!r}: say which run is patched, into='corrupted' (clean "
                          "activations into the corrupted run: what restores it) or into='clean' "
                          "(corrupted into clean: what breaks it, the direction of edge patching)")
    clean, corrupted = token_pair(model, clean, corrupted)
    cfg = model.config
    if axes[0] == "head" and cfg.heads_used == 0:
        raise ConfigError(f"hook={hook!r} is a head's, and this model's mixer "
                          f"({cfg.mixer!r}) has no heads")
    names = [HOOKS[hook][0].format(i=i) for i in range(cfg.n_layers)]
    sizes = {"layer": cfg.n_layers, "head": cfg.heads_used, "position": clean.shape[1]}
    target, source = (corrupted, clean) if into == "corrupted" else (clean, corrupted)
    return (jnp.asarray(target), jnp.asarray(source), names,
            (cfg.n_layers, *[sizes[a] for a in BY[by]]))


_NOT_ONE = ("metric returns {}, not one number: reduce it over the batch (e.g. a mean) so each "
            "patch gets a value")


def check_metric(metric, logits_shape=None) -> Keyed:
    """A metric the sweep can compile, keyed by what it computes with (`fingerprint.Keyed`: a metric
    that reads a global is not served the program of the global's old value); given the logits'
    shape, checked to give one number from them."""
    if not callable(metric):
        raise ConfigError(f"metric {type(metric).__name__} is not callable: pass a function of the "
                          "logits [B, T, V] that returns one number")
    if logits_shape is not None:
        out = jax.eval_shape(metric, jax.ShapeDtypeStruct(logits_shape, jnp.float32))
        if getattr(out, "shape", None) != ():
            raise ConfigError(_NOT_ONE.format(getattr(out, "shape", type(out).__name__)))
    return Keyed(metric)


MEMORY = 1 << 30     # bytes of activations the default batch of side-by-side patched
                     # forwards may hold


def side_by_side(config, shape) -> int:
    """How many patched forwards of `shape` ([B, T] tokens) fit in `MEMORY`: each holds, in float32,
    every block's residual stream, projections, feed-forward and [H, T, T] scores,
    and the logits."""
    B, T = shape
    per_block = 8 * config.d_model + 2 * config.d_ff * config.feed_forward \
        + 3 * config.heads_used * T
    one = 4 * B * T * (config.n_layers * per_block + 2 * config.output_size_used)
    return max(1, MEMORY // one)


def map_batches(run, items: np.ndarray, batch_size: int | None, default: int) -> np.ndarray:
    """`run` over `items` [N, ...], `batch_size` (checked; None: `default`, at most N) at a time,
    the results concatenated. The last batch is filled up with copies of its final item, so every
    call has one shape (one compiled program); between calls a Ctrl-C is answered, where one call
    for them all held it to the end."""
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, (int, np.integer))
                                   or batch_size < 1):
        raise ConfigError(f"batch_size={batch_size!r} must be a whole number >= 1 "
                          "(None: as many as fit in memory)")
    if len(items) == 0:
        return np.zeros((0,))
    size = min(int(batch_size or default), len(items))
    padded = np.concatenate([items, np.repeat(items[-1:], -len(items) % size, axis=0)])
    return np.concatenate([np.asarray(run(padded[i:i + size]))
                           for i in range(0, len(padded), size)])[:len(items)]


def _mask(shape, axes, by, index, layer):
    """bool [B, ...] of one block's value: where the patch at `index` (layer, then `by`'s
    axes) replaces it."""
    keep = index[0] == layer
    for j, axis in enumerate(BY[by]):
        at = 1 + axes.index(axis)
        line = jnp.arange(shape[at]) == index[1 + j]
        keep = keep & line.reshape([-1 if d == at else 1 for d in range(len(shape))])
    return jnp.broadcast_to(keep, shape)


@functools.partial(jax.jit, static_argnames=("graphdef", "names"))
def hook_values(graphdef, state, tokens, *, names):
    """The named hook points' values on `tokens`: `run_with_cache`, compiled."""
    return run_with_cache(nnx.merge(graphdef, state), tokens, list(names))[1]


@functools.partial(jax.jit, static_argnames=("graphdef", "names", "axes", "by", "metric"))
def _sweep(graphdef, state, target, sources, indices, *, names, axes, by, metric):
    """The target run once per index of `indices` [N, 1 + len(by)], side by side, with one block's
    value taken from `sources` (the other run's hook values)."""
    def one(index):
        model = nnx.merge(graphdef, state)
        with patched(model, {n: _patch(sources[n], i, axes, by, index)
                             for i, n in enumerate(names)}):
            return metric(model(target))
    return jax.vmap(one)(indices)


def _patch(source, layer: int, axes, by: str, index):
    """The hook function of block `layer`: its value, with `source` where the patch at
    `index` falls."""
    def replace(value):
        return jnp.where(_mask(value.shape, axes, by, index, layer), source, value)
    return replace


def activation_patch(model, clean, corrupted, metric: Callable, *, hook: str = "resid_pre",
                     by: str = "position", into: str | None = None,
                     batch_size: int | None = None) -> Sweep:
    """The metric of the target run (`into`: "corrupted" or "clean", no default) with one block's
    `hook` value taken from the other run, for every block and every index of `by`: [layer, *by].

    `metric(logits [B, T, V]) -> scalar`, e.g. `normalized_logit_diff(...)`. `batch_size`: patched
    forwards computed side by side (default: as many as fit in `MEMORY` bytes of activations, by
    the model's size; fewer to bound memory further). Dropout is off (`inspect.deterministic`)."""
    model = deterministic(model)
    target, source, names, grid = _plan(model, clean, corrupted, hook, by, into)
    keyed = check_metric(metric)
    graphdef, state = nnx.split(model)
    indices = np.stack(np.unravel_index(np.arange(int(np.prod(grid))), grid),
                       axis=-1).astype(np.int32)
    sources = hook_values(graphdef, state, source, names=tuple(names))

    def run(batch):
        values = _sweep(graphdef, state, target, sources, batch, names=tuple(names),
                        axes=HOOKS[hook][1], by=by, metric=keyed)
        if values.shape != batch.shape[:1]:     # checked on the values: tracing the metric
                                                # first costs each call
            raise ConfigError(_NOT_ONE.format(values.shape[1:]))
        return values
    values = map_batches(run, indices, batch_size, side_by_side(model.config, target.shape))
    return Sweep(np.asarray(values, np.float64).reshape(grid), ("layer", *BY[by]), hook)


def attribution_patch(model, clean, corrupted, metric: Callable, *, hook: str = "resid_pre",
                      by: str = "position", into: str | None = None) -> Sweep:
    """`activation_patch`'s sweep estimated to first order, for every patch at once: the metric's
    gradient at the target run times the change each patch makes (source - target), summed over
    the axes the patch covers. One forward and one backward pass. Exact where the metric is linear
    in the patched activation over the change; see docs/library.md for where it is not."""
    model = deterministic(model)
    target, source, names, grid = _plan(model, clean, corrupted, hook, by, into)
    keyed = check_metric(metric, (*target.shape, model.config.output_size_used))
    graphdef, state = nnx.split(model)
    came, was = (hook_values(graphdef, state, tokens, names=tuple(names))
                 for tokens in (source, target))
    grads = _hook_gradients(graphdef, state, target, {n: jnp.zeros_like(was[n]) for n in names},
                            names=tuple(names), metric=keyed)
    axes = ("batch",) + HOOKS[hook][1]
    keep = [axes.index(a) for a in BY[by]]
    summed = lambda a: jnp.sum(a, axis=tuple(d for d in range(a.ndim) if d not in keep))
    values = jnp.stack([summed((came[n] - was[n]) * grads[n]) for n in names])
    return Sweep(np.asarray(values, np.float64).reshape(grid), ("layer", *BY[by]), hook,
                 "attribution")


@functools.partial(jax.jit, static_argnames=("graphdef", "names", "metric"))
def _hook_gradients(graphdef, state, target, zeros, *, names, metric):
    """d metric / d each block's hook value, at the target run: through a zero added at
    each hook point."""
    def run(deltas):
        model = nnx.merge(graphdef, state)
        with patched(model, {n: (lambda d: lambda v: v + d)(deltas[n]) for n in names}):
            return metric(model(target))
    return jax.grad(run)(zeros)
