"""`run`: every variant measured from n = 128 up, a process per row, then tables, exponents and claims."""
from __future__ import annotations

import json
import math
import time

import numpy as np

from attention_jax.errors import ConfigError
from experiments.complexity.constants import (BOOK, COLUMNS, D_MODEL, HEADROOM, LAYER, MIB, N_HEADS, TITLES, VARIANTS,
                                              matrix_bytes)
from experiments.harness import cli, report
from experiments.harness.experiment import Result


def run_child(n: int, variant: str, **kw) -> dict:
    """One row, measured in a process of its own (experiments.complexity.measure)."""
    from experiments.complexity.measure import run_child as child   # imports JAX: after --help
    return child(n, variant, **kw)


def measure_all(p: dict, variants: list[str], max_tokens: int | None, budget: int | None, partial) -> dict:
    """Every variant from n = 128 up, doubling; rows that ran go to `partial`, which a rerun resumes."""
    done = {(r["variant"], r["n"], r["repeats"], r["chunk_size"], r.get("layer", 1)): r
            for r in map(json.loads, partial.read_text().splitlines() if partial.exists() else [])}
    results = {variant: [] for variant in variants}
    for variant, rows in results.items():
        top, last = min(p["max_n"][variant], max_tokens or math.inf), {}
        for n in (128 * 2 ** i for i in range(int(math.log2(top / 128)) + 1)):
            grow, start = (n / last["n"]) ** 2 if last else 0.0, time.perf_counter()
            key = (variant, n, p["repeats"] if n < p["one_repeat_from"] else 1, p["chunk_size"], LAYER)
            if last.get("oom"):                   # a larger n needs more still: nothing to start
                r = {"n": n, "variant": variant, "oom": True, "estimate_bytes": last.get("estimate_bytes", 0) * grow}
            elif (r := done.get(key)) is None:    # expect what the last row took, grown as n²
                expect = grow * max((last.get("peak_mb") or 0) * MIB, last.get("xla_total_bytes", 0))
                done[key] = r = run_child(n, variant, repeats=key[2], chunk_size=p["chunk_size"],
                                          expect_bytes=expect, budget_bytes=budget) | {"layer": LAYER}
                report.atomic_write(partial, "\n".join(json.dumps(x) for x in done.values() if x.get("ms") is not None))
            # peak: the allocator's on an accelerator, else what the process grew by
            ran, used = r.get("ms") is not None, r.get("device_peak_bytes") or r.get("rss_peak_bytes")
            r = dict(r, matrix_mb=matrix_bytes(n) / MIB, peak_mb=used / MIB if ran and used is not None else None,
                     xla_mb=r["xla_total_bytes"] / MIB if ran else None)
            if ran and last.get("ms"):
                r.update(ms_x4=r["ms"] / last["ms"], mb_x4=r["peak_mb"] / last["peak_mb"] if last["peak_mb"] else None)
            said = f"{r['ms']:,.1f} ms, {r['peak_mb'] or 0:,.1f} MB" if ran else \
                r.get("error") or f"out of memory: needs ~{r['estimate_bytes'] / MIB:,.0f} MB, not run"
            print(f"  {variant:<10} n = {n:>7,}  {said}  ({time.perf_counter() - start:.1f} s)", flush=True)
            rows.append(last := r)
    return results


def tabulate(results: dict) -> tuple[dict, dict]:
    """A table per variant (the book's beside the naive one), and log-log slopes over the last four rows."""
    tables, fits, book = {}, {}, [("book_ms", "book ms", ".3f"), ("book_mb", "book peak MB", ",.1f")]
    for variant, rows in results.items():
        pts = {key: np.log([(r["n"], r[key]) for r in rows if r.get(key)][-4:]) for key in ("ms", "peak_mb")}
        fit = fits[variant] = {what: float(np.polyfit(*pts[key].T, 1)[0]) if len(pts[key]) >= 2 else math.nan
                               for what, key in (("time", "ms"), ("memory", "peak_mb"))}   # log-log slope
        est = lambda r: r.get("estimate_bytes") and f"~{r['estimate_bytes'] / MIB:,.0f} est."
        shown = [dict(r, book_ms=BOOK.get(r["n"], (None,))[0], book_mb=BOOK.get(r["n"], (None, None))[1]) | ({} if
                 r.get("ms") is not None else {"ms": "out of memory" if r.get("oom") else "failed", "peak_mb": est(r)})
                 for r in rows]
        slope = lambda x: f"n^{x:.2f}" if math.isfinite(x) else "n^? (fewer than two rows measured)"
        tables[TITLES[variant]] = report.format_table(COLUMNS + (book if variant == "naive" else []), shown) + (
            f"\n\nfitted exponent (log-log slope, last four rows): time ~ {slope(fit['time'])}"
            f"   memory ~ {slope(fit['memory'])}" + ("   (book: n^1.91, n^1.87)" if variant == "naive" else ""))
    return tables, fits


def check_claims(results: dict, fits: dict, top: int) -> list[dict]:
    if set(results) != set(VARIANTS):             # every claim compares variants: all four are needed
        return []
    at = lambda variant, n: next((r for r in results[variant] if r["n"] == n), {})
    ran = lambda r: r.get("ms") is not None
    mem = lambda r: (r.get("peak_mb") or 0) * MIB or r.get("estimate_bytes") or math.nan   # estimate if not run
    reach = {v: max([r["n"] for r in results[v] if ran(r)] or [0]) for v in VARIANTS}
    claims = [report.claim(f"naive {what} per doubling → 4: fitted exponent in [1.6, 2.2] (book n^{book})",
                           1.6 <= fits["naive"][what] <= 2.2, f"n^{fits['naive'][what]:.2f} over the last four rows")
              for what, book in (("time", 1.91), ("memory", 1.87))]
    n = min(16384, reach["memeff"], reach["memeff_bwd"])
    for variant, goal in (("memeff", 59), ("memeff_bwd", 32)):
        naive, eff = at(variant.replace("memeff", "naive"), n), at(variant, n)
        claims.append(report.claim(
            f"at n = {n:,} the memory-efficient {'forward' if variant == 'memeff' else 'forward + backward'} needs "
            f"≥ {goal}× less memory than naive (Rabe & Staats 2021: {goal}× at 16,384)",
            mem(naive) / mem(eff) >= goal,
            f"{mem(naive) / mem(eff):.0f}×: naive {mem(naive) / MIB:,.0f} MB "
            f"({'measured' if ran(naive) else 'estimated, not run'}) vs {mem(eff) / MIB:,.1f} MB"))
    both = min(reach["naive"], reach["memeff"])
    slow = at("memeff", both).get("ms", math.nan) / at("naive", both).get("ms", math.nan)
    claims.append(report.claim(f"the memory-efficient forward is within 1.3× of naive time at n = {both:,} "
                               "(the largest both ran)", slow <= 1.3, f"{slow:.2f}× naive's time"))
    end = at("memeff", top)
    stop = next((r for r in results["naive"] if not ran(r)), None)     # else the preset's largest n stopped it
    why = ("out of memory" if stop.get("oom") else "failed") if stop else "the largest n asked for, not memory"
    claims.append(report.claim(
        f"the memory-efficient forward keeps going where the naive one stops, up to n = {top:,}",
        ran(end) and reach["memeff"] > reach["naive"], f"naive up to {reach['naive']:,} (then: {why}), "
        f"memory-efficient up to {reach['memeff']:,}"
        + (f" ({end['ms'] / 1e3:,.1f} s, {mem(end) / MIB:,.0f} MB)" if ran(end) else "")))
    return claims


def figure(results: dict, preset: str):
    fig, (ax_t, ax_m) = report.figure(ncols=2, size=(12, 4.8))
    fig.suptitle(f"one attention layer (width {D_MODEL}, {N_HEADS} heads, batch 1, float32), {preset} preset")
    for variant, rows in results.items():
        ran = [r for r in rows if r.get("ms") is not None and r["peak_mb"]]
        est = [r for r in rows if r.get("ms") is None and r.get("estimate_bytes")]
        color = ax_t.loglog([r["n"] for r in ran], [r["ms"] for r in ran], "o-", label=TITLES[variant])[0].get_color()
        ax_m.loglog([r["n"] for r in ran], [r["peak_mb"] for r in ran], "o-", color=color, label=TITLES[variant])
        ax_m.loglog([r["n"] for r in est], [r["estimate_bytes"] / MIB for r in est], "x", color=color, ms=9)
    ax_m.loglog(ns := sorted({r["n"] for rows in results.values() for r in rows}),
                [matrix_bytes(n) / MIB for n in ns], "k:", label="one n×n matrix, 8·n²·4 B")
    ax_t.set(xlabel="tokens n", ylabel="ms per call", title="time (slope 2 is n²)")
    ax_m.set(xlabel="tokens n", ylabel="MB", title="peak memory (x: out of memory, estimated)")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2), ax.grid(True, which="both", alpha=0.3), ax.legend(fontsize=7)
    return fig


def run(ctx) -> Result:
    args, p = ctx.args, ctx.settings
    if args.max_tokens is not None and args.max_tokens < 256:   # a slope needs two rows: 128 and 256
        raise ConfigError(f"--max-tokens {args.max_tokens} leaves fewer than two rows (128, 256, 512, ... tokens) "
                          "to fit an exponent to; use --max-tokens 256 or more")
    p = dict(p, chunk_size=args.chunk_size or p["chunk_size"])
    budget, started = args.memory_budget_mb and args.memory_budget_mb * MIB, time.perf_counter()
    if budget and budget <= HEADROOM:    # no row could run: say so before starting a process per variant
        raise ConfigError(f"--memory-budget-mb {args.memory_budget_mb} leaves nothing to measure: every row keeps "
                          f"{HEADROOM // MIB:,} MB free besides what it needs; raise it above {HEADROOM // MIB:,}")
    variants, folder = cli.choose_names(args.variants, list(VARIANTS), "variant"), ctx.folder
    results = measure_all(p, variants, args.max_tokens, budget, folder / "partial.jsonl")
    stopped = [v for v, rows in results.items() if sum(r.get("ms") is not None for r in rows) < 2]
    if budget and stopped:     # a claim on no rows would be a FAIL on nan: say what the budget cost instead
        raise ConfigError(f"--memory-budget-mb {args.memory_budget_mb} leaves {', '.join(stopped)} fewer than two "
                          "rows to measure (128 and 256 tokens at least); raise it")
    tables, fits = tabulate(results)
    gpu = any(r.get("device_peak_bytes") for rows in results.values() for r in rows)
    notes = (f"ms: median of timed calls after compiling (one if n >= {p['one_repeat_from']:,} or a call takes "
             "over 2 s); x4: ratio to the row above. attn matrix MB: 8·n²·4 B. XLA plan MB: the compiled program's "
             "arguments + outputs + temporaries. peak MB: " + ("the device allocator's peak" if gpu else "the "
             "process's resident-memory growth in the calls (counts what the plan leaves out)") + ". out of memory: "
             "not run, estimated from the plan, the n² floor and the row above.")
    claims = check_claims(results, fits, min(p["max_n"]["memeff"], args.max_tokens or math.inf))
    (folder / "partial.jsonl").unlink(missing_ok=True)    # complete: the next run measures afresh
    book = [report.book(f"naive attention: {what} exponent", f"n^{b}", f"n^{fits['naive'][what]:.2f}")
            for what, b in (("time", 1.91), ("memory", 1.87)) if "naive" in fits]
    return Result(rows=[r for rows in results.values() for r in rows], claims=claims, book=book,
                  tables=tables | {"Notes": notes},
                  figures={"complexity.png": figure(results, ctx.preset)},
                  config=dict(p, max_tokens=args.max_tokens, budget_bytes=budget, d_model=D_MODEL, n_heads=N_HEADS),
                  extra={"exponents": fits, "seconds": time.perf_counter() - started, "results": results})


def flags(parser):
    parser.add_argument("--max-tokens", type=cli.positive_int, help="largest n to measure (caps every variant)")
    parser.add_argument("--chunk-size", type=cli.positive_int, help="block size of the memory-efficient attention")
    parser.add_argument("--memory-budget-mb", type=cli.positive_int,
                        help="treat this many MB as free instead of asking")
    parser.add_argument("--variants", help=f"a comma-separated subset of {','.join(VARIANTS)} (default: all)")
