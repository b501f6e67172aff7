"""The training engine every experiment uses, and the loop around it.

`engine`: the compiled init / step / evaluation of one (model, training) configuration
for one or N seeds; `loop`: `fit`, which trains with progress, metrics, checkpoints and
resume; `checkpoints`: orbax saves with a fingerprint of what made them.
"""
from attention_jax.config import TrainConfig
from attention_jax.train.checkpoints import Checkpoints
from attention_jax.train.engine import Engine, cross_entropy, lr_schedule, make_optimizer, unstack_seed
from attention_jax.train.loop import RunResult, fit

__all__ = ["TrainConfig", "Engine", "cross_entropy", "lr_schedule", "make_optimizer", "unstack_seed",
           "Checkpoints", "RunResult", "fit"]
