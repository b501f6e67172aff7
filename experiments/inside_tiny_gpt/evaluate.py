"""Compiled forward passes shared by every demo: bits per character, fact accuracy, greedy decoding, caches."""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

from attention_jax.errors import ConfigError


EVAL_ROWS = 40     # every evaluation batch is [EVAL_ROWS, context]: one shape, so one compile per structure


@functools.lru_cache(maxsize=None)
def compiled():
    """nnx.jit-ted forward passes, made once per process.

    A jitted call is keyed by the model's structure, so each ablation (a swapped part)
    compiles once and a rerun in the same process compiles nothing; running the NNX model
    eagerly instead would compile every operation for every new shape.
    """
    import jax.numpy as jnp
    from flax import nnx
    from attention_jax.inspect import patched, replaced, run_with_cache, use_form
    from attention_jax.model import CausalMask

    class PrefixMask(CausalMask):
        """Every query sees the first n positions, the future among them: a bidirectional mask on a
        sequence of length n, padded on the right to a fixed shape."""
        causal = False

        def __init__(self, n):
            self.n = nnx.Variable(n)

        def __call__(self, T: int):
            return jnp.broadcast_to((jnp.arange(T) < self.n[...])[None, :], (T, T))

    @nnx.jit
    def forward(model, x):
        return model(x)

    @nnx.jit
    def forward_prefix(model, x, n):
        masks = {f"blocks.{i}.mixer.mask": PrefixMask(n) for i in range(len(model.blocks))}
        with replaced(model, masks), use_form(model):     # a mask of its own: the reference form applies it
            return model(x)

    @nnx.jit
    def cache(model, x):
        with use_form(model):                            # scores and weights: the reference form
            return run_with_cache(model, x, ["embed", "positions", "blocks.*", "ln_final"])

    @nnx.jit
    def forward_heads(model, x, keep):
        """Heads switched off by a 0/1 mask keep [L, H] given as data: the product inspect.ablate(heads=...)
        applies to each head's output (blocks.i.mixer.z), but one compile serves every head."""
        zero = lambda i: lambda z: z * keep[i].astype(z.dtype)[:, None, None]
        with patched(model, {f"blocks.{i}.mixer.z": zero(i) for i in range(len(model.blocks))}):
            return model(x)

    return Compiled(forward, forward_prefix, cache, forward_heads)


class Compiled(NamedTuple):
    forward: Callable             # (model, x [B, T]) -> logits
    forward_prefix: Callable      # (model, x, n) -> logits with every position seeing the first n
    cache: Callable               # (model, x) -> (logits, {hook name: value})
    forward_heads: Callable       # (model, x, keep [L, H]) -> logits with the heads where keep = 0 off


def _rows(a, rows: int = EVAL_ROWS):
    """`a` padded with copies of its first row to a multiple of `rows` (the copies are dropped later)."""
    import numpy as np
    a = np.asarray(a)
    extra = -len(a) % rows
    return np.concatenate([a, np.repeat(a[:1], extra, axis=0)]) if extra else a


def _pad_right(a, width: int, value=0):
    import numpy as np
    a = np.asarray(a)
    return np.pad(a, [(0, 0), (0, width - a.shape[1])], constant_values=value)


def model_bits(model, x, y, forward: Callable | None = None) -> float:
    """Bits per character of `model` as it stands (ablations included) on windows x, y [W, T].

    `forward(model, x)`: the compiled forward pass (default `compiled().forward`).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    forward = forward or compiled().forward
    n, xs, ys, total = len(x), _rows(x), _rows(y), 0.0
    for i in range(0, len(xs), EVAL_ROWS):
        lp = jax.nn.log_softmax(forward(model, jnp.asarray(xs[i:i + EVAL_ROWS])).astype(jnp.float32), axis=-1)
        nll = -np.asarray(jnp.take_along_axis(lp, jnp.asarray(ys[i:i + EVAL_ROWS])[..., None], -1)[..., 0],
                          np.float64)
        total += nll[: max(0, min(EVAL_ROWS, n - i))].sum()
    return total / np.asarray(y).size / math.log(2)


def teacher_forced_accuracy(model, tok, world, forward: Callable | None = None) -> float:
    """Fact accuracy from one pass over prompt + answer (tiny_world.fact_batch): under a causal mask
    the same as greedy completion, since a right prefix is what greedy decoding would have fed."""
    import jax.numpy as jnp
    import numpy as np
    from attention_jax.data import tiny_world as tw
    x, y, w = tw.fact_batch(tok, world)
    T = model.config.context
    xs, n = _rows(_pad_right(x, T)), len(x)
    forward = forward or compiled().forward
    logits = np.concatenate([np.asarray(forward(model, jnp.asarray(xs[i:i + EVAL_ROWS])))
                             for i in range(0, len(xs), EVAL_ROWS)])[:n]
    return tw.fact_accuracy_from_logits(logits, _pad_right(y, T), _pad_right(w, T, 0.0))


def greedy_completions(model, tok, world, *, bidirectional: bool = False, max_new: int = 10) -> dict:
    """{fact prompt: the max_new ids greedy decoding appends}, for every person's "\\n{name} lives in".

    Each step runs a batch of prompts padded on the right to the context (one shape, one
    compile): under the causal mask the padding is invisible; with `bidirectional` every
    position sees exactly the text so far (prompt + generated), as the bidirectional model
    would on the unpadded text.
    """
    import jax.numpy as jnp
    import numpy as np
    from attention_jax.data import tiny_world as tw
    run = compiled()
    T = model.config.context
    prompts = sorted({tw.fact_prompt(p)[0] for p in world.people})
    made: dict[str, np.ndarray] = {}
    for length in sorted({len(p) for p in prompts}):
        group = [p for p in prompts if len(p) == length]
        if length + max_new > T:
            raise ConfigError(f"a fact prompt of {length} characters leaves no room for {max_new} more in "
                              f"the {T}-character context")
        for start in range(0, len(group), EVAL_ROWS):
            part = group[start:start + EVAL_ROWS]
            buf = _rows(_pad_right(np.stack([tok.encode(p) for p in part]), T))
            for n in range(length, length + max_new):
                x = jnp.asarray(buf)
                logits = run.forward_prefix(model, x, jnp.int32(n)) if bidirectional else run.forward(model, x)
                buf[:, n] = np.asarray(logits[:, n - 1].argmax(-1), np.int32)
            for i, p in enumerate(part):
                made[p] = buf[i, length:length + max_new].copy()
    return made


def greedy_accuracy(model, tok, world, *, bidirectional: bool = False, max_new: int = 10) -> float:
    """The lecture's fact completion: greedy decoding, scored by tiny_world.fact_accuracy."""
    from attention_jax.data import tiny_world as tw
    made = greedy_completions(model, tok, world, bidirectional=bidirectional, max_new=max_new)
    return tw.fact_accuracy(lambda prompt_ids, n: made[tok.decode(prompt_ids)][:n], tok, world, max_new)


def cached_run(model, ids) -> dict:
    """Every hook point for one sequence, run padded to the context (causal: the first T positions are
    those of the unpadded run) and cut back to its T positions."""
    import jax.numpy as jnp
    import numpy as np
    T, ctx = len(ids), model.config.context
    _, cache = compiled().cache(model, jnp.asarray(_pad_right(np.asarray(ids)[None], ctx)))
    out = {}
    for name, value in cache.items():
        v = np.asarray(value, np.float64)
        if name == "positions":
            out[name] = v[:T]
        elif name.endswith((".scores", ".weights")):
            out[name] = v[..., :T, :T]
        elif name.endswith((".q", ".k", ".v", ".z")):
            out[name] = v[..., :T, :]
        else:
            out[name] = v[:, :T]
    return out
