"""`run`: choose the contestants, let them take turns, then the table, the claims and one JSON line."""
from __future__ import annotations

import json
import os

from attention_jax.errors import ConfigError, UserError
from experiments.configs import ONE_BLOCK
from experiments.harness import cli, report
from experiments.harness.experiment import Result
from experiments.harness.oracles import NOT_MEASURED, absent, missing, note
from experiments.throughput.constants import CLAIM, CONTEXT, GOAL_MFU, GOAL_RATIO
from experiments.throughput.lineup import allocators, auto_dtypes, contestants

COLUMNS = [("name", "contestant", ""), ("kernel", "attention", ""), ("dtype", "dtype", ""),
           ("allocator", "allocator", ""), ("parallel", "parallel", ""), ("per_call", "steps/call", ""),
           ("ms", "ms/step (median)", ".1f"), ("p25", "p25", ".1f"), ("p75", "p75", ".1f"),
           ("tokens_per_s", "tokens/s", ",.0f"), ("peak_gflops", "matmul peak GFLOP/s", ",.0f"),
           ("mfu", "MFU", ".2f"), ("mfu_float32", "MFU of float32 peak", ".2f"), ("vs_ours", "ms / ours", ".2f")]
FASTER_THAN_BEST = "JAX step faster than the fastest PyTorch allocator setup tried"
AS_FAST_AS_GOAL = f"JAX step at least {GOAL_RATIO}x as fast as the fastest PyTorch setup tried"


def flags(parser):
    parser.add_argument("--json", action="store_true", help="also print one JSON line with the numbers")
    parser.add_argument("--no-torch", action="store_true", help="time ours only")
    parser.add_argument("--rounds", type=cli.positive_int, default=None, help="turns per contestant (preset's default)")
    parser.add_argument("--allocator", default="auto", help="ours': auto (best found), mimalloc, jemalloc, "
                        "mallopt (glibc tuned in-process) or system (glibc as is)")
    parser.add_argument("--attention", default="auto", help="comma-separated backends to time: auto, reference, "
                        "chunked, fused (the first is 'ours')")
    parser.add_argument("--dtype", default="auto", help="comma-separated: float32, bfloat16 (activations and "
                        "products), bfloat16_matmul (float32 with bfloat16 products); auto: bfloat16_matmul,float32 "
                        "on a CPU with bfloat16 units, else float32 (the first is 'ours')")
    parser.add_argument("--context", type=cli.positive_int, default=CONTEXT, help="tokens per sequence")
    parser.add_argument("--batch", type=cli.positive_int, default=None, help="sequences per step (preset's default)")


def run(ctx) -> Result:
    args = ctx.args
    gone = [] if args.no_torch else missing("torch")
    if gone:        # the reference contestant: without it, ours alone and its claims not checked
        print(note("PyTorch's step", gone), flush=True)
    # Contestants share an accelerator, taking turns: none reserves most of its memory up front
    # (XLA_PYTHON_CLIENT_PREALLOCATE=false, set by the harness before this process looked for it).
    worker_env = dict(os.environ)
    p, variants, on_cpu = asked(ctx)
    T, work = args.context, step_work(args.context, p["batch"])
    rows = contestants(p, args.allocator, torch=not args.no_torch and not gone and T == CONTEXT, one_device=on_cpu,
                       loss_only=True, variants=variants, context=T)
    from experiments.throughput.worker import take_turns   # the worker module is also run as a script
    got = take_turns(rows, p, worker_env)
    if got["ours"].get("failed"):
        raise UserError(f"our step could not run at context {T}, batch {p['batch']} "
                        f"({got['ours'].get('reason', 'no output')}); "
                        "try --attention chunked or a smaller --batch")
    records = timed(got, rows, work)
    summary = summarise(got, rows, records, work, p["batch"], T)
    claims = judge({r["name"]: r for r in records}, summary, gone)
    say(summary, work, T)
    if args.json:
        print(json.dumps(summary))
    return Result(rows=records, claims=claims, tables={"Training step": report.format_table(COLUMNS, records)},
                  config={**p, "model": ONE_BLOCK.to_dict()}, extra={"summary": summary})


def asked(ctx) -> tuple[dict, list[tuple[str, str]], bool]:
    """The preset with --rounds and --batch, the (attention, dtype) pairs to time, and whether on a CPU;
    a name or allocator that is not there refused in one line."""
    from experiments.harness.platform import accelerator, host_cpu
    args = ctx.args
    p = {**ctx.settings, **({"rounds": args.rounds} if args.rounds else {}),
         **({"batch": args.batch} if args.batch else {})}
    attentions = cli.choose_names(args.attention, ["auto", "reference", "causal_halves", "chunked", "fused"], "attention",
                                  as_given=True)
    on_cpu = accelerator() is None
    dtypes = auto_dtypes(on_cpu, host_cpu()["bf16_units"]) if args.dtype == "auto" else \
        cli.choose_names(args.dtype, ["float32", "bfloat16", "bfloat16_matmul"], "dtype", as_given=True)
    if args.allocator not in ("auto", "system", *allocators()):
        raise ConfigError(f"--allocator {args.allocator}: not available here; choose auto, system or one "
                          f"found: {', '.join(allocators())}")
    return p, [(a, d) for d in dtypes for a in attentions], on_cpu


def step_work(T: int, batch: int) -> dict:
    """Useful work per step: PaLM's 6·N + 12·L·T·d FLOPs per token, N the parameters outside the tables."""
    from attention_jax.parameters import param_breakdown   # imports JAX: after --help
    cfg = ONE_BLOCK
    n_params = sum(n for part, n in param_breakdown(cfg).items() if part not in ("token_embed", "position_embed"))
    tokens = batch * T
    return {"n_params": n_params, "tokens": tokens, "flops": tokens * (6 * n_params + 12 * cfg.n_layers * T * cfg.d_model)}


def timed(got: dict, rows: dict, work: dict) -> list[dict]:
    """A table row per contestant: median ms and quartiles, tokens/s, MFU against its dtype's peak."""
    import numpy as np   # here, not at the top: a worker process imports this package before its mallopt
    peak32, tokens, flops = got["ours"]["peak_flops_float32"], work["tokens"], work["flops"]
    low_peak = next((r["peak_flops"] for n, r in got.items() if n.startswith("ours") and not r.get("failed")
                     and r.get("dtype") != "float32"), got["ours"]["peak_flops"])   # bfloat16's, for torch's autocast row
    ours_ms = 1e3 * float(np.median(got["ours"]["times"]))
    records = []
    for name, r in got.items():
        if r.get("failed"):
            records.append(dict(name=name, allocator=rows[name][2], ms=f"failed: {r.get('reason', 'no output')}"))
            continue
        ms, p25, p75 = (float(np.percentile(1e3 * np.asarray(r["times"]), q)) for q in (50, 25, 75))
        # MFU against the matmul peak in the contestant's dtype (torch's: one of ours measured in it)
        own_peak = r.get("peak_flops") or (peak32 if r.get("dtype", "float32") == "float32" else low_peak)
        records.append(dict(name=name, allocator=rows[name][2], backend=r["backend"], ms=ms, p25=p25, p75=p75,
                            attention=r.get("attention", "-"), kernel=r.get("attention_kernel", r.get("attention", "-")),
                            dtype=r.get("dtype", "float32"),
                            peak_gflops=own_peak / 1e9,
                            parallel=f"{r['devices']} device(s)" if "devices" in r else f"{r['threads']} threads",
                            per_call=r.get("steps_per_call", 1),
                            tokens_per_s=tokens / ms * 1e3, mfu=flops / ms * 1e3 / own_peak,
                            mfu_float32=flops / ms * 1e3 / peak32, vs_ours=ms / ours_ms))
    return records


def summarise(got: dict, rows: dict, records: list[dict], work: dict, batch: int, T: int) -> dict:
    """Ours in figures (the JSON line and results.json's summary), and torch's best beside it when timed."""
    import numpy as np
    by, flops = {r["name"]: r for r in records}, work["flops"]
    ours, ours_ms = by["ours"], 1e3 * float(np.median(got["ours"]["times"]))
    summary = dict(ms_per_step=ours_ms, tokens_per_s=ours["tokens_per_s"], mfu=ours["mfu"],
                   mfu_float32=ours["mfu_float32"], peak_flops_float32=got["ours"]["peak_flops_float32"],
                   attention=ours["attention"], attention_kernel=ours["kernel"], dtype=ours["dtype"],
                   context=T,
                   variants={r["name"]: {k: r.get(k) for k in ("attention", "kernel", "dtype", "ms", "tokens_per_s", "mfu")}
                             for r in records if r["name"].startswith("ours (")},
                   backend=ours["backend"], devices=got["ours"]["devices"], allocator=rows["ours"][2],
                   steps_per_call=ours["per_call"],
                   mallopt=got["ours"]["mallopt"], allocators_found=list(allocators()),
                   flops_per_step=flops, flops_per_s=flops / ours_ms * 1e3, peak_flops=got["ours"]["peak_flops"],
                   batch=batch)
    if "ours, loss only" in by:   # what the step's metrics (grad norms per block, lr) cost
        summary["metrics_cost"] = ours_ms / by["ours, loss only"]["ms"] - 1
    if "torch" in by and isinstance(by["torch"]["ms"], float):
        torch_refs = {n: r["ms"] for n, r in by.items() if n.startswith("torch") and isinstance(r["ms"], float)}
        best = min(torch_refs, key=torch_refs.get)
        summary.update(torch_ms_per_step=by["torch"]["ms"], ratio=ours_ms / by["torch"]["ms"],
                       torch_best=best, torch_best_ms_per_step=torch_refs[best],
                       ratio_best=ours_ms / torch_refs[best])
    return summary


def judge(by: dict, summary: dict, gone: list[str]) -> list[dict]:
    """Against torch (as installed, then its fastest setup, then the goal ratio) when it was timed; the MFU
    bar always."""
    ours_ms, claims = summary["ms_per_step"], []
    if "torch_best" in summary:
        best, best_ms, torch_ms = summary["torch_best"], summary["torch_best_ms_per_step"], summary["torch_ms_per_step"]
        claims = [report.claim(CLAIM, ours_ms < torch_ms, f"{ours_ms:.1f} vs {torch_ms:.1f} "
                               f"ms/step (ratio {summary['ratio']:.2f})", torch_ms - ours_ms),
                  report.claim(FASTER_THAN_BEST, ours_ms < best_ms, f"{ours_ms:.1f} vs {best_ms:.1f} ms/step, "
                               f"{best} (ratio {summary['ratio_best']:.2f})", best_ms - ours_ms),
                  report.claim(AS_FAST_AS_GOAL, best_ms / ours_ms >= GOAL_RATIO,
                               f"{best_ms / ours_ms:.2f}x ({best})", best_ms / ours_ms - GOAL_RATIO)]
    elif gone:
        claims = [report.unchecked(report.claim(text, False, NOT_MEASURED), absent(gone)) for text in
                  (CLAIM, FASTER_THAN_BEST, AS_FAST_AS_GOAL)]
    else:
        print("torch not timed (--no-torch, or a context other than the twin's 128): ours alone")
    claims.append(report.claim(f"JAX step's MFU at least {GOAL_MFU} of the measured float32 matmul peak",
                               summary["mfu_float32"] >= GOAL_MFU,
                               f"{summary['mfu_float32']:.2f} ({by['ours']['dtype']} step, float32 peak "
                               f"{summary['peak_flops_float32'] / 1e9:.0f} GFLOP/s)", summary["mfu_float32"] - GOAL_MFU))
    return claims


def say(summary: dict, work: dict, T: int) -> None:
    print(f"context {T}, {work['tokens']:,} tokens/step, {work['flops'] / 1e9:.2f} GFLOP/step "
          f"(6·{work['n_params']:,} + 12·L·T·d per token), matmul peak {summary['peak_flops'] / 1e9:.0f} GFLOP/s "
          f"({summary['dtype']}), {summary['peak_flops_float32'] / 1e9:.0f} in float32"
          + (f"; the step's metrics cost {100 * summary['metrics_cost']:+.1f}%" if "metrics_cost" in summary else ""))
    if summary["backend"] != "cpu":   # the float32 rows' products are not float32 there, nor the peak's
        print("float32 here: products at JAX's default precision (TF32 on a recent GPU, one bfloat16 pass on a "
              "TPU), in the step and in its matmul peak alike; JAX_DEFAULT_MATMUL_PRECISION=highest for full float32")
