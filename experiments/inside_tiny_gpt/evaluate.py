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
    from attention_jax.analysis.inspect import patched, replaced, run_with_cache
    from attention_jax.model import CausalMask
    from attention_jax.speed import fast

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
        with fast(model):                                # as the engine computes it
            return model(x)

    @nnx.jit
    def forward_prefix(model, x, n):
        masks = {f"blocks.{i}.mixer.attention.mask": PrefixMask(n) for i in range(len(model.blocks))}
        with replaced(model, masks):
            return model(x)

    @nnx.jit
    def cache(model, x):
        return run_with_cache(model, x, ["embed", "positions", "blocks.*", "ln_final"])

    @nnx.jit
    def forward_heads(model, x, keep):
        """Heads switched off by a 0/1 mask keep [L, H] given as data: the product inspect.ablate(heads=...)
        applies to each head's output (blocks.i.mixer.z), but one compile serves every head."""
        zero = lambda i: lambda z: z * keep[i].astype(z.dtype)[:, None, None]
        with patched(model, {f"blocks.{i}.mixer.z": zero(i) for i in range(len(model.blocks))}), fast(model):
            return model(x)

    return Compiled(forward, forward_prefix, cache, forward_heads)


class Compiled(NamedTuple):
    forward: Callable             # (model, x [B, T]) -> logits
    forward_prefix: Callable      # (model, x, n) -> logits with every position seeing the first n
    cache: Callable               # (model, x) -> (logits, {hook name: value})
    forward_heads: Callable       # (model, x, keep [L, H]) -> logits with the heads where keep = 0 off


def _pad_right(a, width: int, value=0):
    import numpy as np
    a = np.asarray(a)
    return np.pad(a, [(0, 0), (0, width - a.shape[1])], constant_values=value)


def _batched(forward, model, x):
    """forward(model, x) over the rows of x [N, T] in batches of EVAL_ROWS (one shape), as numpy [N, ...]."""
    import jax.numpy as jnp
    import numpy as np
    from attention_jax.train.engine import in_batches
    x = np.asarray(x)
    return np.concatenate([np.asarray(forward(model, jnp.asarray(x[rows]))) for rows in in_batches(len(x), EVAL_ROWS)]
                          )[:len(x)]


def model_bits(model, x, y, forward: Callable | None = None) -> float:
    """Bits per character of `model` as it stands (ablations included) on windows x, y [W, T].

    `forward(model, x)`: the compiled forward pass (default `compiled().forward`).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from attention_jax.train.engine import in_batches
    forward = forward or compiled().forward
    x, y, total = np.asarray(x), np.asarray(y), 0.0
    for i, rows in enumerate(in_batches(len(x), EVAL_ROWS)):
        lp = jax.nn.log_softmax(forward(model, jnp.asarray(x[rows])).astype(jnp.float32), axis=-1)
        nll = -np.asarray(jnp.take_along_axis(lp, jnp.asarray(y[rows])[..., None], -1)[..., 0], np.float64)
        total += nll[: min(EVAL_ROWS, len(x) - i * EVAL_ROWS)].sum()
    return total / y.size / math.log(2)


def teacher_forced_accuracy(model, tok, world, forward: Callable | None = None) -> float:
    """Fact accuracy from one pass over prompt + answer (tiny_world.fact_batch): under a causal mask
    the same as greedy completion, since a right prefix is what greedy decoding would have fed."""
    from attention_jax.data import tiny_world as tw
    x, y, w = tw.fact_batch(tok, world)
    T = model.config.context
    logits = _batched(forward or compiled().forward, model, _pad_right(x, T))
    return tw.fact_accuracy_from_logits(logits, _pad_right(y, T), _pad_right(w, T, 0.0))


def greedy_completions(model, tok, world, *, bidirectional: bool = False, max_new: int = 10) -> dict:
    """{fact prompt: the max_new ids greedy decoding appends}, for every person's "\\n{name} lives in".

    `attention_jax.decoding.generate` decodes the causal model, the prompts of one length at once. It
    refuses a model that sees the future; `bidirectional` decodes that one here, each step's
    window padded on the right and every position seeing exactly the text so far.
    """
    import jax.numpy as jnp
    import numpy as np
    from attention_jax.data import tiny_world as tw
    from attention_jax.decoding.generate import generate
    T = model.config.context
    prompts = sorted({tw.fact_prompt(p)[0] for p in world.people})
    made: dict[str, np.ndarray] = {}
    for length in sorted({len(p) for p in prompts}):
        group = [p for p in prompts if len(p) == length]
        if length + max_new > T:
            raise ConfigError(f"a fact prompt of {length} characters leaves no room for {max_new} more in "
                              f"the {T}-character context")
        ids = np.stack([tok.encode(p) for p in group])
        if not bidirectional:
            out = np.stack(generate(model, ids, max_new, temperature=0))
        else:
            out, run = _pad_right(ids, T), compiled()
            for n in range(length, length + max_new):
                logits = _batched(lambda m, x: run.forward_prefix(m, x, jnp.int32(n)), model, out)
                out[:, n] = logits[:, n - 1].argmax(-1)
        made.update({p: out[i, length:length + max_new].copy() for i, p in enumerate(group)})
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
