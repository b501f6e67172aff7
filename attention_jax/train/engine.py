"""The training engine: one jit-compiled step, written once.

The model and its optimizer live as one `nnx.State` pytree and the step is a pure
function `state, batch -> state, metrics` that merges, differentiates, updates and
splits. Being pure, the same step runs for one seed or, under `jax.vmap`, for N seeds in
one compiled program; the state is what orbax saves, so a resumed run continues bit for
bit (on a CPU; docs/install.md says why not on a GPU); and with several devices the batch
axis is sharded over all of them.

A batch is a dict of host arrays: `x` and `y` [B, T] token ids and, optionally,
`weights` [B, T], how much each position's loss counts (the default: every position
alike; the Winograd toy scores one token). What to sample lives with the task
(`attention_jax.data`); the engine only places batches on devices.

The step's metrics (loss, learning rate, global gradient norm, gradient norm per block)
stay on: a few reductions over the gradients. A float16 model's step scales its loss and skips
an update whose gradients are not finite (`train.loss_scale`), reporting both. Every compiled
function computes with `speed` (default `Speed()`: the fastest attention on the engine's
devices, or on `backend`, and the hand-written dense backward) swapped into the model;
`speed=None` trains the model as built.

The compiled functions are the Engine's own (`_compile`). jit keeps its traces per function object,
so two Engines of one configuration would trace and compile twice: Engines handed one
`ProgramCache` (held, and dropped, by the caller; nothing here is global) share them.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.data import eval_windows
from attention_jax.errors import ConfigError, DataError
from attention_jax.fingerprint import Keyed
from attention_jax.model import LanguageModel, check_ids
from attention_jax.speed import Speed, fast
from attention_jax.speed.backend import backend_of
from attention_jax.train import loss_scale, memory
from attention_jax.train.distributed import local, put, to_host
from attention_jax.train.program_cache import ProgramCache
from attention_jax.train.objective import (OPTIMIZER_FIELDS, block_grad_norms, cross_entropy,
                                           lr_schedule, make_optimizer, token_loss)


class Engine:
    """Compiled init / step / evaluation for one (model, training) configuration and N seeds."""

    def __init__(self, model_config: ModelConfig, train_config: TrainConfig, *, n_seeds: int = 1,
                 loss: Callable = token_loss, step_metrics: bool = True,
                 speed: Speed | None = Speed(), programs: ProgramCache | None = None, backend=None):
        self.model_config, self.train_config, self.n_seeds, self.loss = \
            model_config, train_config, n_seeds, loss
        self.step_metrics = step_metrics   # False: the step returns the loss alone
                                           # (the benchmark's baseline)
        self.speed = speed
        devices = tuple(jax.devices())
        # The forms are chosen for these devices, or for `backend` when the programs are built for
        # others (jax.export for cuda or tpu from this machine): read here, once, never inside
        # a trace.
        self.backend = backend_of(devices if backend is None else backend)
        if len(devices) > 1 and train_config.batch_size % len(devices):
            raise ConfigError(f"batch_size={train_config.batch_size} does not split over "
                              f"{len(devices)} devices; use a multiple of the device count")
        memory.check(model_config, train_config, n_seeds, devices)   # before anything is allocated
        if speed is not None:
            speed.form_for(model_config, self.backend)   # a form this model cannot take:
                                                         # refused now, in one line
        self.tx, self.schedule, self.vmapped = \
            make_optimizer(train_config), lr_schedule(train_config), n_seeds > 1
        self.graphdef, _ = nnx.split(nnx.eval_shape(lambda: self._build(jax.random.key(0))))
        # Auto axes: the batch is laid out over devices and XLA propagates the rest (the
        # embedding gather included); explicit axes would demand sharding rules per op.
        self.mesh = (jax.make_mesh((len(devices),), ("data",),
                                   axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
                     if len(devices) > 1 else None)
        # Everything the compiled functions read of this Engine: Engines equal in it share them.
        self.program_key = (model_config, tuple(getattr(train_config, f) for f in OPTIMIZER_FIELDS),
                            n_seeds, Keyed(loss), step_metrics, devices, speed, self.backend)
        compiled = self._compile() if programs is None \
            else programs.get(self.program_key, self._compile)
        self._init, self._step, self._steps, self._nll, self._logits = compiled

    # -- the pure functions, and their compiled forms --------------------------------------
    def _build(self, key):
        model = LanguageModel(self.model_config, rngs=nnx.Rngs(key))
        return model, loss_scale.optimizer(model, self.tx, self.model_config.dtype)

    def _faster(self, model):
        """`model` with the speed's forms swapped in, for the `with` block."""
        return contextlib.nullcontext(model) if self.speed is None \
            else fast(model, self.speed, backend=self.backend)

    def _init_one(self, key):
        return nnx.state(self._build(key))

    def _step_one(self, state, batch):
        model, opt = nnx.merge(self.graphdef, state)
        lr = self.schedule(opt.step[...]) if callable(self.schedule) else jnp.asarray(self.schedule)
        loss_of = lambda m: self.loss(m(batch["x"]), batch["y"], batch.get("weights"))
        with self._faster(model):
            loss, grads, scaling = loss_scale.value_and_grad(loss_of, model, opt)
        loss_scale.update(opt, model, grads, scaling)   # float16: skipped where not finite
        metrics = {"loss": loss} if not self.step_metrics else {
            "loss": loss, "lr": jnp.asarray(lr, jnp.float32), "grad_norm": optax.tree.norm(grads),
            "block_grad_norm": block_grad_norms(grads, self.model_config.n_layers)}
        return nnx.state((model, opt)), {**metrics, **scaling}

    def _nll_one(self, state, x, y, weights):
        model, _ = nnx.merge(self.graphdef, state)
        model.eval()                                   # dropout off
        with self._faster(model):
            ce = cross_entropy(model(x), y)
        if weights is None:
            return ce.sum(axis=-1), jnp.full(ce.shape[:-1], ce.shape[-1], jnp.float32)
        return (ce * weights).sum(axis=-1), weights.sum(axis=-1).astype(jnp.float32)   # per window

    def _logits_one(self, state, x):
        model, _ = nnx.merge(self.graphdef, state)
        model.eval()
        with self._faster(model):
            return model(x)

    def _compile(self) -> tuple:
        """(init, step, steps, nll, logits): the pure functions for one seed or N under `vmap`,
        jit-compiled."""
        over_seeds = (lambda f, **kw: jax.vmap(f, **kw)) if self.vmapped else (lambda f, **kw: f)
        replicated = None if self.mesh is None else NamedSharding(self.mesh, P())
        # On one device the initialisation runs op by op: compiling it costs about what the step
        # does, while each random draw compiles once per shape for every later engine too (the same
        # bits: a test). Over a mesh it is compiled, so every process lays the state out alike.
        init = over_seeds(self._init_one)
        init = init if self.mesh is None else jax.jit(init, out_shardings=replicated)
        step = jax.jit(over_seeds(self._step_one), donate_argnums=0)
        # K steps in one call, a scan over the batches' leading step axis: on a GPU/TPU a small
        # model's step takes less time than Python needs to launch it (`fit`'s steps_per_call).
        steps = jax.jit(
            lambda state, batches: jax.lax.scan(over_seeds(self._step_one), state, batches),
            donate_argnums=0)
        # Evaluation windows are split over the devices like a batch (each device scores its
        # share); the per-window sums and logits come back whole, so every process reads them all.
        whole = {} if self.mesh is None else {"out_shardings": replicated}
        nll = jax.jit(over_seeds(self._nll_one, in_axes=(0, None, None, None)), **whole)
        logits = jax.jit(over_seeds(self._logits_one, in_axes=(0, None)), **whole)
        return init, step, steps, nll, logits

    # -- host-side API --------------------------------------------------------------------
    def check_seeds(self, seeds) -> list[int]:
        """The seeds as ints, one per seed this engine was built for (else one line saying how
        to build it)."""
        seeds = [int(s) for s in seeds]
        if len(seeds) != self.n_seeds:
            raise ConfigError(f"{len(seeds)} seed(s) for an engine built for {self.n_seeds}; build "
                              f"it with Engine(..., n_seeds={len(seeds) or 1})"
                              + (" and give at least one" if not seeds else ""))
        return seeds

    def _keys(self, seeds):
        seeds = self.check_seeds(seeds)
        return jax.vmap(jax.random.key)(jnp.asarray(seeds)) if self.vmapped \
            else jax.random.key(seeds[0])

    def init(self, seeds) -> nnx.State:
        return self.replicate(self._init(self._keys(seeds)))

    def abstract_state(self, seeds):
        return jax.eval_shape(self._init, self._keys(seeds))

    def _host(self, batches: list[dict]) -> dict:
        if len(batches) != self.n_seeds:
            raise ValueError(f"{len(batches)} batches for {self.n_seeds} seed(s)")
        return {k: np.stack([b[k] for b in batches]) if self.vmapped else batches[0][k]
                for k in batches[0]}

    def _checked(self, host: dict, steps: tuple = ()) -> dict:
        """On the host, where it costs nothing (the compiled step cannot raise): a batch the config
        asked for, of token ids in the vocabulary, with loss weights that mean something."""
        missing = [k for k in ("x", "y") if k not in host]
        if missing:
            raise ConfigError(f"a batch needs 'x' and 'y' (and optionally 'weights'); this one has "
                              f"no {', '.join(map(repr, missing))}")
        tc, lead = self.train_config, (self.n_seeds,) if self.vmapped else ()
        want = (*steps, *lead, tc.batch_size, self.model_config.context)
        for k in ("x", "y"):
            a = np.asarray(host[k])
            if not np.issubdtype(a.dtype, np.integer):
                raise DataError(f"batch[{k!r}] holds {a.dtype} values; token ids are integers")
            if a.shape != want:
                raise ConfigError(f"batch[{k!r}] has shape {a.shape}; this engine trains batches "
                                  f"of [{tc.batch_size}, {self.model_config.context}] "
                                  "(batch_size, context)"
                                  + (f", {want} with its step and seed axes"
                                     if len(want) > 2 else ""))
            check_ids(a, self.model_config.vocab_size)
        if "weights" in host:
            w = _loss_weights(host["weights"], np.shape(host["y"]), "batch['weights']", "y")
            if not (w.reshape(-1, *w.shape[-2:]).sum(axis=(-2, -1)) > 0).all():
                raise DataError("batch['weights'] are all zero: "
                                "that batch has nothing to learn from")
        return host

    def shard(self, batches: list[dict]) -> dict:
        """Per-seed host batches -> one device batch: stacked over seeds when vmapped, split
        over devices."""
        return {k: self._shard(v) for k, v in self._checked(self._host(batches)).items()}

    def shard_steps(self, steps: list[list[dict]]) -> dict:
        """K steps' per-seed host batches -> one device batch for `steps`, with a
        leading step axis."""
        if not steps:
            raise ValueError("shard_steps needs the batches of at least one step")
        hosts = [self._host(b) for b in steps]
        stacked = self._checked({k: np.stack([h[k] for h in hosts]) for k in hosts[0]},
                                (len(hosts),))
        return {k: self._shard(v, lead=1) for k, v in stacked.items()}

    def step(self, state, batch: dict):
        """One optimizer step: (new state, metrics dict of device arrays, one value per seed). The
        state passed in is consumed (its buffers are donated): go on with the one returned."""
        _live(state)
        return self._step(state, batch)

    def steps(self, state, batches: dict):
        """K optimizer steps in one compiled call (`batches` from `shard_steps`): the state after
        the last, and every step's metrics stacked [K, ...]. The same updates as K calls of
        `step`, to float rounding (XLA compiles the loop body on its own)."""
        _live(state)
        return self._steps(state, batches)

    def nll(self, state, x, y, weights=None) -> tuple[np.ndarray, np.ndarray]:
        """Summed -log p over the given windows [W, T] and how many positions counted, per seed.

        Perplexity is exp(sum / count); bits per character is sum / ln 2 / characters.
        """
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.ndim != 2:
            raise ConfigError("nll needs windows x and targets y of one shape [W, T], got "
                              f"{x.shape} and {y.shape}")
        check_ids(x, self.model_config.vocab_size), check_ids(y, self.model_config.vocab_size)
        b, n = self.train_config.eval_batch, len(x)
        if weights is not None:
            weights = _loss_weights(weights, x.shape, "nll's weights", "x").astype(np.float32)
        total, count = 0.0, 0.0
        for i, rows in enumerate(in_batches(n, b)):
            w = None if weights is None else self._windows(weights[rows])
            s, c = (np.asarray(a, np.float64)
                    for a in to_host(self._nll(state, self._windows(x[rows]),
                                               self._windows(y[rows]), w)))
            keep = min(b, n - i * b)
            total, count = total + s[..., :keep].sum(axis=-1), count + c[..., :keep].sum(axis=-1)
        return np.atleast_1d(total), np.atleast_1d(count)

    def perplexity(self, state, tokens, *, context: int | None = None,
                   max_windows: int | None = None) -> np.ndarray:
        """exp(mean token NLL) over non-overlapping windows of `tokens`; one value per seed."""
        x, y = eval_windows(tokens, context or self.model_config.context, max_windows=max_windows)
        total, count = self.nll(state, x, y)
        return np.exp(total / count)

    def logits(self, state, x) -> jax.Array:
        """The model's logits for windows x [W, T] (dropout off); [S, W, T, V] when vmapped."""
        x = np.asarray(x)
        if x.ndim != 2:
            raise ConfigError(f"logits needs windows x [W, T], got shape {x.shape}")
        check_ids(x, self.model_config.vocab_size)
        return self._logits(state, self._windows(x))

    def model(self, state, seed: int = 0) -> LanguageModel:
        """A usable NNX model holding one seed's parameters (the i-th of a vmapped state), as built:
        the reference equation (`speed.fast(model)` to compute it as the engine does), in eval mode:
        dropout off, so what is read of it is deterministic (`model.train()` turns dropout on)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
                or not 0 <= seed < self.n_seeds:
            raise ConfigError(f"seed={seed!r}: this engine holds {self.n_seeds} seed(s), by place: "
                              f"0 to {self.n_seeds - 1}")
        one = unstack_seed(state, seed) if self.vmapped else state
        model, _ = nnx.merge(self.graphdef, local(one))
        model.eval()
        return model

    # -- devices ----------------------------------------------------------------------------
    def _shard(self, a, lead: int = 0):
        """A batch array onto the devices, its batch axis split (after `lead` step axes and
        the seed axis)."""
        if self.mesh is None:
            return jnp.asarray(a)
        spec = P(*[None] * (lead + self.vmapped), "data")
        return put(np.asarray(a), NamedSharding(self.mesh, spec))

    def _windows(self, a):
        """Evaluation windows [W, ...] split over the devices when W divides, else whole on
        every device."""
        if self.mesh is None or len(a) % self.mesh.size:
            return self._everywhere(a)
        return put(np.asarray(a), NamedSharding(self.mesh, P("data")))

    def _everywhere(self, a):
        """An evaluation input, whole on every device (on every process's devices)."""
        return jnp.asarray(a) if self.mesh is None \
            else put(np.asarray(a), NamedSharding(self.mesh, P()))

    def replicate(self, state):
        if self.mesh is None:
            return state
        sharding = NamedSharding(self.mesh, P())
        return jax.tree.map(lambda a: a if getattr(a, "sharding", None) == sharding
                            else jax.device_put(a, sharding), state)


def _loss_weights(weights, shape, what: str, like: str) -> np.ndarray:
    """Loss weights as float64, or one line: they must be finite, non-negative and shaped
    like the targets."""
    w = np.asarray(weights, np.float64)
    if w.shape != tuple(shape) or not np.all(np.isfinite(w)) or (w < 0).any():
        raise DataError(f"{what} must be finite, non-negative and shaped like {like} "
                        f"{tuple(shape)}, got shape {w.shape}"
                        + ("" if w.shape != tuple(shape)
                           else " with negative or non-finite values"))
    return w


def _live(state) -> None:
    """A state whose buffers a step already consumed is refused in one line (JAX's own
    error is deep)."""
    if any(isinstance(a, jax.Array) and a.is_deleted() for a in jax.tree.leaves(state)):
        raise ConfigError("this state was consumed by an earlier step (its buffers are donated to "
                          "the step); go on with the state that step returned")


def in_batches(n: int, batch: int) -> list[np.ndarray]:
    """Row indices covering 0 .. n-1 in batches of exactly `batch`, the last one filled up with rows
    from the start: every call has one shape (one compile); drop the copies (past n) afterwards."""
    rows = np.arange(n + (-n % batch)) % n
    return [rows[i:i + batch] for i in range(0, len(rows), batch)]


def unstack_seed(state, i: int):
    """The state of one seed out of a vmapped (stacked) state."""
    return jax.tree.map(lambda a: a[i], state)
