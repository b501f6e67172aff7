"""The training engine every experiment uses: one jit-compiled step, written once.

The model and its optimizer live as one `nnx.State` pytree and the step is a pure
function `state, x, y -> state, loss` that merges, differentiates, updates and splits.
Being pure, the same step runs for one seed or, under `jax.vmap`, for N seeds in one
compiled program; the state is what orbax saves, so a resumed run continues bit for bit;
and with several devices the batch axis is sharded over all of them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.data import eval_windows, get_batch
from attention_jax.errors import ConfigError
from attention_jax.model import LanguageModel


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
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


class Engine:
    """Compiled init / step / evaluation for one (model, training) configuration and N seeds."""

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig, *, n_seeds: int = 1):
        self.model_config, self.train_config, self.n_seeds = model_config, train_config, n_seeds
        self.tx = make_optimizer(train_config)
        self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: self._build(jax.random.key(0))))
        self.vmapped = n_seeds > 1
        over_seeds = (lambda f, **kw: jax.vmap(f, **kw)) if self.vmapped else (lambda f, **kw: f)

        devices = jax.devices()
        # Auto axes: the batch is laid out over devices and XLA propagates the rest (the
        # embedding gather included); explicit axes would demand sharding rules per op.
        self.mesh = (jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
                     if len(devices) > 1 else None)
        if self.mesh is not None and train_config.batch_size % len(devices):
            raise ConfigError(f"batch_size={train_config.batch_size} does not split over {len(devices)} "
                              "devices; use a multiple of the device count")
        self._init = jax.jit(over_seeds(self._init_one))
        self._step = jax.jit(over_seeds(self._step_one), donate_argnums=0)
        self._nll = jax.jit(over_seeds(self._nll_one, in_axes=(0, None, None)))

    # -- pure functions of the state ----------------------------------------------------
    def _build(self, key):
        model = LanguageModel(self.model_config, rngs=nnx.Rngs(key))
        return model, nnx.Optimizer(model, self.tx, wrt=nnx.Param)

    def _init_one(self, key):
        return nnx.state(self._build(key))

    def _step_one(self, state, x, y):
        model, opt = nnx.merge(self.graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: cross_entropy(m(x), y).mean())(model)
        opt.update(model, grads)
        return nnx.state((model, opt)), loss

    def _nll_one(self, state, x, y):
        model, _ = nnx.merge(self.graphdef, state)
        model.eval()                                   # dropout off
        return cross_entropy(model(x), y).sum(axis=-1)  # per window

    # -- host-side API --------------------------------------------------------------------
    def init(self, seeds) -> nnx.State:
        keys = jax.vmap(jax.random.key)(jnp.asarray(seeds)) if self.vmapped else jax.random.key(seeds[0])
        return self.replicate(self._init(keys))

    def abstract_state(self, seeds):
        keys = jax.vmap(jax.random.key)(jnp.asarray(seeds)) if self.vmapped else jax.random.key(seeds[0])
        return jax.eval_shape(self._init, keys)

    def batch(self, tokens, seeds, step):
        """The training batch of `step` for each seed: a function of (seed, step) only."""
        tc, T = self.train_config, self.model_config.context
        xs, ys = zip(*(get_batch(tokens, seed=s, step=step, batch_size=tc.batch_size, context=T) for s in seeds))
        x, y = (np.stack(a) for a in (xs, ys)) if self.vmapped else (xs[0], ys[0])
        return self._shard(x), self._shard(y)

    def step(self, state, x, y):
        return self._step(state, x, y)

    def perplexity(self, state, tokens, *, context: int | None = None, max_windows: int | None = None) -> np.ndarray:
        """exp(mean token NLL) over non-overlapping windows of `tokens`; one value per seed."""
        x, y = eval_windows(tokens, context or self.model_config.context, max_windows=max_windows)
        b = self.train_config.eval_batch
        # Pad with repeated windows so every call has one shape (one compile); the copies'
        # losses are dropped below.
        rows = np.arange(len(x) + (-len(x) % b)) % len(x)
        xp, yp = x[rows], y[rows]
        total = 0.0
        for i in range(0, len(xp), b):
            nll = np.asarray(self._nll(state, jnp.asarray(xp[i:i + b]), jnp.asarray(yp[i:i + b])))
            keep = min(b, len(x) - i)
            total = total + nll[..., :keep].sum(axis=-1)
        return np.atleast_1d(np.exp(total / x.size))

    # -- devices ----------------------------------------------------------------------------
    def _shard(self, a):
        if self.mesh is None:
            return jnp.asarray(a)
        spec = P(None, "data") if self.vmapped else P("data")
        return jax.device_put(a, NamedSharding(self.mesh, spec))

    def replicate(self, state):
        return state if self.mesh is None else jax.device_put(state, NamedSharding(self.mesh, P()))


def unstack_seed(state, i: int):
    """The state of one seed out of a vmapped (stacked) state."""
    return jax.tree.map(lambda a: a[i], state)

