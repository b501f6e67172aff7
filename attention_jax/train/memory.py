"""Whether a training configuration can fit, asked before anything is allocated.

5,000 seeds or an absurd batch used to be killed by the system for memory, with no line
to say why. `check` refuses, in one line, a configuration whose lower bound of memory per
device is past what the device has free: the state every seed keeps (parameters, AdamW's
two moments and the gradients, four float32 copies) and, for the larger of a training batch
and an evaluation batch, the logits and their gradient. The real need is higher (every
block's activations), so what is refused certainly cannot run; what passes may still not.
"""
from __future__ import annotations

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import ConfigError

GIB = 1 << 30


def needed(model_config: ModelConfig, train_config: TrainConfig, n_seeds: int,
           n_devices: int) -> dict[str, int]:
    """Bytes per device, at least: {"state": parameters, moments, gradients; "logits": one batch's
    and their gradient}."""
    from attention_jax.parameters import count_params
    state = 4 * 4 * count_params(model_config) * n_seeds
    # a device's share, rounded up
    rows = -(-max(train_config.batch_size, train_config.eval_batch) // n_devices)
    logits = 2 * 4 * rows * model_config.context * model_config.vocab_size * n_seeds
    return {"state": state, "logits": logits}


def available(devices) -> int | None:
    """Bytes free on this process's first device: an accelerator's own count, a CPU's `MemAvailable`
    (Linux); None where neither says."""
    import jax
    mine = [d for d in devices if getattr(d, "process_index", 0) == jax.process_index()] \
        or list(devices)
    try:        # only this process's own devices answer (several processes: the others' raise)
        stats = getattr(mine[0], "memory_stats", lambda: None)()
    except Exception:           # JaxRuntimeError, or a device kind that keeps no such count
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check(model_config: ModelConfig, train_config: TrainConfig, n_seeds: int, devices) -> None:
    """One line, before allocating, for a configuration that cannot fit on `devices`."""
    free = available(devices)
    if free is None:
        return
    need = needed(model_config, train_config, n_seeds, len(devices))
    if sum(need.values()) > free:
        raise ConfigError(
            f"training {n_seeds} seed(s) at batch {train_config.batch_size} (evaluation batch "
            f"{train_config.eval_batch}) needs at least {sum(need.values()) / GIB:.1f} GiB a "
            f"device (the state {need['state'] / GIB:.1f} GiB, a batch's logits and their gradient "
            f"{need['logits'] / GIB:.1f} GiB), and {free / GIB:.1f} GiB is free; train fewer seeds "
            "at once or smaller batches")
