"""The Mathematical Framework's analyses (Elhage et al. 2021), on the model's own weights.

    qk(model), ov(model)                  # each head's QK and OV circuits, [L, H, D, D], as factors
    full_ov(model).eigenvalues()          # through the embedding and unembedding: [L, H, V, V],
                                          # rank d_head
    copying_scores(model)                 # [L, H]: how much each head's OV circuit copies tokens
    composition_scores(model, "K")        # [L, H, L, H]: how much a later head reads an earlier
                                          # one's output
    direct_logit_attribution(model, tokens, answer, wrong)   # each component's share of a
                                                             # logit difference

A head's QK circuit W_Q W_Kᵀ says which residual directions attend to which; its OV circuit
W_V W_O what it writes when it does. Both are [D, D] of rank d_head and are kept as their two
factors (`Factored`), so nothing [V, V] is made unless `.full()` asks. Composition scores are
‖W_OV¹ · W²‖_F / (‖W_OV¹‖_F ‖W²‖_F) for a head of a later layer (W² its QK circuit for Q,
QKᵀ for K, OV for V), zero where the second head is not later; `composition_baseline` is the
same score between products of random matrices of those shapes. The circuits are the raw
weights: the LayerNorms between blocks and the biases are left out, as TransformerLens does.
They mean what they say only for a pre-norm model whose positions do not rotate its queries
and keys: RoPE (QK circuits) and post-norm (composition, attribution) are refused, each in one
line; ALiBi's QK circuits leave out its distance bias. docs/library.md says more.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from attention_jax.errors import ConfigError
from attention_jax.analysis.inspect import (attention_blocks, deterministic, head_weights,
                                            run_with_cache)
from attention_jax.layers import check_ids
from attention_jax.analysis.metrics import check_answers
from attention_jax.analysis.patching import Sweep


@dataclasses.dataclass(frozen=True)
class Factored:
    """A matrix kept as two factors, A [..., m, r] @ B [..., r, n] (r small): products, norms and
    eigenvalues from the factors, the full matrix only on request."""
    A: jax.Array
    B: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.A.shape[:-1], self.B.shape[-1])

    @property
    def T(self) -> "Factored":
        return Factored(jnp.swapaxes(self.B, -1, -2), jnp.swapaxes(self.A, -1, -2))

    def full(self) -> jax.Array:
        return self.A @ self.B

    def __matmul__(self, other: "Factored") -> "Factored":
        return Factored(self.A @ (self.B @ other.A), other.B)

    def left(self, m: jax.Array) -> "Factored":
        """m @ self, for a plain matrix m (an embedding)."""
        return Factored(m @ self.A, self.B)

    def right(self, m: jax.Array) -> "Factored":
        """self @ m, for a plain matrix m (an unembedding)."""
        return Factored(self.A, self.B @ m)

    def norm(self) -> jax.Array:
        """Frobenius norm over the last two axes: √tr((AᵀA)(BBᵀ)), from r×r products."""
        a, b = jnp.swapaxes(self.A, -1, -2) @ self.A, self.B @ jnp.swapaxes(self.B, -1, -2)
        return jnp.sqrt(jnp.maximum(jnp.sum(a * jnp.swapaxes(b, -1, -2), axis=(-2, -1)), 0.0))

    def eigenvalues(self) -> np.ndarray:
        """The r eigenvalues of A @ B that can be nonzero (those of B @ A), complex, [..., r]."""
        if self.A.shape[-2] != self.B.shape[-1]:
            raise ConfigError(f"eigenvalues need a square matrix; this one is {self.shape[-2:]}")
        return np.linalg.eigvals(np.asarray(self.B @ self.A, np.float64))


def _heads(model, *, rotates: bool = False) -> dict[str, jax.Array]:
    """Every block's W_Q, W_K, W_V [L, H, D, D_head] and W_O [L, H, D_head, D], or one
    line why not."""
    cfg = model.config
    if len(attention_blocks(model)) != cfg.n_layers:
        raise ConfigError("circuits need attention in every block; this model's mixer is "
                          f"{cfg.mixer!r}")
    if rotates and cfg.positions == "rope":
        raise ConfigError("positions='rope' rotates queries and keys by their positions, so "
                          "W_Q W_Kᵀ alone is no head's QK circuit; QK circuits and Q/K-composition "
                          "are defined for learned, sinusoidal, ALiBi or no positions (OV circuits "
                          "and V-composition hold for RoPE)")
    per = [head_weights(model, i) for i in range(cfg.n_layers)]
    eye = jnp.eye(cfg.d_model)[None]                                  # one head without W_o writes
                                                                      # what it reads
    o = [eye if w["o"] is None else w["o"] for w in per]
    return {"q": jnp.stack([w["q"] for w in per]), "k": jnp.stack([w["k"] for w in per]),
            "v": jnp.stack([w["v"] for w in per]), "o": jnp.stack(o)}


def qk(model) -> Factored:
    """Each head's QK circuit in the residual stream, W_Q W_Kᵀ: [L, H, D, D] (query side first)."""
    w = _heads(model, rotates=True)
    return Factored(w["q"], jnp.swapaxes(w["k"], -1, -2))


def ov(model) -> Factored:
    """Each head's OV circuit in the residual stream, W_V W_O: [L, H, D, D]."""
    w = _heads(model)
    return Factored(w["v"], w["o"])


def _unembedding(model) -> jax.Array:
    return model.token_embed.embedding[...].T if model.lm_head is None \
        else model.lm_head.kernel[...]


def full_qk(model) -> Factored:
    """Token to token: W_E W_Q W_Kᵀ W_Eᵀ, [L, H, V, V] (which token attends to which,
    positions aside)."""
    e = model.token_embed.embedding[...]
    return qk(model).left(e).right(e.T)


def full_ov(model) -> Factored:
    """Token to logit: W_E W_V W_O W_U, [L, H, V, V] (what attending to a token does
    to each logit)."""
    return ov(model).left(model.token_embed.embedding[...]).right(_unembedding(model))


def copying_scores(model) -> np.ndarray:
    """[L, H]: Σλ / Σ|λ| over the eigenvalues of each head's full OV circuit (real part): near 1
    for a head that raises the logit of the token it attends to (positive eigenvalues), near -1 for
    one that lowers it."""
    lam = full_ov(model).eigenvalues()
    return (lam.sum(-1) / np.abs(lam).sum(-1)).real


def _post_norm(model, what: str) -> None:
    if model.config.norm == "post":
        raise ConfigError(f"{what} adds up the residual stream's parts, and a post-norm model "
                          "normalises the stream after every block (no sum of its parts reaches "
                          "the next); use a pre-norm model")


def composition_scores(model, kind: str) -> np.ndarray:
    """[L, H, L, H]: Q-, K- or V-composition of head (l, h) into head (l', h'), for
    l < l' (else 0)."""
    if kind not in ("Q", "K", "V"):
        raise ConfigError(f"kind={kind!r}; choose 'Q', 'K' or 'V' composition")
    _post_norm(model, f"{kind}-composition")
    first = ov(model)
    second = {"Q": lambda: qk(model), "K": lambda: qk(model).T, "V": lambda: first}[kind]()
    scores = _scores(first, second)
    L = model.config.n_layers
    later = np.arange(L)[:, None, None, None] < np.arange(L)[None, None, :, None]
    return np.where(later, scores, 0.0)


def _scores(first: Factored, second: Factored) -> np.ndarray:
    """‖first[l, h] @ second[l', h']‖ / (‖first[l, h]‖ ‖second[l', h']‖) for every pair:
    [L, H, L', H']."""
    a = Factored(first.A[:, :, None, None], first.B[:, :, None, None])
    b = Factored(second.A[None, None], second.B[None, None])
    return np.asarray((a @ b).norm() / (a.norm() * b.norm()), np.float64)


def composition_baseline(d_model: int, d_head: int, *, samples: int = 1000,
                         seed: int = 0) -> tuple[float, float]:
    """(mean, std) of the composition score between two random rank-d_head products of Gaussian
    matrices [d_model, d_head][d_head, d_model]: what a pair of unrelated heads scores."""
    for name, value in (("d_model", d_model), ("d_head", d_head), ("samples", samples)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or value < (2 if name == "samples" else 1):
            raise ConfigError(f"composition_baseline({name}={value!r}): a whole number of at least "
                              f"{2 if name == 'samples' else 1} (a spread needs two samples)")
    keys = jax.random.split(jax.random.key(seed), 4)
    draw = lambda k, shape: jax.random.normal(k, (samples, *shape))
    one = Factored(draw(keys[0], (d_model, d_head)), draw(keys[1], (d_head, d_model)))
    two = Factored(draw(keys[2], (d_model, d_head)), draw(keys[3], (d_head, d_model)))
    s = np.asarray((one @ two).norm() / (one.norm() * two.norm()), np.float64)
    return float(s.mean()), float(s.std())


def direct_logit_attribution(model, tokens, answer, wrong, *, position: int = -1,
                             by: str = "component") -> Sweep:
    """Each part of the final residual stream's share of logit[answer] - logit[wrong] at `position`,
    through the final LayerNorm with its scale frozen at the run's (as TransformerLens does), mean
    over the batch. `by="component"`: embed, positions, then each block's attention and MLP outputs;
    `by="head"`: each head's output, [L, H], without what it adds whatever it attends to (W_O's
    bias, and `value_bias` through W_O, since a row of weights sums to 1), as TransformerLens
    counts. The parts, with the biases and the LayerNorm's shift, add up to the logit difference
    itself. Dropout is off (`inspect.deterministic`)."""
    _post_norm(model, "direct logit attribution")
    if not model.config.residual:
        raise ConfigError("direct logit attribution adds up the residual stream's parts, and this "
                          "model has residual=False: each block replaces the stream, so no sum of "
                          "parts reaches the logits; use a residual model")
    if by not in ("component", "head"):
        raise ConfigError(f"by={by!r}; choose 'component' or 'head'")
    model, tokens = deterministic(model), np.asarray(tokens)
    if tokens.ndim != 2 or not tokens.size:
        raise ConfigError("tokens must be [B, T] token ids with B, T >= 1, got "
                          f"shape {tokens.shape}")
    check_ids(tokens, model.config.vocab_size)
    if not -tokens.shape[1] <= position < tokens.shape[1]:
        raise ConfigError(f"position={position} is outside the text's {tokens.shape[1]} positions")
    check_answers(answer, wrong, tokens.shape[0], model.config.vocab_size)
    tokens = jnp.asarray(tokens)
    names = ["embed", "final"] + \
        (["positions"] if model.config.positions in ("learned", "sinusoidal") else []) + \
        (["blocks.*.mixer.z"] if by == "head"
         else [n for n in ("blocks.*.mixer_out", "blocks.*.ffn_out") if _has(model, n)])
    _, cache = run_with_cache(model, tokens, names)
    rows = jnp.arange(tokens.shape[0])
    direction = _unembedding(model)[:, jnp.broadcast_to(jnp.asarray(answer), rows.shape)] - \
        _unembedding(model)[:, jnp.broadcast_to(jnp.asarray(wrong), rows.shape)]     # [D, B]
    final = cache["final"][:, position]                                              # [B, D]
    eps = model.config.ln_eps
    scale = jnp.sqrt(jnp.var(final, axis=-1, keepdims=True) + eps) if model.ln_f is not None \
        else 1.0
    gain = model.ln_f.scale[...] if model.ln_f is not None else jnp.ones(final.shape[-1])

    def attribute(part):   # [..., B, D] at the position -> [...], mean over the batch
        centred = part - (jnp.mean(part, axis=-1, keepdims=True) if model.ln_f is not None else 0.0)
        return jnp.mean(jnp.sum(centred / scale * gain * direction.T, axis=-1), axis=-1)

    if by == "head":
        w = _heads(model)
        z = jnp.stack([cache[f"blocks.{i}.mixer.z"][:, :, position]
                       - value_bias(model, i)[:, None].swapaxes(0, 1)
                       for i in range(model.config.n_layers)])   # [L, B, H, D_head]
        per_head = jnp.einsum("LBHd,LHdD->LHBD", z, w["o"])      # [L, H, B, D]
        return Sweep(np.asarray(attribute(per_head), np.float64), ("layer", "head"), "head_output",
                     "direct")
    named = [("embed", cache["embed"][:, position])]             # (label, [B, D])
    if "positions" in cache:
        named.append(("positions", jnp.broadcast_to(cache["positions"][position], final.shape)))
    named += [(f"{i}.{part}", cache[f"blocks.{i}.{part}"][:, position])
              for i in range(model.config.n_layers) for part in ("mixer_out", "ffn_out")
              if f"blocks.{i}.{part}" in cache]
    labels, parts = zip(*named)
    return Sweep(np.asarray(attribute(jnp.stack(parts)), np.float64), ("component",), "component",
                 "direct", labels)


def value_bias(model, block: int) -> jax.Array:
    """Block `block`'s value bias per head, [H, D_head]: what every position's value holds whatever
    its token (the projection's bias, and the pre-norm LayerNorm's shift through W_V); zeros
    without either."""
    mixer, cfg = model.blocks[block].mixer, model.config
    bias = mixer.head_biases()["v"]
    ln = model.blocks[block].ln1
    if ln is not None and ln.bias is not None and cfg.norm == "pre":
        bias = bias + jnp.einsum("D,HDd->Hd", ln.bias[...], mixer.head_weights()["v"])
    return bias


def _has(model, pattern: str) -> bool:
    """Whether some hook point of the model matches `pattern`."""
    import fnmatch
    from attention_jax.analysis.inspect import hook_names
    return any(fnmatch.fnmatchcase(n, pattern) for n in hook_names(model))


# --- what heads attend to, on repeated text (Olsson et al. 2022) ----------------------------------

def prefix_matching(weights, first, span) -> jax.Array:
    """[H]: each head's mean weight, from every token of a repeated segment's second copy, on the
    token after that token's earlier occurrence (t - span + 1): an induction head's signature, 1 at
    most. `weights` [B, H, T, T] on sequences whose first copy starts at `first` [B] and spans
    `span` [B] (`data.repeats.repeated_segments`)."""
    T, B = weights.shape[-1], weights.shape[0]
    first, span = np.asarray(first), np.asarray(span)
    if weights.ndim != 4 or first.shape != (B,) or span.shape != (B,) or not (
            np.issubdtype(first.dtype, np.integer) and np.issubdtype(span.dtype, np.integer)):
        raise ConfigError(f"prefix_matching needs weights [B, H, T, T] and whole numbers first and "
                          f"span, one per text ([{B}]); got weights {tuple(weights.shape)}, first "
                          f"{first.shape}, span {span.shape}")
    if (first < 0).any() or (span < 1).any() or (first + 2 * span > T).any():
        raise ConfigError(f"each text's repeated segment must lie in its {T} positions: "
                          f"first >= 0, span >= 1, first + 2 * span <= {T}; got first "
                          f"{first.tolist()}, span {span.tolist()}")
    t = jnp.arange(T)[None, :]
    first, span = jnp.asarray(first)[:, None], jnp.asarray(span)[:, None]
    in_copy = (t >= first + span) & (t < first + 2 * span)                       # [B, T]
    key = jnp.clip(t - span + 1, 0, T - 1)
    picked = jnp.take_along_axis(weights, jnp.broadcast_to(key[:, None, :, None],
                                                           (*weights.shape[:-1], 1)),
                                 axis=-1)[..., 0]                                # [B, H, T]
    return jnp.sum(picked * in_copy[:, None], axis=(0, 2)) / jnp.maximum(jnp.sum(in_copy), 1)


def previous_token(weights) -> jax.Array:
    """[H]: each head's mean weight on the token just before the query (t - 1), over
    every t >= 1."""
    return jnp.mean(jnp.diagonal(weights, offset=-1, axis1=-2, axis2=-1), axis=(0, -1))
