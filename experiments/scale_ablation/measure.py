"""Train one row both ways and measure its scores: std, entropy, frozen rows, at each evaluation."""
from __future__ import annotations

import dataclasses
import math

from attention_jax.config import TrainConfig
from experiments.scale_ablation.constants import FROZEN, PROBE_WINDOWS, SHORT, STATS, WidthRow


def score_stats(scores, weights) -> dict:
    """Score std, mean entropy and frozen share of one attention block's [B, H, T, T] scores and weights.

    The std is over the causal entries (j <= i) only: the scores are taken before the mask,
    so the future's are computed but never used. Entropy (nats) and the frozen share are
    over rows i >= 1: row 0 sees one token and is one-hot whatever the scores.
    """
    import jax.numpy as jnp
    from jax.scipy.special import xlogy
    T = scores.shape[-1]
    causal = jnp.tril(jnp.ones((T, T), bool))
    n = causal.sum() * (scores.size // (T * T))
    mean = jnp.where(causal, scores, 0.0).sum() / n
    std = jnp.sqrt(jnp.where(causal, (scores - mean) ** 2, 0.0).sum() / n)
    w = weights[..., 1:, :]
    entropy = -xlogy(w, w).sum(-1)
    return {"score_std": std, "entropy": entropy.mean(), "frozen": (w.max(-1) > FROZEN).mean()}


def uniform_entropy(T: int) -> float:
    """The mean entropy of uniform causal rows i >= 1 (each spreads over i + 1 tokens): the ceiling."""
    return sum(math.log(i + 1) for i in range(1, T)) / (T - 1)


def make_probe(engine, windows):
    """state -> {score_std, entropy, frozen: one value per seed} on the fixed windows (jitted, vmapped)."""
    import jax
    import numpy as np
    from flax import nnx
    from attention_jax.analysis.inspect import run_with_cache
    names = ("blocks.0.mixer.attention.scores", "blocks.0.mixer.attention.weights")
    x = np.asarray(windows, np.int32)

    def one(state):
        model, _ = nnx.merge(engine.graphdef, state)
        model.eval()
        _, cache = run_with_cache(model, x, list(names))
        return score_stats(*(cache[n] for n in names))

    fn = jax.jit(jax.vmap(one) if engine.vmapped else one)
    return lambda state: {k: np.atleast_1d(np.asarray(v, np.float64)) for k, v in fn(state).items()}


# --- training ----------------------------------------------------------------------------------

def train_variant(table, name, cfg, tc, probe_windows, say) -> dict:
    """`table.train` with the score statistics added to every evaluation (so they are curves too)."""
    base = table.text_task(cfg, tc)
    probes = {}

    def probe(engine):
        if id(engine) not in probes:
            probes[id(engine)] = make_probe(engine, probe_windows)
        return probes[id(engine)]

    def evaluate(engine, state):
        return {**base.evaluate(engine, state), **probe(engine)(state)}

    def at_init(engine, _state):   # the "before": the same seeds' initial state, re-made
        return {k: v.tolist() for k, v in probe(engine)(engine.init(table.seeds)).items()}

    task = dataclasses.replace(base, evaluate=evaluate,
                               identity={**base.identity, "probe": f"scale_ablation/{PROBE_WINDOWS}"})
    return table.train(name, cfg, train_config=tc, task=task, measures={"init": at_init}, say=say)


def row_budget(ctx, row: WidthRow) -> TrainConfig:
    return ctx.settings if row.budget == "long" else ctx.budget(SHORT[ctx.preset])


def describe_budget(tc: TrainConfig) -> str:
    warm = f", warmup {tc.warmup_steps}" if tc.warmup_steps else ""
    return f"{tc.steps} x {tc.batch_size}, lr {tc.lr:g}{warm}"


def combine(row: WidthRow, runs: dict, book: bool) -> dict:
    """One table row from the two trainings: val perplexity both ways, the gain, the statistics, per seed."""
    import numpy as np
    from attention_jax.train.loop import mean_std
    from experiments.harness import rows
    on, off = runs[True], runs[False]
    s, u = np.asarray(on["val_ppl_seeds"]), np.asarray(off["val_ppl_seeds"])
    gain = u - s                               # same seed, same init, same batches: paired
    r = {"name": row.name, "label": row.label, "d_head": row.d_head, "params": on["params"],
         "val_scaled": float(s.mean()), "val_scaled_seeds": s.tolist(),
         "val_unscaled": float(u.mean()), "val_unscaled_seeds": u.tolist(),
         "val_scaled_sd": on["val_ppl_std"], "val_unscaled_sd": off["val_ppl_std"],
         "gain": mean_std(gain)[0], "gain_seeds": gain.tolist(), "gain_std": mean_std(gain)[1],
         "scaled": rows.fmt(on["val_ppl"], on["val_ppl_std"]), "unscaled": rows.fmt(off["val_ppl"], off["val_ppl_std"]),
         "book_gain": row.book_gain if book else None, "book_gain_text": row.book_gain_text if book else None}
    r["gain_text"] = f"{r['gain']:+.2f}" + (f" ± {r['gain_std']:.2f}" if r["gain_std"] else "")
    for scale, run in runs.items():
        way = "scaled" if scale else "unscaled"
        for stat in STATS:
            before = np.asarray(run["measures"]["init"][stat], np.float64)
            after = np.asarray(run["final"][stat], np.float64)
            r[f"{stat}_before_{way}"], r[f"{stat}_before_{way}_seeds"] = float(before.mean()), before.tolist()
            r[f"{stat}_after_{way}"], r[f"{stat}_after_{way}_seeds"] = float(after.mean()), after.tolist()
    r["runs"] = {"scaled" if k else "unscaled": v for k, v in runs.items()}
    return r
