"""Writing text, cached and uncached: the milliseconds a token costs at every position.

`python -m experiments.generation` decodes greedily from a prompt of 16 tokens with random
weights, for the ladder's one-block model and for a model of GPT-2 small's shape (12 blocks,
width 768, context 1024), both ways `attention_jax.decoding.generate` can: with the key/value cache
(the prompt in one call, then one position a step) and without (a whole window of `context`
tokens a step). Each step is one compiled call, timed alone, so the per-position curve can be
drawn; `generate` runs the same step inside one `lax.scan`, without the per-call dispatch.
A window's cost does not depend on where the text is (it is always `context` tokens), so the
uncached path is timed at a few positions spread over the same range. Then ours against
transformers' `generate` on one GPT-2's weights, and both against this machine's memory
bandwidth, the fastest of three reads of a large array (`experiments.generation_versus`).
"""
from __future__ import annotations

import time

import numpy as np

from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.harness.oracles import NOT_MEASURED, absent, missing, note

NAME = "generation"
PROMPT = 16
PRESETS = {
    "smoke": dict(models=("tiny",), new=24, uncached_positions=3, versus="tiny", versus_new=8, rounds=1),
    "cpu": dict(models=("one_block", "gpt2_small_shape"), new=1000, uncached_positions=6, versus="gpt2_small",
                versus_new=128, rounds=3),
    "paper": dict(models=("one_block", "gpt2_small_shape"), new=1000, uncached_positions=12, versus="gpt2_small",
                  versus_new=256, rounds=5),
}
SPEEDUP = 10          # the goal at 1,000 tokens for GPT-2 small's shape: cached >= 10x the tokens/s
FLAT = 1.5            # "flat in position": the last tenth of the steps within 1.5x the first tenth's time
FASTER = 2.0          # the goal against transformers' generate, float32, batch 1
NEAR_FLOOR = 1.2      # the goal for bfloat16 weights: within 1.2x the floor for their bytes
SPREAD = 0.05         # bfloat16 weights move the logits by under 0.05 of their standard deviation
ORACLES = ("torch", "transformers")


def model_config(name: str):
    from attention_jax.config import GPT2_SMALL, ModelConfig
    from experiments.configs import ONE_BLOCK
    return {"tiny": ModelConfig(vocab_size=64, context=48, d_model=32, n_layers=2, n_heads=4),
            "one_block": ONE_BLOCK, "gpt2_small_shape": GPT2_SMALL}[name]


def time_model(name: str, new: int, uncached_positions: int) -> dict:
    """Per-step milliseconds of both paths for one model, greedy, batch 1."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from attention_jax.decoding.kv_cache import Cached, cached
    from attention_jax.model import LanguageModel
    cfg = model_config(name)
    new = min(new, cfg.context - PROMPT + 1)        # the cache holds the context, no more
    model = LanguageModel(cfg, rngs=nnx.Rngs(0))
    model.eval()
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, PROMPT)), jnp.int32)

    def timed(fn, *args):
        t = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        return out, 1e3 * (time.perf_counter() - t)

    graph, params = nnx.split(model)                # uncached: a window of `context` tokens a step
    text = jnp.zeros((1, cfg.context), jnp.int32).at[:, :PROMPT].set(prompt)
    window = jax.jit(lambda params, x, at: nnx.merge(graph, params)(x)[:, at].argmax(-1)).lower(
        params, text, jnp.int32(0)).compile()      # compiled before the clock runs, as every step below
    at = np.linspace(PROMPT, PROMPT + new - 1, uncached_positions).astype(int)
    uncached = [timed(window, params, text, jnp.int32(p - 1))[1] for p in at]

    decoding = cached(model, 1, PROMPT + new - 1)     # cached: the prompt once, then one position a step
    cache_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Cache)))
    graph, state = nnx.split(model)

    def step(state, tokens):
        m = nnx.merge(graph, state)
        token = Cached.resume(m)(tokens)[:, -1].argmax(-1).astype(jnp.int32)
        return nnx.state(m), token

    prefill = jax.jit(step, donate_argnums=0).lower(state, prompt).compile()
    one = jax.jit(step, donate_argnums=0).lower(state, prompt[:, :1]).compile()
    (state, token), prefill_ms = timed(prefill, state, prompt)
    steps = []
    for _ in range(new - 1):
        (state, token), ms = timed(one, state, token[:, None])
        steps.append(ms)
    decoding.undo()
    steady = steps[3:] if len(steps) > 13 else steps         # the first steps also warm caches and threads
    tenth = max(1, len(steady) // 10)
    return {"name": name, "params": sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))),
            "context": cfg.context, "new": new, "cache_mb": cache_bytes / 2**20, "prefill_ms": prefill_ms,
            "cached_ms": float(np.median(steps)), "uncached_ms": float(np.median(uncached)),
            "cached_positions": list(range(PROMPT + 1, PROMPT + new)), "cached_curve": steps,
            "uncached_positions": [int(p) for p in at], "uncached_curve": uncached,
            "flatness": float(np.median(steady[-tenth:]) / np.median(steady[:tenth]))}


def figure(rows: list[dict], title: str):
    fig, axes = report.figure(ncols=len(rows), size=(6.5 * len(rows), 4.5))
    for ax, r in zip(np.atleast_1d(axes), rows):
        ax.plot(r["cached_positions"], r["cached_curve"], ".", markersize=2, label="cached (one position a step)")
        ax.plot(r["uncached_positions"], r["uncached_curve"], "s-", label=f"uncached (a window of {r['context']})")
        ax.set(yscale="log", xlabel="position of the token written", ylabel="ms per token",
               title=f"{r['name']}: {r['params']:,} parameters")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return fig


def claims(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        out.append(report.claim(f"{r['name']}: the cached cost per token is flat in position (last tenth within "
                                f"{FLAT}x the first)", r["flatness"] < FLAT, f"{r['flatness']:.2f}x",
                                FLAT - r["flatness"]))
    big = [r for r in rows if r["name"] == "gpt2_small_shape" and r["new"] >= 1000]
    for r in big:
        out.append(report.claim(f"GPT-2 small's shape, {r['new']} tokens: cached >= {SPEEDUP}x the tokens/s of "
                                "uncached", r["ratio"] >= SPEEDUP, f"{r['ratio']:.1f}x ({r['cached_ms']:.1f} vs "
                                f"{r['uncached_ms']:.0f} ms a token)", r["ratio"] - SPEEDUP))
    return out


def versus_claims(v: dict) -> list[dict]:
    at = {(r["who"], r["weights"], r["batch"]): r for r in v["rows"]}
    low = at[("ours", "bfloat16", 1)]
    same_tokens = "our greedy tokens are transformers' on the same weights, batch 1 and each row of a batch of " \
                  "4 unequal prompts"
    faster = f"ours >= {FASTER:g}x transformers' tokens/s at float32, batch 1"
    if v.get("oracle") is False:        # transformers and torch not installed: what compares is not checked
        why = absent(ORACLES)
        compared = [report.unchecked(report.claim(t, False, NOT_MEASURED), why) for t in (same_tokens, faster)]
    else:
        ratio = at[("transformers", "float32", 1)]["ms"] / at[("ours", "float32", 1)]["ms"]
        compared = [
            report.claim(same_tokens, all(v["tokens_equal"].values()),
                         ", ".join(f"batch {b}: {'equal' if e else 'differ'}" for b, e in v["tokens_equal"].items())),
            report.claim(faster, ratio >= FASTER,
                         f"{ratio:.2f}x; {FASTER:g}x would be {at[('transformers', 'float32', 1)]['ms'] / FASTER:.1f} ms "
                         f"a token, the float32 floor {at[('ours', 'float32', 1)]['floor_ms']:.1f}", ratio - FASTER)]
    return [
        compared[0],
        report.claim("a batch of 4 unequal prompts gives each row the tokens it gets alone", v["batch_equals_alone"],
                     "equal" if v["batch_equals_alone"] else "differ"),
        compared[1],
        report.claim(f"bfloat16 weights: within {NEAR_FLOOR:g}x the bandwidth floor for their bytes, batch 1",
                     low["of_floor"] <= NEAR_FLOOR, f"{low['of_floor']:.2f}x ({low['ms']:.1f} ms against "
                     f"{low['floor_ms']:.1f})", NEAR_FLOOR - low["of_floor"]),
        report.claim(f"bfloat16 weights move the logits by under {SPREAD:g} of their standard deviation",
                     v["bf16_logit_diff"] < SPREAD * v["logit_std"],
                     f"max |diff| {v['bf16_logit_diff']:.4f}, std {v['logit_std']:.3f}",
                     SPREAD - v["bf16_logit_diff"] / v["logit_std"]),
    ]


def versus_table(v: dict) -> str:
    columns = [("who", "decoder", ""), ("weights", "weights", ""), ("batch", "batch", "d"),
               ("ms", "ms/token", ".2f"), ("mb", "MB read a token", ",.1f"), ("floor_ms", "floor ms", ".2f"),
               ("of_floor", "x floor", ".2f")]
    return report.format_table(columns, v["rows"])


def run(ctx) -> Result:
    p = ctx.settings
    rows = []
    for name in p["models"]:
        r = time_model(name, p["new"], p["uncached_positions"])
        r.update(ratio=r["uncached_ms"] / r["cached_ms"], cached_tps=1e3 / r["cached_ms"],
                 uncached_tps=1e3 / r["uncached_ms"])
        rows.append(r)
        print(f"  {name:<17} {r['new']:>5} tokens  cached {r['cached_ms']:8.2f} ms/token  uncached "
              f"{r['uncached_ms']:9.2f}  x{r['ratio']:.1f}  cache {r['cache_mb']:.1f} MB", flush=True)
    columns = [("name", "model", ""), ("params", "params", ",d"), ("context", "context", "d"),
               ("new", "new tokens", "d"), ("cache_mb", "cache MB", ".1f"), ("prefill_ms", "prefill ms", ".1f"),
               ("cached_ms", "cached ms/token", ".2f"), ("uncached_ms", "uncached ms/token", ".1f"),
               ("cached_tps", "cached tokens/s", ",.0f"), ("uncached_tps", "uncached tokens/s", ",.1f"),
               ("ratio", "speedup", ".1f")]
    title = f"greedy decoding, batch 1, prompt {PROMPT}, random weights ({ctx.preset} preset)"
    table = report.format_table(columns, rows)
    from experiments.generation_versus import PROMPTS, race
    gone = missing(*ORACLES)
    if gone:
        print(note("transformers' generate", gone), flush=True)
    v = race(p["versus"], p["versus_new"], p["rounds"], oracle=not gone)
    print(versus_table(v), flush=True)
    probes = ", ".join(f"{name} {gbs:.1f}" for name, gbs in v["bandwidth_probes"].items())
    heading = (f"ours against transformers on one {p['versus']} GPT-2 ({v['params']:,} parameters), {v['new']} "
               f"greedy tokens, prompts of {PROMPTS[0]} (batch 1) and {', '.join(map(str, PROMPTS))} (batch 4); "
               f"median of {p['rounds']} turns each; floor: the bytes read at {v['bandwidth_gbs']:.1f} GB/s, the "
               f"fastest of three compiled reads of 512 MB before the turns and after ({probes}); our Decoders "
               f"made once, outside the clock (float32 "
               f"{v['prepare_ms']['float32']:.0f} ms, bfloat16 {v['prepare_ms']['bfloat16']:.0f}, int8 "
               f"{v['prepare_ms']['int8']:.0f}); bfloat16 weights kept the float32 greedy tokens for "
               f"{v['bf16_same_tokens']} of {v['new']}, int8 for {v['int8_same_tokens']} (int8 logits within "
               f"{v['int8_logit_diff']:.3f} of float32's, {v['int8_logit_diff'] / v['logit_std']:.2f} of their std); "
               + (f"torch on {v['torch_threads']} threads" if v["torch_threads"] else absent(gone)))
    return Result(rows=rows, claims=claims(rows) + versus_claims(v), config=dict(p, prompt=PROMPT),
                  tables={"ms per token, median over the steps (a model's new tokens stop at its context)": table,
                          heading: versus_table(v)},
                  figures={"ms_per_token.png": figure(rows, title)}, extra={"versus": v})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
