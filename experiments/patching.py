"""Activation and edge patching as compiled sweeps, against TransformerLens' loops of forwards on the same weights.

`python -m experiments.patching` makes random GPT-2s with transformers, loads each into our
modules (`attention_jax.pretrained`) and into TransformerLens' TransformerBridge, and times
three sweeps on both: the residual stream before every block at every position
(`activation_patch(..., hook="resid_pre", by="position", into="corrupted")` against `get_act_patch_resid_pre`),
every head's output (`hook="z", by="head"` against `get_act_patch_attn_head_out_all_pos`), and
every edge of the residual graph patched alone (`discovery.edge_patch` against ACDC's edge
patching written as a loop of hooked forwards, `transformer_lens_ref.edge_patch_loop`). Ours is
one compiled program each (the patches are an index it maps over); TransformerLens runs one
forward per patch with hooks. They take turns, `rounds` times each; medians are reported, ours
once more with its first call (tracing and compiling included). Every sweep must agree to
float32 rounding, and the table says by how much they do.

Then, on ours alone: how well edge attribution (EAP, one forward and one backward) and EAP with
integrated gradients (`steps` points) rank the edges that exact patching scores (Pearson and
Spearman, the edges they miss most), and the circuit each score names, top k edges at a time,
as a faithfulness curve (the circuit alone, every other edge patched: its share of the clean-
corrupted gap). Without TransformerLens (and torch, transformers: the test extra) ours is timed
alone on a GPT-2 of the same shapes made here, TransformerLens' columns say "not measured" and
the claims that compare are not checked.
"""
from __future__ import annotations

import copy
import tempfile
import time

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
KS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)     # circuit sizes of the faithfulness curves (those <= the edges)
ACDC = 0.02        # ACDC's threshold: an edge moving the normalised metric by less is patched away (not tuned)
ANSWER, WRONG = 5, 6                                 # the metric: logit(5) - logit(6) at the last position, normalised

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
    """(our sweep, TransformerLens' or None): each a function of nothing returning the values as an array.
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
        return ours_run, None
    import torch
    from experiments.transformer_lens_ref import bridge
    theirs = bridge(copy.deepcopy(hf))
    tl_metric = lambda lg: ((lg[:, -1, ANSWER] - lg[:, -1, WRONG]).mean() - metric.corrupted) / \
        (metric.clean - metric.corrupted)
    x, y = torch.as_tensor(clean), torch.as_tensor(corrupted)
    if hook == "edges":
        from attention_jax.analysis.edges import graph_of
        from experiments.transformer_lens_ref import edge_patch_loop, split_inputs
        single, split = [[tuple(n.split("->"))] for n in graph_of(ours).names()], split_inputs(theirs)
        return ours_run, lambda: np.asarray(edge_patch_loop(split, x, y, single, tl_metric))
    import transformer_lens.patching as tl_patching
    _, clean_cache = theirs.run_with_cache(x)
    return ours_run, lambda: getattr(tl_patching, tl_name)(theirs, y, clean_cache, tl_metric).numpy()


def speed(name: str, ours, hf, params: int, rounds: int) -> list[dict]:
    """Each sweep on one model: our first call, our median and TransformerLens' median, and their largest difference."""
    from attention_jax.analysis.patching import normalized_logit_diff
    clean, corrupted = _texts(MODELS[name])
    metric = normalized_logit_diff(ours, clean, corrupted, ANSWER, WRONG)
    rows = []
    for hook, by, tl_name in SWEEPS:
        ours_run, tl_run = _contestants(ours, hf, clean, corrupted, metric, hook, by, tl_name)
        first, mine = _timed(ours_run)
        times, tl_values = {"ours": [], "tl": []}, None
        for _ in range(rounds):
            for who, fn in (("ours", ours_run), ("tl", tl_run)):
                if fn is not None:
                    seconds, values = _timed(fn)
                    times[who].append(seconds)
                    tl_values = values if who == "tl" else tl_values
        ours_s = float(np.median(times["ours"]))
        tl_s = float(np.median(times["tl"])) if tl_run else None
        rows.append(dict(kind="speed", model=name, sweep=EDGES if hook == "edges" else f"{hook} by {by}",
                         patches=int(np.prod(np.shape(mine))), params=params, first_s=first, ours_ms=1e3 * ours_s,
                         tl_ms=1e3 * tl_s if tl_run else NOT_MEASURED,
                         ratio=tl_s / ours_s if tl_run else NOT_MEASURED,
                         first_ratio=tl_s / first if tl_run else NOT_MEASURED,
                         diff=float(np.abs(np.asarray(mine) - tl_values).max()) if tl_run else NOT_MEASURED))
    return rows


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def estimates(name: str, ours, steps: int) -> tuple[list[dict], list[dict], list[dict]]:
    """EAP and EAP-IG against exact edge patching on one model (Pearson, Spearman, the three edges each misses
    most), the faithfulness of each score's circuits, and ACDC's greedy circuit against the scores' circuits of
    its size: (agreement rows, faithfulness rows, ACDC rows)."""
    from attention_jax.analysis.discovery import edge_attribution, edge_patch
    from attention_jax.analysis.faithfulness import circuit_faithfulness, faithfulness
    from attention_jax.analysis.pruning import acdc, circuit
    from attention_jax.analysis.patching import normalized_logit_diff
    clean, corrupted = _texts(MODELS[name])
    metric = normalized_logit_diff(ours, clean, corrupted, ANSWER, WRONG)
    scored = {"exact": _timed(lambda: edge_patch(ours, clean, corrupted, metric))}
    for method, s in (("EAP", None), (f"EAP-IG, {steps} steps", steps)):
        edge_attribution(ours, clean, corrupted, metric, steps=s)          # compiled once, apart from the timing
        scored[method] = _timed(lambda: edge_attribution(ours, clean, corrupted, metric, steps=s))
    exact = scored["exact"][1]
    names, ks = exact.graph.names(), [k for k in KS if k <= len(exact.graph.edges)]
    agree, faithful = [], []
    for method, (seconds, scores) in scored.items():
        if method != "exact":
            miss = np.argsort(-np.abs(scores.effect - exact.effect), kind="stable")[:3]
            pearson, spearman = exact.agreement(scores)
            agree.append(dict(kind="estimate", model=name, method=method, edges=len(names), ms=1e3 * seconds,
                              gap=float(metric.clean - metric.corrupted), pearson=pearson, spearman=spearman,
                              misses="; ".join(f"{names[i]} {exact.effect[i]:+.3f} (est. {scores.effect[i]:+.3f})"
                                               for i in miss)))
        curve = faithfulness(ours, clean, corrupted, metric, scores, ks)
        faithful += [dict(kind="faithfulness", model=name, method=method, k=k, kept=len(circuit(scores, k=k)),
                          faithfulness=float(f)) for k, f in zip(ks, curve)]
    seconds, greedy = _timed(lambda: acdc(ours, clean, corrupted, metric, threshold=ACDC))
    same = {method: circuit(scored[method][1], k=len(greedy)) for method in scored}
    alone = circuit_faithfulness(ours, clean, corrupted, metric, greedy, *same.values())
    acdc_row = dict(kind="acdc", model=name, threshold=ACDC, edges=len(greedy), s=seconds, faithfulness=float(alone[0]),
                    **{f"{m}_faithfulness": float(f) for m, f in zip(same, alone[1:])},
                    **{f"{m}_overlap": len(set(greedy) & set(c)) / max(1, len(set(greedy) | set(c)))
                       for m, c in same.items()})
    return agree, faithful, [acdc_row]


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
    return [report.claim(same, worst < AGREE, f"{worst:.2e}", AGREE - worst)] + [
        report.claim(text(r), r["ratio"] >= GOAL, f"{r['ratio']:.1f}x ({r['ours_ms']:.1f} vs {r['tl_ms']:.0f} ms)",
                     r["ratio"] - GOAL) for r in goals]


def curves(rows: list[dict], models) -> object:
    """Faithfulness against circuit size, a panel per model, a line per score."""
    fig, axes = report.figure(ncols=len(models), size=(6.5 * len(models), 4.5), squeeze=False)
    for ax, name in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == name]
        for i, method in enumerate(dict.fromkeys(r["method"] for r in mine)):
            at = [r for r in mine if r["method"] == method]
            ax.plot([r["k"] for r in at], [r["faithfulness"] for r in at], "o-", color=f"C{i}", label=method)
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set(xscale="log", xlabel="edges kept (top k by the score, pruned to paths to the logits)",
               ylabel="faithfulness (share of the clean-corrupted gap)", title=f"{name} GPT-2")
        ax.legend(fontsize=8)
    report.plain_log_ticks(fig)
    return fig


def run(ctx) -> Result:
    p = ctx.settings
    rows, gone = [], missing(*ORACLES)
    if gone:
        print(note("TransformerLens' loops", gone), flush=True)
    for name in p["models"]:
        ours, hf, params = made(name, oracles=not gone)
        for r in speed(name, ours, hf, params, p["rounds"]):
            rows.append(r)
            tl = ("TransformerLens not measured" if gone else
                  f"TransformerLens {r['tl_ms']:8.1f} ms  x{r['ratio']:.1f}  |diff| {r['diff']:.1e}")
            print(f"  {r['model']:<5} {r['sweep']:<22} {r['patches']:>5} patches  ours {r['ours_ms']:8.1f} ms "
                  f"(first {r['first_s']:.2f} s)  {tl}", flush=True)
        agree, faithful, greedy = estimates(name, ours, p["steps"])
        rows += agree + faithful + greedy
        for r in agree:
            print(f"  {r['model']:<5} {r['method']:<22} against exact: Pearson {r['pearson']:.3f}, "
                  f"Spearman {r['spearman']:.3f}", flush=True)
        for r in greedy:
            print(f"  {r['model']:<5} ACDC (threshold {r['threshold']:g}) keeps {r['edges']} edges in {r['s']:.1f} s, "
                  f"faithfulness {r['faithfulness']:.2f}", flush=True)
    columns = [("model", "model", ""), ("params", "params", ",d"), ("sweep", "sweep", ""), ("patches", "patches", "d"),
               ("ours_ms", "ours ms (median)", ".1f"), ("first_s", "ours, first call s", ".2f"),
               ("tl_ms", "TransformerLens ms (median)", ".0f"), ("ratio", "TransformerLens / ours", ".1f"),
               ("first_ratio", "... / our first call", ".2f"), ("diff", "max |diff|", ".1e")]
    agreement = [("model", "model", ""), ("edges", "edges", "d"), ("gap", "clean - corrupted logit diff", ".3f"),
                 ("method", "estimate", ""), ("ms", "ms", ".1f"),
                 ("pearson", "Pearson", ".3f"), ("spearman", "Spearman", ".3f"),
                 ("misses", "the three edges it misses most: exact (estimate)", "")]
    faithful = [r for r in rows if r["kind"] == "faithfulness"]
    by_k = [dict(model=m, method=method, **{f"k{r['k']}": r["faithfulness"] for r in faithful
                                           if (r["model"], r["method"]) == (m, method)})
            for m, method in dict.fromkeys((r["model"], r["method"]) for r in faithful)]
    curve_columns = [("model", "model", ""), ("method", "circuit by", "")] + \
        [(f"k{k}", f"k={k}", ".2f") for k in KS if any(f"k{k}" in r for r in by_k)]
    methods = [m for m in dict.fromkeys(r["method"] for r in faithful)]
    acdc_columns = [("model", "model", ""), ("edges", "ACDC's edges", "d"), ("s", "ACDC s", ".2f"),
                    ("faithfulness", "its faithfulness", ".2f")] + \
        [(f"{m}_faithfulness", f"{m}'s, same size", ".2f") for m in methods] + \
        [(f"{m}_overlap", f"edges shared with {m}'s (Jaccard)", ".2f") for m in methods]
    tables = {"Patching sweeps, ours against TransformerLens' loop":
              report.format_table(columns, [r for r in rows if r["kind"] == "speed"]),
              "Edge attribution against exact edge patching": report.format_table(
                  agreement, [r for r in rows if r["kind"] == "estimate"]),
              "Faithfulness of the circuit of the top k edges": report.format_table(curve_columns, by_k),
              f"ACDC's greedy circuit (threshold {ACDC:g} of the normalised metric) against each score's top edges "
              "of its size": report.format_table(acdc_columns, [r for r in rows if r["kind"] == "acdc"])}
    return Result(rows=rows, claims=claims(rows, gone), config=dict(p, models={n: MODELS[n] for n in p["models"]}),
                  tables=tables, figures={"faithfulness.png": curves(faithful, p["models"])})


EXPERIMENT = Experiment(NAME, __doc__, PRESETS, run)
main = EXPERIMENT.main

if __name__ == "__main__":
    raise SystemExit(main())
