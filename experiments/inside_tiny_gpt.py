"""Inside a tiny GPT: the lecture's demos on a char-level model trained on a generated world.

    python -m experiments.inside_tiny_gpt [--preset smoke|cpu|paper] [--steps N] [--lr X] [--batch-size N]
                                          [--seeds N] [--world-seed N] [--fresh] [--no-progress] [--out DIR]

The lecture's model (experiments.configs.TINY_GPT: 2 layers, d 64, 4 heads, context 96,
tied output, biases; 109,056 parameters over the 44-symbol alphabet) is trained on random
96-character windows of the tiny world's training text (attention_jax.data.tiny_world:
40 people in 8 cities, facts, questions, reviews) and cached by the row cache: a rerun
reopens the checkpoint instead of training. Then, in the lecture's order, each demo is
printed and saved: parameters by formula against the framework's count (and GPT-3 by
12·L·d²); a forward pass from the raw weight arrays alone, shapes printed at every step,
against the module's logits; the residual stream's norm after each component; where the
heads look on a fact question (exact zeros on the future, top-3 positions, weight on the
name, ASCII and PNG heatmaps); why scores are divided by √d (random vectors, then the
trained model's own scores); and ablations (positions zeroed, each layer's attention or
MLP off, each head off, causal -> bidirectional) with validation bits per character and
fact-completion accuracy, beside the lecture's figures.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from typing import Callable, NamedTuple

from attention_jax.config import ModelConfig, TrainConfig
from attention_jax.errors import ConfigError
from attention_jax.harness import report
from attention_jax.harness.experiment import Experiment, Result
from experiments.configs import TINY_GPT

NAME = "inside_tiny_gpt"
ROW = "tiny_gpt"
CONFIG = TINY_GPT
PRESETS = {
    # A GPU/TPU budget: twice the cpu preset's steps at twice its batch.
    "paper": TrainConfig(steps=3000, batch_size=64, lr=1e-2, warmup_steps=100, schedule="cosine",
                         checkpoint_every=500, eval_every=250, train_eval_windows=97, eval_batch=128),
    # About a minute of training on 2 cores (README, "Choosing the cpu budget" of this section).
    "cpu": TrainConfig(steps=1500, batch_size=32, lr=1e-2, warmup_steps=100, schedule="cosine",
                       checkpoint_every=500, train_eval_windows=97, eval_batch=128),
    "smoke": TrainConfig(steps=12, batch_size=8, lr=3e-3, checkpoint_every=12, log_every=6,
                         train_eval_windows=16, eval_batch=128),
}
SQRT_D_ROWS = {"smoke": 200, "cpu": 2000, "paper": 2000}   # random query rows per d_k (the lecture: 2000)
SQRT_D_DIMS, SQRT_D_KEYS, SQRT_D_SEED = (4, 16, 64, 256, 1024), 96, 4
SHADES = " .:-=+*#%@"                                       # the lecture's ten levels, 0.1 apart
REVIEW = "\nreview: the soup was tasty and the host was kind."
GPT3 = dict(n_layers=96, d_model=12288, vocab_size=50257, context=2048, reported=175e9)

# The lecture's figures (its demo 5 table and notes), beside ours: (bits/char, fact accuracy).
LECTURE = {"intact": (0.409, 0.93), "uniform": (5.459, 0.0), "positions": (5.022, 0.0),
           "attention 0": (6.799, None), "attention 1": (1.348, 0.05), "mlp 0": (5.499, None),
           "mlp 1": (None, None), "bidirectional": (7.528, None)}
LECTURE_SQRT_D = {4: "std 2.0", 16: "std 4.0", 64: "std 8.0; 18% rows > 0.99", 256: "std 16.0",
                  1024: "std 32.0; mean max 0.94, ~70% rows > 0.99"}


# --- the data: the tiny world as a Task ------------------------------------------------------

def world_data(world_seed: int = 0):
    """(world, tokenizer, train ids, val ids) of the generated world."""
    from attention_jax.data import tiny_world as tw
    world, tok = tw.build_world(tw.WorldSpec(), seed=world_seed), tw.CharTokenizer()
    if tok.vocab_size != CONFIG.vocab_size:
        raise ConfigError(f"the alphabet has {tok.vocab_size} symbols but the model's vocab_size is "
                          f"{CONFIG.vocab_size}; make them agree")
    return world, tok, tok.encode(world.train_text), tok.encode(world.val_text)


def identity(world, world_seed: int) -> dict:
    """What the row was trained on: a changed spec, seed, alphabet or generator retrains it."""
    from attention_jax.data import tiny_world as tw
    text = hashlib.sha256((world.train_text + "\0" + world.val_text).encode()).hexdigest()[:16]
    return {"data": "tiny_world", "spec": dataclasses.asdict(tw.WorldSpec()), "world_seed": world_seed,
            "alphabet": tw.ALPHABET, "text_sha256": text}


def bits(total, count):
    import numpy as np
    return np.asarray(total, np.float64) / np.asarray(count, np.float64) / math.log(2)


def make_task(world, tok, train_ids, val_ids, tc: TrainConfig, context: int, ident: dict):
    """Random `context`-char windows from (seed, step); validation bits/char and fact accuracy."""
    import numpy as np
    from attention_jax.data import eval_windows, get_batch
    from attention_jax.data import tiny_world as tw
    from attention_jax.train import Task
    vx, vy = eval_windows(val_ids, context)
    tx, ty = eval_windows(train_ids, context, max_windows=tc.train_eval_windows)
    fx, fy, fw = tw.fact_batch(tok, world)

    def sample(seed: int, step: int) -> dict:
        x, y = get_batch(train_ids, seed=seed, step=step, batch_size=tc.batch_size, context=context)
        return {"x": x, "y": y}

    def evaluate(engine, state) -> dict:
        logits = np.asarray(engine.logits(state, fx))
        logits = logits[None] if logits.ndim == 3 else logits            # [seeds, people, T, V]
        return {"val_bpc": bits(*engine.nll(state, vx, vy)), "train_bpc": bits(*engine.nll(state, tx, ty)),
                "fact_acc": np.array([tw.fact_accuracy_from_logits(lg, fy, fw) for lg in logits])}

    return Task(sample, evaluate, ident)


# --- demo 1: parameters ------------------------------------------------------------------------

def param_parts(cfg: ModelConfig) -> list[tuple[str, str, int, bool]]:
    """(component, formula, count by formula, per block?) in the lecture's order, read off the architecture."""
    if cfg.mixer != "heads" or not cfg.feed_forward or not cfg.layer_norm or cfg.norm != "pre":
        raise ConfigError("the parameter demo reads a pre-norm GPT (heads, feed-forward, LayerNorm)")
    V, T, d, f, w = cfg.vocab_size, cfg.position_rows, cfg.d_model, cfg.d_ff, cfg.num_heads * cfg.head_dim
    b, qb = int(cfg.bias), int(cfg.qkv_bias)
    ln = d + d * b
    return [("token_embed", "V·d", V * d, False),
            ("position_embed", "T·d", T * d if cfg.positions == "learned" else 0, False),
            ("ln1", "2d", ln, True),
            ("mixer.qkv", "d·3d + 3d", d * 3 * w + 3 * w * qb, True),
            ("mixer.out", "d·d + d", w * d + d * b, True),
            ("ln2", "2d", ln, True),
            ("ffn.up", "d·4d + 4d", d * f + f * b, True),
            ("ffn.down", "4d·d + d", f * d + d * b, True),
            ("ln_f", "2d", ln, False),
            ("lm_head", "0 (tied)" if cfg.tie_embeddings else "d·V + V",
             0 if cfg.tie_embeddings else d * V + V * b, False)]


def framework_parts(model) -> dict[str, int]:
    """The same components counted by the framework (inspect.param_breakdown), per block where per block."""
    from attention_jax.inspect import param_breakdown
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
    from attention_jax.inspect import count_params
    cfg = model.config
    L, d, V, T = cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.position_rows
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
    import jax
    import jax.numpy as jnp
    cfg = model.config
    if (cfg.mixer != "heads" or not cfg.feed_forward or not cfg.layer_norm or cfg.norm != "pre"
            or cfg.positions not in ("learned", "none") or not cfg.residual or not cfg.scale):
        raise ConfigError("raw_forward reads a pre-norm GPT with learned (or no) positions, heads, "
                          "feed-forward, residuals and scaled scores")
    H, dh = cfg.num_heads, cfg.head_dim
    ids = jnp.asarray(ids)
    T = ids.shape[0]
    get = lambda p: None if p is None else p[...]

    def layer_norm(x, ln):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        y = (x - mu) / jnp.sqrt(var + cfg.ln_eps) * get(ln.scale)
        return y if ln.bias is None else y + get(ln.bias)

    def linear(x, dense):
        y = x @ get(dense.kernel)
        return y if dense.bias is None else y + get(dense.bias)

    table = get(model.token_embed.embedding)
    x = table[ids]
    if cfg.positions == "learned":
        x = x + get(model.position_embed.embedding)[:T]
    say("x = token_table[ids] + position_table[:T]", x.shape)
    causal = jnp.tril(jnp.ones((T, T), bool))
    for i, block in enumerate(model.blocks):
        first = i == 0
        h = layer_norm(x, block.ln1)
        qkv = linear(h, block.mixer.qkv).reshape(T, 3, H, dh)          # columns (q|k|v, head, width)
        q, k, v = (qkv[:, j].transpose(1, 0, 2) for j in range(3))      # each [H, T, d_h]
        scores = q @ k.transpose(0, 2, 1) / jnp.sqrt(jnp.float32(dh))
        scores = jnp.where(causal, scores, -jnp.inf)
        e = jnp.exp(scores - scores.max(-1, keepdims=True))
        weights = e / e.sum(-1, keepdims=True)
        z = (weights @ v).transpose(1, 0, 2).reshape(T, H * dh)         # heads side by side again
        attn = linear(z, block.mixer.out)
        x = x + attn
        h2 = layer_norm(x, block.ln2)
        up = linear(h2, block.ffn.up)
        act = 0.5 * up * (1.0 + jax.scipy.special.erf(up / jnp.sqrt(jnp.float32(2.0))))
        x = x + linear(act, block.ffn.down)
        if first:
            say(f"block {i}: h = LayerNorm(x)", h.shape)
            say(f"block {i}: q, k, v = h·W_qkv + b, split into {H} heads", q.shape)
            say(f"block {i}: weights = softmax(q·kᵀ/√{dh}, -inf above the diagonal)", weights.shape)
            say(f"block {i}: heads' weighted values, concatenated, ·W_o + b", attn.shape)
            say(f"block {i}: x = x + attention", x.shape)
            say(f"block {i}: MLP up to {cfg.d_ff}, exact GELU", act.shape)
            say(f"block {i}: x = x + MLP(LayerNorm(x))", x.shape)
        else:
            say(f"block {i}: the same", x.shape)
    hf = layer_norm(x, model.ln_f)
    if model.lm_head is None:
        logits = hf @ table.T
        say("logits = LayerNorm(x) · token_tableᵀ (tied)", logits.shape)
    else:
        logits = linear(hf, model.lm_head)
        say("logits = LayerNorm(x) · W_out + b", logits.shape)
    return logits


def forward_check(model, ids, say=print) -> dict:
    """Raw forward vs the module on the same ids: max |diff| and the logits' scale."""
    import jax.numpy as jnp
    import numpy as np
    mine = np.asarray(raw_forward(model, ids, say), np.float64)
    ref = np.asarray(compiled().forward(model, jnp.asarray(ids)[None])[0], np.float64)
    return {"max_abs_diff": float(np.abs(mine - ref).max()), "logit_scale": float(np.abs(ref).max()),
            "logits": mine}


def softmax_np(x):
    import numpy as np
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


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


# --- demo 4: attention ------------------------------------------------------------------------

def ascii_heatmap(weights, labels, shades: str = SHADES) -> str:
    """Rows = query positions, columns = key positions; each weight as one of ten shades (0.1 apart).

    Only the value decides the shade, so the blank upper triangle of a causal head is its
    exact zeros, not something drawn in.
    """
    import numpy as np
    w = np.asarray(weights, np.float64)
    labels = [str(c) for c in labels]
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] != len(labels):
        raise ConfigError(f"ascii_heatmap needs a square [T, T] matrix and T labels, got {w.shape} "
                          f"and {len(labels)} labels")
    top = len(shades) - 1
    level = np.clip(np.floor(w * len(shades)), 0, top).astype(int)    # the lecture's min(9, int(10 w))
    lines = ["     " + "".join(c[:1] for c in labels)]
    for i, row in enumerate(level):
        lines.append(f"  {labels[i][:1]:>1}  " + "".join(shades[k] for k in row))
    return "\n".join(lines)


def heatmap_figure(matrices: dict, labels, title: str, *, ncols: int = 4, highlight=()):
    """One panel per named [T, T] weight matrix, characters on both axes; `highlight` marks key columns."""
    import numpy as np
    n = len(matrices)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    T = len(labels)
    from matplotlib.figure import Figure
    fig = Figure(figsize=(3.6 * ncols + 1.2, 3.5 * nrows + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    ticks = [("\\n" if c in ("\n", "⏎") else ("␣" if c == " " else c)) for c in labels]
    image = None
    for k, (ax, (name, w)) in enumerate(zip(axes, matrices.items())):
        image = ax.imshow(np.asarray(w), cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        bottom, left = k + ncols >= n, k % ncols == 0       # characters on the outer panels only
        ax.set_xticks(range(T), ticks if bottom else [], fontsize=5, rotation=90)
        ax.set_yticks(range(T), ticks if left else [], fontsize=5)
        if bottom:
            ax.set_xlabel("key position (attended to)", fontsize=7)
        if left:
            ax.set_ylabel("query position", fontsize=7)
        for j in highlight:
            ax.axvline(j, color="cyan", linewidth=0.4, alpha=0.5)
    for ax in axes[n:]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=list(axes[:n]), shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=10)
    return fig


def attention_demo(model, tok, name: str) -> dict:
    """Every head's weights on the question about `name`: future mass, top-3 of the last row, weight on the name."""
    import numpy as np
    from attention_jax.data import tiny_world as tw
    prompt, name_pos = tw.question_prompt(name)
    ids = tok.encode(prompt)
    cache = cached_run(model, ids)
    layers = [np.asarray(cache[f"blocks.{i}.mixer.weights"], np.float64)[0] for i in range(len(model.blocks))]
    T = len(ids)
    upper = np.triu(np.ones((T, T), bool), 1)
    future = np.concatenate([a[:, upper].ravel() for a in layers])
    chars = list(tw.show(prompt))
    heads = []
    for i, a in enumerate(layers):
        for h in range(a.shape[0]):
            row = a[h, -1]
            top = np.argsort(-row, kind="stable")[:3]
            heads.append(dict(head=f"{i}.{h}", layer=i, index=h,
                              top3="  ".join(f"{chars[j]!r}@{j}:{row[j]:.2f}" for j in top),
                              on_name=float(row[name_pos].sum()), on_self=float(row[-1]), max=float(row.max())))
    best = max(heads, key=lambda r: r["on_name"])
    return dict(prompt=prompt, chars=chars, name_positions=name_pos, layers=layers, heads=heads, best=best,
                future_sum=float(future.sum()), future_max=float(future.max()) if future.size else 0.0,
                future_entries=int(future.size))


# --- demo 5: why divide by √d -----------------------------------------------------------------

def sqrt_d_random(rows: int, dims=SQRT_D_DIMS, keys: int = SQRT_D_KEYS, seed: int = SQRT_D_SEED) -> list[dict]:
    """q, k ~ N(0, 1) per component, `rows` queries against `keys` keys each, for every d_k."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for dk in dims:
        s_parts, chunk = [], max(1, 2_000_000 // (keys * dk))       # bounded memory at d_k = 1024
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            q = rng.standard_normal((n, 1, dk), dtype=np.float32)
            k = rng.standard_normal((n, keys, dk), dtype=np.float32)
            s_parts.append((q * k).sum(-1, dtype=np.float64))
        s = np.concatenate(s_parts)                                 # [rows, keys]
        raw, scaled = softmax_np(s).max(-1), softmax_np(s / math.sqrt(dk)).max(-1)
        out.append(dict(d_k=dk, std=float(s.std()), sqrt_d=math.sqrt(dk), raw_max=float(raw.mean()),
                        scaled_max=float(scaled.mean()), saturated=float((raw > 0.99).mean()),
                        scaled_saturated=float((scaled > 0.99).mean()), lecture=LECTURE_SQRT_D.get(dk, "-")))
    return out


def entropy_rows(weights, mask):
    """Mean entropy (nats) of the softmax rows."""
    import numpy as np
    w = np.where(mask, weights, 0.0)
    return float(-(w * np.log(np.where(w > 0, w, 1.0))).sum(-1).mean())


def sqrt_d_trained(model, ids) -> list[dict]:
    """Per layer: std of the real scores with and without the √d division, and the rows' entropy both ways."""
    import numpy as np
    cache = cached_run(model, ids)
    T, dh = len(ids), model.config.head_dim
    causal = np.tril(np.ones((T, T), bool))
    uniform = float(np.mean(np.log(np.arange(1, T + 1))))
    out = []
    for i in range(len(model.blocks)):
        s = np.asarray(cache[f"blocks.{i}.mixer.scores"], np.float64)[0]          # [H, T, T], divided by √d_h
        seen = s[:, causal]
        rows = []
        for scale in (1.0, math.sqrt(dh)):                                         # as trained / without ÷√d
            masked = np.where(causal, s * scale, -np.inf)
            w = softmax_np(masked)
            rows.append((entropy_rows(w, causal), float(w.max(-1).mean()), float((w.max(-1) > 0.99).mean())))
        out.append(dict(layer=i, std_scaled=float(seen.std()), std_unscaled=float((seen * math.sqrt(dh)).std()),
                        entropy=rows[0][0], entropy_unscaled=rows[1][0], uniform_entropy=uniform,
                        max_weight=rows[0][1], max_weight_unscaled=rows[1][1], saturated_unscaled=rows[1][2]))
    return out


# --- compiled forward passes (one compile per model structure, shared by every demo) ------------

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
    from attention_jax.inspect import patched, replaced, run_with_cache
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


# --- demo 6: ablations ---------------------------------------------------------------------------

def ablation_list(cfg: ModelConfig) -> list[tuple[str, str, dict]]:
    """(key, description, inspect.ablate keywords): the lecture's five, then every single head."""
    out = [("intact", "the trained model", {}),
           ("positions", "position vectors zeroed", {"positions": True})]
    out += [(f"attention {i}", f"layer {i}'s attention off", {"mixer": [i]}) for i in range(cfg.n_layers)]
    out += [(f"mlp {i}", f"layer {i}'s MLP off", {"feed_forward": [i]}) for i in range(cfg.n_layers)]
    out += [("bidirectional", "causal -> bidirectional mask", {"bidirectional": True})]
    out += [(f"head {i}.{h}", f"head {i}.{h} off (its output zeroed)", {"heads": {i: [h]}})
            for i in range(cfg.n_layers) for h in range(cfg.num_heads)]
    return out


def head_mask(cfg: ModelConfig, heads: dict):
    """keep [L, H] float32: 0 for the heads {block: [head, ...]} to switch off, 1 elsewhere."""
    import numpy as np
    keep = np.ones((cfg.n_layers, cfg.num_heads), np.float32)
    for block, hs in heads.items():
        keep[block, list(hs)] = 0.0
    return keep


def run_ablations(models, tok, world, vx, vy) -> list[dict]:
    """Every ablation (inspect.ablate) on every seed's model: validation bits/char and fact accuracy.

    Fact accuracy is teacher-forced under a causal mask (= greedy, checked on the intact
    model by the caller) and greedy decoding for the bidirectional row, where a teacher-forced
    pass would show the model the answer.
    """
    import numpy as np
    from attention_jax.inspect import ablate
    cfg = models[0].config
    rows = []
    for key, label, kw in ablation_list(cfg):
        bpc, acc = [], []
        for model in models:
            if set(kw) == {"heads"}:      # as data: one compile for every head (test: = inspect.ablate)
                keep = head_mask(cfg, kw["heads"])
                forward = lambda m, x: compiled().forward_heads(m, x, keep)
                bpc.append(model_bits(model, vx, vy, forward))
                acc.append(teacher_forced_accuracy(model, tok, world, forward))
                continue
            with ablate(model, **kw):
                bpc.append(model_bits(model, vx, vy))
                acc.append(greedy_accuracy(model, tok, world, bidirectional=True) if kw.get("bidirectional")
                           else teacher_forced_accuracy(model, tok, world))
        lec = LECTURE.get(key, (None, None))
        rows.append(dict(key=key, ablation=label, bpc=float(np.mean(bpc)), bpc_seeds=bpc,
                         bpc_std=float(np.std(bpc, ddof=1)) if len(bpc) > 1 else 0.0,
                         acc=float(np.mean(acc)), acc_seeds=acc, lecture_bpc=lec[0], lecture_acc=lec[1]))
    base = rows[0]["bpc"]
    for r in rows:
        r["change"] = r["bpc"] - base if r["key"] != "intact" else None
    uniform = math.log2(cfg.vocab_size)
    rows.insert(1, dict(key="uniform", ablation=f"uniform over {cfg.vocab_size} symbols (nothing learned)",
                        bpc=uniform, bpc_seeds=[uniform] * len(models), acc=0.0, acc_seeds=[0.0] * len(models),
                        change=uniform - base, lecture_bpc=LECTURE["uniform"][0], lecture_acc=LECTURE["uniform"][1]))
    return rows


# --- claims ------------------------------------------------------------------------------------

def ablation_claims(r: dict) -> list[dict]:
    """The ablation claims on {key: row} (seed means, or one seed's figures under claims_across_seeds)."""
    out = []
    full = r["intact"]
    if "positions" in r:
        cost = r["positions"]["bpc"] - full["bpc"]
        out.append(report.claim("zeroing the positions costs bits/char", cost > 0,
                                f"{r['positions']['bpc']:.3f} vs {full['bpc']:.3f} bits/char (+{cost:.3f}; "
                                f"lecture 5.022 vs 0.409)", cost))
    layers = sorted(k for k in r if k.startswith("attention "))
    if layers:
        worst = min(layers, key=lambda k: r[k]["acc"])
        half = 0.5 * full["acc"]
        out.append(report.claim("one layer's attention off drops fact accuracy by more than half",
                                r[worst]["acc"] < half,
                                ", ".join(f"{k} off {r[k]['acc']:.3f}" for k in layers)
                                + f" vs intact {full['acc']:.3f} (lecture: attention 1 off 0.05 vs 0.93)",
                                half - r[worst]["acc"]))
    if "bidirectional" in r:
        worse = r["bidirectional"]["bpc"] - full["bpc"]
        out.append(report.claim("the bidirectional mask does worse than causal on validation", worse > 0,
                                f"{r['bidirectional']['bpc']:.3f} vs {full['bpc']:.3f} bits/char "
                                f"(lecture 7.528 vs 0.409)", worse))
    return out


# --- figures -----------------------------------------------------------------------------------

def ablation_figure(rows: list[dict], title: str):
    import numpy as np
    fig, (ax1, ax2) = report.figure(ncols=2, size=(12, 0.32 * len(rows) + 2.2), sharey=True)
    ys = np.arange(len(rows))
    ax1.barh(ys, [r["bpc"] for r in rows], color="C0", label="ours")
    lec = [(i, r["lecture_bpc"]) for i, r in enumerate(rows) if r.get("lecture_bpc") is not None]
    ax1.plot([v for _, v in lec], [i for i, _ in lec], "kx", markersize=8, label="lecture")
    ax1.set_yticks(ys, [r["key"] for r in rows])
    ax1.invert_yaxis()
    ax1.set(xlabel="validation bits per character (lower is better)", ylabel="ablation")
    ax1.legend(loc="lower right", fontsize=8)
    ax2.barh(ys, [r["acc"] for r in rows], color="C1", label="ours")
    lec = [(i, r["lecture_acc"]) for i, r in enumerate(rows) if r.get("lecture_acc") is not None]
    ax2.plot([v for _, v in lec], [i for i, _ in lec], "kx", markersize=8, label="lecture")
    ax2.set(xlabel="fact-completion accuracy (greedy)", xlim=(0, 1.05))
    ax2.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return fig


def sqrt_d_figure(random_rows: list[dict], trained: list[dict], title: str):
    fig, (ax1, ax2, ax3) = report.figure(ncols=3, size=(15, 4.5))
    dks = [r["d_k"] for r in random_rows]
    ax1.plot(dks, [r["std"] for r in random_rows], "o-", label="std of q·k (measured)")
    ax1.plot(dks, [r["sqrt_d"] for r in random_rows], "k--", label="√d_k")
    ax1.set(xscale="log", yscale="log", xlabel="d_k (per-head width)", ylabel="std of the score",
            title="random q, k ~ N(0, 1)")
    ax1.set_xticks(dks, [str(d) for d in dks])
    ax1.legend(fontsize=8)
    ax2.plot(dks, [r["raw_max"] for r in random_rows], "o-", label="mean max weight, q·k")
    ax2.plot(dks, [r["scaled_max"] for r in random_rows], "s-", label="mean max weight, q·k/√d_k")
    ax2.plot(dks, [r["saturated"] for r in random_rows], "^--", label="share of rows > 0.99, q·k")
    ax2.set(xscale="log", xlabel="d_k", ylabel="weight / share", ylim=(0, 1.05),
            title=f"softmax over {SQRT_D_KEYS} keys")
    ax2.set_xticks(dks, [str(d) for d in dks])
    ax2.legend(fontsize=8)
    layers = [r["layer"] for r in trained]
    width = 0.2
    ax3.bar([x - 1.5 * width for x in layers], [r["entropy"] for r in trained], width, label="as trained (÷√d)")
    ax3.bar([x - 0.5 * width for x in layers], [r["entropy_unscaled"] for r in trained], width,
            label="same scores without ÷√d")
    ax3.bar([x + 0.5 * width for x in layers], [r["uniform_entropy"] for r in trained], width,
            label="uniform over the prefix")
    ax3.set_xticks(layers, [f"layer {x}" for x in layers])
    ax3.set(ylabel="mean row entropy (nats)", title="the trained model's scores")
    ax3.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title, fontsize=10)
    return fig


def residual_figure(rows: list[dict], title: str):
    fig, ax = report.figure(size=(8, 4.2))
    parts = [r for r in rows if r["writes"] is not None]
    xs = range(len(parts))
    ax.bar(xs, [r["writes"] for r in parts], color="C0", label="norm of what it writes (last position)")
    ax.plot(xs, [r["stream"] for r in parts], "ko-", label="norm of the stream after it")
    ax.set_xticks(list(xs), [r["component"] for r in parts], rotation=20, ha="right")
    ax.set(ylabel="L2 norm", xlabel="component, in order", title=title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


def training_figure(record: dict, title: str):
    import numpy as np
    from experiments.plots import integer_steps
    fig, ax = report.figure(size=(7.5, 4.5))
    log = record.get("train_log") or []
    if log:
        ax.plot([p["step"] for p in log], [float(np.mean(p["loss"])) / math.log(2) for p in log], "-",
                label="training loss (bits/char, mean over log_every steps)")
    hist = record.get("history") or []
    if hist:
        ax.plot([h["step"] for h in hist], [float(np.mean(h["val_bpc"])) for h in hist], "o-", label="validation")
        ax.plot([h["step"] for h in hist], [float(np.mean(h["train_bpc"])) for h in hist], "s--",
                label="train windows")
    ax.axhline(math.log2(CONFIG.vocab_size), color="gray", linestyle=":", label="uniform (log2 44)")
    ax.axhline(LECTURE["intact"][0], color="k", linestyle="--", linewidth=0.8, label="lecture's final 0.409")
    ax.set(yscale="log", xlabel="step", ylabel="bits per character", title=title)
    integer_steps(ax)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return fig


# --- the command -----------------------------------------------------------------------------------

def flags(p) -> None:
    p.add_argument("--world-seed", type=int, default=0, metavar="N",
                   help="seed of the generated world (people, cities, text); another seed trains a new model")


def _pm(mean: float, std: float, fmt: str = ".3f") -> str:
    return format(mean, fmt) if not std else f"{format(mean, fmt)} ± {format(std, fmt)}"


def run(ctx) -> Result:
    import numpy as np
    from attention_jax.data import eval_windows
    from attention_jax.data import tiny_world as tw
    from attention_jax.harness import rows as row_cache
    args, tc = ctx.args, ctx.settings
    if args.corpus or args.data:
        raise ConfigError("the tiny GPT trains on the generated world, not a corpus; drop --corpus/--data "
                          "(--world-seed N draws another world)")
    if args.world_seed < 0:
        raise ConfigError(f"--world-seed {args.world_seed} must be a non-negative integer")
    seeds = list(range(args.seeds))
    config = ctx.model(CONFIG) if hasattr(ctx, "model") else CONFIG     # --attention / --dtype, where offered
    world, tok, train_ids, val_ids = world_data(args.world_seed)
    ident = identity(world, args.world_seed)
    task = make_task(world, tok, train_ids, val_ids, tc, config.context, ident)
    budget = (f"{ctx.preset} preset: {tc.steps} steps x batch {tc.batch_size} x {CONFIG.context} chars, "
              f"lr {tc.lr:g} ({tc.schedule}), {len(seeds)} seed(s)")
    print(f"world (seed {args.world_seed}): {len(world.people)} people in {len(world.cities)} cities, "
          f"{len(world.train_text):,} training and {len(world.val_text):,} validation characters", flush=True)
    record = row_cache.train_row(ROW, config, tc, task, preset=ctx.preset, seeds=seeds, folder=ctx.folder,
                                 fresh=args.fresh, progress=ctx.progress)
    engine, state = row_cache.restore_state(record, ctx.folder)      # fresh or cached, always from the checkpoint
    models = [engine.model(state, i) for i in range(len(seeds))]
    model = models[0]
    took = "reopened from the row cache" if record["cached"] else f"trained in {record['seconds']:.1f} s"
    final = {k: row_cache.summary(record, k) for k in record["final"]}
    print(f"tiny GPT ({record['params']:,} parameters) {took}: validation {_pm(*final['val_bpc'][:2])} bits/char, "
          f"fact accuracy {_pm(*final['fact_acc'][:2])}", flush=True)
    tables, figures, claims = {}, {}, []
    person = world.people[0]

    # demo 1: parameters
    prows, gpt3, shares = demo_params(model)
    tables["1. Parameters by formula and by the framework (inspect.param_breakdown)"] = report.format_table(
        [("part", "component", ""), ("formula", "formula", ""), ("by_formula", "by formula", ",d"),
         ("framework", "framework", ",d"), ("equal", "equal", ""), ("lecture", "lecture", ",d")], prows) + (
        f"\n\nPer block the MLP holds {shares['mlp_share_of_block']:.0%} and attention "
        f"{shares['attention_share_of_block']:.0%}; the two tables hold {shares['embeddings_share']:.1%} of the "
        f"model (lecture 8.2%); an untied output would add V·d = {shares['untied_would_add']:,} "
        f"({shares['untied_share']:.1%}).")
    tables["1b. GPT-3 by 12·L·d² (d 12,288, L 96, V 50,257, T 2,048)"] = report.format_table(
        [("part", "part", ""), ("count", "parameters", ",d"), ("billions", "billions", ".2f"),
         ("lecture", "lecture", "")], gpt3) + (
        f"\n\nThe embeddings are {shares['gpt3_embeddings_share']:.2%} of GPT-3 (lecture ≈0.37%) "
        f"against {shares['embeddings_share']:.1%} here.")
    total = prows[-1]
    mismatched = [r["part"] for r in prows if not r["equal"]]
    claims.append(report.claim("parameters by formula = the framework's count, component by component",
                               not mismatched, f"{total['by_formula']:,} by formula, {total['framework']:,} counted; "
                               f"{len(prows) - len(mismatched)} of {len(prows)} rows equal (lecture 109,056)",
                               -float(sum(abs(r["by_formula"] - r["framework"]) for r in prows
                                          if isinstance(r["framework"], int)))))

    # demo 2: the forward pass from raw weights
    prompt = f"\n{person.name} lives in "
    ids = tok.encode(prompt)
    print(f"\nforward pass from the raw weights on {tw.show(prompt)!r} (T = {len(ids)}):", flush=True)
    steps = []

    def say(step, shape):
        steps.append(dict(step=step, shape=str(tuple(int(s) for s in shape))))
        print(f"  {step:<62} {tuple(int(s) for s in shape)}", flush=True)

    check = forward_check(model, ids, say)
    probs = softmax_np(check["logits"][-1])
    top5 = np.argsort(-probs, kind="stable")[:5]
    next_text = "  ".join(f"{tw.show(tok.alphabet[i])!r} {probs[i]:.3f}" for i in top5)
    print(f"  max |raw - module| = {check['max_abs_diff']:.2e} (logits up to {check['logit_scale']:.1f}); "
          f"next character: {next_text}", flush=True)
    tables["2. Forward pass from the raw weights (plain jnp on param[...] arrays)"] = report.format_table(
        [("step", "step", ""), ("shape", "shape", "")], steps) + (
        f"\n\nPrompt {tw.show(prompt)!r} ({person.name} lives in {person.city}). Max |raw - module| = "
        f"{check['max_abs_diff']:.2e} with logits up to {check['logit_scale']:.1f} (lecture: ~1e-5). "
        f"Next character, top 5: {next_text}.")
    claims.append(report.claim("the forward pass from the raw weights = the module's logits (<= 1e-5)",
                               check["max_abs_diff"] <= 1e-5, f"max |diff| {check['max_abs_diff']:.2e}",
                               1e-5 - check["max_abs_diff"]))

    # demo 3: the residual stream
    norms = residual_norms(model, ids)
    tables["3. The residual stream: what each component writes, and the stream after it (L2 norms)"] = \
        report.format_table([("component", "component", ""), ("writes", "writes (last position)", ".2f"),
                             ("stream", "stream after (last position)", ".2f"),
                             ("writes_mean", "writes (mean over positions)", ".2f"),
                             ("lecture", "lecture, writes", "")], norms) + (
        f"\n\nSame prompt as demo 2; the last position is the one that predicts the city's first letter.")
    figures["residual.png"] = residual_figure(norms, f"residual stream on {tw.show(prompt)!r} ({ctx.preset} preset)")

    # demo 4: attention
    att = attention_demo(model, tok, person.name)
    best = att["best"]
    layer, head = best["layer"], best["index"]
    heat = ascii_heatmap(att["layers"][layer][head], att["chars"])
    print(f"\nattention on {tw.show(att['prompt'])!r}: weight on the future, all heads: sum {att['future_sum']}, "
          f"max {att['future_max']} over {att['future_entries']:,} entries", flush=True)
    print(f"head {best['head']} puts the most weight on the name ({best['on_name']:.2f}); its weights "
          f"(row = query, column = key, shades '{SHADES}' 0.1 apart):\n{heat}", flush=True)
    tables["4. Attention at the last position of the question (after ':', where the city comes next)"] = \
        report.format_table([("head", "layer.head", ""), ("top3", "top 3 positions (char@index:weight)", ""),
                             ("on_name", "on the name", ".2f"), ("on_self", "on itself", ".2f"),
                             ("max", "max weight", ".2f")], att["heads"]) + (
        f"\n\nPrompt {tw.show(att['prompt'])!r}; the name is positions {att['name_positions'][0]}-"
        f"{att['name_positions'][-1]}. Weight on the future over all heads: sum {att['future_sum']}, max "
        f"{att['future_max']} ({att['future_entries']:,} entries). Lecture: layer-0 heads diffuse (max < 0.2), "
        f"its head 1.0 put ≈0.39 on the name, head 1.1 ≈0.58 on itself (head numbers are arbitrary between "
        f"trainings).")
    tables[f"4b. Head {best['head']}'s weights (most weight on the name), ASCII"] = f"```\n{heat}\n```"
    matrices = {f"head {i}.{h}" + (" (most on the name)" if (i, h) == (layer, head) else ""): a[h]
                for i, a in enumerate(att["layers"]) for h in range(a.shape[0])}
    figures["attention.png"] = heatmap_figure(
        matrices, att["chars"], f"attention weights on {tw.show(att['prompt'])!r} ({ctx.preset} preset, seed 0); "
        f"lines mark the name", ncols=CONFIG.n_heads, highlight=att["name_positions"])
    claims.append(report.claim("attention puts exactly zero weight on the future", att["future_sum"] == 0.0,
                               f"sum {att['future_sum']}, max {att['future_max']} over "
                               f"{att['future_entries']:,} future entries of {len(matrices)} heads", 0.0))

    # demo 5: √d
    rand = sqrt_d_random(SQRT_D_ROWS[ctx.preset])
    tables[f"5. Why divide by √d: random q, k ~ N(0, 1), {SQRT_D_ROWS[ctx.preset]:,} rows x {SQRT_D_KEYS} keys "
           f"(seed {SQRT_D_SEED})"] = report.format_table(
        [("d_k", "d_k", "d"), ("std", "std of q·k", ".2f"), ("sqrt_d", "√d_k", ".2f"),
         ("raw_max", "mean max weight, q·k", ".3f"), ("scaled_max", "mean max weight, ÷√d_k", ".3f"),
         ("saturated", "rows > 0.99, q·k", ".1%"), ("scaled_saturated", "rows > 0.99, ÷√d_k", ".1%"),
         ("lecture", "lecture", "")], rand)
    worst = max(rand, key=lambda r: abs(r["std"] / r["sqrt_d"] - 1))
    off = abs(worst["std"] / worst["sqrt_d"] - 1)
    claims.append(report.claim("random q·k has std ≈ √d_k (within 5% at every d_k)", off < 0.05,
                               ", ".join(f"{r['d_k']}: {r['std']:.2f}" for r in rand)
                               + f"; furthest {100 * off:.1f}% at d_k {worst['d_k']}", 0.05 - off))
    text = f"\n{person.name} lives in {person.city}.{REVIEW}"
    real = sqrt_d_trained(model, tok.encode(text))
    tables["5b. The trained model's own scores (d_h = 16), as trained and without the ÷√d"] = report.format_table(
        [("layer", "layer", "d"), ("std_scaled", "std of scores ÷√d", ".2f"),
         ("std_unscaled", "std without ÷√d", ".2f"), ("entropy", "row entropy (nats)", ".2f"),
         ("entropy_unscaled", "entropy without ÷√d", ".2f"), ("uniform_entropy", "uniform entropy", ".2f"),
         ("max_weight", "mean max weight", ".2f"), ("max_weight_unscaled", "mean max without ÷√d", ".2f"),
         ("saturated_unscaled", "rows > 0.99 without ÷√d", ".1%")], real) + (
        f"\n\nText {tw.show(text)!r} ({len(text)} chars); statistics over the causal entries of all heads. "
        "Uniform entropy: the mean of ln(t + 1) over the rows (the lecture quotes ln((T + 1)/2)). "
        "Without the division the same scores are 4x larger and the rows sharper.")
    figures["sqrt_d.png"] = sqrt_d_figure(rand, real, f"why scores are divided by √d ({ctx.preset} preset)")

    # demo 6: ablations
    vx, vy = eval_windows(val_ids, CONFIG.context)
    print(f"\nablations on {len(models)} model(s): {len(ablation_list(CONFIG))} each ...", flush=True)
    abl = run_ablations(models, tok, world, vx, vy)
    for r in abl:
        r["bpc_text"] = _pm(r["bpc"], r.get("bpc_std", 0.0))
    tables["6. Ablations: validation bits per character and fact-completion accuracy"] = report.format_table(
        [("key", "ablation", ""), ("ablation", "what", ""), ("bpc_text", "val bits/char", ""),
         ("change", "change", "+.3f"), ("acc", "fact accuracy", ".3f"), ("lecture_bpc", "lecture bits/char", ".3f"),
         ("lecture_acc", "lecture fact", ".2f")], abl) + (
        f"\n\nValidation: {len(vx)} non-overlapping {CONFIG.context}-char windows of the validation text "
        f"({vy.size:,} characters). Fact accuracy: greedy from '\\n{{name}} lives in', {len(world.people)} people, "
        "right iff the text up to the first '.' is ' {city}.'; one teacher-forced pass under the causal mask "
        "(the same as greedy decoding: checked on the intact model), greedy decoding with its own mask for the "
        "bidirectional row (a teacher-forced pass would show it the answer). "
        "A layer's attention or MLP off = the sub-layer removed (the lecture zeroes its output projection: the "
        "same); a head off = its output zeroed before W_o. Layers and heads count from 0, as the lecture's do.")
    intact = abl[0]
    greedy0 = greedy_accuracy(model, tok, world)
    print(f"fact accuracy of the intact model: greedy {greedy0:.3f}, teacher-forced {intact['acc_seeds'][0]:.3f}",
          flush=True)
    engine_bpc = float(np.asarray(record["final"]["val_bpc"])[0])
    consistency = abs(intact["bpc_seeds"][0] - engine_bpc)
    figures["ablations.png"] = ablation_figure(abl, f"ablations, {budget}")
    by_key = {r["key"]: r for r in abl}
    claims += report.claims_across_seeds(ablation_claims, by_key, len(seeds))

    # training
    train_rows = [dict(figure="validation bits/char", ours=_pm(*final["val_bpc"][:2]), lecture="0.409"),
                  dict(figure="train-window bits/char", ours=_pm(*final["train_bpc"][:2]), lecture="-"),
                  dict(figure="fact accuracy (teacher-forced argmax)", ours=_pm(*final["fact_acc"][:2]),
                       lecture="0.93"),
                  dict(figure="fact accuracy (greedy decoding, the lecture's way; seed 0)", ours=f"{greedy0:.3f}",
                       lecture="0.93"),
                  dict(figure="uniform baseline bits/char", ours=f"{math.log2(CONFIG.vocab_size):.3f}",
                       lecture="5.459"),
                  dict(figure="training time", ours=("cached" if record["cached"] else
                                                     f"{record['seconds']:.1f} s"), lecture="~1 min"),
                  dict(figure="parameters", ours=f"{record['params']:,}", lecture="109,056")]
    tables["0. The trained model"] = report.format_table(
        [("figure", "figure", ""), ("ours", "ours", ""), ("lecture", "lecture", "")], train_rows) + (
        f"\n\n{budget}; world seed {args.world_seed}: {len(world.people)} people in {len(world.cities)} cities, "
        f"{len(world.train_text):,} training characters. Validation bits/char from the engine's nll; the "
        f"ablation table's intact row recomputes it from the reopened checkpoint (|diff| {consistency:.1e}).")
    tables = {"0. The trained model": tables.pop("0. The trained model"), **tables}
    figures["training.png"] = training_figure(record, f"tiny GPT training, {budget}")

    settings = {"model": config.to_dict(), "train": dataclasses.asdict(tc), "seeds": seeds, "data": ident,
              "sqrt_d": {"rows": SQRT_D_ROWS[ctx.preset], "keys": SQRT_D_KEYS, "seed": SQRT_D_SEED}}
    extra = {"record": {k: record[k] for k in ("key", "steps", "seconds", "cached", "final", "history")},
             "train_log": record["train_log"], "parameters": prows, "gpt3": gpt3, "shares": shares,
             "forward": {"max_abs_diff": check["max_abs_diff"], "steps": steps, "top5": next_text},
             "residual": norms, "attention": {k: v for k, v in att.items() if k != "layers"},
             "attention_weights": {name: np.asarray(w).tolist() for name, w in matrices.items()},
             "heatmap": heat, "sqrt_d_random": rand, "sqrt_d_trained": real,
             "ablation_engine_consistency": consistency}
    return Result(rows=abl, claims=claims, tables=tables, figures=figures, config=settings, extra=extra)


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags, rows=[ROW])
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
