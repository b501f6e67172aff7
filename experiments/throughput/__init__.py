"""Training-step throughput of the ladder's one-block model: JAX (ours) vs PyTorch eager.

`python -m experiments.throughput [--preset smoke|cpu|paper] [--json]` times the ladder's
"layer_norm" row (vocab 1024, context 128, d 128, 4 heads, one pre-norm block) through
`Engine.step`, the compiled step every experiment uses (AdamW, lr 1e-3; on a GPU/TPU several
steps per call, `Engine.steps`, as `fit` runs them there), against a torch twin
(nanoGPT style: SDPA, exact GELU, torch.optim.AdamW) at the same batch. Each contestant has
its own process and they take turns, a few steps each, so other load on the machine weighs on
all alike; medians are reported. Ours: the best allocator found (see `allocators`), data
parallel over the cores (one JAX CPU device each, Engine's mesh); also on one device. Torch:
as installed, then with each allocator found. Useful FLOPs per token = 6·N + 12·L·T·d (N =
parameters outside the embedding tables: PaLM's count, attention as if unmasked); MFU divides
by a 2048² float32 matmul timed on the same backend in the same run.
"""
from __future__ import annotations

import ctypes.util
import glob
import json
import os
import sysconfig

from attention_jax.errors import ConfigError, UserError
from experiments.harness import cli, report
from experiments.harness.oracles import NOT_MEASURED, absent, missing, note
from experiments.harness.experiment import Experiment, Result
from experiments.configs import ONE_BLOCK
from experiments.harness.platform import MALLOPT_ENV

CONTEXT = 128   # the ladder's window

NAME = "throughput"
PRESETS = {   # rounds × steps calls timed per contestant, after `warmup` calls (a call: 16 steps on a GPU/TPU)
    "smoke": dict(batch=8, warmup=1, rounds=2, steps=1, peak_size=512),   # a 512² peak: its MFU means nothing
    "cpu": dict(batch=64, warmup=3, rounds=10, steps=3),
    "paper": dict(batch=64, warmup=5, rounds=10, steps=5),
}
CLAIM = "JAX step faster than PyTorch eager on the same CPU"
GOAL_RATIO, GOAL_MFU = 1.15, 0.6   # issue 31's bar: against the fastest PyTorch setup, and of float32's matmul peak


def allocators() -> dict[str, tuple[dict, str]]:
    """Allocators that keep freed memory, best first: name -> (environment, in words).

    XLA takes a ~120-250 MB scratch area every step, which glibc maps and unmaps each time
    (page faults: +60-100 ms a step). Measured best: mimalloc (`pip install cmeel-mimalloc`),
    jemalloc (`apt-get install libjemalloc2`), then glibc tuned by mallopt (always there).
    """
    found = {}
    wheel = sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "cmeel.prefix/lib/libmimalloc.so*")))
    lib = ctypes.util.find_library("mimalloc") or (wheel[0] if wheel else None)
    if lib:
        found["mimalloc"] = ({"LD_PRELOAD": lib, "MIMALLOC_PURGE_DELAY": "-1"}, "mimalloc, LD_PRELOAD, purge off")
    lib = ctypes.util.find_library("jemalloc")
    if lib:
        found["jemalloc"] = ({"LD_PRELOAD": lib, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"},
                             "jemalloc, LD_PRELOAD, decay off")
    found["mallopt"] = ({MALLOPT_ENV: "1"}, "glibc, mallopt in-process")
    return found


def cpu_devices(batch: int) -> int:
    """JAX CPU devices for data parallelism: one per core, each with >= 32 sequences.

    One device runs the small per-head attention matmuls on one thread while the other
    cores wait; one device per core runs them side by side (batch 64 on 2 cores: -5%).
    With few sequences per device the gradient all-reduce costs more than it saves.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(n for n in range(1, min(cores, batch // 32) + 1) if batch % n == 0) if batch >= 32 else 1


def auto_dtypes(on_cpu: bool, bf16_units) -> list[str]:
    """`--dtype auto`: on a CPU with bfloat16 units (AMX, AVX512-BF16) bfloat16 products in a
    float32 step ("bfloat16_matmul", ours) and the float32 step beside it; elsewhere float32
    (a GPU's or TPU's float32 products are already TF32 or bfloat16 passes)."""
    return ["bfloat16_matmul", "float32"] if on_cpu and bf16_units else ["float32"]


def contestants(p: dict, allocator: str, torch: bool, one_device: bool, loss_only: bool = False,
                variants=(("auto", "float32"),), context: int = CONTEXT) -> dict[str, tuple[list[str], dict, str]]:
    """name -> (worker arguments, extra environment, allocator in words).

    `variants`: (attention, dtype) pairs; the first is "ours", the others "ours (attention, dtype)".
    """
    found = {**allocators(), "system": ({}, "glibc, default")}
    env, words = found[next(iter(found)) if allocator == "auto" else allocator]
    devices = str(cpu_devices(p["batch"])) if one_device else "0"
    rows = {}
    for i, (attention, dtype) in enumerate(variants):
        name = "ours" if i == 0 else f"ours ({attention}, {dtype})"
        rows[name] = (["jax", "--devices", devices, "--attention", attention, "--dtype", dtype,
                       "--context", str(context)], env, words)
    first = rows["ours"][0]
    if loss_only:   # the same step without its metrics (grad norms per block, lr): what they cost
        rows["ours, loss only"] = (first + ["--loss-only"], env, words)
    if one_device and devices != "1":   # ours on several CPU devices, against one (else the same program twice)
        rows["ours, 1 device"] = (first[:2] + ["1"] + first[3:], env, words)
    if torch:   # as its users run it, then with each allocator we could have used
        rows["torch"] = (["torch"], {}, "glibc, default")
        rows.update({f"torch + {name}": (["torch"], e, w) for name, (e, w) in found.items() if name != "system"})
        if any(d != "float32" for _, d in variants):   # torch's own mixed precision, with the best allocator
            best, (e, w) = next((n, v) for n, v in found.items() if n != "system")
            rows[f"torch + {best}, bfloat16 autocast"] = (["torch", "--dtype", "bfloat16"], e, w)
    return rows


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
    import numpy as np   # here, not at the top: a worker process imports this package before its mallopt

    from experiments.harness.platform import accelerator
    from attention_jax.parameters import param_breakdown   # imports JAX: after --help
    args = ctx.args
    gone = [] if args.no_torch else missing("torch")
    if gone:        # the reference contestant: without it, ours alone and its claims not checked
        print(note("PyTorch's step", gone), flush=True)
    # Contestants share an accelerator, taking turns: none reserves most of its memory up front
    # (XLA_PYTHON_CLIENT_PREALLOCATE=false, set by the harness before this process looked for it).
    worker_env = dict(os.environ)
    p = {**ctx.settings, **({"rounds": args.rounds} if args.rounds else {}),
         **({"batch": args.batch} if args.batch else {})}
    attentions = cli.choose_names(args.attention, ["auto", "reference", "causal_halves", "chunked", "fused"], "attention",
                                  as_given=True)
    from experiments.harness.platform import host_cpu
    on_cpu = accelerator() is None
    dtypes = auto_dtypes(on_cpu, host_cpu()["bf16_units"]) if args.dtype == "auto" else \
        cli.choose_names(args.dtype, ["float32", "bfloat16", "bfloat16_matmul"], "dtype", as_given=True)
    variants = [(a, d) for d in dtypes for a in attentions]
    cfg, T = ONE_BLOCK, args.context
    n_params = sum(n for part, n in param_breakdown(cfg).items() if part not in ("token_embed", "position_embed"))
    tokens = p["batch"] * T
    flops = tokens * (6 * n_params + 12 * cfg.n_layers * T * cfg.d_model)
    if args.allocator not in ("auto", "system", *allocators()):
        raise ConfigError(f"--allocator {args.allocator}: not available here; choose auto, system or one "
                          f"found: {', '.join(allocators())}")
    rows = contestants(p, args.allocator, torch=not args.no_torch and not gone and T == CONTEXT, one_device=on_cpu,
                       loss_only=True, variants=variants, context=T)
    from experiments.throughput.worker import take_turns   # the worker module is also run as a script
    got = take_turns(rows, p, worker_env)
    if got["ours"].get("failed"):
        raise UserError(f"our step could not run at context {T}, batch {p['batch']} "
                        f"({got['ours'].get('reason', 'no output')}); "
                        "try --attention chunked or a smaller --batch")
    peak, peak32 = got["ours"]["peak_flops"], got["ours"]["peak_flops_float32"]
    low_peak = next((r["peak_flops"] for n, r in got.items() if n.startswith("ours") and not r.get("failed")
                     and r.get("dtype") != "float32"), peak)      # bfloat16's, for torch's autocast row
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
    by = {r["name"]: r for r in records}
    columns = [("name", "contestant", ""), ("kernel", "attention", ""), ("dtype", "dtype", ""),
               ("allocator", "allocator", ""), ("parallel", "parallel", ""), ("per_call", "steps/call", ""),
               ("ms", "ms/step (median)", ".1f"), ("p25", "p25", ".1f"), ("p75", "p75", ".1f"),
               ("tokens_per_s", "tokens/s", ",.0f"), ("peak_gflops", "matmul peak GFLOP/s", ",.0f"),
               ("mfu", "MFU", ".2f"), ("mfu_float32", "MFU of float32 peak", ".2f"), ("vs_ours", "ms / ours", ".2f")]
    summary = dict(ms_per_step=ours_ms, tokens_per_s=by["ours"]["tokens_per_s"], mfu=by["ours"]["mfu"],
                   mfu_float32=by["ours"]["mfu_float32"], peak_flops_float32=peak32,
                   attention=by["ours"]["attention"], attention_kernel=by["ours"]["kernel"], dtype=by["ours"]["dtype"],
                   context=T,
                   variants={r["name"]: {k: r.get(k) for k in ("attention", "kernel", "dtype", "ms", "tokens_per_s", "mfu")}
                             for r in records if r["name"].startswith("ours (")},
                   backend=by["ours"]["backend"], devices=got["ours"]["devices"], allocator=rows["ours"][2],
                   steps_per_call=by["ours"]["per_call"],
                   mallopt=got["ours"]["mallopt"], allocators_found=list(allocators()),
                   flops_per_step=flops, flops_per_s=flops / ours_ms * 1e3, peak_flops=peak, batch=p["batch"])
    if "ours, loss only" in by:   # what the step's metrics (grad norms per block, lr) cost
        summary["metrics_cost"] = ours_ms / by["ours, loss only"]["ms"] - 1
    claims = []
    if "torch" in by and isinstance(by["torch"]["ms"], float):
        torch_refs = {n: r["ms"] for n, r in by.items() if n.startswith("torch") and isinstance(r["ms"], float)}
        best = min(torch_refs, key=torch_refs.get)
        summary.update(torch_ms_per_step=by["torch"]["ms"], ratio=ours_ms / by["torch"]["ms"],
                       torch_best=best, torch_best_ms_per_step=torch_refs[best],
                       ratio_best=ours_ms / torch_refs[best])
        claims = [report.claim(CLAIM, ours_ms < by["torch"]["ms"], f"{ours_ms:.1f} vs {by['torch']['ms']:.1f} "
                               f"ms/step (ratio {summary['ratio']:.2f})", by["torch"]["ms"] - ours_ms),
                  report.claim("JAX step faster than the fastest PyTorch allocator setup tried",
                               ours_ms < torch_refs[best], f"{ours_ms:.1f} vs {torch_refs[best]:.1f} ms/step, "
                               f"{best} (ratio {summary['ratio_best']:.2f})", torch_refs[best] - ours_ms),
                  report.claim(f"JAX step at least {GOAL_RATIO}x as fast as the fastest PyTorch setup tried",
                               torch_refs[best] / ours_ms >= GOAL_RATIO,
                               f"{torch_refs[best] / ours_ms:.2f}x ({best})", torch_refs[best] / ours_ms - GOAL_RATIO)]
    elif gone:
        claims = [report.unchecked(report.claim(text, False, NOT_MEASURED), absent(gone)) for text in
                  (CLAIM, "JAX step faster than the fastest PyTorch allocator setup tried",
                   f"JAX step at least {GOAL_RATIO}x as fast as the fastest PyTorch setup tried")]
    else:
        print("torch not timed (--no-torch, or a context other than the twin's 128): ours alone")
    claims.append(report.claim(f"JAX step's MFU at least {GOAL_MFU} of the measured float32 matmul peak",
                               summary["mfu_float32"] >= GOAL_MFU,
                               f"{summary['mfu_float32']:.2f} ({by['ours']['dtype']} step, float32 peak "
                               f"{peak32 / 1e9:.0f} GFLOP/s)", summary["mfu_float32"] - GOAL_MFU))
    print(f"context {T}, {tokens:,} tokens/step, {flops / 1e9:.2f} GFLOP/step (6·{n_params:,} + 12·L·T·d per token), "
          f"matmul peak {peak / 1e9:.0f} GFLOP/s ({by['ours']['dtype']}), {peak32 / 1e9:.0f} in float32"
          + (f"; the step's metrics cost {100 * summary['metrics_cost']:+.1f}%" if "metrics_cost" in summary else ""))
    if summary["backend"] != "cpu":   # the float32 rows' products are not float32 there, nor the peak's
        print("float32 here: products at JAX's default precision (TF32 on a recent GPU, one bfloat16 pass on a "
              "TPU), in the step and in its matmul peak alike; JAX_DEFAULT_MATMUL_PRECISION=highest for full float32")
    if args.json:
        print(json.dumps(summary))
    return Result(rows=records, claims=claims, tables={"Training step": report.format_table(columns, records)},
                  config={**p, "model": cfg.to_dict()}, extra={"summary": summary})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run, flags=flags, shares_accelerator=True)
main = EXPERIMENT.main
