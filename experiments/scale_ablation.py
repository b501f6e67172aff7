"""Dividing the scores by √d: trained with and without it at head widths 32, 128, 256 and 1024.

    python -m experiments.scale_ablation [--preset smoke|cpu|paper] [--rows d32,d1024] [--steps N]
                                         [--seeds N] [--eval-every N] [--corpus PATH]

Each row trains one model twice, identical but for `ModelConfig.scale` (the same seed, so
the same initial weights and batches): with ÷√d and without. Two setups, as the chapter's:

* d32, d128: the ladder's one pre-norm block (LayerNorm before the projections, FFN) at
  the ladder's budget; d32 is its four heads of 32 + W_o, d128 the same block with one
  head of 128 (+ W_o), so that only the head count and width change between the two.
* d256, d1024: one head projecting *up* from d_model 128 to d_head 256 / 1024, W_o back
  down, no LayerNorm anywhere (so none before the projections), FFN and residuals kept;
  the chapter's shorter budget (1500 steps, batch 32).

--steps, --lr, --batch-size, --schedule and --eval-every override both budgets.
Besides perplexity, every row records on 16 fixed held-out windows, at initialisation,
at each evaluation and after training: the std of the scores fed to the softmax (causal
entries only; divided when ÷√d is on), the mean attention entropy (nats, rows with at
least two visible tokens) and the share of those rows putting > 0.99 on one token.
"""
from __future__ import annotations

import dataclasses
import math

from attention_jax.config import TrainConfig
from attention_jax.harness import report
from attention_jax.harness.experiment import Experiment, Result
from experiments.configs import LADDER_BUDGETS, ONE_BLOCK

PROBE_WINDOWS = 16      # held-out windows the score statistics are measured on
FROZEN = 0.99           # a row is "frozen" when it puts more than this on one token
SMALL_GAIN = 2.0        # |gain| below this many perplexity points is "worth nothing" (d_head 32)
BIG_GAIN = 5.0          # the least gain the chapter's 18 / 17 points must at least show (d_head 256, 1024)
COLLAPSED = 0.9         # share of frozen rows that counts as collapse (book 99.9%)


@dataclasses.dataclass(frozen=True)
class WidthRow:
    name: str
    label: str
    config: object              # ModelConfig (scale is set per variant)
    budget: str                 # "long" (the ladder's budget) or "short" (the chapter's 1500 x 32)
    book_gain: float | None = None
    book_gain_text: str | None = None

    @property
    def d_head(self) -> int:
        return self.config.head_dim


# The ladder's block with one head of width d_head projecting up from d_model 128 (W_o back
# down), and no LayerNorm: the chapter's "one head, no normalisation before the projections".
_UP = dataclasses.replace(ONE_BLOCK, mixer="heads", n_heads=1, layer_norm=False)
ROWS = (
    WidthRow("d32", "4 heads x 32 + W_o, pre-norm block", ONE_BLOCK, "long", None, "≈0"),
    WidthRow("d128", "1 head x 128 + W_o, pre-norm block", dataclasses.replace(ONE_BLOCK, n_heads=1), "long"),
    WidthRow("d256", "1 head 128 -> 256 + W_o, no LayerNorm", dataclasses.replace(_UP, d_head=256), "short",
             18.0, "18"),
    WidthRow("d1024", "1 head 128 -> 1024 + W_o, no LayerNorm", dataclasses.replace(_UP, d_head=1024), "short",
             17.0, "17"),
)
# The chapter's score figures (l.116) name no width; init std 21 is (2/3)·√1024 for PyTorch's
# init without LayerNorm (10.7 at 256), so they are printed beside d1024.
BOOK_SCORES = {("d1024", False): {"std": "21 → 5147", "entropy": "→ 0", "frozen": "99.9%"},
               ("d1024", True): {"std": "→ 3.44"}}

# The long rows' budget is ctx.settings (the preset's TrainConfig, with --steps/--lr/--batch-size/
# --schedule/--eval-every applied); the short rows' is SHORT[preset], with the same overrides.
PRESETS = {
    "paper": dataclasses.replace(LADDER_BUDGETS["paper"], eval_every=250),
    # The ladder's cpu budget cut to 1500 steps (the positions table's): the d_head 32 gain stays
    # within +0.1 … +0.95 at every evaluation from 250 to 2250 steps, and 2250 would put the table
    # past 30 min (README, "Choosing the cpu budget").
    "cpu": dataclasses.replace(LADDER_BUDGETS["cpu"], steps=1500),
    "smoke": LADDER_BUDGETS["smoke"],
}
SHORT = {
    # The chapter's own short budget (lr unstated there: the chapter's 1e-3). The cpu preset keeps
    # it: the d_head 1024 collapse crosses 90% only at ~750-1000 steps (README).
    "paper": TrainConfig(steps=1500, batch_size=32, lr=1e-3, checkpoint_every=250, eval_every=250),
    "cpu": TrainConfig(steps=1500, batch_size=32, lr=1e-3, checkpoint_every=250, eval_every=250,
                       train_eval_windows=120),
    "smoke": LADDER_BUDGETS["smoke"],
}
VARIANTS = ((True, "÷√d"), (False, "no ÷"))
STATS = ("score_std", "entropy", "frozen")


# --- the statistics ----------------------------------------------------------------------------

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
    from attention_jax.inspect import run_with_cache
    names = ("blocks.0.mixer.scores", "blocks.0.mixer.weights")
    x = np.asarray(windows, np.int32)

    def one(state):
        model, _ = nnx.merge(engine.graphdef, state)
        model.eval()
        _, cache = run_with_cache(model, x, list(names))
        return score_stats(*(cache[n] for n in names))

    fn = jax.jit(jax.vmap(one) if engine.vmapped else one)
    return lambda state: {k: np.atleast_1d(np.asarray(v, np.float64)) for k, v in fn(state).items()}


# --- training ----------------------------------------------------------------------------------

def _train(table, name, cfg, tc, probe_windows) -> dict:
    """TextTable.train with the score statistics added to every evaluation (so they are curves too).

    TextTable.train builds its text task itself; this one wraps the same task's `evaluate`.
    """
    from attention_jax.harness import rows
    from attention_jax.train import text_task
    ctx = table.ctx
    base = text_task(*table.splits, batch_size=tc.batch_size, context=cfg.context,
                     train_eval_windows=tc.train_eval_windows, identity=table.corpus.identity())
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
    record = rows.train_row(name, cfg, tc, task, preset=ctx.preset, seeds=table.seeds, folder=ctx.folder,
                            fresh=ctx.args.fresh, progress=ctx.progress, measures={"init": at_init})
    for figure in record["final"]:
        record[figure], record[f"{figure}_std"], record[f"{figure}_seeds"] = rows.summary(record, figure)
    return record


def _budget(ctx, row: WidthRow) -> TrainConfig:
    from attention_jax.harness.rows import with_overrides
    return ctx.settings if row.budget == "long" else with_overrides(SHORT[ctx.preset], ctx.args)


def _describe(tc: TrainConfig) -> str:
    warm = f", warmup {tc.warmup_steps}" if tc.warmup_steps else ""
    return f"{tc.steps} x {tc.batch_size}, lr {tc.lr:g}{warm}"


def combine(row: WidthRow, runs: dict, book: bool) -> dict:
    """One table row from the two trainings: val perplexity both ways, the gain, the statistics, per seed."""
    import numpy as np
    from attention_jax.harness import rows
    on, off = runs[True], runs[False]
    s, u = np.asarray(on["val_ppl_seeds"]), np.asarray(off["val_ppl_seeds"])
    gain = u - s                               # same seed, same init, same batches: paired
    r = {"name": row.name, "label": row.label, "d_head": row.d_head, "params": on["params"],
         "val_scaled": float(s.mean()), "val_scaled_seeds": s.tolist(),
         "val_unscaled": float(u.mean()), "val_unscaled_seeds": u.tolist(),
         "val_scaled_sd": on["val_ppl_std"], "val_unscaled_sd": off["val_ppl_std"],
         "gain": float(gain.mean()), "gain_seeds": gain.tolist(),
         "gain_std": float(gain.std(ddof=1)) if len(gain) > 1 else 0.0,
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


# --- claims ------------------------------------------------------------------------------------

def claims(r: dict) -> list[dict]:
    """The chapter's claims on the rows present (each record: gain, val_*, the statistics)."""
    out = []
    if "d32" in r:
        g = r["d32"]["gain"]
        out.append(report.claim(f"÷√d makes no meaningful difference at d_head 32 (|gain| < {SMALL_GAIN:g} points)",
                                abs(g) < SMALL_GAIN,
                                f"{r['d32']['val_scaled']:.2f} with vs {r['d32']['val_unscaled']:.2f} without, "
                                f"gain {g:+.2f}", SMALL_GAIN - abs(g)))
    for name, book in (("d256", 18), ("d1024", 17)):
        if name in r:
            x = r[name]
            out.append(report.claim(f"÷√d gains at least {BIG_GAIN:g} points at d_head {name[1:]} (book {book})",
                                    x["gain"] >= BIG_GAIN,
                                    f"{x['val_scaled']:.2f} with vs {x['val_unscaled']:.2f} without, "
                                    f"gain {x['gain']:+.2f}", x["gain"] - BIG_GAIN))
    if "d1024" in r:
        share = r["d1024"]["frozen_after_unscaled"]
        also = f"; d_head 256: {100 * r['d256']['frozen_after_unscaled']:.1f}%" if "d256" in r else ""
        out.append(report.claim(f"without ÷√d the d_head 1024 head collapses: > {100 * COLLAPSED:g}% of rows put "
                                f"> {FROZEN} on one token after training (book 99.9%)", share > COLLAPSED,
                                f"{100 * share:.1f}% (at init {100 * r['d1024']['frozen_before_unscaled']:.1f}%)"
                                + also, share - COLLAPSED))
    scaled = [(name, when, x[f"score_std_{when}_scaled"]) for name, x in r.items() for when in ("before", "after")]
    if scaled:
        worst = max(scaled, key=lambda t: abs(math.log10(t[2])))
        decades = abs(math.log10(worst[2]))
        after = ", ".join(f"{name[1:]}: {x['score_std_after_scaled']:.2f}" for name, x in r.items())
        out.append(report.claim("with ÷√d the score std stays within an order of magnitude of 1 "
                                "(init and trained, every width; book 3.44 trained)", decades < 1,
                                f"trained {after}; farthest from 1: {worst[2]:.3g} ({worst[0][1:]}, {worst[1]} "
                                "training)", 1 - decades))
    return out


# --- tables and figures ------------------------------------------------------------------------

def _pct(x):
    return None if x is None else f"{100 * x:.1f}%"


def score_rows(records: list[dict], book: bool) -> list[dict]:
    out = []
    for r in records:
        for scale, way in VARIANTS:
            key = "scaled" if scale else "unscaled"
            b = BOOK_SCORES.get((r["name"], scale), {}) if book else {}
            out.append({"name": r["name"], "way": way,
                        "std_before": r[f"score_std_before_{key}"], "std_after": r[f"score_std_after_{key}"],
                        "book_std": b.get("std"),
                        "ent_before": r[f"entropy_before_{key}"], "ent_after": r[f"entropy_after_{key}"],
                        "book_entropy": b.get("entropy"),
                        "frozen_before": _pct(r[f"frozen_before_{key}"]), "frozen_after": _pct(r[f"frozen_after_{key}"]),
                        "book_frozen": b.get("frozen")})
    return out


def _curve(run: dict, stat: str):
    import numpy as np
    points = [(0, np.mean(run["measures"]["init"][stat]))]
    points += [(p["step"], np.mean(p[stat])) for p in run["history"] if stat in p]
    return [p[0] for p in points], [p[1] for p in points]


def scores_figure(records: list[dict], title: str):
    from experiments.plots import integer_steps
    fig, axes = report.figure(ncols=3, size=(17, 4.8))
    panels = [("score_std", "std of the scores fed to the softmax", "score std (log)"),
              ("entropy", "mean attention entropy (nats)", "entropy (nats)"),
              ("frozen", f"share of rows with > {FROZEN} on one token", "share of rows")]
    for i, r in enumerate(records):
        for scale, way in VARIANTS:
            run = r["runs"]["scaled" if scale else "unscaled"]
            for ax, (stat, _, _) in zip(axes, panels):
                xs, ys = _curve(run, stat)
                ax.plot(xs, ys, "o-" if scale else "s--", markersize=3, color=f"C{i}",
                        label=f"d_head {r['d_head']}, {way}")
    T = records[0]["runs"]["scaled"]["config"]["context"] if records else 128
    axes[1].axhline(uniform_entropy(T), color="gray", linestyle=":", label="uniform causal rows")
    for ax, (_, panel, ylabel) in zip(axes, panels):
        ax.set(title=panel, xlabel="step (0 = initialisation)", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        integer_steps(ax)
    axes[0].set_yscale("log")
    axes[2].set_ylim(-0.03, 1.03)
    handles, labels = axes[1].get_legend_handles_labels()
    axes[2].legend(handles, labels, fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    return fig


def perplexity_figure(records: list[dict], title: str):
    fig, axes = report.figure(ncols=2, size=(13, 4.8))
    xs = list(range(len(records)))
    ax = axes[0]
    for key, way, marker, shift in (("val_scaled", "÷√d", "o", -0.06), ("val_unscaled", "no ÷", "s", 0.06)):
        ax.errorbar([x + shift for x in xs], [r[key] for r in records], fmt=marker, markersize=8, label=way,
                    yerr=[r[f"{key}_sd"] for r in records] if any(r[f"{key}_sd"] for r in records) else None)
    ax.set(ylabel="held-out perplexity", title="val perplexity, both ways")
    ax = axes[1]
    ax.bar(xs, [r["gain"] for r in records], color="C2", alpha=0.7, label="gain (ours): no ÷ − ÷√d",
           yerr=[r["gain_std"] for r in records] if any(r["gain_std"] for r in records) else None)
    # the book's d_head 32 figure is words ("worth nothing"): drawn at 0
    book = [(i, 0.0 if r["book_gain_text"] == "≈0" else r["book_gain"]) for i, r in enumerate(records)
            if r["book_gain_text"] is not None]
    if book:
        ax.plot([i for i, _ in book], [b for _, b in book], "kx", markersize=10, label="gain (book)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(ylabel="perplexity points", title="what ÷√d is worth")
    for ax in axes:
        ax.set_xticks(xs, [f"{r['d_head']}\n{'ladder block' if r['budget'] == 'long' else 'no LN'}"
                           for r in records])
        ax.set_xlabel("head width d_head")
        ax.grid(True, axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title)
    return fig


def curves_figure(records: list[dict], title: str):
    """Held-out perplexity over training, one colour per width, solid ÷√d, dashed without (as scores.png)."""
    import numpy as np
    from experiments.plots import integer_steps
    fig, ax = report.figure(size=(9, 5))
    for i, r in enumerate(records):
        for scale, way in VARIANTS:
            points = r["runs"]["scaled" if scale else "unscaled"]["history"]
            ax.plot([p["step"] for p in points], [float(np.mean(p["val_ppl"])) for p in points],
                    "o-" if scale else "s--", markersize=3, color=f"C{i}", label=f"d_head {r['d_head']}, {way}")
    ax.set(yscale="log", xlabel="step", ylabel="held-out perplexity", title="val perplexity over training")
    ax.grid(True, which="both", alpha=0.3)
    integer_steps(ax)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    return fig


def run(ctx) -> Result:
    from attention_jax.data import eval_windows
    from attention_jax.harness.tables import TextTable
    table = TextTable.open(ctx)
    probe_windows, _ = eval_windows(table.splits[1], ONE_BLOCK.context, max_windows=PROBE_WINDOWS)
    records = []
    for row in ROWS:
        if row.name not in ctx.rows:
            continue
        tc = _budget(ctx, row)
        runs = {}
        for scale, way in VARIANTS:
            cfg = dataclasses.replace(row.config, scale=scale)
            runs[scale] = rec = _train(table, f"{row.name}_{'scaled' if scale else 'unscaled'}", cfg, tc,
                                       probe_windows)
            took = "cached" if rec["cached"] else f"{rec['seconds']:.0f} s"
            print(f"  {row.name:<6} {way:<5} params {rec['params']:>9,}  val {rows_fmt(rec)}  score std "
                  f"{rec['measures']['init']['score_std'][0]:.3g} -> {rec['score_std']:.3g}  frozen "
                  f"{100 * rec['frozen']:.1f}%  ({took})", flush=True)
        r = combine(row, runs, table.book)
        r.update(budget=row.budget, setup=_describe(tc))
        records.append(r)
    columns = [("name", "row", ""), ("label", "model", ""), ("setup", "budget", ""), ("params", "params", ",d"),
               ("scaled", "val ppl ÷√d", ""), ("unscaled", "val ppl no ÷", ""),
               ("gain_text", "gain (no ÷ − ÷√d)", ""), ("book_gain_text", "book gain", "")]
    score_columns = [("name", "row", ""), ("way", "scores", ""),
                     ("std_before", "score std init", ".3g"), ("std_after", "score std trained", ".3g"),
                     ("book_std", "book std", ""),
                     ("ent_before", "entropy init", ".3f"), ("ent_after", "entropy trained", ".3f"),
                     ("book_entropy", "book entropy", ""),
                     ("frozen_before", "> 0.99 init", ""), ("frozen_after", "> 0.99 trained", ""),
                     ("book_frozen", "book > 0.99", "")]
    n = len(table.seeds)
    budgets = {}
    for r in records:
        budgets.setdefault(r["setup"], []).append(r["name"])
    title = (f"scale_ablation, {ctx.preset} preset, {n} seed(s), {table.corpus.name}\n"
             + "; ".join(f"{', '.join(names)}: {setup}" for setup, names in budgets.items()))
    figures = {}
    if records:
        figures = {"scores.png": scores_figure(records, title), "perplexity.png": perplexity_figure(records, title)}
        if any(len(run["history"]) > 1 for r in records for run in r["runs"].values()):
            figures["curves.png"] = curves_figure(records, title)
    T = ONE_BLOCK.context
    tables = {"Held-out perplexity with and without ÷√d": report.format_table(columns, records),
              f"Inside the scores: {PROBE_WINDOWS} held-out windows of {T}, at initialisation and trained "
              f"(entropy in nats; uniform causal rows {uniform_entropy(T):.3f})":
                  report.format_table(score_columns, score_rows(records, table.book))}
    summary = [report.book(f"{r['name']}: perplexity gain from ÷√d", r["book_gain_text"], r["gain_text"])
               for r in records if r["book_gain_text"] is not None]
    return Result(rows=records, claims=report.claims_across_seeds(claims, {r["name"]: r for r in records}, n),
                  tables=tables, figures=figures, book=summary,
                  config={"long": dataclasses.asdict(ctx.settings),
                          "short": dataclasses.asdict(_budget(ctx, ROWS[-1])), "seeds": table.seeds,
                          "rows": {row.name: {"budget": row.budget, "config": row.config.to_dict()} for row in ROWS},
                          "probe_windows": PROBE_WINDOWS, "frozen_above": FROZEN, "data": table.describe()})


def rows_fmt(rec: dict) -> str:
    from attention_jax.harness.rows import fmt
    return fmt(rec["val_ppl"], rec["val_ppl_std"])


EXPERIMENT = Experiment("scale_ablation", __doc__, PRESETS, run, rows=[r.name for r in ROWS])
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
