"""Whether a batch can decode, asked before anything the batch scales is allocated.

Decoding allocates, for B rows: the key/value cache (every slot of every row, each mixer), the
text (the prompts and the new tokens, or the uncached path's buffer of a window at least a
row), and the logits (the prompts' in the prefill, or a window's each uncached step). A batch
past the machine's memory used to be killed by the system with no line to say why; `check`
refuses it in one, naming how much it needs, how much is free and what to lower. As the
training engine's (`train.memory`), the bound is a lower one: what is refused certainly
cannot run; what passes may still not (each block's activations are not counted).
"""
from __future__ import annotations

import jax.numpy as jnp

from attention_jax.errors import ConfigError

GIB = 1 << 30


def cache_bytes(config, batch: int, length: int) -> int:
    """Bytes the key/value cache of `batch` rows of `length` slots holds: keys and values
    [B, H, length, D] an attention mixer, the values [B, length, D] an average."""
    width = {"heads": 2 * config.heads_used * config.d_head_used, "head": 2 * config.d_head_used,
             "average": config.d_model}.get(config.mixer, 0)
    return batch * length * width * config.n_layers * jnp.dtype(config.dtype).itemsize


def needed(config, batch: int, prompt: int, n: int, *, cache: bool) -> dict[str, int]:
    """Bytes `generate` allocates for `batch` rows of prompts up to `prompt` ids and `n` new ones,
    at least: {"cache", "logits", "text"}."""
    logit = jnp.dtype(config.dtype).itemsize * config.vocab_size
    if cache:      # the prompts' logits in one call; the prompt and each new id but the last kept
        return {"cache": cache_bytes(config, batch, prompt + n - 1),
                "logits": batch * prompt * logit, "text": 4 * batch * (prompt + n)}
    return {"cache": 0, "logits": batch * config.context * logit,
            "text": 4 * batch * max(config.context, prompt + n)}


def _free() -> int | None:
    from attention_jax.speed.backend import default_devices
    from attention_jax.train.memory import available     # the training engine's count of free bytes
    return available(default_devices())


NAMES = {"cache": "the key/value cache", "logits": "the logits", "text": "the text"}


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB // 10 else f"{n / (1 << 20):.1f} MiB"


def check(need: dict[str, int], doing: str, fix: str) -> None:
    """One line, before allocating, when the bytes of `need` (`needed`) pass what is free: what is
    `doing` needs how much, of which part, and the `fix`."""
    free = _free()
    if free is None or sum(need.values()) <= free:
        return
    parts = ", ".join(f"{NAMES.get(k, k)} {_size(v)}" for k, v in need.items() if v)
    raise ConfigError(f"{doing} needs at least {_size(sum(need.values()))} ({parts}), and "
                      f"{_size(free)} is free; {fix}")
