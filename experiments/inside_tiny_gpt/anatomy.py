"""Demos 1-3: parameters by formula, the forward pass from the raw weights, the residual stream."""
from __future__ import annotations

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from experiments.configs import GPT3
from experiments.inside_tiny_gpt.evaluate import cached_run, compiled


def param_parts(cfg: ModelConfig) -> list[tuple[str, str, int, bool]]:
    """(component, formula, count by formula, per block?) in the lecture's order (counts: params.components)."""
    from experiments.params import BLOCK_PARTS, components
    if cfg.mixer != "heads" or not cfg.feed_forward or not cfg.layer_norm or cfg.norm != "pre":
        raise ConfigError("the parameter demo reads a pre-norm GPT (heads, feed-forward, LayerNorm)")
    texts = {"token_embed": "V·d", "position_embed": "T·d", "ln1": "2d", "mixer.qkv": "d·3d + 3d",
             "mixer.out": "d·d + d", "ln2": "2d", "ffn.up": "d·4d + 4d", "ffn.down": "4d·d + d", "ln_f": "2d",
             "lm_head": "0 (tied)" if cfg.tie_embeddings else "d·V + V"}
    return [(name, texts[name], count, name in BLOCK_PARTS) for name, count in components(cfg).items()]


def framework_parts(model) -> dict[str, int]:
    """The same components counted by the framework (parameters.param_breakdown), per block where per block."""
    from attention_jax.parameters import param_breakdown
    top, out = param_breakdown(model), {}
    out["token_embed"], out["position_embed"] = top.get("token_embed", 0), top.get("position_embed", 0)
    out["ln_f"], out["lm_head"] = top.get("ln_f", 0), top.get("lm_head", 0)
    for i, block in enumerate(model.blocks):
        parts = param_breakdown(block)
        inner = {"ln1": parts.get("ln1", 0), "ln2": parts.get("ln2", 0),
                 **{f"mixer.{k}": v for k, v in param_breakdown(block.mixer).items()},
                 **{f"ffn.{k}": v for k, v in param_breakdown(block.ffn).items()}}
        for k, v in inner.items():
            out[f"blocks.{i}.{k}"] = v
    return out


def demo_params(model) -> tuple[list[dict], list[dict], dict]:
    from attention_jax.parameters import count_params
    cfg = model.config
    L, d, V, T = cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.max_positions_used
    counted = framework_parts(model)
    rows, formula_total = [], 0
    for name, text, n, per_block in param_parts(cfg):
        if per_block:
            fw = [counted.get(f"blocks.{i}.{name}", 0) for i in range(L)]
            fw_text = fw[0] if len(set(fw)) == 1 else "/".join(map(str, fw))
            rows.append(dict(part=f"each block: {name}", formula=text, by_formula=n, framework=fw_text,
                             equal=all(x == n for x in fw)))
            formula_total += L * n
        else:
            rows.append(dict(part=name, formula=text, by_formula=n, framework=counted.get(name, 0),
                             equal=counted.get(name, 0) == n))
            formula_total += n
    parts = param_parts(cfg)
    per_block = sum(n for _, _, n, pb in parts if pb)
    block0 = sum(v for k, v in counted.items() if k.startswith("blocks.0."))
    framework_total = count_params(cfg)
    rows.append(dict(part="one block", formula="12d² + 13d", by_formula=per_block, framework=block0,
                     equal=per_block == block0))
    rows.append(dict(part="total", formula="V·d + T·d + L·(12d² + 13d) + 2d", by_formula=formula_total,
                     framework=framework_total, equal=formula_total == framework_total, lecture=109_056))
    attn = sum(n for name, _, n, _ in parts if name.startswith("mixer."))
    ffn = sum(n for name, _, n, _ in parts if name.startswith("ffn."))
    embeds = V * d + (T * d if cfg.positions == "learned" else 0)
    shares = {"mlp_share_of_block": ffn / per_block, "attention_share_of_block": attn / per_block,
              "embeddings_share": embeds / framework_total, "untied_would_add": V * d,
              "untied_share": V * d / framework_total}
    L3, d3, V3, T3 = GPT3["n_layers"], GPT3["d_model"], GPT3["vocab_size"], GPT3["context"]
    blocks3, emb3 = 12 * L3 * d3 * d3, (V3 + T3) * d3
    gpt3 = [dict(part="blocks, 12·L·d²", count=blocks3, billions=blocks3 / 1e9, lecture="≈ 173.9 B"),
            dict(part="embeddings, (V + T)·d", count=emb3, billions=emb3 / 1e9, lecture="-"),
            dict(part="total", count=blocks3 + emb3, billions=(blocks3 + emb3) / 1e9, lecture="≈ 174.6 B"),
            dict(part="reported (GPT-3 paper)", count=int(GPT3["reported"]), billions=GPT3["reported"] / 1e9,
                 lecture="175 B")]
    shares["gpt3_embeddings_share"] = emb3 / (blocks3 + emb3)
    return rows, gpt3, shares


# --- demo 2: the forward pass from the raw weights ------------------------------------------

def raw_forward(model, ids, say=print):
    """Logits [T, V] for one sequence of ids, from the parameter arrays only (read with `param[...]`).

    Plain jnp, step by step as the lecture writes it: embeddings, L pre-norm blocks
    (LayerNorm -> q, k, v split into heads -> q·kᵀ/√d_h, -inf above the diagonal, softmax
    -> weighted values, heads concatenated, W_o -> residual add -> LayerNorm -> d -> 4d ->
    exact GELU -> d -> residual add), final LayerNorm, output layer (the token table's
    transpose when tied). No module's __call__ runs. `say(step, shape)` reports each step.
    """
    import jax.numpy as jnp
    cfg = model.config
    if (cfg.mixer != "heads" or not cfg.feed_forward or not cfg.layer_norm or cfg.norm != "pre"
            or cfg.positions not in ("learned", "none") or not cfg.residual or not cfg.scale):
        raise ConfigError("raw_forward reads a pre-norm GPT with learned (or no) positions, heads, "
                          "feed-forward, residuals and scaled scores")
    ids = jnp.asarray(ids)
    T = ids.shape[0]
    table = _array(model.token_embed.embedding)
    x = table[ids]
    if cfg.positions == "learned":
        x = x + _array(model.position_embed.embedding)[:T]
    say("x = token_table[ids] + position_table[:T]", x.shape)
    for i, block in enumerate(model.blocks):
        x = _raw_block(x, block, cfg, i, say)
    hf = _layer_norm(x, model.ln_f, cfg.ln_eps)
    if model.lm_head is None:
        logits = hf @ table.T
        say("logits = LayerNorm(x) · token_tableᵀ (tied)", logits.shape)
    else:
        logits = _linear(hf, model.lm_head)
        say("logits = LayerNorm(x) · W_out + b", logits.shape)
    return logits


def _array(param):
    return None if param is None else param[...]


def _layer_norm(x, ln, eps: float):
    import jax.numpy as jnp
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / jnp.sqrt(var + eps) * _array(ln.scale)
    return y if ln.bias is None else y + _array(ln.bias)


def _linear(x, dense):
    y = x @ _array(dense.kernel)
    return y if dense.bias is None else y + _array(dense.bias)


def _raw_block(x, block, cfg, i: int, say):
    """One pre-norm block of `raw_forward` on x [T, d]; the first block says each step, the others one line."""
    import jax
    import jax.numpy as jnp
    T, H, dh = x.shape[0], cfg.heads_used, cfg.d_head_used
    causal = jnp.tril(jnp.ones((T, T), bool))
    h = _layer_norm(x, block.ln1, cfg.ln_eps)
    qkv = _linear(h, block.mixer.qkv).reshape(T, 3, H, dh)          # columns (q|k|v, head, width)
    q, k, v = (qkv[:, j].transpose(1, 0, 2) for j in range(3))      # each [H, T, d_h]
    scores = q @ k.transpose(0, 2, 1) / jnp.sqrt(jnp.float32(dh))
    scores = jnp.where(causal, scores, -jnp.inf)
    e = jnp.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    z = (weights @ v).transpose(1, 0, 2).reshape(T, H * dh)         # heads side by side again
    attn = _linear(z, block.mixer.out)
    x = x + attn
    h2 = _layer_norm(x, block.ln2, cfg.ln_eps)
    up = _linear(h2, block.ffn.up)
    act = 0.5 * up * (1.0 + jax.scipy.special.erf(up / jnp.sqrt(jnp.float32(2.0))))
    x = x + _linear(act, block.ffn.down)
    if i == 0:
        say(f"block {i}: h = LayerNorm(x)", h.shape)
        say(f"block {i}: q, k, v = h·W_qkv + b, split into {H} heads", q.shape)
        say(f"block {i}: weights = softmax(q·kᵀ/√{dh}, -inf above the diagonal)", weights.shape)
        say(f"block {i}: heads' weighted values, concatenated, ·W_o + b", attn.shape)
        say(f"block {i}: x = x + attention", x.shape)
        say(f"block {i}: MLP up to {cfg.d_ff}, exact GELU", act.shape)
        say(f"block {i}: x = x + MLP(LayerNorm(x))", x.shape)
    else:
        say(f"block {i}: the same", x.shape)
    return x


def forward_check(model, ids, say=print) -> dict:
    """Raw forward vs the module on the same ids: max |diff| and the logits' scale.

    Both run with float32 matrix products (a GPU would otherwise use TF32 for both, each
    rounding in its own order).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    with jax.default_matmul_precision("float32"):
        mine = np.asarray(raw_forward(model, ids, say), np.float64)
        ref = np.asarray(compiled().forward(model, jnp.asarray(ids)[None])[0], np.float64)
    return {"max_abs_diff": float(np.abs(mine - ref).max()), "logit_scale": float(np.abs(ref).max()),
            "logits": mine}


# --- demo 3: the residual stream -----------------------------------------------------------------

def residual_norms(model, ids) -> list[dict]:
    """L2 norm of what each component writes into the stream and of the stream after it (last position, mean)."""
    import numpy as np
    cache = cached_run(model, ids)
    norm = lambda a: np.linalg.norm(np.asarray(a, np.float64)[0], axis=-1)    # [T]
    stream = np.asarray(cache["embed"], np.float64)
    if "positions" in cache:
        stream = stream + np.asarray(cache["positions"], np.float64)[None]
    rows = [dict(component="embed + positions", writes=norm(stream)[-1], stream=norm(stream)[-1],
                 writes_mean=norm(stream).mean(), lecture="-")]
    for i in range(len(model.blocks)):
        for part, out, after, label in (("mixer", "mixer_out", "resid_mid", "attention"),
                                        ("ffn", "ffn_out", "resid_post", "MLP")):
            key = f"blocks.{i}.{out}"
            if key not in cache:
                continue
            w = norm(cache[key])
            lecture = "4.8" if (label == "MLP" and i == len(model.blocks) - 1) else "1.3-1.5"
            rows.append(dict(component=f"block {i} {label}", writes=w[-1],
                             stream=norm(cache[f"blocks.{i}.{after}"])[-1], writes_mean=w.mean(), lecture=lecture))
    if "ln_final" in cache:
        rows.append(dict(component="final LayerNorm (read by the output)", writes=None,
                         stream=norm(cache["ln_final"])[-1], writes_mean=None, lecture="-"))
    return rows
