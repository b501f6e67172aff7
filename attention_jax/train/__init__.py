"""The training engine and the loop around it.

`engine`: the compiled init / step / evaluation of one (model, training) configuration
for one or N seeds, and the cache Engines can share them through; `objective`: the loss and
the optimizer; `loss_scale`: float16's dynamic loss scale; `loop`: `fit`, which trains with
progress, metrics, checkpoints and resume; `checkpoints`: orbax saves, recorded and
checksummed; `tasks`: what a run trains on and how it is scored.
"""
from attention_jax.config import TrainConfig
from attention_jax.train.checkpoints import Checkpoints, run_record
from attention_jax.train.engine import Engine, unstack_seed
from attention_jax.train.program_cache import ProgramCache
from attention_jax.train.objective import cross_entropy, lr_schedule, make_optimizer, token_loss
from attention_jax.train.loop import RunResult, fit, mean_std, read_metrics
from attention_jax.train.tasks import Task, text_task

__all__ = ["TrainConfig", "Engine", "ProgramCache", "cross_entropy", "lr_schedule",
           "make_optimizer", "unstack_seed", "Checkpoints", "run_record", "RunResult", "fit",
           "mean_std", "read_metrics", "Task", "text_task", "token_loss"]
