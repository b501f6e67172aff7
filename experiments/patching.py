"""Activation and edge patching as compiled sweeps, against TransformerLens' loops on the same weights.

`python -m experiments.patching` makes random GPT-2s with transformers, loads each into our
modules (`attention_jax.pretrained`) and into TransformerLens' TransformerBridge, and times
three sweeps on both: the residual stream before every block at every position
(`activation_patch(..., hook="resid_pre", by="position")` against `get_act_patch_resid_pre`),
every head's output (`hook="z", by="head"` against `get_act_patch_attn_head_out_all_pos`), and
every edge of the residual graph patched alone (`discovery.edge_patch`) against two loops of
TransformerLens forwards: one forward per edge (ACDC's edge patching written plainly,
`transformer_lens_ref.edge_patch_loop`) and the patched copies of the batch side by side, as a
practised user writes it (`edge_patch_batched`, 64 copies a forward). Ours is one compiled
program a sweep (the patches are an index it maps over). They take turns, `rounds` times each;
medians are reported, ours once more with its first call (tracing and compiling included).
Every sweep must agree to float32 rounding, and the table says by how much they do.

Then, on ours alone: how well each estimate from gradients ranks the edges that exact patching
scores (Pearson and Spearman, the edges they miss most): EAP, EAP-IG over the inputs and over the
activations (Hanna et al. 2024; MIB's names), and integrated gradients over the edge masks. These
random models have no behaviour to find a circuit for (the corrupted token moves the logit
difference little), so no faithfulness is reported here: circuits are judged where their answer
is known (`experiments.circuits_known`) or learned (`experiments.induction`). Without
TransformerLens (and torch, transformers: the test extra) ours is timed alone on a GPT-2 of the
same shapes made here, TransformerLens' columns say "not measured" and the claims that compare
are not checked.
"""
from __future__ import annotations

import copy
import tempfile
import time
from unittest import mock

import numpy as np

from experiments.harness import report
from experiments.harness.experiment import Experiment, Result
from experiments.harness.oracles import NOT_MEASURED, absent, missing, note

NAME = "patching"
MODELS = {   # GPT-2 shapes: the tests' parity model, and one four times as wide with a real vocabulary's share
    "tiny": dict(shape=dict(vocab_size=101, n_positions=16, n_embd=32, n_layer=3, n_head=4), batch=2, tokens=10),
    "wide": dict(shape=dict(vocab_size=1000, n_positions=32, n_embd=128, n_layer=4, n_head=8), batch=8, tokens=16),
}
PRESETS = {"smoke": dict(models=("tiny",), rounds=2, steps=4), "cpu": dict(models=("tiny", "wide"), rounds=5, steps=16),
           "paper": dict(models=("tiny", "wide"), rounds=10, steps=16)}
SWEEPS = (("resid_pre", "position", "get_act_patch_resid_pre"), ("z", "head", "get_act_patch_attn_head_out_all_pos"),
          ("edges", "edge", None))
EDGES = "every edge alone"     # the edge sweep's name in the table
GOAL = 10          # the issues': a sweep at least 10x TransformerLens' loop (the tests' parity model; edges: every size)
AGREE = 1e-3       # float32 rounding through a normalised metric
COPIES = 64        # patched copies of the batch in one forward of TransformerLens' batched edge loop
ANSWER, WRONG = 5, 6                                 # the metric: logit(5) - logit(6) at the last position, normalised
# GAP: a random model's clean-corrupted gap is a few thousandths of a nat (below the floor a share of it
# would need): here the normalisation is only a scale, which the times and the rank correlations do not
# read, so no floor is asked; nothing on this page is a share of that gap.
AUTO_CIRCUIT = "auto-circuit: not measured (it imports TransformerLens' HookedTransformer, gone since 4.0)"

ORACLES = ("torch", "transformers", "transformer_lens")


def made(name: str, oracles: bool):
    """(ours, the transformers model or None, parameter count): the model's random GPT-2 written by transformers
    and read by ours (`oracles`), or ours alone with every parameter, LayerNorm gains included, from N(0, 0.1²)."""
    import jax
    from flax import nnx
    from attention_jax import pretrained
    from attention_jax.model import LanguageModel
    spec, hf = MODELS[name], None
    if oracles:
        from experiments.transformer_lens_ref import random_gpt2
        ours, hf = random_gpt2(tempfile.mkdtemp(prefix="attention_jax-gpt2-"), std=0.1, **spec["shape"])
    else:
        ours = LanguageModel(pretrained.config_from_hf({"model_type": "gpt2", **spec["shape"]}), rngs=nnx.Rngs(0))
    leaves, treedef = jax.tree.flatten(nnx.state(ours, nnx.Param))
    if not oracles:
        draw = np.random.default_rng(0)
        nnx.update(ours, treedef.unflatten([np.asarray(0.1 * draw.standard_normal(a.shape), np.float32)
                                            for a in leaves]))
    return ours, hf, sum(int(np.prod(a.shape)) for a in leaves)


def _texts(spec):
    vocab, T = spec["shape"]["vocab_size"], spec["tokens"]
    clean = np.random.default_rng(0).integers(0, vocab, (spec["batch"], T))
    corrupted = clean.copy()
    corrupted[:, T // 2] = (corrupted[:, T // 2] + 1) % vocab
    return clean, corrupted


def _contestants(ours, hf, clean, corrupted, metric, hook, by, tl_name):
    """(our sweep, TransformerLens' loop, its batched loop): each a function of nothing returning the values as
    an array, or None (no TransformerLens; the batched loop is the edges' alone).
    TransformerLens runs a bridge of its own over a copy of `hf` for each sweep (a bridge takes over the
    modules it is given: a second bridge over them computes something else)."""
    from attention_jax.analysis.discovery import edge_patch
    from attention_jax.analysis.patching import activation_patch
    if hook == "edges":
        def ours_run():      # the metric with each edge patched, as TransformerLens' loop returns it
            scores = edge_patch(ours, clean, corrupted, metric)
            return scores.effect + scores.clean
    else:
        ours_run = lambda: activation_patch(ours, clean, corrupted, metric, hook=hook, by=by, into="corrupted").values
    if hf is None:
        return ours_run, None, None
    import torch
    from experiments.transformer_lens_ref import bridge
    theirs = bridge(copy.deepcopy(hf))
    tl_metric = lambda lg: ((lg[:, -1, ANSWER] - lg[:, -1, WRONG]).mean() - metric.corrupted) / \
        (metric.clean - metric.corrupted)
    x, y = torch.as_tensor(clean), torch.as_tensor(corrupted)
    if hook == "edges":
        from attention_jax.analysis.edges import graph_of
        from experiments.transformer_lens_ref import edge_patch_batched, edge_patch_loop, split_inputs
        single, split = [tuple(n.split("->")) for n in graph_of(ours).names()], split_inputs(theirs)
        return ours_run, lambda: np.asarray(edge_patch_loop(split, x, y, [[e] for e in single], tl_metric)), \
            lambda: np.asarray(edge_patch_batched(split, x, y, single, tl_metric, copies=COPIES))
    import transformer_lens.patching as tl_patching
    _, clean_cache = theirs.run_with_cache(x)

    def tl_run():  # its sweeps draw a progress bar a call and take no flag to hush it: the log would be bars
        with mock.patch.object(tl_patching, "tqdm", lambda items, **_: items):
            return getattr(tl_patching, tl_name)(theirs, y, clean_cache, tl_metric).numpy()
    return ours_run, tl_run, None


def speed(name: str, ours, hf, params: int, rounds: int) -> list[dict]:
    """Each sweep on one model: our first call, our median, TransformerLens' medians (its loop, and for the edges
    its batched loop), and the largest difference from either."""
    from attention_jax.analysis.patching import normalized_logit_diff
    clean, corrupted = _texts(MODELS[name])
    metric = normalized_logit_diff(ours, clean, corrupted, ANSWER, WRONG, min_gap=0.0)   # see GAP
    rows = []
    for hook, by, tl_name in SWEEPS:
        runs = dict(zip(("ours", "tl", "batched"), _contestants(ours, hf, clean, corrupted, metric, hook, by, tl_name)))
        first, mine = _timed(runs["ours"])
        times, diff = {who: [] for who in runs}, 0.0
        for _ in range(rounds):
            for who, fn in runs.items():
                if fn is not None:
                    seconds, values = _timed(fn)
                    times[who].append(seconds)
                    diff = max(diff, float(np.abs(np.asarray(mine) - values).max()))
        ms = {who: 1e3 * float(np.median(v)) if v else NOT_MEASURED for who, v in times.items()}
        ratio = lambda who: ms[who] / ms["ours"] if times[who] else NOT_MEASURED
        rows.append(dict(kind="speed", model=name, sweep=EDGES if hook == "edges" else f"{hook} by {by}",
                         patches=int(np.prod(np.shape(mine))), params=params, first_s=first, ours_ms=ms["ours"],
                         tl_ms=ms["tl"], ratio=ratio("tl"), batched_ms=ms["batched"] if hook == "edges" else "",
                         batched_ratio=ratio("batched") if hook == "edges" else "",
                         first_ratio=ms["tl"] / 1e3 / first if times["tl"] else NOT_MEASURED,
                         diff=diff if times["tl"] else NOT_MEASURED))
    return rows


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def estimates(name: str, ours, steps: int) -> tuple[list[dict], dict]:
    """Each estimate from gradients against exact edge patching on one model: Pearson, Spearman and the three
    edges it misses most, with its time (compiled once, apart from the timing); and every edge's effect by
    each, {method: [edges]}."""
    from attention_jax.analysis.attribution import eap_ig, edge_attribution, mask_ig
    from attention_jax.analysis.discovery import edge_patch
    from attention_jax.analysis.patching import normalized_logit_diff
    clean, corrupted = _texts(MODELS[name])
    metric = normalized_logit_diff(ours, clean, corrupted, ANSWER, WRONG, min_gap=0.0)   # see GAP
    exact = edge_patch(ours, clean, corrupted, metric)
    names, rows, effects = exact.graph.names(), [], {"exact": exact.effect}
    methods = {"EAP": lambda: edge_attribution(ours, clean, corrupted, metric),
               f"EAP-IG-inputs, {steps} steps": lambda: eap_ig(ours, clean, corrupted, metric, steps=steps),
               f"EAP-IG-activations, {steps} steps": lambda: eap_ig(ours, clean, corrupted, metric, steps=steps,
                                                                     over="activations"),
               f"mask-gradient IG, {steps} steps": lambda: mask_ig(ours, clean, corrupted, metric, steps=steps)}
    for method, score in methods.items():
        score()
        seconds, scores = _timed(score)
        effects[method] = scores.effect
        miss = np.argsort(-np.abs(scores.effect - exact.effect), kind="stable")[:3]
        pearson, spearman = exact.agreement(scores)
        rows.append(dict(kind="estimate", model=name, method=method, edges=len(names), ms=1e3 * seconds,
                         gap=float(metric.clean - metric.corrupted), pearson=pearson, spearman=spearman,
                         misses="; ".join(f"{names[i]} {exact.effect[i]:+.3f} (est. {scores.effect[i]:+.3f})"
                                          for i in miss)))
    return rows, effects


def claims(rows: list[dict], gone: list[str] = ()) -> list[dict]:
    """The claims compare with TransformerLens: without it (`gone`), not checked."""
    speed_rows = [r for r in rows if r["kind"] == "speed"]
    goals = [r for r in speed_rows if r["model"] == "tiny" or r["sweep"] == EDGES]
    text = lambda r: (f"{r['sweep']} on the {r['model']} GPT-2" + (" (the tests' parity model)" if r["model"] == "tiny"
                                                                  else "") + f": ours >= {GOAL}x TransformerLens' loop")
    same = f"every sweep equals TransformerLens' on the same weights (max |diff| < {AGREE:g})"
    if gone:
        return [report.unchecked(report.claim(t, False, NOT_MEASURED), absent(gone))
                for t in [same] + [text(r) for r in goals]]
    worst = max(r["diff"] for r in speed_rows)
    batched = [r for r in speed_rows if r["sweep"] == EDGES and r["model"] == "wide"]
    return [report.claim(same, worst < AGREE, f"{worst:.2e}", AGREE - worst)] + [
        report.claim(text(r), r["ratio"] >= GOAL, f"{r['ratio']:.1f}x ({r['ours_ms']:.1f} vs {r['tl_ms']:.0f} ms)",
                     r["ratio"] - GOAL) for r in goals] + [
        report.claim(f"{EDGES} on the wide GPT-2: ours >= {GOAL}x TransformerLens' batched loop ({COPIES} copies a "
                     "forward)", r["batched_ratio"] >= GOAL,
                     f"{r['batched_ratio']:.1f}x ({r['ours_ms']:.0f} vs {r['batched_ms']:.0f} ms)",
                     r["batched_ratio"] - GOAL) for r in batched]


def scatter(rows: list[dict], scores: dict) -> object:
    """Each estimate against exact patching, edge by edge: a panel per model."""
    models = list(scores)
    fig, axes = report.figure(ncols=len(models), size=(6.5 * len(models), 4.5), squeeze=False)
    for ax, name in zip(axes[0], models):
        exact = scores[name]["exact"]
        for i, (method, est) in enumerate(scores[name].items()):
            if method != "exact":
                ax.plot(exact, est, ".", color=f"C{i}", alpha=0.6, label=method)
        lim = float(np.abs(exact).max())
        ax.plot([-lim, lim], [-lim, lim], color="0.6", lw=0.8)
        ax.set(xlabel="exact effect (edge patched alone)", ylabel="estimated effect", title=f"{name} GPT-2")
        ax.legend(fontsize=8)
    return fig


def _said(r: dict, gone) -> str:
    """One speed row as a line of the log."""
    tl = "TransformerLens not measured" if gone else \
        f"TransformerLens {r['tl_ms']:8.1f} ms  x{r['ratio']:.1f}  |diff| {r['diff']:.1e}"
    if r["batched_ms"] != "" and not gone:
        tl += f"  batched {r['batched_ms']:.1f} ms x{r['batched_ratio']:.1f}"
    return f"  {r['model']:<5} {r['sweep']:<22} {r['patches']:>5} patches  ours {r['ours_ms']:8.1f} ms " \
           f"(first {r['first_s']:.2f} s)  {tl}"


def tables(rows: list[dict]) -> dict:
    columns = [("model", "model", ""), ("params", "params", ",d"), ("sweep", "sweep", ""), ("patches", "patches", "d"),
               ("ours_ms", "ours ms (median)", ".1f"), ("first_s", "ours, first call s", ".2f"),
               ("tl_ms", "TransformerLens loop ms (median)", ".0f"), ("ratio", "loop / ours", ".1f"),
               ("batched_ms", f"its batched loop ms ({COPIES} copies a forward)", ".0f"),
               ("batched_ratio", "batched / ours", ".1f"), ("first_ratio", "loop / our first call", ".2f"),
               ("diff", "max |diff|", ".1e")]
    agreement = [("model", "model", ""), ("edges", "edges", "d"), ("gap", "clean - corrupted logit diff", ".3f"),
                 ("method", "estimate", ""), ("ms", "ms", ".1f"),
                 ("pearson", "Pearson", ".3f"), ("spearman", "Spearman", ".3f"),
                 ("misses", "the three edges it misses most: exact (estimate)", "")]
    return {"Patching sweeps, ours against TransformerLens' loops":
            report.format_table(columns, [r for r in rows if r["kind"] == "speed"]),
            "Estimates from gradients against exact edge patching": report.format_table(
                agreement, [r for r in rows if r["kind"] == "estimate"])}


def run(ctx) -> Result:
    p = ctx.settings
    rows, gone, effects = [], missing(*ORACLES), {}
    print(note("TransformerLens' loops", gone) if gone else AUTO_CIRCUIT, flush=True)
    for name in p["models"]:
        ours, hf, params = made(name, oracles=not gone)
        for r in speed(name, ours, hf, params, p["rounds"]):
            rows.append(r)
            print(_said(r, gone), flush=True)
        agree, effects[name] = estimates(name, ours, p["steps"])
        rows += agree
        for r in agree:
            print(f"  {r['model']:<5} {r['method']:<34} against exact: Pearson {r['pearson']:.3f}, "
                  f"Spearman {r['spearman']:.3f}", flush=True)
    return Result(rows=rows, claims=claims(rows, gone), config=dict(p, models={n: MODELS[n] for n in p["models"]}),
                  tables=tables(rows), figures={"estimates.png": scatter(rows, effects)})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
