"""`run`: the init measurement, the four trained rows, their tables, claims and figures."""
from __future__ import annotations

import dataclasses

from attention_jax.errors import ConfigError
from experiments.harness import report
from experiments.harness.cli import positive_int
from experiments.harness.experiment import Result
from experiments.norms.constants import (BASE, BOOK_INIT, BOOK_PPL, DEPTH, N_LAYERS, NORMS, PROBE, PROBE_SEED, ROWS,
                                         model_config)
from experiments.norms.figures import early_figure, init_figure
from experiments.norms.measure import measure_init


def flags(p) -> None:
    p.add_argument("--warmup", type=positive_int, default=None, metavar="N",
                   help="warmup rows: linear warmup over N steps (default: the preset's; the book's 200)")


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


def check_warmup(names, warmup: int, steps: int) -> int:
    """The warmup rows' warmup, refused when it does not fit in the run; no-warmup rows alone never use it."""
    if any(ROWS[n][1] for n in names) and not 0 < warmup < steps:
        raise ConfigError(f"warmup {warmup} must be between 1 and steps - 1 ({steps - 1}); use --warmup N "
                          f"with N < --steps")
    return warmup


def run(ctx) -> Result:
    from experiments.harness.rows import Table
    tc = ctx.settings
    warm = check_warmup(ctx.rows, ctx.args.warmup or tc.warmup_steps, tc.steps)
    table = Table.on_corpus(ctx)
    # 1. The gradient norm of each block at initialisation, before any step.
    init_seeds = list(range(max(len(table.seeds), PROBE[ctx.preset][2])))
    init = measure_init(ctx, table, init_seeds)
    init_rows = init_table_rows(init, len(init_seeds), table.book, DEPTH.get(ctx.preset, N_LAYERS))
    # 2. The four trained rows.
    records = trained_rows(ctx, table, warm)
    budget = f"{table.budget()}, warmup {warm}"
    summary = [report.book(f"{r['name']}: val perplexity", r["book_val_ppl"], r["val"]) for r in records
               if r["book_val_ppl"] is not None]
    summary += [report.book(f"{norm}-norm: last/first block gradient norm at init", BOOK_INIT[norm]["ratio"],
                            init[norm]["ratio"]) for norm in init if table.book and norm in BOOK_INIT]
    batch, n_batches, _ = PROBE[ctx.preset]
    result = table.result(records, claims=claims, tables=tables_for(ctx.preset, init_rows, records, budget, len(init_seeds)),
                          figures=figures_for(ctx, init, records, budget, warm, table.book, len(init_seeds)),
                          book=summary, extra={"init": init_rows},
                          config={"warmup_steps": warm, "init_seeds": init_seeds,
                                  "probe": {"batch_size": batch, "batches": n_batches, "data_seed": PROBE_SEED},
                                  "models": {n: model_config(n, ctx.preset).to_dict() for n in NORMS}})
    result.claims += report.claims_across_seeds(init_claims, init, len(init_seeds))
    return result


def init_table_rows(init: dict, n_seeds: int, book: bool, depth: int) -> list[dict]:
    """A row per norm of the init measurement, beside the book's, each printed as it is made."""
    from experiments.harness.rows import fmt
    rows = []
    for norm in NORMS:
        rec = init[norm]
        b = BOOK_INIT[norm] if book else {}
        rows.append({**rec, "book_first": b.get("first"), "book_last": b.get("last"),
                     "book_ratio": b.get("ratio"), "first_text": fmt(rec["first"], rec["first_std"], ".4f"),
                     "last_text": fmt(rec["last"], rec["last_std"], ".4f"),
                     "ratio_text": fmt(rec["ratio"], rec["ratio_std"], ".2f")})
        print(f"  init {norm:<4}  block 1 {rec['first']:.4f}  block {depth} {rec['last']:.4f}  "
              f"ratio {rec['ratio']:.2f}  ({n_seeds} seeds)", flush=True)
    return rows


def trained_rows(ctx, table, warm: int) -> list[dict]:
    """The chosen rows of the four, trained (or cached), each beside the book's and pre-norm's without warmup."""
    tc, book = ctx.settings, table.book
    with_warmup, without = dataclasses.replace(tc, warmup_steps=warm), dataclasses.replace(tc, warmup_steps=0)
    records = []
    for name, (norm, warmup) in ROWS.items():
        if name not in ctx.rows:
            continue
        r = table.train(name, model_config(norm, ctx.preset), train_config=with_warmup if warmup else without,
                        say=lambda r: f"train {r['train']:>16}  val {r['val']:>16}")
        r.update(norm=norm, warmup=warm if warmup else 0, book_val_ppl=BOOK_PPL[name] if book else None,
                 lr_first=r["train_log"][0]["lr"] if r["train_log"] else None)
        records.append(r)
    base = next((r for r in records if r["name"] == "pre_no_warmup"), None)
    for r in records:
        r["vs_pre"] = r["val_ppl"] / base["val_ppl"] if base else None
        r["book_vs_pre"] = BOOK_PPL[r["name"]] / BOOK_PPL["pre_no_warmup"] if book else None
    return records


def tables_for(preset: str, init_rows: list[dict], records: list[dict], budget: str, n_seeds: int) -> dict[str, str]:
    depth, (batch, n_batches, _) = DEPTH.get(preset, N_LAYERS), PROBE[preset]
    init_columns = [("name", "norm", ""), ("first_text", "block 1", ""), ("last_text", f"block {depth}", ""),
                    ("ratio_text", f"block {depth} / block 1", ""), ("book_first", "book block 1", ".4f"),
                    ("book_last", f"book block {N_LAYERS}", ".4f"), ("book_ratio", "book ratio", ".2f")]
    columns = [("name", "row", ""), ("norm", "norm", ""), ("warmup", "warmup steps", "d"),
               ("train", "train ppl", ""), ("val", "val ppl", ""), ("book_val_ppl", "book val ppl", ".2f"),
               ("vs_pre", "val / pre-norm no warmup", ".2f"), ("book_vs_pre", "book ratio", ".2f")]
    return {f"Gradient norm per block at initialisation ({n_seeds} seeds, mean ± std; "
            f"{n_batches} fixed batch(es) of {batch} windows)": report.format_table(init_columns, init_rows),
            f"Perplexity, {depth} blocks of width {BASE.d_model}: pre/post-norm x warmup ({budget})":
                report.format_table(columns, records)}


def figures_for(ctx, init: dict, records: list[dict], budget: str, warm: int, book: bool, n_seeds: int) -> dict:
    from experiments.plots import curves
    preset = ctx.preset
    batch, n_batches, _ = PROBE[preset]
    made = {"init_grad_norms.png": init_figure(
        init, f"norms: gradient norm per block at init, {n_seeds} seeds, {n_batches} x {batch} windows "
              f"({preset} preset)", book)}
    if records:
        first = min(ctx.settings.steps, 2 * warm)
        made["early_steps.png"] = early_figure(records, first, f"norms: the first {first} steps, {budget}", warm)
    if any(len(r["history"]) > 1 for r in records):
        made["curves.png"] = curves(records, ("val_ppl", "train_ppl"),
                                    ("held-out (val) perplexity", "train perplexity"), f"norms, {budget}")
    return made
