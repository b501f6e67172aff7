"""What the training engine compiles: the optimizer, the loss, and the pure functions of one configuration.

`Programs` holds a configuration's pure functions (build, init, step, evaluation) and their
jit-compiled forms; an `Engine` drives them from the host. jit keeps its traces per function
object, so two Engines of one configuration trace and compile twice, unless they share their
programs: a `ProgramCache` that the caller holds (and drops) hands Engines of one
configuration the same `Programs`. Nothing here is global.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.fingerprint import Keyed
from attention_jax.model import LanguageModel
from attention_jax.speed import Speed, fast
from attention_jax.speed.backend import Backend

# The TrainConfig fields the optimizer (and so every compiled step) reads; the loop's own
# (log_every, eval_every, checkpoint_every, train_eval_windows, eval_batch, batch_size) it does not.
OPTIMIZER_FIELDS = ("steps", "lr", "weight_decay", "b1", "b2", "warmup_steps", "schedule", "min_lr_ratio",
                    "grad_clip")


def lr_schedule(tc: TrainConfig) -> optax.Schedule | float:
    if tc.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup_steps, tc.steps, tc.lr * tc.min_lr_ratio)
    if tc.warmup_steps:
        return optax.join_schedules([optax.linear_schedule(0.0, tc.lr, tc.warmup_steps),
                                     optax.constant_schedule(tc.lr)], [tc.warmup_steps])
    return tc.lr


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(lr_schedule(tc), b1=tc.b1, b2=tc.b2, eps=1e-8, weight_decay=tc.weight_decay)
    return optax.chain(optax.clip_by_global_norm(tc.grad_clip), adamw) if tc.grad_clip else adamw


def cross_entropy(logits, targets):
    """Per-position -log p(target), in float32 whatever the logits' dtype."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def token_loss(logits, targets, weights=None):
    """The default loss: mean cross-entropy over the positions, weighted when `weights` is given."""
    ce = cross_entropy(logits, targets)
    if weights is None:
        return ce.mean()
    return (ce * weights).sum() / jnp.maximum(weights.sum(), 1e-12)


def block_grad_norms(grads, n_layers: int) -> jax.Array:
    """[n_layers]: the global norm of each block's gradient (0 for a block without parameters)."""
    blocks = grads["blocks"] if "blocks" in grads else {}
    return jnp.stack([optax.tree.norm(blocks[i]) if i in blocks else jnp.zeros((), jnp.float32)
                      for i in range(n_layers)])


class Programs:
    """The pure functions of one configuration and their compiled forms: init, step (one, or K in a
    scan), summed NLL and logits, for one seed or N under `vmap`, over `devices` (a mesh when more
    than one). Every function computes with `speed`'s faster forms swapped in (None: the model as
    built); the state is the model's as built either way."""

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig, n_seeds: int, loss: Callable,
                 step_metrics: bool, devices: tuple, speed: Speed | None, backend: Backend):
        self.model_config, self.loss, self.step_metrics, self.speed = model_config, loss, step_metrics, speed
        self.backend = backend                     # what the forms are chosen for, read once (speed.backend)
        if speed is not None:
            speed.form_for(model_config, backend)  # a form this model cannot take: refused now, in one line
        self.tx = make_optimizer(train_config)
        self.schedule = lr_schedule(train_config)
        self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: self.build(jax.random.key(0))))
        self.vmapped = n_seeds > 1
        over_seeds = (lambda f, **kw: jax.vmap(f, **kw)) if self.vmapped else (lambda f, **kw: f)
        # Auto axes: the batch is laid out over devices and XLA propagates the rest (the
        # embedding gather included); explicit axes would demand sharding rules per op.
        self.mesh = (jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                                   devices=devices) if len(devices) > 1 else None)
        replicated = None if self.mesh is None else NamedSharding(self.mesh, P())
        # On one device the initialisation runs op by op: compiling it costs about what the step
        # does, while each random draw compiles once per shape for every later engine too (the same
        # bits: a test). Over a mesh it is compiled, so every process lays the state out alike.
        init = over_seeds(self.init_one)
        self.init = init if self.mesh is None else jax.jit(init, out_shardings=replicated)
        self.step = jax.jit(over_seeds(self.step_one), donate_argnums=0)
        # K steps in one call, a scan over the batches' leading step axis: on a GPU/TPU a small
        # model's step takes less time than Python needs to launch it (`fit`'s steps_per_call).
        self.steps = jax.jit(lambda state, batches: jax.lax.scan(over_seeds(self.step_one), state, batches),
                             donate_argnums=0)
        # Evaluation windows are split over the devices like a batch (each device scores its
        # share); the per-window sums and logits come back whole, so every process reads them all.
        whole = {} if self.mesh is None else {"out_shardings": replicated}
        self.nll = jax.jit(over_seeds(self.nll_one, in_axes=(0, None, None, None)), **whole)
        self.logits = jax.jit(over_seeds(self.logits_one, in_axes=(0, None)), **whole)

    def build(self, key):
        model = LanguageModel(self.model_config, rngs=nnx.Rngs(key))
        return model, nnx.Optimizer(model, self.tx, wrt=nnx.Param)

    def faster(self, model):
        """`model` with the speed's forms swapped in, for the `with` block."""
        return contextlib.nullcontext(model) if self.speed is None else fast(model, self.speed, backend=self.backend)

    def init_one(self, key):
        return nnx.state(self.build(key))

    def step_one(self, state, batch):
        model, opt = nnx.merge(self.graphdef, state)
        lr = self.schedule(opt.step[...]) if callable(self.schedule) else jnp.asarray(self.schedule)
        with self.faster(model):
            loss, grads = nnx.value_and_grad(lambda m: self.loss(m(batch["x"]), batch["y"], batch.get("weights")))(model)
        opt.update(model, grads)
        if not self.step_metrics:
            return nnx.state((model, opt)), {"loss": loss}
        metrics = {"loss": loss, "lr": jnp.asarray(lr, jnp.float32), "grad_norm": optax.tree.norm(grads),
                   "block_grad_norm": block_grad_norms(grads, self.model_config.n_layers)}
        return nnx.state((model, opt)), metrics

    def nll_one(self, state, x, y, weights):
        model, _ = nnx.merge(self.graphdef, state)
        model.eval()                                   # dropout off
        with self.faster(model):
            ce = cross_entropy(model(x), y)
        if weights is None:
            return ce.sum(axis=-1), jnp.full(ce.shape[:-1], ce.shape[-1], jnp.float32)
        return (ce * weights).sum(axis=-1), weights.sum(axis=-1).astype(jnp.float32)   # per window

    def logits_one(self, state, x):
        model, _ = nnx.merge(self.graphdef, state)
        model.eval()
        with self.faster(model):
            return model(x)


class ProgramCache:
    """Programs shared by the Engines built with this cache (`Engine(..., programs=cache)`): a second
    Engine of a configuration already built traces and compiles nothing. The key is everything the
    programs compute with (model config, the optimizer's fields, seed count, loss, metrics, devices,
    speed, backend); the `maxsize` most recently used are kept. Like any `jax.jit` function they keep what they
    traced: after editing the library's code in a running session, `clear()` (or a new cache)."""

    def __init__(self, maxsize: int = 32):
        self.maxsize, self._kept = maxsize, collections.OrderedDict()

    def get(self, model_config: ModelConfig, train_config: TrainConfig, n_seeds: int, loss: Callable,
            step_metrics: bool, devices: tuple, speed: Speed | None, backend: Backend) -> Programs:
        # The loss by what it computes (a loss reading a global that changed since is another program).
        key = (model_config, tuple(getattr(train_config, f) for f in OPTIMIZER_FIELDS), n_seeds, Keyed(loss),
               step_metrics, devices, speed, backend)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        programs = self._kept[key] = Programs(model_config, train_config, n_seeds, loss, step_metrics, devices, speed,
                                              backend)
        while len(self._kept) > self.maxsize:
            self._kept.popitem(last=False)
        return programs

    def clear(self) -> None:
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)
