"""Looking inside a model without editing it: counts, named intermediates, per-head weights,
ablations.

    logits, cache = run_with_cache(model, tokens)        # every hook point, by name
    cache["blocks.0.mixer.attention.weights"]            # [B, H, T, T] attention weights
    with ablate(model, heads={1: [0]}):                  # zero head 0 of block 1 after its softmax
        ablated = model(tokens)                          # the model is whole again after the block

Two ideas carry it: TransformerLens' `run_with_cache` (named intermediates) and penzai's
select/replace (an ablation swaps a part of the model and puts it back, even when the
body raises). Names are module paths with `hook_` dropped: `embed`, `positions`,
`blocks.{i}.resid_pre`, `blocks.{i}.mixer.{q,k,v,z}`, `blocks.{i}.mixer.attention.{scores,weights}`,
`blocks.{i}.mixer_in`, `blocks.{i}.mixer_out`, `blocks.{i}.resid_mid`, `blocks.{i}.ffn_in`,
`blocks.{i}.ffn_out`, `blocks.{i}.resid_post`,
`final`, `ln_final`, `logits` (`hook_names(model)` lists a model's own; docs/library.md maps
them to TransformerLens' names). The model as built computes every one of them.
"""
from __future__ import annotations

import contextlib
import fnmatch
from typing import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.errors import ConfigError
from attention_jax.fingerprint import Keyed
from attention_jax.swap import replaced, select, swap  # noqa: F401  (part of inspect's API)
from attention_jax.model import Bidirectional, Head, Hook, LanguageModel, MultiHeadAttention
from attention_jax.speed.swap import forms_of


def deterministic(model):
    """`model` as an analysis reads it: with dropout off. A model with dropout on is copied (the
    caller's is left as it is) and the copy set to eval mode; one without is returned itself."""
    if not any(isinstance(m, nnx.Dropout) and not m.deterministic
               for _, m in nnx.iter_modules(model)):
        return model
    graphdef, state = nnx.split(model)
    copy = nnx.merge(graphdef, state, copy=True)
    copy.eval()
    return copy


# --- hook points: named intermediates -------------------------------------------------------------

def hook_names(model) -> list[str]:
    """Every hook point this model computes, by its public name (one whose part is absent or
    switched off, such as `positions` under RoPE or `ln_final` without a final LayerNorm,
    is not listed)."""
    return [_public(path) for path, m in nnx.iter_modules(model)
            if isinstance(m, Hook) and _computed(model, path)]


def _computed(model, path) -> bool:
    """Whether the model's forward pass goes through the hook point at `path`: a patch or a record
    of one it skips would silently do nothing."""
    names = [str(p) for p in path]
    if "reference" in names:  # a twin's part as built (speed, kv_cache): reached through the twin
        return False
    if names == ["hook_positions"]:
        return model.config.positions in ("learned", "sinusoidal")
    if names == ["hook_ln_final"]:
        return model.ln_f is not None
    if len(names) == 3 and names[0] == "blocks" \
            and names[2].startswith(("hook_mixer_", "hook_ffn_")):
        block = model.blocks[int(names[1])]
        return (block.mixer if names[2].startswith("hook_mixer_") else block.ffn) is not None
    return True


def _public(path) -> str:
    *parent, last = [str(p) for p in path]
    return ".".join([*parent, last.removeprefix("hook_")])


def _hook_paths(model, patterns: Iterable[str] | None) -> dict[str, str]:
    """public name -> module path, for the hook points matching any pattern
    (fnmatch; None = all)."""
    found = {_public(path): ".".join(map(str, path)) for path, m in nnx.iter_modules(model)
             if isinstance(m, Hook) and _computed(model, path)}
    if patterns is None:
        return found
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    chosen = {n: p for n, p in found.items()
              if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)}
    missing = [pat for pat in patterns if not any(fnmatch.fnmatchcase(n, pat) for n in found)]
    if missing:
        fast = sorted(p for p, form in forms_of(model).items() if form != "reference")
        why = (f" ({', '.join(fast)} computed by a faster form: speed.fast is on, and scores and "
               "weights exist in the model as built only)" if fast else "")
        raise ConfigError(f"no hook point matches {', '.join(map(repr, missing))}{why}; this model "
                          f"has: {', '.join(found)}")
    return chosen


class Record(Hook):
    """Sows the value passing through (after the hook it replaced: a patch stays in force), for
    `nnx.capture`."""

    def __init__(self, inner: Hook | None = None):
        self.inner = inner or Hook()

    def __call__(self, x):
        x = self.inner(x)
        self.sow(nnx.Intermediate, "value", x)
        return x


class Patch(Hook):
    """Returns fn(value) instead of the value (applied after the hook it replaced). `fn` is held
    keyed by what it computes with (`fingerprint.Keyed`): a program compiled with one patch is not
    served to the same function reading other values (a global changed since)."""

    def __init__(self, fn: Callable, inner: Hook | None = None):
        self.fn, self.inner = Keyed(fn), inner or Hook()

    def __call__(self, x):
        return self.fn(self.inner(x))


def run_with_cache(model: LanguageModel, tokens, names: str | Iterable[str] | None = None):
    """(logits, {name: value}) for every hook point (or those matching `names`,
    fnmatch patterns)."""
    paths = _hook_paths(model, names)
    with replaced(model, {path: Record(select(model, path)) for path in paths.values()}):
        logits, sown = nnx.capture(model, nnx.Intermediate)(tokens)
    cache = {}
    for path, var in nnx.to_flat_state(sown):
        if path[-1] == "value" and not (len(path) > 1 and path[-2] == "inner"):
            cache[_public(path[:-1])] = var.get_value()[0]   # sow keeps a tuple
                                                             # of the calls' values
    return logits, {n: cache[n] for n in paths if n in cache}


@contextlib.contextmanager
def patched(model, patches: Mapping[str, Callable]):
    """Replace hook points' values by fn(value) inside the block: {"blocks.0.mixer.z": fn, ...}.

    Names are fnmatch patterns, as in `run_with_cache`: {"blocks.*.mixer.z": fn} patches every
    block. A hook point matched by two patterns is refused (which fn would win is unclear)."""
    chosen = {}
    for pattern, fn in patches.items():
        for name, path in _hook_paths(model, [pattern]).items():
            if name in chosen:
                raise ConfigError(f"hook point {name!r} is matched by two patches "
                                  f"({chosen[name][2]!r} and {pattern!r}); give it one")
            chosen[name] = (path, fn, pattern)
    with replaced(model, {path: Patch(fn, select(model, path)) for path, fn, _ in chosen.values()}):
        yield model


def _zero_heads(heads: list[int]):
    def fn(z):                                # z: [B, H, T, D_head]
        keep = jnp.ones(z.shape[-3], z.dtype).at[jnp.asarray(heads)].set(0)
        return z * keep[:, None, None]
    return fn


@contextlib.contextmanager
def ablate(model: LanguageModel, *, mixer: Iterable[int] = (), feed_forward: Iterable[int] = (),
           heads: Mapping[int, Iterable[int]] | None = None, positions: bool = False,
           bidirectional: bool = False):
    """Switch parts off inside the block, then restore the model (even when the body raises).

    mixer / feed_forward: blocks whose attention / MLP sub-layer is removed (the block skips
    it); heads: {block: [head, ...]} whose output is zeroed after the softmax (W_o's bias
    stays, as it belongs to no head); positions: the position vectors added to the tokens
    are zeroed; bidirectional: every attention sees the whole window, the future included.
    """
    mixer, feed_forward = _blocks("mixer", mixer), _blocks("feed_forward", feed_forward)
    if heads is not None and not isinstance(heads, Mapping):
        raise ConfigError(f"ablate(heads={heads!r}): give {{block: [head, ...]}}, e.g. "
                          f"heads={{0: [1]}}")
    heads = {block: _blocks(f"heads[{block}]", chosen) for block, chosen in (heads or {}).items()}
    removed = {f"blocks.{i}.mixer" for i in mixer}
    parts = dict.fromkeys(removed)
    parts.update({f"blocks.{i}.ffn": None for i in feed_forward})
    n = model.config.heads_used      # zeroing an index past the last head would silently do nothing
    for block, chosen in heads.items():
        bad = [h for h in chosen if not -n <= h < n]
        if bad:
            raise ConfigError(f"ablate(heads={{{block}: {sorted(chosen)}}}): block {block} has {n} "
                              f"head(s); head {bad[0]} does not exist (heads are 0 .. {n - 1})")
    patches = {f"blocks.{i}.mixer.z": _zero_heads(sorted(h)) for i, h in heads.items() if list(h)}
    if positions:
        if model.config.positions not in ("learned", "sinusoidal"):
            raise ConfigError(f"ablate(positions=True) zeroes the position vectors added to the "
                              f"tokens; this model's positions={model.config.positions!r} adds "
                              "none (RoPE rotates q and k, ALiBi biases the scores): compare with "
                              "a model trained without them instead")
        patches["positions"] = jnp.zeros_like
    if bidirectional and not attention_blocks(model):
        raise ConfigError(f"ablate(bidirectional=True) swaps attention's causal mask, and this "
                          f"model has no attention (mixer={model.config.mixer!r}): "
                          "there is no mask to swap")
    if bidirectional:   # the masks of attention that is kept (a removed mixer has none to swap)
        parts.update({f"{p}.attention.mask": Bidirectional() for p in attention_blocks(model)
                      if p not in removed})
    with replaced(model, parts), patched(model, patches):
        yield model


def _blocks(name: str, value) -> list[int]:
    """An ablation's list of block (or head) indices, or one line: a bare number is no list."""
    try:
        found = list(value)
    except TypeError:
        found = None
    if found is None or isinstance(value, (str, bytes)) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in found):
        raise ConfigError(f"ablate({name}={value!r}): give a list of whole numbers, "
                          f"e.g. {name}=[0]")
    return [int(i) for i in found]


def attention_blocks(model) -> list[str]:
    """The paths of the model's attention mixers, in order: ["blocks.0.mixer", ...]."""
    return [".".join(map(str, p)) for p, m in nnx.iter_modules(model)
            if isinstance(m, (Head, MultiHeadAttention))]


def head_weights(model: LanguageModel, block: int) -> dict[str, jax.Array]:
    """Block `block`'s projections per head: q, k, v [H, D, D_head] and o [H, D_head, D]
    (None without W_o)."""
    if not -len(model.blocks) <= block < len(model.blocks):
        raise ConfigError(f"block {block} does not exist: the model has {len(model.blocks)} "
                          f"(0 .. {len(model.blocks) - 1})")
    mixer = model.blocks[block].mixer
    if not isinstance(mixer, (Head, MultiHeadAttention)):
        raise ConfigError(f"block {block} has no attention heads (its mixer is "
                          f"{type(mixer).__name__})")
    return mixer.head_weights()


def logit_lens(model: LanguageModel, tokens) -> jax.Array:
    """[L + 1, B, T, V]: the logits the stream would give if it stopped after the embedding and
    after each block (through the model's own `unembed`: the final LayerNorm, the output layer);
    the last row is the model's own."""
    _, cache = run_with_cache(model, tokens, ["embed", "positions", "blocks.*.resid_post"])
    start = cache["embed"] + cache.get("positions", 0)
    streams = [start] + [cache[f"blocks.{i}.resid_post"] for i in range(len(model.blocks))]
    return jnp.stack([model.unembed(x) for x in streams])
