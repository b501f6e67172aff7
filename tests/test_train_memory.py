"""attention_jax.train.memory: what cannot fit is refused in one line before anything is allocated."""

import time

import jax
import pytest

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import ConfigError
from attention_jax.parameters import count_params
from attention_jax.train import Engine, memory

CONFIG = ModelConfig(vocab_size=1024, context=128, d_model=128, n_layers=1, n_heads=4)


def test_the_bound_counts_the_state_per_seed_and_the_logits_per_device():
    need = memory.needed(CONFIG, TrainConfig(batch_size=64, eval_batch=32), n_seeds=3, n_devices=2)
    assert need["state"] == 16 * count_params(CONFIG) * 3
    assert need["logits"] == 2 * 4 * 32 * 128 * 1024 * 3               # 64 rows over 2 devices


@pytest.mark.parametrize("seeds, batch", [(5000, 64), (1, 10**6)])
def test_seeds_or_a_batch_past_the_machine_are_refused_in_one_line(seeds, batch):
    """--seeds 5000 or an absurd batch were killed by the system for memory with no line."""
    began = time.perf_counter()
    with pytest.raises(ConfigError, match=r"needs at least [0-9.]+ GiB a device .* GiB is free; train fewer") as info:
        Engine(CONFIG, TrainConfig(batch_size=batch, eval_batch=min(batch, 32)), n_seeds=seeds)
    assert "\n" not in str(info.value) and time.perf_counter() - began < 10


def test_what_fits_and_a_machine_that_does_not_say_pass(monkeypatch):
    memory.check(CONFIG, TrainConfig(batch_size=64), 3, jax.devices())
    monkeypatch.setattr(memory, "available", lambda devices: None)
    memory.check(CONFIG, TrainConfig(batch_size=10**6), 5000, jax.devices())
