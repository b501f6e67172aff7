"""The gradient norm of each block at initialisation, before any step (cached like a finished row)."""
from __future__ import annotations

from attention_jax.config import TrainConfig
from experiments.norms.constants import NORMS, PROBE, PROBE_SEED, model_config


def probe_batches(train_tokens, *, batch_size: int, n_batches: int, context: int) -> list[dict]:
    """Fixed training windows for the init measurement (the same for every seed and model)."""
    from attention_jax.data import get_batch
    out = []
    for i in range(n_batches):
        x, y = get_batch(train_tokens, seed=PROBE_SEED, step=i, batch_size=batch_size, context=context)
        out.append({"x": x, "y": y})
    return out


def init_grad_norms(model_config, batches: list[dict], seeds):
    """[seeds, batches, n_layers]: each block's gradient norm at initialisation, per seed and batch.

    The Engine's `block_grad_norm` step metric of the first step from a freshly initialised
    state (the gradient is taken before the optimizer moves anything); seed s is initialised
    exactly as the training rows' seed s.
    """
    import numpy as np
    from attention_jax.train import Engine
    seeds = list(seeds)
    tc = TrainConfig(steps=1, batch_size=len(batches[0]["x"]))
    engine = Engine(model_config, tc, n_seeds=len(seeds))
    out = []
    for batch in batches:
        _, metrics = engine.step(engine.init(seeds), engine.shard([batch] * len(seeds)))
        out.append(np.asarray(metrics["block_grad_norm"], np.float64).reshape(len(seeds), model_config.n_layers))
    return np.stack(out, axis=1)


def init_record(norm: str, grad_norms) -> dict:
    """The figures of one norm's init measurement ([seeds, batches, blocks] from `init_grad_norms`):
    means over seeds, and `k_seeds` lists per seed."""
    from attention_jax.train.loop import mean_std
    per_seed = grad_norms.mean(axis=1)             # [S, L]: averaged over the probe batches
    first, last = per_seed[:, 0], per_seed[:, -1]
    ratio = last / first
    rec = {"name": norm, "per_block": per_seed.mean(axis=0).tolist(), "per_block_seeds": per_seed.tolist(),
           "per_batch": grad_norms.tolist()}
    for k, v in (("first", first), ("last", last), ("ratio", ratio)):
        (rec[k], rec[f"{k}_std"]), rec[f"{k}_seeds"] = mean_std(v), v.tolist()
    return rec


def measure_init(ctx, table, seeds: list[int]) -> dict[str, dict]:
    """Both norms' init measurement, kept like a finished row (`rows.measured`)."""
    from experiments.harness import rows
    batch, n_batches, _ = PROBE[ctx.preset]
    out = {}
    for norm in NORMS:
        cfg = model_config(norm, ctx.preset)

        def compute(cfg=cfg, norm=norm):
            batches = probe_batches(table.splits[0], batch_size=batch, n_batches=n_batches, context=cfg.context)
            return init_record(norm, init_grad_norms(cfg, batches, seeds))

        identity = {"model": cfg.to_dict(), "probe": [batch, n_batches, PROBE_SEED], "preset": ctx.preset,
                    "seeds": seeds, **table.corpus.identity()}
        out[norm] = rows.measured(f"init_{norm}", identity, compute, folder=ctx.folder, fresh=ctx.fresh)
    return out
