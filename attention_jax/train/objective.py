"""What training minimises and how: the loss (cross-entropy, weighted or not) and the optimizer
(AdamW with warmup, cosine or constant learning rate, optional gradient clipping), both read by
the `Engine`'s compiled step."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from attention_jax.config import TrainConfig

# The TrainConfig fields the optimizer (and so every compiled step) reads; the loop's own
# (log_every, eval_every, checkpoint_every, train_eval_windows, eval_batch, batch_size) it does not.
OPTIMIZER_FIELDS = ("steps", "lr", "weight_decay", "b1", "b2", "warmup_steps", "schedule",
                    "min_lr_ratio", "grad_clip")


def lr_schedule(tc: TrainConfig) -> optax.Schedule | float:
    if tc.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup_steps, tc.steps,
                                                  tc.lr * tc.min_lr_ratio)
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
