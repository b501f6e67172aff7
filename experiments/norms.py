"""Pre-norm vs post-norm, with and without learning-rate warmup: twelve blocks of width 128.

    python -m experiments.norms [--preset smoke|cpu|paper] [--rows a,b] [--steps N] [--warmup N]
                                [--seeds N] [--eval-every N] [--lr X] [--batch-size N] [--corpus PATH]

Two measurements, as the chapter makes them. First the gradient norm of each block at
initialisation, before any step: the Engine's own `block_grad_norm` step metric (the global
L2 norm of all of a block's parameter gradients, from one backward pass of the mean
cross-entropy) on fixed training batches, for several seeds, pre-norm and post-norm alike.
Then four models trained alike but for where the LayerNorm sits and whether the learning
rate warms up linearly from 0 (the preset's `warmup_steps`, 200 in the book; the
no-warmup rows start at the full rate). Every row is `experiments.configs.ONE_BLOCK` (the
ladder's pre-norm block) with n_layers=12 and `norm` "pre" or "post"; post-norm puts a
LayerNorm after each residual add and has no final one.
"""
from __future__ import annotations

import dataclasses
import json

from attention_jax.config import TrainConfig
from attention_jax.errors import ConfigError
from attention_jax.harness import report
from attention_jax.harness.cli import positive_int
from attention_jax.harness.experiment import Experiment, Result
from experiments.configs import ONE_BLOCK

N_LAYERS = 12
BASE = dataclasses.replace(ONE_BLOCK, n_layers=N_LAYERS)
NORMS = ("pre", "post")
CONFIGS = {norm: dataclasses.replace(BASE, norm=norm) for norm in NORMS}
# The smoke preset is a plumbing check for the tests: three blocks, because compiling
# twelve unrolled blocks (init, step, evaluation; ten programs in all) takes minutes on 2
# cores. The cpu and paper presets train the chapter's twelve.
DEPTH = {"smoke": 3}
# name -> (norm, warmup?); the book's order.
ROWS = {"pre_no_warmup": ("pre", False), "pre_warmup": ("pre", True),
        "post_no_warmup": ("post", False), "post_warmup": ("post", True)}
BOOK_PPL = {"pre_no_warmup": 37.82, "pre_warmup": 37.62, "post_no_warmup": 308.05, "post_warmup": 37.88}
BOOK_INIT = {"pre": {"first": 0.0498, "last": 0.0657, "ratio": 1.32},
             "post": {"first": 0.0977, "last": 0.1613, "ratio": 1.65}}

# A preset's `warmup_steps` is the warmup rows' warmup (--warmup overrides it); the
# no-warmup rows train with warmup_steps=0. `log_every` is small so that record["train_log"]
# draws the first steps' gradient norms; `eval_every` draws the perplexity curves.
PRESETS = {
    # The book: 12 blocks, 1000 steps, lr 3e-3, 200-step warmup; batch 64 as the ladder's paper budget.
    "paper": TrainConfig(steps=1000, batch_size=64, lr=3e-3, warmup_steps=200, log_every=5, eval_every=100,
                         checkpoint_every=250),
    # Chosen by measurement on 2 cores (README, "Choosing the cpu budget" under norms): of the two
    # budgets tried, this one shows three claims of four (1000 x 16 with a 200-step warmup: two);
    # none within 30 minutes brings warmed-up post-norm within 5% of pre-norm.
    "cpu": TrainConfig(steps=600, batch_size=32, lr=3e-3, warmup_steps=100, log_every=5, eval_every=100,
                       checkpoint_every=100, train_eval_windows=120),
    "smoke": TrainConfig(steps=8, batch_size=4, lr=3e-3, warmup_steps=4, log_every=1, checkpoint_every=4,
                         train_eval_windows=8, eval_batch=8),
}
# The init measurement: (windows per batch, batches averaged, at least this many seeds), the
# same fixed training windows for every seed and both norms.
PROBE = {"paper": (64, 4, 5), "cpu": (64, 2, 5), "smoke": (4, 1, 2)}
PROBE_SEED = 10_000       # the data seed of the probe batches: not any training seed's batches


def flags(p) -> None:
    p.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                   help="warmup rows: linear warmup over N steps (default: the preset's; the book's 200)")


def model_config(norm: str, preset: str):
    return dataclasses.replace(CONFIGS[norm], n_layers=DEPTH.get(preset, N_LAYERS))


# -- the gradient norm of each block at initialisation -----------------------------------------

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
    per_seed = grad_norms.mean(axis=1)             # [S, L]: averaged over the probe batches
    first, last = per_seed[:, 0], per_seed[:, -1]
    ratio = last / first
    rec = {"name": norm, "per_block": per_seed.mean(axis=0).tolist(), "per_block_seeds": per_seed.tolist(),
           "per_batch": grad_norms.tolist()}
    for k, v in (("first", first), ("last", last), ("ratio", ratio)):
        rec[k], rec[f"{k}_seeds"] = float(v.mean()), v.tolist()
        rec[f"{k}_std"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
    return rec


def measure_init(ctx, table, seeds: list[int]) -> dict[str, dict]:
    """Both norms' init measurement, cached in <folder>/init/ like a finished row."""
    from attention_jax.harness import rows
    batch, n_batches, _ = PROBE[ctx.preset]
    probe = TrainConfig(steps=1, batch_size=batch)      # the gradient is taken before any update: no lr in it
    identity = {**table.corpus.identity(), "probe": [batch, n_batches, PROBE_SEED]}
    out = {}
    for norm in NORMS:
        cfg = model_config(norm, ctx.preset)
        path = ctx.folder / "init" / f"{rows.row_key('init_' + norm, cfg, probe, ctx.preset, seeds, identity)}.json"
        if path.exists() and not ctx.args.fresh:
            try:
                out[norm] = json.loads(path.read_text(encoding="utf-8"))
                continue
            except ValueError:
                pass
        batches = probe_batches(table.splits[0], batch_size=batch, n_batches=n_batches, context=cfg.context)
        out[norm] = init_record(norm, init_grad_norms(cfg, batches, seeds))
        report.atomic_write(path, json.dumps(out[norm]))
    return out


# -- the claims ----------------------------------------------------------------------------------

def claims(r: dict) -> list[dict]:
    """The trained rows' claims, on val perplexity: `r` maps a row name to a record with `val_ppl`."""
    v = {k: x["val_ppl"] for k, x in r.items()}
    need = lambda *names: all(n in v for n in names)
    out = []
    if need("pre_no_warmup", "post_no_warmup"):
        ratio = v["post_no_warmup"] / v["pre_no_warmup"]
        out.append(report.claim("post-norm without warmup is >= 3x worse than pre-norm", ratio >= 3,
                                f"{v['post_no_warmup']:.2f} vs {v['pre_no_warmup']:.2f} ({ratio:.2f}x)", ratio - 3))
    if need("pre_warmup", "post_warmup"):
        rel = abs(v["post_warmup"] - v["pre_warmup"]) / v["pre_warmup"]
        out.append(report.claim("warmup brings post-norm within 5% of pre-norm (both warmed up)", rel < 0.05,
                                f"{v['post_warmup']:.2f} vs {v['pre_warmup']:.2f} ({100 * rel:.1f}%)", 0.05 - rel))
    if need("pre_no_warmup", "pre_warmup"):
        rel = abs(v["pre_no_warmup"] - v["pre_warmup"]) / v["pre_warmup"]
        out.append(report.claim("pre-norm barely needs warmup (within 2%)", rel < 0.02,
                                f"{v['pre_no_warmup']:.2f} without vs {v['pre_warmup']:.2f} with "
                                f"({100 * rel:.1f}%)", 0.02 - rel))
    return out


def init_claims(r: dict) -> list[dict]:
    """The init measurement's claim: `r` maps "pre" / "post" to a record with `ratio` (last / first block)."""
    if not all(n in r for n in NORMS):
        return []
    pre, post = r["pre"]["ratio"], r["post"]["ratio"]
    return [report.claim("the last-to-first block gradient ratio at init is larger for post-norm", post > pre,
                         f"post {post:.2f} vs pre {pre:.2f} (book 1.65 vs 1.32)", post - pre)]


# -- figures -------------------------------------------------------------------------------------

def init_figure(init: dict, title: str, book: bool):
    import numpy as np
    fig, ax = report.figure(size=(10, 4.5))
    for i, norm in enumerate(NORMS):
        rec = init[norm]
        blocks = np.arange(1, len(rec["per_block"]) + 1)
        seeds = np.asarray(rec["per_block_seeds"])
        ax.plot(blocks, rec["per_block"], "o-", color=f"C{i}", label=f"{norm}-norm (mean of {len(seeds)} seeds)")
        if len(seeds) > 1:
            ax.fill_between(blocks, seeds.min(axis=0), seeds.max(axis=0), color=f"C{i}", alpha=0.2,
                            label=f"{norm}-norm, seed range")
        if book and len(blocks) == N_LAYERS:     # the book prints blocks 1 and 12 only
            b = BOOK_INIT[norm]
            ax.plot([1, N_LAYERS], [b["first"], b["last"]], "x", color=f"C{i}", markersize=10,
                    markeredgewidth=2, label=f"{norm}-norm, book (blocks 1 and {N_LAYERS})")
    ax.set(xlabel="block", ylabel="gradient norm at initialisation")
    fig.suptitle(title)
    ax.set_xticks(range(1, len(init[NORMS[0]]["per_block"]) + 1))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return fig


def early_figure(records: list[dict], first: int, title: str, warmup: int | None = None):
    """Learning rate, global gradient norm and training loss over the first steps (seed means)."""
    import numpy as np
    from experiments.plots import finish_panels
    fig, axes = report.figure(ncols=3, size=(16, 4.5))
    style = {"pre": "-", "post": "--"}
    for i, r in enumerate(records):
        points = [p for p in r["train_log"] if p["step"] <= first]
        steps = [p["step"] for p in points]
        for ax, key in zip(axes, ("lr", "grad_norm", "loss")):
            ax.plot(steps, [float(np.mean(p[key])) for p in points], style[ROWS[r["name"]][0]], color=f"C{i}",
                    label=r["name"])
    panels = (("learning rate", False), ("global gradient norm", True), ("training loss (nats)", False))
    return finish_panels(fig, axes, panels, title, ylabel=True, mark_step=warmup, mark_label="end of warmup")


# -- the table -----------------------------------------------------------------------------------

def check_warmup(names, warmup: int, steps: int) -> int:
    """The warmup rows' warmup, refused when it does not fit in the run; no-warmup rows alone never use it."""
    if any(ROWS[n][1] for n in names) and not 0 < warmup < steps:
        raise ConfigError(f"warmup {warmup} must be between 1 and steps - 1 ({steps - 1}); use --warmup N "
                          f"with N < --steps")
    return warmup


def run(ctx) -> Result:
    from attention_jax.harness.tables import TextTable
    from experiments.plots import curves
    tc = ctx.settings
    warm = check_warmup(ctx.rows, ctx.args.warmup or tc.warmup_steps, tc.steps)
    with_warmup, without = dataclasses.replace(tc, warmup_steps=warm), dataclasses.replace(tc, warmup_steps=0)
    table = TextTable.open(ctx)
    book, depth = table.book, DEPTH.get(ctx.preset, N_LAYERS)

    # 1. The gradient norm of each block at initialisation, before any step.
    init_seeds = list(range(max(len(table.seeds), PROBE[ctx.preset][2])))
    init = measure_init(ctx, table, init_seeds)
    init_rows = []
    for norm in NORMS:
        rec = init[norm]
        b = BOOK_INIT[norm] if book else {}
        init_rows.append({**rec, "book_first": b.get("first"), "book_last": b.get("last"),
                          "book_ratio": b.get("ratio"),
                          "first_text": rows_fmt(rec["first"], rec["first_std"], 4),
                          "last_text": rows_fmt(rec["last"], rec["last_std"], 4),
                          "ratio_text": rows_fmt(rec["ratio"], rec["ratio_std"], 2)})
        print(f"  init {norm:<4}  block 1 {rec['first']:.4f}  block {depth} {rec['last']:.4f}  "
              f"ratio {rec['ratio']:.2f}  ({len(init_seeds)} seeds)", flush=True)

    # 2. The four trained rows.
    records = []
    for name, (norm, warmup) in ROWS.items():
        if name not in ctx.rows:
            continue
        r = table.train(name, model_config(norm, ctx.preset), train_config=with_warmup if warmup else without)
        r.update(norm=norm, warmup=warm if warmup else 0, book_val_ppl=BOOK_PPL[name] if book else None,
                 lr_first=r["train_log"][0]["lr"] if r["train_log"] else None)
        records.append(r)
        took = "cached" if r["cached"] else f"{r['seconds']:.0f} s"
        print(f"  {name:<15} train {r['train']:>16}  val {r['val']:>16}  ({took})", flush=True)
    base = next((r for r in records if r["name"] == "pre_no_warmup"), None)
    for r in records:
        r["vs_pre"] = r["val_ppl"] / base["val_ppl"] if base else None
        r["book_vs_pre"] = BOOK_PPL[r["name"]] / BOOK_PPL["pre_no_warmup"] if book else None

    init_columns = [("name", "norm", ""), ("first_text", "block 1", ""), ("last_text", f"block {depth}", ""),
                    ("ratio_text", f"block {depth} / block 1", ""), ("book_first", "book block 1", ".4f"),
                    ("book_last", f"book block {N_LAYERS}", ".4f"), ("book_ratio", "book ratio", ".2f")]
    columns = [("name", "row", ""), ("norm", "norm", ""), ("warmup", "warmup steps", "d"),
               ("train", "train ppl", ""), ("val", "val ppl", ""), ("book_val_ppl", "book val ppl", ".2f"),
               ("vs_pre", "val / pre-norm no warmup", ".2f"), ("book_vs_pre", "book ratio", ".2f")]
    budget = (f"{ctx.preset} preset: {tc.steps} steps x batch {tc.batch_size}, lr {tc.lr:g}, warmup {warm}, "
              f"{len(table.seeds)} seed(s), {table.corpus.name}")
    batch, n_batches, _ = PROBE[ctx.preset]
    tables = {f"Gradient norm per block at initialisation ({len(init_seeds)} seeds, mean ± std; "
              f"{n_batches} fixed batch(es) of {batch} windows)": report.format_table(init_columns, init_rows),
              f"Perplexity, {depth} blocks of width {BASE.d_model}: pre/post-norm x warmup ({budget})":
                  report.format_table(columns, records)}
    figures = {"init_grad_norms.png": init_figure(
        init, f"norms: gradient norm per block at init, {len(init_seeds)} seeds, {n_batches} x {batch} windows "
              f"({ctx.preset} preset)", book)}
    if records:
        first = min(tc.steps, 2 * warm)
        figures["early_steps.png"] = early_figure(records, first, f"norms: the first {first} steps, {budget}", warm)
    if any(len(r["history"]) > 1 for r in records):
        figures["curves.png"] = curves(records, ("val_ppl", "train_ppl"),
                                       ("held-out (val) perplexity", "train perplexity"), f"norms, {budget}")
    found = (report.claims_across_seeds(claims, {r["name"]: r for r in records}, len(table.seeds))
             + report.claims_across_seeds(init_claims, init, len(init_seeds)))
    summary = [report.book(f"{r['name']}: val perplexity", r["book_val_ppl"], r["val"]) for r in records
               if r["book_val_ppl"] is not None]
    summary += [report.book(f"{norm}-norm: last/first block gradient norm at init", BOOK_INIT[norm]["ratio"],
                            init[norm]["ratio"]) for norm in init if book and norm in BOOK_INIT]
    return Result(rows=records, claims=found, tables=tables, figures=figures, book=summary,
                  config={"train": dataclasses.asdict(tc), "warmup_steps": warm, "seeds": table.seeds,
                          "init_seeds": init_seeds, "probe": {"batch_size": batch, "batches": n_batches,
                                                              "data_seed": PROBE_SEED},
                          "models": {n: model_config(n, ctx.preset).to_dict() for n in NORMS},
                          "data": table.describe()},
                  extra={"init": init_rows})


def rows_fmt(mean: float, std: float, digits: int) -> str:
    return f"{mean:.{digits}f}" if not std else f"{mean:.{digits}f} ± {std:.{digits}f}"


# Twelve blocks on three seeds fragment one glibc arena (12.4 GB at the peak against 3.9 GB with two).
EXPERIMENT = Experiment("norms", __doc__, PRESETS, run, flags=flags, rows=list(ROWS), big_programs=True)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
