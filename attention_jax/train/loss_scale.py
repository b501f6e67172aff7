"""Dynamic loss scaling for a float16 step: flax's `DynamicScale`, its state kept in the optimizer.

float16 holds 2^-24 to 65,504: a backward pass in it loses the small gradients to zero. The loss
is multiplied by a scale before the backward and the gradients divided by it after (in float32,
as the parameters are); a step whose gradients are not all finite changes no parameter, moment
or step count (the learning-rate schedule waits with them), and halves the scale; 2,000 finite
steps in a row double it (PyTorch's `GradScaler` and flax's defaults, from 2^16). bfloat16 has
float32's range and needs none.

The scale and its count of finite steps are two variables of the optimizer (`ScaledOptimizer`),
so they are in the state every checkpoint saves and a resumed run goes on with them. The step
reports `loss_scale` (the scale its loss was multiplied by) and `skipped` (1 where its update
was not applied).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.training.optimizer import OptState
from flax.training.dynamic_scale import DynamicScale

SCALED = ("float16",)       # the compute dtypes whose step scales its loss


class LossScale(nnx.Variable):
    """The dynamic loss scale's state: saved with the optimizer's, never trained."""


class ScaledOptimizer(nnx.Optimizer):
    """`nnx.Optimizer` holding a dynamic loss scale (`DynamicScale`'s starting values)."""

    def __init__(self, model, tx, *, wrt):
        super().__init__(model, tx, wrt=wrt)
        start = DynamicScale()
        self.loss_scale = LossScale(jnp.asarray(start.scale, jnp.float32))
        self.finite_steps = LossScale(jnp.asarray(start.fin_steps, jnp.int32))


def optimizer(model, tx, dtype: str) -> nnx.Optimizer:
    """The optimizer of a model computing in `dtype`: with a loss scale where `SCALED`."""
    kind = ScaledOptimizer if dtype in SCALED else nnx.Optimizer
    return kind(model, tx, wrt=nnx.Param)


def value_and_grad(loss_of, model, opt: nnx.Optimizer):
    """(loss, gradients with respect to `model`'s parameters, the step's own metrics) of
    `loss_of(model)`: `nnx.value_and_grad`'s, with no metrics of its own, unless `opt` holds a
    loss scale; then differentiated at that scale and unscaled, the scale moved on
    (`DynamicScale`), and `loss_scale` and `skipped` reported. What else the forward changes in
    `model` (dropout's streams) is kept."""
    if not isinstance(opt, ScaledOptimizer):
        return (*nnx.value_and_grad(loss_of)(model), {})
    return _scaled(loss_of, model, opt)


@jax.named_scope("scaled_loss")     # the name the programs' tests look for
def _scaled(loss_of, model, opt: ScaledOptimizer):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def scaled(params, rest):
        m = nnx.merge(graphdef, params, rest, copy=True)   # variables of this trace: dropout
                                                            # advances its streams in them
        return loss_of(m), nnx.state(m, nnx.Not(nnx.Param))

    dynamic = DynamicScale(fin_steps=opt.finite_steps[...], scale=opt.loss_scale[...])
    moved, finite, (loss, after), grads = dynamic.value_and_grad(scaled, has_aux=True)(params, rest)
    nnx.update(model, after)
    opt.loss_scale[...], opt.finite_steps[...] = moved.scale, moved.fin_steps
    return loss, grads, {"loss_scale": jnp.asarray(dynamic.scale, jnp.float32),
                         "skipped": jnp.logical_not(finite).astype(jnp.int32)}


def update(opt: nnx.Optimizer, model, grads, scaling: dict) -> None:
    """`opt.update(model, grads)`; where `scaling` says the step is skipped, parameters, moments
    and step count stay as they were: one select a value (a branch would cost a GPU more than
    computing both)."""
    if "skipped" not in scaling:
        return opt.update(model, grads)
    trained = nnx.Any(nnx.Param, OptState)
    # Copies: nnx.state hands over the variables themselves, which the update changes.
    values = lambda: jax.tree.map(lambda a: a, nnx.state((model, opt), trained))
    before = values()
    opt.update(model, grads)
    after = values()
    keep = scaling["skipped"] == 0
    nnx.update((model, opt), jax.tree.map(lambda a, b: jnp.where(keep, a, b), after, before))
